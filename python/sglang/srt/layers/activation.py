"""Gated MLP activations: the merged gate_up projection output [.., 2*d] -> act(gate) * up, and
the plain activations of ungated MLPs, by HF's `hidden_act` names."""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.layers import cpu_ops


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if cpu_ops.enabled(x):
            return torch.ops.sgl_kernel.silu_and_mul(x)
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]


def _gelu_new(x: torch.Tensor) -> torch.Tensor:
    # HF's NewGELUActivation (GPT-2 / Phi), written out as HF writes it
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


_ACTIVATIONS = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_new": _gelu_new,
    "relu": F.relu,
}


def get_act_fn(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """HF `hidden_act` name -> function; an unknown name stops the load with one line naming it."""
    if name not in _ACTIVATIONS:
        raise ValueError(f"config.json hidden_act={name!r} is not supported; supported: {', '.join(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]


class ActAndMul(nn.Module):
    """act(gate) * up for any `get_act_fn` activation (SiluAndMul is the sgl-kernel one for SiLU)."""

    def __init__(self, act: str):
        super().__init__()
        self.act = get_act_fn(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return self.act(x[..., :d]) * x[..., d:]
