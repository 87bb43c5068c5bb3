"""Qwen2: the Llama decoder with a bias on q/k/v (not on o_proj)."""

from __future__ import annotations

from sglang.srt.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    attention_kwargs = dict(qkv_bias=True, o_bias=False)


EntryClass = Qwen2ForCausalLM
