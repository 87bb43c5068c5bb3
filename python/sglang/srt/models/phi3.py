"""Phi-3: Llama with q/k/v and gate/up already fused in the checkpoint (`qkv_proj`,
`gate_up_proj`, loaded whole), `sliding_window` on every layer, and longrope scaling."""

from sglang.srt.models.decoder import LLAMA_SPEC
from sglang.srt.models.llama import LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    supports_tensor_parallel = False  # not tested under TP yet
    spec = LLAMA_SPEC.replace(window_all_layers=True)


EntryClass = Phi3ForCausalLM
