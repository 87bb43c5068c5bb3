"""GLM (GLM-4 0414's predecessor, `GlmForCausalLM`): Llama with q/k/v bias, no o_proj bias, a fused
`gate_up_proj` checkpoint and interleaved partial rotary (half of each head)."""

from sglang.srt.models.decoder import LLAMA_SPEC, DecoderForCausalLM

GLM_SPEC = LLAMA_SPEC.replace(o_bias=False, rope_interleaved=True)


class GlmForCausalLM(DecoderForCausalLM):
    spec = GLM_SPEC


EntryClass = GlmForCausalLM
