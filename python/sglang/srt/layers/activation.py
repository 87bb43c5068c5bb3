"""Gated MLP activation: the merged gate_up projection output [.., 2*d] -> silu(gate) * up."""

from __future__ import annotations

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
