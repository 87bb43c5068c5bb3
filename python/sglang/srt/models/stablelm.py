"""StableLM: LayerNorm with bias, q/k/v bias (`use_qkv_bias`), partial rotary, SiLU-gated MLP;
`use_parallel_residual` checkpoints run attention and MLP off one norm."""

from sglang.srt.models.decoder import DecoderForCausalLM, DecoderSpec

STABLELM_SPEC = DecoderSpec(norm="layer", norm_eps_key="layer_norm_eps", bias_key="use_qkv_bias", o_bias=False)


class StableLmForCausalLM(DecoderForCausalLM):
    spec = STABLELM_SPEC

    def __init__(self, config, model_config=None):
        if getattr(config, "qk_layernorm", False):
            raise ValueError("config.json qk_layernorm=true is not supported for StableLmForCausalLM yet")
        if getattr(config, "use_parallel_residual", False):
            self.spec = STABLELM_SPEC.replace(layout="parallel")
        super().__init__(config, model_config)


EntryClass = StableLmForCausalLM
