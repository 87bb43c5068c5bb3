"""Builds sgl-kernel's CPU library (build/sgl_kernel_cpu.so) with torch's C++ extension tooling.

    python sgl-kernel/build.py          # scripts/setup.sh runs this; incremental (ninja)

No download: g++, ninja and torch's headers are all it needs. Every ISA's kernels go into the one
library (isa_*.cpp, each under its own `#pragma GCC target`) and ops.cpp picks one at run time, so
the build does not depend on the CPU it runs on.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = ["ops.cpp", "linear_ops.cpp", "decode_layer.cpp", "moe_ops.cpp", "gguf_ops.cpp", "isa_generic.cpp", "isa_avx2.cpp", "isa_avx512.cpp", "isa_avx512bf16.cpp",
           "isa_amx.cpp"]
BUILD_DIR = HERE / "build"
NAME = "sgl_kernel_cpu"


def build(verbose: bool = False) -> Path:
    from torch.utils.cpp_extension import load

    BUILD_DIR.mkdir(exist_ok=True)
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
    load(
        name=NAME,
        sources=[str(HERE / "csrc" / "cpu" / s) for s in SOURCES],
        # -fopenmp: at::parallel_for is inline (ATen/ParallelOpenMP.h); without it the ops run on one
        # thread. libgomp resolves to the copy torch already loaded (same soname): one OpenMP runtime.
        extra_cflags=["-O3", "-fopenmp", "-std=c++17", "-Wno-unused-function", "-Wno-psabi"],
        extra_ldflags=["-fopenmp"],
        build_directory=str(BUILD_DIR),
        is_python_module=False,
        verbose=verbose,
    )
    return BUILD_DIR / f"{NAME}.so"


def main() -> int:
    start = time.time()
    print("[sgl-kernel] building the CPU library (first time ~1-2 min on 2 cores)", flush=True)
    path = build(verbose="-v" in sys.argv)
    import torch

    print(f"[sgl-kernel] {path.name} ready in {time.time() - start:.0f} s; kernels for this CPU: "
          f"{torch.ops.sgl_kernel.isa()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
