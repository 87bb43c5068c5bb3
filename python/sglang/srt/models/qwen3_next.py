"""Qwen3-Next and Qwen3.5 (text): gated-DeltaNet hybrids. Each layer is

    h = h + mixer(norm(h)),  h = h + mlp(norm(h))     (norms zero-centred: x_norm * (1 + w))

where the mixer is, per `layer_types`, a gated DeltaNet ("linear_attention", state in the state
pool: `layers/gdn/`) or gated full attention ("full_attention": q_proj yields q and an output
gate, q/k per-head zero-centred RMSNorm, partial rotary embedding over the first
`partial_rotary_factor` of each head, o_proj(attn * sigmoid(gate))). The MLP is a sparse MoE with
a shared expert (`layers/moe/`) or a dense gated MLP:

* Qwen3-Next: MoE where `num_experts > 0`, `(i + 1) % decoder_sparse_step == 0` and i not in
  `mlp_only_layers`; DeltaNet projections `in_proj_qkvz` / `in_proj_ba` (grouped per key head).
* Qwen3.5 dense (`Qwen3_5ForCausalLM`): dense MLP everywhere; Qwen3.5-MoE: MoE everywhere; both
  with the split projections `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`.

Only full-attention layers own KV (`ModelConfig.attention_layer_ids`); the DeltaNet layers
report `mamba_layer_ids` / `mamba_state_shapes` so the runner sizes the state pool for them.
Checkpoint names: `model.` (text models) or `model.language_model.` (Qwen3.5 vision-language
checkpoints, `*ForConditionalGeneration`: served as text models, the vision tower `model.visual.`
is not loaded, image inputs are not supported); `mtp.` (multi-token prediction) is skipped.
"""

from __future__ import annotations

from typing import Any, Iterable, List, Optional, Tuple

import torch
from torch import nn

from sglang.srt.layers.gdn.gated_delta_net import GatedDeltaNet
from sglang.srt.layers.layernorm import ZeroCenteredRMSNorm
from sglang.srt.layers.linear import MergedColumnParallelLinear, ReplicatedLinear
from sglang.srt.layers.logits_processor import LogitsProcessor, LogitsProcessorOutput
from sglang.srt.layers.mamba.mamba_mixer2 import Mamba2Metadata
from sglang.srt.layers.moe import SparseMoeBlock, expert_weight_keys, load_expert_tensor
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.layers.rotary_embedding import get_rope, get_rope_config
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from sglang.srt.model_loader.weight_loading import expected_weight_keys, load_weights_into


def _cfg(config: Any, key: str, default=None):
    return config.get(key, default) if isinstance(config, dict) else getattr(config, key, default)


def partial_rotary_factor(config: Any) -> float:
    params = _cfg(config, "rope_parameters") or {}
    return float(params.get("partial_rotary_factor", _cfg(config, "partial_rotary_factor", 1.0)))


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2)
        self.down_proj = ReplicatedLinear(intermediate_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up_proj.silu_mul(x))


class GatedAttention(nn.Module):
    def __init__(self, config: Any, layer_id: int, model_config=None):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        bias = bool(getattr(config, "attention_bias", False))
        hidden = config.hidden_size
        self.q_proj = ReplicatedLinear(hidden, 2 * self.num_heads * self.head_dim, bias=bias)
        self.k_proj = ReplicatedLinear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = ReplicatedLinear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = ReplicatedLinear(self.num_heads * self.head_dim, hidden, bias=bias)
        self.q_norm = ZeroCenteredRMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = ZeroCenteredRMSNorm(self.head_dim, config.rms_norm_eps)
        theta, scaling = get_rope_config(config)
        max_pos = int(getattr(config, "max_position_embeddings", 2048))
        if model_config is not None:
            max_pos = max(max_pos, int(model_config.context_len))
        rotary_dim = int(self.head_dim * partial_rotary_factor(config))
        self.rotary_emb = get_rope(self.head_dim, rotary_dim, max_pos, theta, scaling)
        self.attn = RadixAttention(self.num_heads, self.head_dim, self.head_dim ** -0.5, self.num_kv_heads,
                                   layer_id=layer_id)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, forward_batch) -> torch.Tensor:
        T, H, D = x.shape[0], self.num_heads, self.head_dim
        q, gate = self.q_proj(x).view(T, H, 2 * D).split([D, D], dim=-1)
        q = self.q_norm(q.contiguous()).reshape(T, H * D)
        k = self.k_norm(self.k_proj(x).view(T, self.num_kv_heads, D)).reshape(T, -1)
        q, k = self.rotary_emb(positions, q, k)
        o = self.attn(q.contiguous(), k.contiguous(), self.v_proj(x), forward_batch)
        return self.o_proj(o * torch.sigmoid(gate.reshape(T, H * D)))


class HybridDecoderLayer(nn.Module):
    def __init__(self, config: Any, layer_id: int, kind: str, state_layer_idx: int, use_moe: bool,
                 gdn_layout: str, model_config=None):
        super().__init__()
        self.kind = kind
        if kind == "linear_attention":
            self.linear_attn = GatedDeltaNet(config, state_layer_idx, gdn_layout)
        elif kind == "full_attention":
            self.self_attn = GatedAttention(config, layer_id, model_config)
        else:
            raise ValueError(f"Unknown layer type {kind!r} at layer {layer_id} (linear_attention / full_attention)")
        if use_moe:
            shared = None
            if int(getattr(config, "shared_expert_intermediate_size", 0) or 0) > 0:
                shared = GatedMLP(config.hidden_size, config.shared_expert_intermediate_size)
            self.mlp = SparseMoeBlock(config.hidden_size, config.num_experts, config.num_experts_per_tok,
                                      config.moe_intermediate_size, bool(getattr(config, "norm_topk_prob", True)),
                                      shared)
        else:
            self.mlp = GatedMLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, positions, h, residual, forward_batch, meta):
        if residual is None:
            residual, h = h, self.input_layernorm(h)
        else:
            h, residual = self.input_layernorm(h, residual)
        if self.kind == "linear_attention":
            h = self.linear_attn(h, forward_batch, meta)
        else:
            h = self.self_attn(positions, h, forward_batch)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class HybridModel(nn.Module):
    def __init__(self, config: Any, moe_layers: List[bool], gdn_layout: str, model_config=None):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        layers, s = [], 0
        for i, kind in enumerate(config.layer_types):
            layers.append(HybridDecoderLayer(config, i, kind, s, moe_layers[i], gdn_layout, model_config))
            s += kind == "linear_attention"
        self.layers = nn.ModuleList(layers)
        self.norm = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids, positions, forward_batch, input_embeds=None) -> torch.Tensor:
        h = self.embed_tokens(input_ids) if input_embeds is None else input_embeds
        meta = Mamba2Metadata.from_forward_batch(forward_batch)
        residual = None
        for layer in self.layers:
            h, residual = layer(positions, h, residual, forward_batch, meta)
        h, _ = self.norm(h, residual)
        return h


class Qwen3NextForCausalLM(nn.Module):
    gdn_layout = "qkvz"
    # HF and the FLA kernels keep the key x value state in float32 whatever the model dtype;
    # the state pool does too unless --mamba-ssm-dtype (or the checkpoint) says otherwise.
    mamba_state_dtype = torch.float32
    stacked_params_mapping: List[Tuple[str, str, Any]] = [
        (".gate_up_proj", ".gate_proj", 0),
        (".gate_up_proj", ".up_proj", 1),
    ]

    def __init__(self, config: Any, model_config=None):
        super().__init__()
        self.config = config
        self.model_config = model_config
        kinds = list(config.layer_types)
        if len(kinds) != config.num_hidden_layers:
            raise ValueError(f"layer_types has {len(kinds)} entries for {config.num_hidden_layers} layers")
        self.model = HybridModel(config, self.moe_layers(config), self.gdn_layout, model_config)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        if self.tie_word_embeddings:
            self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(config)
        self.mamba_layer_ids = [i for i, k in enumerate(kinds) if k == "linear_attention"]

    @staticmethod
    def moe_layers(config: Any) -> List[bool]:
        only_mlp = set(getattr(config, "mlp_only_layers", None) or [])
        step = int(getattr(config, "decoder_sparse_step", 1) or 1)
        experts = int(getattr(config, "num_experts", 0) or 0)
        return [i not in only_mlp and experts > 0 and (i + 1) % step == 0 for i in range(config.num_hidden_layers)]

    def mamba_state_shapes(self):
        """(conv_state shape, recurrent state shape) of one slot of one DeltaNet layer."""
        gdn = self.model.layers[self.mamba_layer_ids[0]].linear_attn
        return gdn.conv_state_shape, gdn.ssm_state_shape

    def forward(self, input_ids, positions, forward_batch, input_embeds=None) -> LogitsProcessorOutput:
        h = self.model(input_ids, positions, forward_batch, input_embeds)
        return self.logits_processor(input_ids, h, self.lm_head, forward_batch)

    @staticmethod
    def _canonical(name: str) -> Optional[str]:
        if name.startswith("mtp.") or name.startswith("model.visual.") or name.startswith("visual."):
            return None
        if name.startswith("model.language_model."):
            return "model." + name[len("model.language_model."):]
        return name

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> set:
        params = dict(self.named_parameters(remove_duplicate=False))
        return load_weights_into(self, weights, self.stacked_params_mapping, canonical=self._canonical,
                                 special=lambda name, tensor: load_expert_tensor(self, params, name, tensor),
                                 skip_merged=lambda name: ".experts." in name)

    def expected_weight_keys(self) -> set:
        return expected_weight_keys(self, skip=lambda name: ".experts." in name) | expert_weight_keys(self)


class Qwen3_5ForCausalLM(Qwen3NextForCausalLM):
    gdn_layout = "split"

    @staticmethod
    def moe_layers(config: Any) -> List[bool]:
        return [False] * config.num_hidden_layers


class Qwen3_5MoeForCausalLM(Qwen3NextForCausalLM):
    gdn_layout = "split"

    @staticmethod
    def moe_layers(config: Any) -> List[bool]:
        return [True] * config.num_hidden_layers


def _text_part(config: Any) -> Any:
    """The language model's config of a vision-language checkpoint (tie flag from the top level)."""
    text = config.text_config
    if getattr(config, "tie_word_embeddings", None) is not None:
        text.tie_word_embeddings = config.tie_word_embeddings
    return text


class Qwen3_5ForConditionalGeneration(Qwen3_5ForCausalLM):
    """Qwen3.5 vision-language checkpoints served as text models (the vision tower is not loaded)."""

    def __init__(self, config: Any, model_config=None):
        super().__init__(_text_part(config), model_config)


class Qwen3_5MoeForConditionalGeneration(Qwen3_5MoeForCausalLM):
    def __init__(self, config: Any, model_config=None):
        super().__init__(_text_part(config), model_config)


EntryClass = Qwen3NextForCausalLM
