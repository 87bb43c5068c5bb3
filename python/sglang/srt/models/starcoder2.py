"""Starcoder 2: LayerNorm with bias, biases on attention and MLP (`use_bias`), an ungated MLP
(c_fc, c_proj) and `sliding_window` on every layer."""

from sglang.srt.models.decoder import DecoderForCausalLM, DecoderSpec


class Starcoder2ForCausalLM(DecoderForCausalLM):
    spec = DecoderSpec(norm="layer", norm_eps_key="norm_epsilon", bias_key="use_bias", mlp="fc",
                       mlp_bias_key="use_bias", window_all_layers=True,
                       rename=((".mlp.c_fc.", ".mlp.fc1."), (".mlp.c_proj.", ".mlp.fc2.")))


EntryClass = Starcoder2ForCausalLM
