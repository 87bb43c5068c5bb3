"""RMSNorm as HF Llama/Qwen compute it (statistics in fp32, weight applied in the input dtype).

The fused-residual form `forward(x, residual)` returns `(norm(x + residual), x + residual)`:
decoder layers carry the residual stream separately, saving one add and one copy per layer.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        orig_dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * x.to(orig_dtype)

    def forward(
        self, x: torch.Tensor, residual: Optional[torch.Tensor] = None
    ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x
