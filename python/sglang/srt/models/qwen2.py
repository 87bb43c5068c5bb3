"""Qwen2: the Llama decoder with a bias on q/k/v (not on o_proj)."""

from __future__ import annotations

from sglang.srt.models.decoder import LLAMA_SPEC
from sglang.srt.models.llama import LlamaForCausalLM, LlamaForSequenceClassification

QWEN2_SPEC = LLAMA_SPEC.replace(qkv_bias=True, o_bias=False)


class Qwen2ForCausalLM(LlamaForCausalLM):
    spec = QWEN2_SPEC


class Qwen2ForSequenceClassification(LlamaForSequenceClassification):
    spec = QWEN2_SPEC


EntryClass = Qwen2ForCausalLM
