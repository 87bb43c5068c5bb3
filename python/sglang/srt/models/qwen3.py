"""Qwen3: the Llama decoder with per-head RMSNorm on q and k before the rotary embedding
(q/k/v/o bias only when `attention_bias`, as in HF)."""

from __future__ import annotations

from sglang.srt.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    attention_kwargs = dict(qk_norm=True)


EntryClass = Qwen3ForCausalLM
