"""Qwen2: the Llama decoder with a bias on q/k/v (not on o_proj)."""

from __future__ import annotations

from sglang.srt.models.llama import LlamaForCausalLM, LlamaForSequenceClassification


class Qwen2ForCausalLM(LlamaForCausalLM):
    attention_kwargs = dict(qkv_bias=True, o_bias=False)


class Qwen2ForSequenceClassification(LlamaForSequenceClassification):
    attention_kwargs = Qwen2ForCausalLM.attention_kwargs


EntryClass = Qwen2ForCausalLM
