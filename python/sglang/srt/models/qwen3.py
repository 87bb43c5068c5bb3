"""Qwen3: the Llama decoder with per-head RMSNorm on q and k before the rotary embedding
(q/k/v/o bias only when `attention_bias`, as in HF)."""

from __future__ import annotations

from sglang.srt.models.decoder import LLAMA_SPEC
from sglang.srt.models.llama import LlamaForCausalLM, LlamaForSequenceClassification

QWEN3_SPEC = LLAMA_SPEC.replace(qk_norm="head")


class Qwen3ForCausalLM(LlamaForCausalLM):
    spec = QWEN3_SPEC


class Qwen3ForSequenceClassification(LlamaForSequenceClassification):
    spec = QWEN3_SPEC


EntryClass = Qwen3ForCausalLM
