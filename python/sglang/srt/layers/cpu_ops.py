"""Which CPU ops a forward uses: sgl-kernel's compiled ones (`torch.ops.sgl_kernel.*`) when the
library is built and loads, else the layers' own torch expressions.

One decision per process, reported once (`describe()`, logged by the model runner); layers ask
`enabled(tensor)` before calling an op. `SGLANG_DISABLE_SGL_KERNEL=1` forces the fallbacks.
Small-M linears (decode) go to `sgl_kernel.linear` up to `linear_max_rows(dtype)` rows; larger
ones stay on oneDNN (layers/linear.py), which is faster once the GEMM is compute-bound.
"""

from __future__ import annotations

import contextlib
import logging
import os

import torch

logger = logging.getLogger(__name__)

try:
    import sgl_kernel as _sgl_kernel
except ImportError:  # the package itself is absent (not installed from this repo)
    _sgl_kernel = None
if _sgl_kernel is not None and not hasattr(_sgl_kernel, "load"):  # another package of that name
    _sgl_kernel = None

_state: dict = {}


def available() -> bool:
    if "ok" not in _state:
        if _sgl_kernel is None:
            _state["ok"], _state["why"] = False, "the sgl_kernel package is not installed"
        else:
            _state["ok"], _state["why"] = _sgl_kernel.load(), _sgl_kernel.unavailable_reason()
    return _state["ok"]


def enabled(t: torch.Tensor) -> bool:
    """True when `t` (a CPU fp32/bf16 tensor) should go through the compiled ops."""
    return t.device.type == "cpu" and t.dtype in _DTYPES and not _state.get("off") and available()


@contextlib.contextmanager
def torch_fallbacks():
    """Within the block every layer takes its torch expression (tests compare the two paths)."""
    before = _state.get("off", False)
    _state["off"] = True
    try:
        yield
    finally:
        _state["off"] = before


_DTYPES = (torch.float32, torch.bfloat16)


def describe() -> str:
    """One line for the start-up log: which path the CPU ops take, and why."""
    if available():
        return f"CPU ops: sgl-kernel ({_sgl_kernel.isa()} kernels, {torch.get_num_threads()} threads)"
    return f"CPU ops: torch fallbacks ({_state['why']})"


def linear_max_rows(dtype: torch.dtype) -> int:
    """Rows up to which sgl_kernel.linear beats oneDNN here, measured over a decode step's weights
    read from memory (benchmark/kernels/bench_cpu_ops.py --only sweep); SGLANG_CPU_SMALL_M_LINEAR
    overrides (0 turns the kernel's linear off)."""
    env = os.environ.get("SGLANG_CPU_SMALL_M_LINEAR")
    if env is not None:
        return int(env)
    if dtype == torch.float32:
        # AVX-512: 16 rows in 81 ms vs oneDNN's 96 (8: 44 vs 55; 1: 38 vs 50). AVX2 (half the FMA
        # width, measured before the kernel's prefetch): oneDNN from 2 rows on.
        if "fp32_rows" not in _state:  # the ISA of the kernels loaded at start
            _state["fp32_rows"] = 16 if available() and _sgl_kernel.isa() == "avx512" else 1
        return _state["fp32_rows"]
    if dtype == torch.bfloat16:
        # native bf16 oneDNN (AMX): 4 rows 21 vs 31 ms, 8 rows 36 vs 30; without it oneDNN
        # multiplies an fp32 copy (twice the bytes), 4 rows measured on AVX2.
        return 4
    if dtype == torch.int8:  # --quantization w8a16_int8: decode batches
        return 8
    return 0
