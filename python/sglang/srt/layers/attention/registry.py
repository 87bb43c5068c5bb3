"""Attention backend factory: `--attention-backend NAME` -> backend instance.

Backends are imported lazily so that a backend whose dependencies are missing (e.g. triton
kernels on a machine without a usable triton) only fails when it is actually chosen.
"""

from __future__ import annotations

from typing import Callable, Dict

ATTENTION_BACKENDS: Dict[str, Callable] = {}


def register_attention_backend(name: str):
    def deco(fn: Callable) -> Callable:
        ATTENTION_BACKENDS[name] = fn
        return fn

    return deco


@register_attention_backend("torch_native")
def _create_torch_native(inputs):
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    return TorchNativeAttnBackend(inputs)


@register_attention_backend("triton")
def _create_triton(inputs):
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    return TritonAttnBackend(inputs)


def create_attention_backend(name: str, inputs):
    """`inputs`: an `AttentionInputs` (pools and shapes)."""
    if name not in ATTENTION_BACKENDS:
        raise ValueError(
            f"Invalid attention backend: {name!r}. Supported on this build: {sorted(ATTENTION_BACKENDS)}"
        )
    return ATTENTION_BACKENDS[name](inputs)
