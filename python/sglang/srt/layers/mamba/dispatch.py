"""Chooses the Mamba2 op implementations for a device: the Triton kernels on CUDA, the plain-torch
references (`torch_ops`) elsewhere. Both sets take the same arguments and agree (see the tests),
so model code calls `get_mamba_ops(device).selective_state_update(...)` and never branches itself.
The Triton set can be forced on CPU (it then runs in Triton's interpreter: tests only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

MAMBA_OPS_BACKENDS = ("torch", "triton")


@dataclass(frozen=True)
class MambaOps:
    backend: str
    causal_conv1d_fn: Callable
    causal_conv1d_update: Callable
    selective_state_update: Callable
    mamba_chunk_scan_combined: Callable


def get_mamba_ops(device="cpu", backend: Optional[str] = None) -> MambaOps:
    """backend: None (by device), "torch" or "triton"."""
    if backend is None:
        backend = "triton" if torch.device(device).type == "cuda" else "torch"
    if backend == "torch":
        from sglang.srt.layers.mamba import torch_ops as m

        return MambaOps("torch", m.causal_conv1d_fn, m.causal_conv1d_update, m.selective_state_update,
                        m.mamba_chunk_scan_combined)
    if backend == "triton":
        from sglang.srt.layers.mamba.ops.causal_conv1d import causal_conv1d_fn, causal_conv1d_update
        from sglang.srt.layers.mamba.ops.selective_state_update import selective_state_update
        from sglang.srt.layers.mamba.ops.ssd_combined import mamba_chunk_scan_combined

        return MambaOps("triton", causal_conv1d_fn, causal_conv1d_update, selective_state_update,
                        mamba_chunk_scan_combined)
    raise ValueError(f"Unknown Mamba ops backend {backend!r}; choose one of {MAMBA_OPS_BACKENDS}")
