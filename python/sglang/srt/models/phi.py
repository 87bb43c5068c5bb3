"""Phi-1/1.5/2: attention and MLP in parallel off one LayerNorm (with bias), partial rotary,
biases everywhere (q/k/v, `dense` = o_proj, fc1/fc2 with gelu_new, the LM head)."""

from sglang.srt.models.decoder import DecoderForCausalLM, DecoderSpec


class PhiForCausalLM(DecoderForCausalLM):
    spec = DecoderSpec(norm="layer", norm_eps_key="layer_norm_eps", layout="parallel", qkv_bias=True, o_bias=True,
                       mlp="fc", mlp_bias=True, lm_head_bias=True, final_norm="final_layernorm",
                       rename=((".self_attn.dense.", ".self_attn.o_proj."),))

    def __init__(self, config, model_config=None):
        if getattr(config, "qk_layernorm", False):
            raise ValueError("config.json qk_layernorm=true is not supported for PhiForCausalLM yet")
        super().__init__(config, model_config)


EntryClass = PhiForCausalLM
