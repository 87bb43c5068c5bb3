"""Top-k routing as HF computes it (the weights' dtype matters in bf16: HF's Qwen/OLMoE routers
cast the renormalised weights back to the logits' dtype, Mixtral's keep them in fp32)."""

from __future__ import annotations

from typing import Tuple

import torch


def softmax_topk(router_logits: torch.Tensor, top_k: int, renormalize: bool,
                 keep_fp32: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k], expert ids [T, k]): softmax in fp32, top-k, renormalised to sum 1 when
    `renormalize` (`norm_topk_prob`); the weights in the logits' dtype unless `keep_fp32`."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return (weights if keep_fp32 else weights.to(router_logits.dtype)), ids
