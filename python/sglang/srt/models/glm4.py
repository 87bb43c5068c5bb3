"""GLM-4 (0414): GLM with norms after attention and after the MLP as well (Gemma 2's layout).
HF names them post_self_attn_layernorm (after attention), post_attention_layernorm (before the
MLP) and post_mlp_layernorm; they are renamed to the decoder's."""

from sglang.srt.models.decoder import DecoderForCausalLM
from sglang.srt.models.glm import GLM_SPEC


class Glm4ForCausalLM(DecoderForCausalLM):
    spec = GLM_SPEC.replace(layout="sandwich", rename=(
        (".post_attention_layernorm.", ".pre_feedforward_layernorm."),
        (".post_self_attn_layernorm.", ".post_attention_layernorm."),
        (".post_mlp_layernorm.", ".post_feedforward_layernorm."),
    ))


EntryClass = Glm4ForCausalLM
