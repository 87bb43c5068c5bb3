"""Triton kernels for attention over the paged KV pool (decode, extend) and their helpers.

On a machine without a GPU Triton can only run through its interpreter, and the interpreter is
chosen when a kernel's `@triton.jit` runs (at import of the kernel module). Importing this
package therefore turns the interpreter on when no CUDA device is present, unless the user set
TRITON_INTERPRET explicitly; on a GPU nothing changes.
"""

from __future__ import annotations

import os

import torch


def use_interpreter_without_gpu() -> None:
    """Sets TRITON_INTERPRET=1 when no CUDA device exists (Triton has no CPU backend otherwise)."""
    if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


def interpreter_active() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def dot_needs_fp32(dtype: torch.dtype) -> bool:
    """bf16 `tl.dot` returns garbage under the interpreter, so kernels upcast its operands there."""
    return dtype == torch.bfloat16 and interpreter_active()


use_interpreter_without_gpu()
