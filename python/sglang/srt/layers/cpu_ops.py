"""Which CPU ops a forward uses: sgl-kernel's compiled ones (`torch.ops.sgl_kernel.*`) when the
library is built and loads, else the layers' own torch expressions.

One decision per process, reported once (`describe()`, logged by the model runner); layers ask
`enabled(tensor)` before calling an op. `SGLANG_DISABLE_SGL_KERNEL=1` forces the fallbacks.
Small-M linears (decode) go to `sgl_kernel.linear` up to `linear_max_rows(dtype)` rows, measured
once per machine and model shapes (layers/linear_crossover.py); larger ones stay on oneDNN
(layers/linear.py), which is faster once the GEMM is compute-bound.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Optional

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


def isa_name() -> str:
    """The kernel set the ops run ("avx2", "avx512bf16", "amx", ...), "torch" for the fallbacks."""
    return _sgl_kernel.isa() if available() else "torch"


def linear_panels_enabled(dtype: torch.dtype) -> bool:
    """Whether linear weights of `dtype` go into sgl-kernel's panel layout at load time
    (layers/linear.py `pack_linear_weights`): bf16 on the AMX and AVX512-BF16 kernel sets (tiles,
    vdpbf16ps) and the AVX2 one (FMA, the weights converted in registers), fp32 on those and the
    AVX-512 one (FMA tiles); unless SGLANG_CPU_LINEAR_PANELS=0 (then oneDNN's blocked copy)."""
    sets = {torch.bfloat16: ("amx", "avx512bf16", "avx2"), torch.float32: ("amx", "avx512bf16", "avx512", "avx2")}.get(dtype, ())
    return isa_name() in sets and os.environ.get("SGLANG_CPU_LINEAR_PANELS", "1") != "0"


def library_path() -> Optional[Path]:
    """The sgl-kernel library this process loads (None without the package)."""
    return None if _sgl_kernel is None else _sgl_kernel.library_path()


def linear_max_rows(dtype: torch.dtype) -> int:
    """Rows up to which `sgl_kernel.linear` takes a linear with weights of `dtype` (torch.int8:
    `--quantization w8a16_int8`); beyond them oneDNN does. The model runner measures it on the
    model's own weights once per machine (layers/linear_crossover.py): the crossover differs
    between machines by up to 8x (benchmark/RESULTS.md). Before a measurement: 1 row, where the
    kernel has won on every machine measured. SGLANG_CPU_SMALL_M_LINEAR=N overrides both (0
    turns it off)."""
    fixed = fixed_linear_max_rows()
    if fixed is not None:
        return fixed
    if dtype not in _SMALL_M_DTYPES:
        return 0
    return _state.get("max_rows", {}).get(dtype, 1)


def fixed_linear_max_rows() -> Optional[int]:
    """The rows SGLANG_CPU_SMALL_M_LINEAR fixes for every dtype, or None (then they are measured)."""
    env = os.environ.get("SGLANG_CPU_SMALL_M_LINEAR")
    return None if env is None else int(env)


def set_linear_max_rows(dtype: torch.dtype, rows: int) -> None:
    """Records a measured crossover (see `linear_max_rows`)."""
    _state.setdefault("max_rows", {})[dtype] = rows


def panel_max_rows(dtype: torch.dtype) -> int:
    """Rows up to which a linear whose weight has both sgl-kernel panels and a oneDNN copy
    (layers/linear.py `pack_linear_weights`: where oneDNN multiplies the dtype natively) takes
    the panels; oneDNN takes more. Measured on the model's weights once per machine
    (layers/linear_crossover.py `measure_panel_rows`): on AMX machines oneDNN's bf16 tiles are
    2-7x faster than the panels from 8-16 rows, elsewhere the panels keep up through prefill
    sizes and the copies are dropped. Before a measurement: every row (the panels)."""
    return _state.get("panel_rows", {}).get(dtype, _EVERY_ROW)


def fixed_panel_max_rows() -> Optional[int]:
    """The rows SGLANG_CPU_PANEL_ROWS fixes (0: oneDNN for every row it has a copy for), or None."""
    env = os.environ.get("SGLANG_CPU_PANEL_ROWS")
    return None if env is None else int(env)


def set_panel_max_rows(dtype: torch.dtype, rows: Optional[int]) -> None:
    """Records a measured panel crossover (None: the panels take every row)."""
    _state.setdefault("panel_rows", {})[dtype] = _EVERY_ROW if rows is None else rows


_EVERY_ROW = 1 << 62


_SMALL_M_DTYPES = (torch.float32, torch.bfloat16, torch.int8)
