"""DeepSeek's MoE router, as HF transformers computes it (`DeepseekV2TopkRouter`,
`DeepseekV3TopkRouter`): fp32 logits of an fp32 gate weight, then

* V2 (`scoring_func` softmax): softmax scores; `topk_method` "greedy" (top-k of all experts) or
  "group_limited_greedy" (experts in `n_group` groups, a group scored by its best expert, only the
  `topk_group` best groups kept, the others' scores zeroed); weights = the chosen scores;
* V3 (sigmoid, "noaux_tc"): sigmoid scores; the choice is made on scores + `e_score_correction_bias`
  (a group scored by the sum of its two best, the other groups' masked out) but the weights are the
  uncorrected scores of the chosen experts, renormalised to sum 1 when `norm_topk_prob`;

and every weight times `routed_scaling_factor`. `check_router_config` refuses, with one line naming
the field, the configurations HF's classes do not compute this way.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn


def _cfg(config: Any, key: str, default=None):
    return config.get(key, default) if isinstance(config, dict) else getattr(config, key, default)


def num_routed_experts(config: Any) -> int:
    return int(_cfg(config, "n_routed_experts", None) or _cfg(config, "num_experts", None)
               or _cfg(config, "num_local_experts", 0) or 0)


def check_router_config(config: Any, version: int) -> None:
    experts = num_routed_experts(config)
    top_k = int(_cfg(config, "num_experts_per_tok", 0) or 0)
    if experts <= 0 or not 0 < top_k <= experts:
        raise ValueError(f"config.json num_experts_per_tok={top_k} must be in 1..n_routed_experts ({experts})")
    act = _cfg(config, "hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ValueError(f"config.json hidden_act={act!r} is not supported for DeepSeek experts (silu only)")
    freq = _cfg(config, "moe_layer_freq", 1)
    if freq not in (None, 1):  # DeepSeek's code skips layers by it, HF's classes do not: refuse
        raise ValueError(f"config.json moe_layer_freq={freq} is not supported for DeepSeek (1)")
    n_group, topk_group = _cfg(config, "n_group"), _cfg(config, "topk_group")
    if version == 2:
        scoring = _cfg(config, "scoring_func", "softmax")
        if scoring != "softmax":
            raise ValueError(f"config.json scoring_func={scoring!r} is not supported for DeepseekV2 (softmax)")
        method = _cfg(config, "topk_method", "greedy") or "greedy"
        if method not in ("greedy", "group_limited_greedy"):
            raise ValueError(f"config.json topk_method={method!r} is not supported for DeepseekV2 "
                             "(greedy, group_limited_greedy)")
        if _cfg(config, "norm_topk_prob", False):
            # DeepSeek's own code renormalises, HF's DeepseekV2 does not: refuse rather than pick one
            raise ValueError("config.json norm_topk_prob=true is not supported for DeepseekV2")
        grouped = method == "group_limited_greedy"
    else:
        scoring = _cfg(config, "scoring_func", "sigmoid")
        if scoring != "sigmoid":
            raise ValueError(f"config.json scoring_func={scoring!r} is not supported for DeepseekV3 (sigmoid)")
        method = _cfg(config, "topk_method", "noaux_tc") or "noaux_tc"
        if method != "noaux_tc":
            raise ValueError(f"config.json topk_method={method!r} is not supported for DeepseekV3 (noaux_tc)")
        grouped = True
    if grouped:
        if not n_group or not topk_group or experts % int(n_group) or not 0 < int(topk_group) <= int(n_group):
            raise ValueError(f"config.json n_group={n_group} / topk_group={topk_group} must divide "
                             f"n_routed_experts ({experts}) into groups and keep 1..n_group of them")
        if version == 3 and experts // int(n_group) < 2:
            raise ValueError(f"config.json n_group={n_group} leaves fewer than 2 experts per group "
                             "(a V3 group is scored by its two best experts)")


def grouped_topk(logits: torch.Tensor, top_k: int, version: int, n_group: Optional[int], topk_group: Optional[int],
                 grouped: bool, correction_bias: Optional[torch.Tensor], norm_topk_prob: bool,
                 routed_scaling_factor: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """fp32 router logits [T, E] -> (weights [T, k] fp32, expert ids [T, k])."""
    T, E = logits.shape
    if version == 2:
        scores = logits.softmax(dim=-1, dtype=torch.float32)
        choice = scores
        if grouped:
            group_scores = scores.view(T, n_group, E // n_group).max(dim=-1).values
            choice = scores.masked_fill(~_group_mask(group_scores, topk_group, E), 0.0)
        weights, ids = torch.topk(choice, k=top_k, dim=-1, sorted=False)
    else:
        scores = logits.sigmoid()
        choice = scores + correction_bias
        group_scores = choice.view(T, n_group, E // n_group).topk(2, dim=-1)[0].sum(dim=-1)
        choice = choice.masked_fill(~_group_mask(group_scores, topk_group, E), float("-inf"))
        ids = torch.topk(choice, k=top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, ids)
        if norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * routed_scaling_factor, ids


def _group_mask(group_scores: torch.Tensor, topk_group: int, num_experts: int) -> torch.Tensor:
    """[T, E] bool: the experts of each token's `topk_group` best groups."""
    T, n_group = group_scores.shape
    idx = torch.topk(group_scores, k=topk_group, dim=-1, sorted=False)[1]
    mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, idx, True)
    return mask[:, :, None].expand(T, n_group, num_experts // n_group).reshape(T, num_experts)


class DeepseekRouter(nn.Module):
    """`mlp.gate`: the fp32 gate weight [E, H] (HF keeps it in fp32 whatever the model dtype) and,
    for V3, `e_score_correction_bias` [E]."""

    def __init__(self, config: Any, version: int):
        super().__init__()
        check_router_config(config, version)
        E, H = num_routed_experts(config), int(config.hidden_size)
        self.version = version
        self.top_k = int(config.num_experts_per_tok)
        self.n_group = int(_cfg(config, "n_group", 1) or 1)
        self.topk_group = int(_cfg(config, "topk_group", 1) or 1)
        self.grouped = version == 3 or (_cfg(config, "topk_method", "greedy") == "group_limited_greedy")
        self.norm_topk_prob = bool(_cfg(config, "norm_topk_prob", False))
        self.routed_scaling_factor = float(_cfg(config, "routed_scaling_factor", 1.0) or 1.0)
        self.weight = nn.Parameter(torch.empty(E, H, dtype=torch.float32), requires_grad=False)
        self.e_score_correction_bias = (nn.Parameter(torch.zeros(E, dtype=torch.float32), requires_grad=False)
                                        if version == 3 else None)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        logits = F.linear(x.float(), self.weight)
        return grouped_topk(logits, self.top_k, self.version, self.n_group, self.topk_group, self.grouped,
                            self.e_score_correction_bias, self.norm_topk_prob, self.routed_scaling_factor)
