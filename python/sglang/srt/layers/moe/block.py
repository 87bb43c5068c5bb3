"""The MoE block of a decoder layer, declared per family by a `MoeSpec`:

    Mixtral    every layer; softmax top-k renormalised, the weights kept in fp32
    Qwen2-MoE  `mlp_only_layers` / `decoder_sparse_step` pick the sparse layers; `norm_topk_prob`;
               a shared expert scaled by sigmoid(shared_expert_gate(x))
    Qwen3-MoE  as Qwen2-MoE without the shared expert
    OLMoE      every layer; `norm_topk_prob` (False in its checkpoints)

A config whose router or expert layout the block cannot compute stops the model's construction
with one line naming the field (`check_moe_config`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from sglang.srt.layers.moe.experts import StackedExperts
from sglang.srt.layers.moe.routing import softmax_topk


@dataclass(frozen=True)
class MoeSpec:
    num_experts_key: str = "num_experts"  # Mixtral: num_local_experts
    intermediate_key: str = "moe_intermediate_size"  # Mixtral: intermediate_size
    renormalize: Optional[bool] = None  # None: config.norm_topk_prob
    weights_fp32: bool = False  # Mixtral's router hands the experts fp32 weights
    shared_expert: bool = False  # Qwen2-MoE
    sparse_step: bool = False  # Qwen2/3-MoE: mlp_only_layers and decoder_sparse_step


def _get(config: Any, key: str, default=None):
    value = getattr(config, key, None)
    return default if value is None else value


def sparse_layer(spec: MoeSpec, config: Any, layer_id: int) -> bool:
    """Whether layer `layer_id` holds experts (else a dense MLP of `intermediate_size`), as HF."""
    experts = int(_get(config, spec.num_experts_key, 0))
    if not spec.sparse_step:
        return experts > 0
    only_mlp = set(_get(config, "mlp_only_layers", []))
    step = int(_get(config, "decoder_sparse_step", 1))
    return layer_id not in only_mlp and experts > 0 and (layer_id + 1) % step == 0


def check_moe_config(config: Any, spec: MoeSpec) -> None:
    """Refuses, with one line naming the field, a router or expert layout the block cannot
    compute (`config`: an HF config, or config.json's fields as attributes: transformers 5 saves
    `num_local_experts` for every family)."""
    experts = int(_get(config, spec.num_experts_key) or _get(config, "num_local_experts", 0))
    top_k = int(_get(config, "num_experts_per_tok", 0))
    if experts > 0 and not 0 < top_k <= experts:
        raise ValueError(f"config.json num_experts_per_tok={top_k} must be in [1, {spec.num_experts_key}={experts}]")
    act = _get(config, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"config.json hidden_act={act!r}: the experts compute SiLU-gated MLPs only")
    if spec.sparse_step and int(_get(config, "decoder_sparse_step", 1)) < 1:
        raise ValueError(f"config.json decoder_sparse_step={config.decoder_sparse_step} must be >= 1")
    scoring = _get(config, "scoring_func", "softmax")
    if scoring != "softmax":
        raise ValueError(f"config.json scoring_func={scoring!r}: this router computes softmax top-k only")


class SparseMoeBlock(nn.Module):
    """Routed experts plus an optional always-on shared expert gated by sigmoid(shared_expert_gate(x))."""

    def __init__(self, hidden_size: int, num_experts: int, top_k: int, moe_intermediate_size: int,
                 norm_topk_prob: bool, shared_expert: Optional[nn.Module] = None, weights_fp32: bool = False):
        super().__init__()
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        self.weights_fp32 = weights_fp32
        self.gate = nn.Linear(hidden_size, num_experts, bias=False)
        self.gate.weight.requires_grad_(False)
        self.experts = StackedExperts(num_experts, hidden_size, moe_intermediate_size)
        self.shared_expert = shared_expert
        if shared_expert is not None:
            self.shared_expert_gate = nn.Linear(hidden_size, 1, bias=False)
            self.shared_expert_gate.weight.requires_grad_(False)

    @classmethod
    def from_spec(cls, config: Any, spec: MoeSpec, shared_expert: Optional[nn.Module] = None) -> "SparseMoeBlock":
        renormalize = spec.renormalize
        if renormalize is None:
            renormalize = bool(_get(config, "norm_topk_prob", False))
        return cls(config.hidden_size, int(_get(config, spec.num_experts_key)), int(config.num_experts_per_tok),
                   int(_get(config, spec.intermediate_key)), renormalize, shared_expert, spec.weights_fp32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = softmax_topk(self.gate(x), self.top_k, self.norm_topk_prob, self.weights_fp32)
        out = self.experts(x, weights, ids)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out
