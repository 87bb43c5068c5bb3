"""EXAONE 4: OLMo 2's post-norm layout with per-head q/k RMSNorm; in hybrid checkpoints
(`sliding_window` set) the sliding layers use RoPE and the global ones none."""

from sglang.srt.layers.rotary_embedding import get_rope_config
from sglang.srt.models.decoder import DecoderForCausalLM, DecoderSpec


def exaone4_layer_rope(config, layer_id: int):
    layer_types = getattr(config, "layer_types", None)
    if getattr(config, "sliding_window", None) and layer_types and layer_types[layer_id] != "sliding_attention":
        return None
    return get_rope_config(config)


class Exaone4ForCausalLM(DecoderForCausalLM):
    spec = DecoderSpec(layout="post", qk_norm="head", layer_rope=exaone4_layer_rope)


EntryClass = Exaone4ForCausalLM
