"""Triton kernels for attention over the paged KV pool (decode, extend) and their helpers.

On a machine without a GPU Triton can only run through its interpreter, and the interpreter is
chosen when a function's `@triton.jit` runs (at import of its module). Importing this package
therefore turns the interpreter on when no CUDA device is present, unless the user set
TRITON_INTERPRET explicitly; on a GPU nothing changes.

Triton's own library functions (`tl.sum`, `tl.max`, `tl.sigmoid`, `tl.cumsum`, ...) are jitted
when `triton` is first imported, and transformers/torch import it early; if that happened before
the variable was set they are compiled-mode functions that the interpreter refuses to call
("Cannot call @triton.jit'd outside of the scope of a kernel"). `use_interpreter_without_gpu`
converts those to interpreted functions, so import order does not matter.
"""

from __future__ import annotations

import os
import sys

import torch


def use_interpreter_without_gpu() -> None:
    """Sets TRITON_INTERPRET=1 when no CUDA device exists (Triton has no CPU backend otherwise)."""
    if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    if interpreter_active():
        _interpret_triton_library()


def _interpret_triton_library() -> None:
    """Re-wraps compiled-mode jitted functions of `triton.language.*` as interpreted ones."""
    if "triton.language" not in sys.modules:
        return  # imported later, under the variable: already interpreted
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    converted = {}

    def fix(owner, names):
        for name in names:
            value = getattr(owner, name, None)
            if type(value) is JITFunction:
                if id(value) not in converted:
                    converted[id(value)] = InterpretedFunction(value.fn)
                setattr(owner, name, converted[id(value)])

    for mod_name, mod in list(sys.modules.items()):
        if mod is not None and (mod_name == "triton.language" or mod_name.startswith("triton.language.")):
            fix(mod, list(vars(mod)))
    import triton.language as tl

    fix(tl.tensor, list(vars(tl.tensor)))


def interpreter_active() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def dot_needs_fp32(dtype: torch.dtype) -> bool:
    """bf16 `tl.dot` returns garbage under the interpreter, so kernels upcast its operands there."""
    return dtype == torch.bfloat16 and interpreter_active()


use_interpreter_without_gpu()
