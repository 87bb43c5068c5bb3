"""Gemma 2: Gemma with norms before and after both attention and MLP, the softmax scale
1/sqrt(query_pre_attn_scalar), attention and final logit soft-capping (`attn_logit_softcapping`
in RadixAttention, `final_logit_softcapping` in LogitsProcessor) and sliding-window layers
alternating with global ones (`layer_types`; ModelConfig gives them the SWA pool)."""

from sglang.srt.models.decoder import DecoderForCausalLM
from sglang.srt.models.gemma import GEMMA_SPEC


def query_pre_attn_scaling(config, head_dim: int) -> float:
    return float(config.query_pre_attn_scalar) ** -0.5


GEMMA2_SPEC = GEMMA_SPEC.replace(layout="sandwich", scaling=query_pre_attn_scaling)


class Gemma2ForCausalLM(DecoderForCausalLM):
    spec = GEMMA2_SPEC


EntryClass = Gemma2ForCausalLM
