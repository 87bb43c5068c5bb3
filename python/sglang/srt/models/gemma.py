"""Gemma: (1 + w) RMSNorm, embeddings x sqrt(hidden) (rounded to the dtype first, as HF),
GELU-tanh-gated MLP, tied LM head."""

from sglang.srt.models.decoder import LLAMA_SPEC, DecoderForCausalLM

GEMMA_SPEC = LLAMA_SPEC.replace(norm="gemma_rms", embed_scale="sqrt_hidden")


class GemmaForCausalLM(DecoderForCausalLM):
    spec = GEMMA_SPEC


EntryClass = GemmaForCausalLM
