"""Mistral: Llama with `sliding_window` on every layer (null in later checkpoints). The window is
applied over the full KV pool, as upstream counts it: not a hybrid- or pure-SWA model."""

from sglang.srt.models.decoder import LLAMA_SPEC
from sglang.srt.models.llama import LlamaForCausalLM


class MistralForCausalLM(LlamaForCausalLM):
    spec = LLAMA_SPEC.replace(window_all_layers=True)


EntryClass = MistralForCausalLM
