"""Sparse mixture of experts with softmax top-k routing (Qwen2-MoE / Qwen3-MoE / Qwen3-Next /
Qwen3.5-MoE), experts stacked in two tensors as HF keeps them in memory:

    gate_up_proj [E, 2 * I, H]   (rows [0, I): gate_proj, [I, 2I): up_proj)
    down_proj    [E, H, I]

`fused_experts` is the batched path: the (token, choice) pairs are sorted by expert, so each
expert runs one GEMM over the contiguous block of rows routed to it (a loop over the experts
that got tokens, never over tokens), and the weighted results are scattered back with one
index_add. Checkpoints store experts one by one (`experts.{e}.gate_proj.weight`, ...);
`StackedExperts.load_expert_weight` fills slice e.
"""

from __future__ import annotations

import re
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn


def softmax_topk(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] in the logits' dtype, expert ids [T, k]) as HF: softmax in fp32, top-k,
    renormalised to sum 1 when `renormalize` (`norm_topk_prob`)."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(router_logits.dtype), ids


def fused_experts(x: torch.Tensor, gate_up_proj: torch.Tensor, down_proj: torch.Tensor,
                  topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """sum_k w[t, k] * down_e(silu(gate_e(x_t)) * up_e(x_t)) with e = ids[t, k]; x [T, H]."""
    T, K = topk_ids.shape
    out = torch.zeros_like(x)
    if T == 0:
        return out
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    rows = order // K  # token of each sorted (token, choice) pair
    counts = torch.bincount(flat, minlength=gate_up_proj.shape[0]).tolist()
    grouped = x.index_select(0, rows)
    expert_out = torch.empty_like(grouped)
    inter = down_proj.shape[-1]
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        seg = grouped[start:start + n]
        gate_up = F.linear(seg, gate_up_proj[e])
        h = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        expert_out[start:start + n] = F.linear(h, down_proj[e])
        start += n
    weights = topk_weights.reshape(-1).index_select(0, order).to(expert_out.dtype)
    out.index_add_(0, rows, expert_out * weights[:, None])
    return out


# layers.0.mlp.experts.3.gate_proj.weight -> ("layers.0.mlp.experts", "3", "gate_proj")
EXPERT_WEIGHT = re.compile(r"^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


class StackedExperts(nn.Module):
    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.num_experts = num_experts
        self.intermediate_size = intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size),
                                         requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size), requires_grad=False)

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        return fused_experts(x, self.gate_up_proj, self.down_proj, topk_weights, topk_ids)

    def load_expert_weight(self, expert: int, which: str, tensor: torch.Tensor) -> str:
        """One expert's gate_proj / up_proj / down_proj weight; returns the key it fills."""
        inter = self.intermediate_size
        if which == "down_proj":
            dst = self.down_proj.data[expert]
        else:
            rows = slice(0, inter) if which == "gate_proj" else slice(inter, 2 * inter)
            dst = self.gate_up_proj.data[expert, rows]
        if tuple(dst.shape) != tuple(tensor.shape):
            raise ValueError(f"Expert {expert} {which}: parameter {tuple(dst.shape)} vs checkpoint {tuple(tensor.shape)}")
        dst.copy_(tensor.to(dtype=dst.dtype, device=dst.device))
        return f"{which}:{expert}"

    def expected_keys(self):
        return {f"{w}:{e}" for e in range(self.num_experts) for w in ("gate_proj", "up_proj", "down_proj")}


class SparseMoeBlock(nn.Module):
    """Routed experts plus an optional always-on shared expert gated by sigmoid(shared_expert_gate(x))."""

    def __init__(self, hidden_size: int, num_experts: int, top_k: int, moe_intermediate_size: int,
                 norm_topk_prob: bool, shared_expert: Optional[nn.Module] = None):
        super().__init__()
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        self.gate = nn.Linear(hidden_size, num_experts, bias=False)
        self.gate.weight.requires_grad_(False)
        self.experts = StackedExperts(num_experts, hidden_size, moe_intermediate_size)
        self.shared_expert = shared_expert
        if shared_expert is not None:
            self.shared_expert_gate = nn.Linear(hidden_size, 1, bias=False)
            self.shared_expert_gate.weight.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = softmax_topk(self.gate(x), self.top_k, self.norm_topk_prob)
        out = self.experts(x, weights, ids)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out
