"""Gemma 3 (text): Gemma 2's layer with per-head (1 + w) q/k norms; local (sliding-window)
layers and global layers each have their own RoPE (`rope_parameters["sliding_attention"]` /
`["full_attention"]`, older configs `rope_local_base_freq`)."""

from sglang.srt.layers.rotary_embedding import get_rope_config
from sglang.srt.models.decoder import DecoderForCausalLM
from sglang.srt.models.gemma2 import GEMMA2_SPEC


def gemma3_layer_rope(config, layer_id: int):
    layer_type = (getattr(config, "layer_types", None) or ["full_attention"] * (layer_id + 1))[layer_id]
    local_base = getattr(config, "rope_local_base_freq", None)
    if layer_type == "sliding_attention" and local_base is not None and not isinstance(
            getattr(config, "rope_parameters", None), dict):
        return float(local_base), None
    return get_rope_config(config, layer_type)


class Gemma3ForCausalLM(DecoderForCausalLM):
    spec = GEMMA2_SPEC.replace(qk_norm="head", layer_rope=gemma3_layer_rope)


EntryClass = Gemma3ForCausalLM
