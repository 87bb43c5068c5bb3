"""OLMoE: the Llama decoder with RMSNorm on q and k over the whole projection, q/k/v clamped to
+-`clip_qkv` where set, and experts of `intermediate_size` on every layer (softmax top-k, `norm_topk_prob`)."""

from sglang.srt.layers.moe import MoeSpec
from sglang.srt.models.decoder import LLAMA_SPEC, DecoderForCausalLM


class OlmoeForCausalLM(DecoderForCausalLM):
    spec = LLAMA_SPEC.replace(qk_norm="full", clip_qkv=True, moe=MoeSpec(intermediate_key="intermediate_size"))


EntryClass = OlmoeForCausalLM
