"""Qwen3: the Llama decoder with per-head RMSNorm on q and k before the rotary embedding
(q/k/v/o bias only when `attention_bias`, as in HF)."""

from __future__ import annotations

from sglang.srt.models.llama import LlamaForCausalLM, LlamaForSequenceClassification


class Qwen3ForCausalLM(LlamaForCausalLM):
    attention_kwargs = dict(qk_norm=True)


class Qwen3ForSequenceClassification(LlamaForSequenceClassification):
    attention_kwargs = Qwen3ForCausalLM.attention_kwargs


EntryClass = Qwen3ForCausalLM
