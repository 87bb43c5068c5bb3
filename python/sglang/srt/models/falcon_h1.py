"""Falcon-H1: every layer runs attention and a Mamba2 mixer side by side on the same normed
input, then a gated MLP, with the muP multipliers of the config applied exactly where HF does:

    x = embed(ids) * embedding_multiplier
    per layer:  h = input_layernorm(x)
                m = mamba(h * ssm_in_multiplier), its in_proj output scaled per segment
                    (z, x, B, C, dt) by `ssm_multipliers` (HF's non-persistent `mup_vector`)
                a = attn(h * attention_in_multiplier), keys scaled by key_multiplier
                x = x + m * ssm_out_multiplier + a * attention_out_multiplier
                x = x + mlp(pre_ff_layernorm(x))       mlp: down(up(y) * act(gate(y) * m0)) * m1
    logits = lm_head(final_layernorm(x)) * lm_head_multiplier

Every layer owns KV and a Mamba2 state slot (`mamba_layer_ids` = all layers). The Mamba2 gate
is either a gated RMSNorm (`mamba_rms_norm`, `mamba_norm_before_gate`) or plain silu(z) gating.
The scan clamps dt to `time_step_limit`; the decode step does not (as HF).
"""

from __future__ import annotations

from typing import Any, Iterable, List, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import ReplicatedLinear
from sglang.srt.layers.logits_processor import LogitsProcessor, LogitsProcessorOutput
from sglang.srt.layers.mamba.mamba_mixer2 import Mamba2Metadata, MambaMixer2
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from sglang.srt.model_loader.weight_loading import expected_weight_keys, load_weights_into
from sglang.srt.models.llama import LlamaAttention


def falcon_h1_mup_vector(config: Any) -> torch.Tensor:
    """Per-channel scale of the mixer's in_proj output: segments z, x, B, C, dt get
    ssm_multipliers[0..4] (HF `compute_mup_vector`)."""
    inter = config.mamba_d_ssm if config.mamba_d_ssm is not None else int(config.mamba_expand * config.hidden_size)
    gs = config.mamba_n_groups * config.mamba_d_state
    mults = list(config.ssm_multipliers or [1.0] * 5)
    sizes = [inter, inter, gs, gs, config.mamba_n_heads]
    return torch.cat([torch.full((n,), float(m), dtype=torch.float32) for n, m in zip(sizes, mults)])


class FalconH1Attention(LlamaAttention):
    """Llama attention (rotary, GQA) with keys scaled by `key_multiplier` (before the rotary
    embedding in HF; the rotation is linear, so the order does not matter)."""

    def __init__(self, config: Any, layer_id: int, model_config=None):
        super().__init__(config, layer_id, model_config)
        self.key_multiplier = float(getattr(config, "key_multiplier", 1.0) or 1.0)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, forward_batch) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden_states).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        k = k * self.key_multiplier
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v.contiguous(), forward_batch))


class FalconH1MLP(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        bias = bool(getattr(config, "mlp_bias", False))
        if getattr(config, "hidden_act", "silu") != "silu":
            raise NotImplementedError(f"Falcon-H1 hidden_act {config.hidden_act!r} is not supported (silu only)")
        self.gate_proj = ReplicatedLinear(config.hidden_size, config.intermediate_size, bias=bias)
        self.up_proj = ReplicatedLinear(config.hidden_size, config.intermediate_size, bias=bias)
        self.down_proj = ReplicatedLinear(config.intermediate_size, config.hidden_size, bias=bias)
        self.gate_multiplier, self.down_multiplier = (float(m) for m in (config.mlp_multipliers or [1.0, 1.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.up_proj(x) * F.silu(self.gate_proj(x) * self.gate_multiplier)
        return self.down_proj(y) * self.down_multiplier


def _mixer(config: Any, layer_id: int, mup: torch.Tensor) -> MambaMixer2:
    inter = config.mamba_d_ssm if config.mamba_d_ssm is not None else int(config.mamba_expand * config.hidden_size)
    limit = tuple(config.time_step_limit) if config.time_step_limit is not None else (0.0, float("inf"))
    return MambaMixer2(
        hidden_size=config.hidden_size,
        num_heads=config.mamba_n_heads,
        head_dim=config.mamba_d_head,
        ssm_state_size=config.mamba_d_state,
        conv_kernel_size=config.mamba_d_conv,
        n_groups=config.mamba_n_groups,
        mamba_layer_idx=layer_id,
        chunk_size=config.mamba_chunk_size,
        intermediate_size=inter,
        use_conv_bias=bool(config.mamba_conv_bias),
        in_proj_bias=bool(config.mamba_proj_bias),
        out_proj_bias=bool(config.projectors_bias),
        activation=config.hidden_act,
        rms_norm=bool(config.mamba_rms_norm),
        norm_before_gate=bool(config.mamba_norm_before_gate),
        norm_eps=config.rms_norm_eps,
        prefill_dt_limit=limit,
        decode_dt_limit=None,
        zxbcdt_multipliers=mup,
    )


class FalconH1DecoderLayer(nn.Module):
    def __init__(self, config: Any, layer_id: int, model_config, mup: torch.Tensor):
        super().__init__()
        self.self_attn = FalconH1Attention(config, layer_id, model_config)
        self.mamba = _mixer(config, layer_id, mup)
        self.feed_forward = FalconH1MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.pre_ff_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.ssm_in_multiplier = float(config.ssm_in_multiplier)
        self.ssm_out_multiplier = float(config.ssm_out_multiplier)
        self.attention_in_multiplier = float(config.attention_in_multiplier)
        self.attention_out_multiplier = float(config.attention_out_multiplier)

    def forward(self, positions, hidden_states, forward_batch, meta) -> torch.Tensor:
        residual = hidden_states
        h = self.input_layernorm(hidden_states)
        m = self.mamba(h * self.ssm_in_multiplier, forward_batch, meta) * self.ssm_out_multiplier
        a = self.self_attn(positions, h * self.attention_in_multiplier, forward_batch) * self.attention_out_multiplier
        hidden_states = residual + (m + a)
        return hidden_states + self.feed_forward(self.pre_ff_layernorm(hidden_states))


class FalconH1Model(nn.Module):
    def __init__(self, config: Any, model_config=None):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        mup = falcon_h1_mup_vector(config)
        self.layers = nn.ModuleList(FalconH1DecoderLayer(config, i, model_config, mup)
                                    for i in range(config.num_hidden_layers))
        self.final_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.embedding_multiplier = float(config.embedding_multiplier)

    def forward(self, input_ids, positions, forward_batch, input_embeds=None) -> torch.Tensor:
        h = self.embed_tokens(input_ids) * self.embedding_multiplier if input_embeds is None else input_embeds
        meta = Mamba2Metadata.from_forward_batch(forward_batch)
        for layer in self.layers:
            h = layer(positions, h, forward_batch, meta)
        return self.final_layernorm(h)


class FalconH1ForCausalLM(nn.Module):
    stacked_params_mapping: List[Tuple[str, str, Any]] = [
        (".qkv_proj", ".q_proj", "q"),
        (".qkv_proj", ".k_proj", "k"),
        (".qkv_proj", ".v_proj", "v"),
    ]

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> set:
        return load_weights_into(self, weights, self.stacked_params_mapping)

    def expected_weight_keys(self) -> set:
        return expected_weight_keys(self)

    def __init__(self, config: Any, model_config=None):
        super().__init__()
        self.config = config
        self.model_config = model_config
        self.model = FalconH1Model(config, model_config)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        if self.tie_word_embeddings:
            self.lm_head.tie_weights(self.model.embed_tokens)
        mult = float(getattr(config, "lm_head_multiplier", 1.0) or 1.0)
        self.logits_processor = LogitsProcessor(config, logit_scale=None if mult == 1.0 else mult)
        self.mamba_layer_ids = list(range(config.num_hidden_layers))

    def mamba_state_shapes(self):
        mixer = self.model.layers[0].mamba
        return mixer.conv_state_shape, mixer.ssm_state_shape

    def forward(self, input_ids, positions, forward_batch, input_embeds=None) -> LogitsProcessorOutput:
        h = self.model(input_ids, positions, forward_batch, input_embeds)
        return self.logits_processor(input_ids, h, self.lm_head, forward_batch)


EntryClass = FalconH1ForCausalLM
