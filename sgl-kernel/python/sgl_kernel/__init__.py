"""sgl-kernel: compiled CPU ops for sglang, as `torch.ops.sgl_kernel.*`.

`load()` loads the library that `sgl-kernel/build.py` built (or the one `SGL_KERNEL_LIBRARY`
names) and says whether it could; `SGLANG_DISABLE_SGL_KERNEL=1` makes it say no, so that the
torch fallbacks run. The ops and the torch expressions they compute are listed in
`sgl-kernel/csrc/cpu/ops.cpp`; `isa()` is the kernel set this CPU runs (generic, avx2, avx512,
avx512bf16 or amx, chosen at run time; `SGL_KERNEL_ISA` asks for a lower one).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import torch

_DEFAULT_LIBRARY = Path(__file__).resolve().parents[2] / "build" / "sgl_kernel_cpu.so"
_state: dict = {}


def library_path() -> Path:
    return Path(os.environ.get("SGL_KERNEL_LIBRARY") or _DEFAULT_LIBRARY)


def disabled_by_env() -> bool:
    return os.environ.get("SGLANG_DISABLE_SGL_KERNEL", "").strip().lower() in ("1", "true", "yes", "on")


def load() -> bool:
    """True when the ops are registered (loads the library on the first call)."""
    if "ok" not in _state:
        _state["ok"], _state["why"] = _load()
    return _state["ok"]


def unavailable_reason() -> Optional[str]:
    load()
    return _state["why"]


def _load():
    if disabled_by_env():
        return False, "SGLANG_DISABLE_SGL_KERNEL is set"
    path = library_path()
    if not path.exists():
        return False, f"{path} is not built (run: python sgl-kernel/build.py)"
    try:
        torch.ops.load_library(str(path))
    except OSError as e:  # built against another torch, or a broken build
        return False, f"{path} does not load: {e}"
    return True, None


def isa() -> str:
    """The kernel set in use: "generic", "avx2", "avx512", "avx512bf16" or "amx" ("torch" without the library)."""
    return torch.ops.sgl_kernel.isa() if load() else "torch"


def supported_isas() -> list:
    """The kernel sets this CPU can run, lowest first (empty without the library)."""
    if not load():
        return []
    return [name for name in ("generic", "avx2", "avx512", "avx512bf16", "amx") if torch.ops.sgl_kernel.cpu_supports(name)]


def use_isa(name: str) -> str:
    """Switches every op to the `name` kernel set (for tests and benchmarks); returns it."""
    if not load():
        raise RuntimeError(f"sgl-kernel is not loaded: {unavailable_reason()}")
    return torch.ops.sgl_kernel.use_isa(name)
