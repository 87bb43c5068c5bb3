"""Qwen2-MoE: Qwen2's decoder (q/k/v bias per `qkv_bias`) whose sparse layers (`mlp_only_layers`,
`decoder_sparse_step`) hold experts with softmax top-k routing (`norm_topk_prob`) plus a shared
expert scaled by sigmoid(shared_expert_gate(x)); the other layers a dense MLP."""

from sglang.srt.layers.moe import MoeSpec
from sglang.srt.models.decoder import LLAMA_SPEC, DecoderForCausalLM


class Qwen2MoeForCausalLM(DecoderForCausalLM):
    spec = LLAMA_SPEC.replace(bias_key="qkv_bias", o_bias=False,
                              moe=MoeSpec(shared_expert=True, sparse_step=True))


EntryClass = Qwen2MoeForCausalLM
