"""OLMo 2: norms after attention and after the MLP (none before), q/k RMSNorm over the whole
projection, RMSNorm weights applied in fp32."""

from sglang.srt.models.decoder import DecoderForCausalLM, DecoderSpec


class Olmo2ForCausalLM(DecoderForCausalLM):
    spec = DecoderSpec(norm="rms_fp32_weight", layout="post", qk_norm="full")


EntryClass = Olmo2ForCausalLM
