"""RMSNorm as HF Llama/Qwen compute it (statistics in fp32, weight applied in the input dtype).

The fused-residual form `forward(x, residual)` returns `(norm(x + residual), x + residual)`:
decoder layers carry the residual stream separately, saving one add and one copy per layer.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.layers import cpu_ops


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        # torch's fused rms_norm does HF's arithmetic (x * rsqrt(mean(x^2) + eps)) in one call;
        # for low-precision inputs HF rounds before applying the weight, so the weight is applied
        # after the cast back.
        shape = (x.shape[-1],)
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return F.rms_norm(x, shape, self.weight, self.variance_epsilon)
        return self.weight * F.rms_norm(x.float(), shape, None, self.variance_epsilon).to(x.dtype)

    def forward(
        self, x: torch.Tensor, residual: Optional[torch.Tensor] = None
    ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        if cpu_ops.enabled(x) and self.weight.dtype == x.dtype:  # the same arithmetic, one call
            if residual is None:
                return torch.ops.sgl_kernel.rmsnorm(x, self.weight, self.variance_epsilon)
            return torch.ops.sgl_kernel.add_rmsnorm(x, residual, self.weight, self.variance_epsilon)
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x


class ZeroCenteredRMSNorm(nn.Module):
    """RMSNorm with a zero-centred weight, `norm(x) * (1 + w)`, all in fp32 before the cast back
    (HF Qwen3-Next / Qwen3.5; a zero weight is the identity). Same fused-residual form as RMSNorm."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size))
        self.variance_epsilon = eps

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        h = F.rms_norm(x.float(), (x.shape[-1],), None, self.variance_epsilon)
        return (h * (1.0 + self.weight.float())).to(x.dtype)

    def forward(
        self, x: torch.Tensor, residual: Optional[torch.Tensor] = None
    ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x


# Gemma's RMSNorm is the same arithmetic: `norm(x) * (1 + w)` in fp32, then the cast back.
GemmaRMSNorm = ZeroCenteredRMSNorm


class Fp32WeightRMSNorm(RMSNorm):
    """RMSNorm that applies the weight in fp32 before the cast back (HF Olmo 2; the same as
    RMSNorm in fp32)."""

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None):
        if residual is not None:
            x = x + residual
        h = F.rms_norm(x.float(), (x.shape[-1],), None, self.variance_epsilon)
        out = (self.weight.float() * h).to(x.dtype)
        return out if residual is None else (out, x)


class LayerNorm(nn.Module):
    """torch's LayerNorm (with or without a bias) in the fused-residual form of RMSNorm (Phi,
    StableLM, Starcoder 2)."""

    def __init__(self, hidden_size: int, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.bias = nn.Parameter(torch.zeros(hidden_size)) if bias else None
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None):
        if residual is not None:
            x = x + residual
        out = F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.variance_epsilon)
        return out if residual is None else (out, x)
