"""SmolLM3: Llama whose `no_rope_layers[i] == 0` layers use no rotary embedding (NoPE)."""

from sglang.srt.layers.rotary_embedding import get_rope_config
from sglang.srt.models.decoder import LLAMA_SPEC
from sglang.srt.models.llama import LlamaForCausalLM


def smollm3_layer_rope(config, layer_id: int):
    flags = getattr(config, "no_rope_layers", None)
    if flags is not None and not flags[layer_id]:
        return None
    return get_rope_config(config)


class SmolLM3ForCausalLM(LlamaForCausalLM):
    supports_tensor_parallel = False  # not tested under TP yet
    spec = LLAMA_SPEC.replace(layer_rope=smollm3_layer_rope)


EntryClass = SmolLM3ForCausalLM
