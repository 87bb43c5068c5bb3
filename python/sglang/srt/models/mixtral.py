"""Mixtral: Mistral's decoder with a sparse MoE on every layer (softmax top-k over
`num_local_experts`, renormalised, the weights kept in fp32 as HF's router hands them over).
Checkpoints name the block `block_sparse_moe` and the experts' projections w1 (gate), w3 (up)
and w2 (down)."""

from sglang.srt.layers.moe import MoeSpec
from sglang.srt.models.decoder import LLAMA_SPEC, DecoderForCausalLM

MIXTRAL_MOE = MoeSpec(num_experts_key="num_local_experts", intermediate_key="intermediate_size",
                      renormalize=True, weights_fp32=True)


class MixtralForCausalLM(DecoderForCausalLM):
    spec = LLAMA_SPEC.replace(window_all_layers=True, moe=MIXTRAL_MOE, rename=(
        (".block_sparse_moe.", ".mlp."), (".w1.weight", ".gate_proj.weight"), (".w3.weight", ".up_proj.weight"),
        (".w2.weight", ".down_proj.weight")))


EntryClass = MixtralForCausalLM
