"""Llama decoder (also the base of Qwen2 and Qwen3, which add a qkv bias / per-head q,k norms).

Weights follow HF names; `load_weights` merges q/k/v into `qkv_proj` and gate/up into
`gate_up_proj`. Sliding-window layers come from `ModelConfig.swa_layer_ids` and are handed to
`RadixAttention(sliding_window_size=...)`; the attention backend applies the window.
"""

from __future__ import annotations

from typing import Any, Iterable, List, Optional, Tuple

import torch
from torch import nn

from sglang.srt.configs.model_config import num_labels_of
from sglang.srt.layers import fused_decode
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear, default_weight_loader
from sglang.srt.layers.logits_processor import LogitsProcessor, LogitsProcessorOutput
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.layers.rotary_embedding import get_rope, get_rope_config
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding


def _sliding_window_for_layer(config: Any, model_config, layer_id: int) -> int:
    """HF window size for a sliding layer, -1 for a full-attention layer."""
    if model_config is not None:
        if layer_id in model_config.swa_layer_ids and model_config.sliding_window_size:
            return int(model_config.sliding_window_size)
        return -1
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if window and layer_types and layer_types[layer_id] == "sliding_attention":
        return int(window)
    return -1


class LlamaMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2, bias=bias)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up_proj.silu_mul(x))


class LlamaAttention(nn.Module):
    def __init__(self, config: Any, layer_id: int, model_config=None, qkv_bias: Optional[bool] = None,
                 o_bias: Optional[bool] = None, qk_norm: bool = False):
        super().__init__()
        self.hidden_size = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or self.hidden_size // self.num_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        attention_bias = bool(getattr(config, "attention_bias", False))
        qkv_bias = attention_bias if qkv_bias is None else qkv_bias
        o_bias = attention_bias if o_bias is None else o_bias
        self.qkv_proj = QKVParallelLinear(self.hidden_size, self.head_dim, self.num_heads, self.num_kv_heads, bias=qkv_bias)
        self.o_proj = RowParallelLinear(self.q_size, self.hidden_size, bias=o_bias)
        self.qk_norm = qk_norm
        if qk_norm:
            self.q_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        theta, scaling = get_rope_config(config)
        max_pos = int(getattr(config, "max_position_embeddings", 2048))
        if model_config is not None:
            max_pos = max(max_pos, int(model_config.context_len))
        self.rotary_emb = get_rope(self.head_dim, self.head_dim, max_pos, theta, scaling)
        self.attn = RadixAttention(
            self.num_heads, self.head_dim, self.head_dim ** -0.5, self.num_kv_heads, layer_id=layer_id,
            sliding_window_size=_sliding_window_for_layer(config, model_config, layer_id),
        )

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, forward_batch) -> torch.Tensor:
        qkv = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.qk_norm:
            T = q.shape[0]
            q = self.q_norm(q.reshape(T, self.num_heads, self.head_dim)).reshape(T, self.q_size)
            k = self.k_norm(k.reshape(T, self.num_kv_heads, self.head_dim)).reshape(T, self.kv_size)
        q, k = self.rotary_emb(positions, q, k)
        o = self.attn(q, k, v.contiguous(), forward_batch)
        return self.o_proj(o)


class LlamaDecoderLayer(nn.Module):
    attention_kwargs: dict = {}

    def __init__(self, config: Any, layer_id: int, model_config=None, **attention_kwargs):
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_id, model_config, **attention_kwargs)
        self.mlp = LlamaMLP(config.hidden_size, config.intermediate_size, bias=bool(getattr(config, "mlp_bias", False)))
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.fused_decode_args: dict = {}  # layers/fused_decode.py's per-(rows, dtype) arguments

    def forward(self, positions, hidden_states, forward_batch, residual: Optional[torch.Tensor]):
        fused = fused_decode.decode_layer(self, positions, hidden_states, forward_batch, residual)
        if fused is not None:  # CPU decode: the whole layer in one sgl-kernel call
            return fused
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states, forward_batch)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class LlamaModel(nn.Module):
    layer_attention_kwargs: dict = {}

    def __init__(self, config: Any, model_config=None, **attention_kwargs):
        super().__init__()
        self.config = config
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, i, model_config, **attention_kwargs) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch,
                input_embeds: Optional[torch.Tensor] = None) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids) if input_embeds is None else input_embeds
        fused = fused_decode.decode_layers(self.layers, positions, hidden_states, forward_batch)
        if fused is not None:  # the whole stack in one sgl_kernel call (CPU decode)
            hidden_states, residual = fused
        else:
            residual = None
            for layer in self.layers:
                hidden_states, residual = layer(positions, hidden_states, forward_batch, residual)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class LlamaForCausalLM(nn.Module):
    # (merged param, HF name fragment, shard id)
    stacked_params_mapping: List[Tuple[str, str, Any]] = [
        (".qkv_proj", ".q_proj", "q"),
        (".qkv_proj", ".k_proj", "k"),
        (".qkv_proj", ".v_proj", "v"),
        (".gate_up_proj", ".gate_proj", 0),
        (".gate_up_proj", ".up_proj", 1),
    ]
    attention_kwargs: dict = {}

    def __init__(self, config: Any, model_config=None):
        super().__init__()
        self.config = config
        self.model_config = model_config
        self.model = LlamaModel(config, model_config, **self.attention_kwargs)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        if self.tie_word_embeddings:
            self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(config)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch,
                input_embeds: Optional[torch.Tensor] = None) -> LogitsProcessorOutput:
        hidden_states = self.model(input_ids, positions, forward_batch, input_embeds)
        return self.logits_processor(input_ids, hidden_states, self.lm_head, forward_batch)

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> set:
        """Copies HF-named tensors into the parameters; returns the set of parameter names loaded."""
        params = dict(self.named_parameters(remove_duplicate=False))
        loaded = set()
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name or "rotary_emb.cos_cached" in name or "rotary_emb.sin_cached" in name:
                continue
            if self.tie_word_embeddings and name == "lm_head.weight":
                continue  # the tied head is the embedding
            for merged, hf_frag, shard in self.stacked_params_mapping:
                if hf_frag not in name:
                    continue
                target = name.replace(hf_frag, merged)
                if target not in params:
                    continue
                module = self.get_submodule(target.rsplit(".", 1)[0])
                module.weight_loader(params[target], tensor, shard)
                loaded.add(f"{target}:{shard}")
                break
            else:
                if name not in params:
                    continue  # e.g. extra buffers in some checkpoints
                default_weight_loader(params[name], tensor)
                loaded.add(name)
        return loaded

    def expected_weight_keys(self) -> set:
        """The `load_weights` keys a complete checkpoint provides (for missing-weight checks)."""
        out = set()
        for name, _ in self.named_parameters():
            hit = False
            for merged, _frag, shard in self.stacked_params_mapping:
                if merged + "." in name:
                    shards = {s for m, _f, s in self.stacked_params_mapping if m == merged}
                    out.update(f"{name}:{s}" for s in shards)
                    hit = True
                    break
            if not hit:
                out.add(name)
        return out


EntryClass = LlamaForCausalLM


class LlamaForSequenceClassification(LlamaForCausalLM):
    """HF's `*ForSequenceClassification` (rerankers, reward models): the same decoder with a
    `score` head [num_labels, hidden] instead of the LM head; the logits of the last token are
    the output (served with --is-embedding: /v1/rerank, /v1/score, /encode)."""

    def __init__(self, config: Any, model_config=None):
        nn.Module.__init__(self)
        self.config = config
        self.model_config = model_config
        self.model = LlamaModel(config, model_config, **self.attention_kwargs)
        self.tie_word_embeddings = False
        self.score = ParallelLMHead(num_labels_of(config), config.hidden_size)
        self.logits_processor = LogitsProcessor(config)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch,
                input_embeds: Optional[torch.Tensor] = None) -> LogitsProcessorOutput:
        hidden_states = self.model(input_ids, positions, forward_batch, input_embeds)
        return self.logits_processor(input_ids, hidden_states, self.score, forward_batch)
