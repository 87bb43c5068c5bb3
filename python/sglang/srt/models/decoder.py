"""One shape for a dense decoder-only model: a family is a `DecoderSpec` (and, where its
checkpoint names differ, a rename) over these shared blocks.

    embed_tokens (x sqrt(hidden) for Gemma, x embedding_multiplier for Granite)
    -> layers: DecoderLayer = attention (DecoderAttention) + MLP (GatedMLP / FcMLP) + norms,
       wired by `layout`:
         "pre"      h += attn(norm1(h)); h += mlp(norm2(h))                  (Llama, Mistral, Qwen, Phi-3)
         "sandwich" h += post_attn_norm(attn(norm1(h)));
                    h += post_ff_norm(mlp(pre_ff_norm(h)))                   (Gemma 2/3, GLM-4)
         "post"     h += post_attn_norm(attn(h)); h += post_ff_norm(mlp(h))  (Olmo 2)
         "parallel" h += attn(norm1(h)) + mlp(norm1(h))                      (Phi-1/2)
    -> final norm -> LM head (logits / logits_scaling, final soft-cap: LogitsProcessor)

Norms: "rms" (Llama), "gemma_rms" (x (1 + w)), "rms_fp32_weight" (Olmo 2), "layer" (LayerNorm,
with a bias unless `norm_bias=False`). Attention options: q/k/v and o biases, q/k norm per head
or over the whole projection, partial rotary (`partial_rotary_factor`), per-layer RoPE and NoPE
layers (`layer_rope`), the softmax scale (`scaling`: 1/sqrt(head_dim), Gemma's
`query_pre_attn_scalar`, Granite's `attention_multiplier`), logit soft-capping
(`attn_logit_softcapping`), a sliding window on the layers `ModelConfig.swa_layer_ids` lists (a
hybrid SWA pool) or on every layer (`window_all_layers`: Mistral, Starcoder 2, Phi-3, over the
full KV pool). Attention sinks are not implemented yet (a config with them is refused).

Linear layers are upstream's QKV/column/row-parallel classes (one device today). Loading is
model_loader/weight_loading.py's one loop. A layer that fits `layers/fused_decode.py` (pre-norm
RMSNorm layers, SiLU-gated MLP, full rotary from one table, no residual multiplier) runs a CPU
decode batch in one sgl-kernel call; other families run their layers' ops, which the model
logs once at start.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterable, List, Optional, Tuple

import torch
from torch import nn

from sglang.srt.layers import fused_decode
from sglang.srt.layers.activation import ActAndMul, get_act_fn
from sglang.srt.layers.layernorm import Fp32WeightRMSNorm, GemmaRMSNorm, LayerNorm, RMSNorm
from sglang.srt.layers.linear import (ColumnParallelLinear, MergedColumnParallelLinear, QKVParallelLinear,
                                      RowParallelLinear)
from sglang.srt.layers.logits_processor import LogitsProcessor, LogitsProcessorOutput
from sglang.srt.layers.moe import (MoeSpec, SparseMoeBlock, expert_weight_keys, load_expert_tensor,
                                   sparse_layer)
from sglang.srt.layers.moe.block import check_moe_config
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.layers.rotary_embedding import check_rope_config, get_rope, get_rope_config, partial_rotary_factor
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from sglang.srt.model_loader.weight_loading import LLAMA_STACKED_PARAMS, expected_weight_keys, load_weights_into
from sglang.srt.utils import log_once

logger = logging.getLogger(__name__)


def _cfg(config: Any, key: str, default=None):
    value = getattr(config, key, None)
    return default if value is None else value


def default_layer_rope(config: Any, layer_id: int) -> Optional[Tuple[float, Optional[dict]]]:
    """(rope_theta, scaling) of a layer; None for a layer without RoPE."""
    return get_rope_config(config)


def default_scaling(config: Any, head_dim: int) -> float:
    return head_dim ** -0.5


@dataclass(frozen=True)
class DecoderSpec:
    """What makes a family different; the defaults are Llama."""

    norm: str = "rms"  # "rms" | "gemma_rms" | "rms_fp32_weight" | "layer"
    norm_bias: bool = True  # LayerNorm's bias
    norm_eps_key: str = "rms_norm_eps"
    layout: str = "pre"  # "pre" | "sandwich" | "post" | "parallel"
    qkv_bias: Optional[bool] = None  # None: config.attention_bias
    o_bias: Optional[bool] = None
    bias_key: str = "attention_bias"
    qk_norm: Optional[str] = None  # None | "head" (per head) | "full" (over all heads)
    mlp: str = "gated"  # "gated" (gate_up_proj, down_proj) | "fc" (fc1, fc2)
    mlp_bias: Optional[bool] = None  # None: config.<mlp_bias_key>
    mlp_bias_key: str = "mlp_bias"
    act: Optional[str] = None  # None: config.hidden_activation / hidden_act
    embed_scale: Optional[str] = None  # "sqrt_hidden" (Gemma) | "multiplier" (Granite's embedding_multiplier)
    multipliers: bool = False  # Granite: residual_multiplier, attention_multiplier, logits_scaling
    window_all_layers: bool = False  # config.sliding_window on every layer (full KV pool)
    clip_qkv: bool = False  # OLMoE: q, k, v clamped to +-config.clip_qkv (after the q/k norms)
    moe: Optional[MoeSpec] = None  # experts on the layers `sparse_layer` picks (layers/moe)
    rope_interleaved: bool = False  # GLM: rotate pairs (2i, 2i+1) instead of halves
    lm_head_bias: bool = False
    final_norm: str = "norm"  # the final norm's module name
    scaling: Callable[[Any, int], float] = default_scaling
    layer_rope: Callable[[Any, int], Optional[Tuple[float, Optional[dict]]]] = default_layer_rope
    # checkpoint name fragment -> model name fragment, applied in order
    rename: Tuple[Tuple[str, str], ...] = ()

    def replace(self, **changes) -> "DecoderSpec":
        return dataclasses.replace(self, **changes)


LLAMA_SPEC = DecoderSpec()


def make_norm(spec: DecoderSpec, config: Any, size: int) -> nn.Module:
    eps = float(_cfg(config, spec.norm_eps_key, 1e-6))
    if spec.norm == "rms":
        return RMSNorm(size, eps=eps)
    if spec.norm == "gemma_rms":
        return GemmaRMSNorm(size, eps=eps)
    if spec.norm == "rms_fp32_weight":
        return Fp32WeightRMSNorm(size, eps=eps)
    if spec.norm == "layer":
        return LayerNorm(size, eps=eps, bias=spec.norm_bias)
    raise ValueError(f"unknown norm {spec.norm!r}")


def layer_window(config: Any, model_config, layer_id: int, spec: DecoderSpec = LLAMA_SPEC) -> int:
    """HF window size of a sliding layer, -1 for a full-attention layer. `ModelConfig` decides the
    hybrid layers (swa_layer_ids: the SWA pool holds them); a family whose `sliding_window`
    applies to every layer keeps all of its KV in the full pool and masks by position."""
    window = _cfg(config, "sliding_window")
    if spec.window_all_layers and window:
        return int(window)
    if model_config is not None:
        if layer_id in model_config.swa_layer_ids and model_config.sliding_window_size:
            return int(model_config.sliding_window_size)
        return -1
    layer_types = _cfg(config, "layer_types")
    if window and layer_types and layer_types[layer_id] == "sliding_attention":
        return int(window)
    return -1


def _max_positions(config: Any, model_config) -> int:
    max_pos = int(_cfg(config, "max_position_embeddings", 2048))
    if model_config is not None:
        max_pos = max(max_pos, int(model_config.context_len))
    return max_pos


class DecoderAttention(nn.Module):
    def __init__(self, config: Any, layer_id: int, model_config=None, spec: DecoderSpec = LLAMA_SPEC):
        super().__init__()
        self.hidden_size = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = _cfg(config, "num_key_value_heads") or self.num_heads
        self.head_dim = _cfg(config, "head_dim") or self.hidden_size // self.num_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        config_bias = bool(_cfg(config, spec.bias_key, False))
        qkv_bias = config_bias if spec.qkv_bias is None else spec.qkv_bias
        o_bias = config_bias if spec.o_bias is None else spec.o_bias
        self.qkv_proj = QKVParallelLinear(self.hidden_size, self.head_dim, self.num_heads, self.num_kv_heads, bias=qkv_bias)
        self.o_proj = RowParallelLinear(self.q_size, self.hidden_size, bias=o_bias)
        # Tensor parallelism: this rank's heads (all of them in a group of one).
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qk_norm = spec.qk_norm == "head"  # what layers/fused_decode.py covers
        self.qk_norm_kind = spec.qk_norm
        self.clip_qkv = float(_cfg(config, "clip_qkv", 0.0)) if spec.clip_qkv else 0.0
        if spec.qk_norm == "head":
            self.q_norm = make_norm(spec, config, self.head_dim)
            self.k_norm = make_norm(spec, config, self.head_dim)
        elif spec.qk_norm == "full":
            if self.qkv_proj.tp_size > 1:  # a norm over every head's q: its variance spans the ranks
                raise ValueError("tensor parallelism does not split a q/k norm over all heads (qk_norm 'full') yet")
            self.q_norm = make_norm(spec, config, self.q_size)
            self.k_norm = make_norm(spec, config, self.kv_size)
        rope = spec.layer_rope(config, layer_id)
        self.rotary_emb = None
        if rope is not None:
            theta, scaling = rope
            rotary_dim = int(self.head_dim * partial_rotary_factor(config))
            self.rotary_emb = get_rope(self.head_dim, rotary_dim, _max_positions(config, model_config), theta,
                                       scaling, int(_cfg(config, "max_position_embeddings", 2048)),
                                       is_neox_style=not spec.rope_interleaved)
        scale = spec.scaling(config, self.head_dim)
        self.attn = RadixAttention(
            self.num_heads, self.head_dim, scale, self.num_kv_heads, layer_id=layer_id,
            logit_cap=float(_cfg(config, "attn_logit_softcapping", 0.0)),
            sliding_window_size=layer_window(config, model_config, layer_id, spec),
        )

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, forward_batch) -> torch.Tensor:
        qkv = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.qk_norm_kind == "head":
            T = q.shape[0]
            q = self.q_norm(q.reshape(T, self.num_heads, self.head_dim)).reshape(T, self.q_size)
            k = self.k_norm(k.reshape(T, self.num_kv_heads, self.head_dim)).reshape(T, self.kv_size)
        elif self.qk_norm_kind == "full":
            q, k = self.q_norm(q.contiguous()), self.k_norm(k.contiguous())
        if self.clip_qkv:
            q, k, v = (t.clamp(-self.clip_qkv, self.clip_qkv) for t in (q, k, v))
        if self.rotary_emb is not None:
            q, k = self.rotary_emb(positions, q, k)
        o = self.attn(q.contiguous(), k.contiguous(), v.contiguous(), forward_batch)
        return self.o_proj(o)


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)) with gate and up in one `gate_up_proj`."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False, act: str = "silu"):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2, bias=bias)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias)
        self.act = act
        self.act_and_mul = None if act in ("silu", "swish") else ActAndMul(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.act_and_mul is None:
            return self.down_proj(self.gate_up_proj.silu_mul(x))
        return self.down_proj(self.act_and_mul(self.gate_up_proj(x)))


class FcMLP(nn.Module):
    """fc2(act(fc1(x))), both with a bias by default (Phi, Starcoder 2)."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = True, act: str = "gelu_new"):
        super().__init__()
        self.fc1 = ColumnParallelLinear(hidden_size, intermediate_size, bias=bias)
        self.fc2 = RowParallelLinear(intermediate_size, hidden_size, bias=bias)
        self.act = get_act_fn(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def _act_name(spec: DecoderSpec, config: Any) -> str:
    return spec.act or _cfg(config, "hidden_activation") or _cfg(config, "hidden_act") or "silu"


class DecoderLayer(nn.Module):
    def __init__(self, config: Any, layer_id: int, model_config=None, spec: DecoderSpec = LLAMA_SPEC):
        super().__init__()
        self.layout = spec.layout
        self.self_attn = DecoderAttention(config, layer_id, model_config, spec)
        act = _act_name(spec, config)
        mlp_bias = bool(_cfg(config, spec.mlp_bias_key, False)) if spec.mlp_bias is None else spec.mlp_bias
        if spec.moe is not None and sparse_layer(spec.moe, config, layer_id):
            shared = None
            if spec.moe.shared_expert:
                shared = GatedMLP(config.hidden_size, int(config.shared_expert_intermediate_size), act=act)
            self.mlp = SparseMoeBlock.from_spec(config, spec.moe, shared)
        elif spec.mlp == "gated":
            self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, bias=mlp_bias, act=act)
        else:
            self.mlp = FcMLP(config.hidden_size, config.intermediate_size, bias=mlp_bias, act=act)
        H = config.hidden_size
        if spec.layout != "post":
            self.input_layernorm = make_norm(spec, config, H)
        if spec.layout in ("pre", "sandwich", "post"):
            self.post_attention_layernorm = make_norm(spec, config, H)
        if spec.layout == "sandwich":
            self.pre_feedforward_layernorm = make_norm(spec, config, H)
        if spec.layout in ("sandwich", "post"):
            self.post_feedforward_layernorm = make_norm(spec, config, H)
        self.residual_multiplier = float(_cfg(config, "residual_multiplier", 1.0)) if spec.multipliers else 1.0
        rope = self.self_attn.rotary_emb
        # what layers/fused_decode.py computes: a Llama layer
        # (one sgl-kernel call per layer or stack: no room for the TP all-reduces)
        self.fused_decode_ok = (self.self_attn.qkv_proj.tp_size == 1
                                and spec.layout == "pre" and spec.norm == "rms" and isinstance(self.mlp, GatedMLP)
                                and self.mlp.act_and_mul is None and not spec.clip_qkv and self.residual_multiplier == 1.0
                                and spec.qk_norm in (None, "head") and rope is not None
                                and rope.rotary_dim == rope.head_size and not rope.per_forward_tables
                                and rope.is_neox_style)
        self.fused_decode_args: dict = {}  # layers/fused_decode.py's per-(rows, dtype) arguments

    def forward(self, positions, hidden_states, forward_batch, residual: Optional[torch.Tensor]):
        """(hidden, residual) -> (hidden, residual); the pre-norm layout carries the residual
        apart (fused add + norm), the others return the whole stream and residual None."""
        if self.layout == "pre":
            if self.fused_decode_ok:
                fused = fused_decode.decode_layer(self, positions, hidden_states, forward_batch, residual)
                if fused is not None:  # CPU decode: the whole layer in one sgl-kernel call
                    return fused
            if residual is None:
                residual = hidden_states
                hidden_states = self.input_layernorm(hidden_states)
            else:
                hidden_states, residual = self.input_layernorm(hidden_states, residual)
            hidden_states = self.self_attn(positions, hidden_states, forward_batch)
            if self.residual_multiplier != 1.0:
                hidden_states = hidden_states * self.residual_multiplier
            hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
            hidden_states = self.mlp(hidden_states)
            if self.residual_multiplier != 1.0:
                hidden_states = hidden_states * self.residual_multiplier
            return hidden_states, residual
        if residual is not None:
            hidden_states = hidden_states + residual
        if self.layout == "parallel":
            h = self.input_layernorm(hidden_states)
            attn = self.self_attn(positions, h, forward_batch)
            return attn + self.mlp(h) + hidden_states, None
        if self.layout == "sandwich":
            h = self.input_layernorm(hidden_states)
            h = self.post_attention_layernorm(self.self_attn(positions, h, forward_batch))
            hidden_states = hidden_states + h
            h = self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(hidden_states)))
            return hidden_states + h, None
        # "post"
        h = self.post_attention_layernorm(self.self_attn(positions, hidden_states, forward_batch))
        hidden_states = hidden_states + h
        h = self.post_feedforward_layernorm(self.mlp(hidden_states))
        return hidden_states + h, None


class DecoderModel(nn.Module):
    def __init__(self, config: Any, model_config=None, spec: DecoderSpec = LLAMA_SPEC):
        super().__init__()
        self.config = config
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i, model_config, spec) for i in range(config.num_hidden_layers))
        setattr(self, spec.final_norm, make_norm(spec, config, config.hidden_size))
        self.final_norm_name = spec.final_norm
        self.embed_scale = None
        if spec.embed_scale == "sqrt_hidden":
            self.embed_scale = config.hidden_size ** 0.5
        elif spec.embed_scale == "multiplier":
            self.embed_scale = float(_cfg(config, "embedding_multiplier", 1.0))
        self.embed_scale_in_dtype = spec.embed_scale == "sqrt_hidden"  # Gemma rounds sqrt(H) to the dtype first
        self.fused_decode = all(layer.fused_decode_ok for layer in self.layers)
        if not self.fused_decode:
            log_once(logger, f"{type(self).__name__} ({_cfg(config, 'model_type', '?')}): CPU decode runs each "
                             "layer's ops (the fused decode stack covers pre-norm RMSNorm layers with a SiLU-gated "
                             "MLP and full rotary only)")

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch,
                input_embeds: Optional[torch.Tensor] = None) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids) if input_embeds is None else input_embeds
        if self.embed_scale is not None:
            scale = torch.tensor(self.embed_scale, dtype=hidden_states.dtype) if self.embed_scale_in_dtype else self.embed_scale
            hidden_states = hidden_states * scale
        fused = fused_decode.decode_layers(self.layers, positions, hidden_states, forward_batch) \
            if self.fused_decode else None
        if fused is not None:  # the whole stack in one sgl_kernel call (CPU decode)
            hidden_states, residual = fused
        else:
            residual = None
            for layer in self.layers:
                hidden_states, residual = layer(positions, hidden_states, forward_batch, residual)
        norm = getattr(self, self.final_norm_name)
        if residual is None:
            return norm(hidden_states)
        hidden_states, _ = norm(hidden_states, residual)
        return hidden_states


class DecoderForCausalLM(nn.Module):
    """A family: `spec` (and `stacked_params_mapping` where its checkpoint merges differently)."""

    spec: DecoderSpec = LLAMA_SPEC
    stacked_params_mapping: List[Tuple[str, str, Any]] = LLAMA_STACKED_PARAMS
    # --tp-size > 1 serves this family (model_loader/loader.py check_tp_servable): set on the
    # families whose greedy tokens under TP are tested against tp=1 and HF (test/srt/parallel/).
    supports_tensor_parallel: bool = False

    def __init__(self, config: Any, model_config=None):
        super().__init__()
        check_decoder_config(config, self.spec)
        self.config = config
        self.model_config = model_config
        self.model = DecoderModel(config, model_config, self.spec)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, bias=self.spec.lm_head_bias)
        if self.tie_word_embeddings:
            self.lm_head.tie_weights(self.model.embed_tokens)
        logit_scale = None
        if self.spec.multipliers and float(_cfg(config, "logits_scaling", 1.0)) != 1.0:
            logit_scale = 1.0 / float(config.logits_scaling)
        self.logits_processor = LogitsProcessor(config, logit_scale=logit_scale)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch,
                input_embeds: Optional[torch.Tensor] = None) -> LogitsProcessorOutput:
        hidden_states = self.model(input_ids, positions, forward_batch, input_embeds)
        return self.logits_processor(input_ids, hidden_states, self.lm_head, forward_batch)

    def canonical_name(self, name: str) -> Optional[str]:
        for old, new in self.spec.rename:
            name = name.replace(old, new)
        return name

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> set:
        """Copies HF-named tensors into the parameters; returns the keys loaded."""
        params = dict(self.named_parameters(remove_duplicate=False))
        return load_weights_into(self, weights, self.stacked_params_mapping, canonical=self.canonical_name,
                                 special=lambda name, tensor: load_expert_tensor(self, params, name, tensor),
                                 skip_merged=lambda name: ".experts." in name)

    def expected_weight_keys(self) -> set:
        """The `load_weights` keys a complete checkpoint provides (for missing-weight checks)."""
        return expected_weight_keys(self, skip=lambda name: ".experts." in name) | expert_weight_keys(self)


def check_decoder_config(config: Any, spec: Optional[DecoderSpec] = None) -> None:
    """Refuses, with one line naming the field, what the decoder cannot compute."""
    check_rope_config(config)
    if spec is not None and spec.moe is not None:
        check_moe_config(config, spec.moe)
    if _cfg(config, "use_sinks") or _cfg(config, "attention_sinks"):
        raise ValueError("config.json attention sinks (use_sinks) are not supported by this decoder yet")
