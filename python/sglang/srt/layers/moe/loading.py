"""HF's expert tensors into `StackedExperts`: checkpoints store experts one by one
(`experts.{e}.gate_proj.weight`, ...; Mixtral's w1/w3/w2 are renamed to these by its family),
or, as transformers keeps them in memory, already stacked (`experts.gate_up_proj`,
`experts.down_proj`). Keys are `<experts module>:<which>:<expert>`, so a missing expert is named."""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Set

import torch
from torch import nn

from sglang.srt.layers.linear import default_weight_loader

# layers.0.mlp.experts.3.gate_proj.weight -> ("layers.0.mlp.experts", "3", "gate_proj")
EXPERT_WEIGHT = re.compile(r"^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def load_expert_tensor(model: nn.Module, params: Dict[str, torch.Tensor], name: str,
                       tensor: torch.Tensor) -> Optional[List[str]]:
    """`load_weights_into`'s `special` hook: the keys loaded for an expert tensor, None for
    any other name."""
    expert = EXPERT_WEIGHT.match(name)
    if expert is not None:
        module = model.get_submodule(expert.group(1))
        return [f"{expert.group(1)}:{module.load_expert_weight(int(expert.group(2)), expert.group(3), tensor)}"]
    if (name.endswith(".experts.gate_up_proj") or name.endswith(".experts.down_proj")) and name in params:
        default_weight_loader(params[name], tensor)
        module = model.get_submodule(name.rsplit(".", 1)[0])
        which = ("gate_proj", "up_proj") if name.endswith("gate_up_proj") else ("down_proj",)
        return [f"{name.rsplit('.', 1)[0]}:{w}:{e}" for w in which for e in range(module.num_experts)]
    return None


def expert_weight_keys(model: nn.Module) -> Set[str]:
    """The keys a complete checkpoint's experts give (`load_expert_tensor`)."""
    from sglang.srt.layers.moe.experts import StackedExperts

    return {f"{name}:{k}" for name, module in model.named_modules() if isinstance(module, StackedExperts)
            for k in module.expected_keys()}
