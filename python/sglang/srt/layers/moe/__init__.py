"""Sparse mixture of experts: routing (routing.py), the experts' compute on stacked weights
(experts.py: sgl-kernel's fused op on CPU, a per-expert torch loop elsewhere and as the
reference), the block a decoder layer holds (block.py: router + experts + optional shared
expert, declared per family by a `MoeSpec`) and the loading of HF's per-expert tensors into
the stacked ones (loading.py)."""

from sglang.srt.layers.moe.block import MoeSpec, SparseMoeBlock, sparse_layer
from sglang.srt.layers.moe.experts import StackedExperts, fused_experts, fused_experts_torch, pack_expert_weights
from sglang.srt.layers.moe.loading import EXPERT_WEIGHT, expert_weight_keys, load_expert_tensor
from sglang.srt.layers.moe.routing import softmax_topk

__all__ = ["MoeSpec", "SparseMoeBlock", "sparse_layer", "StackedExperts", "fused_experts", "fused_experts_torch",
           "pack_expert_weights", "EXPERT_WEIGHT", "expert_weight_keys", "load_expert_tensor", "softmax_topk"]
