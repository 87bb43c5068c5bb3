"""Granite: Llama with muP multipliers: embeddings x embedding_multiplier, each residual branch
x residual_multiplier, softmax scale attention_multiplier, logits / logits_scaling."""

from sglang.srt.models.decoder import LLAMA_SPEC
from sglang.srt.models.llama import LlamaForCausalLM


def attention_multiplier(config, head_dim: int) -> float:
    return float(config.attention_multiplier)


class GraniteForCausalLM(LlamaForCausalLM):
    supports_tensor_parallel = False  # not tested under TP yet
    spec = LLAMA_SPEC.replace(embed_scale="multiplier", multipliers=True, scaling=attention_multiplier)


EntryClass = GraniteForCausalLM
