"""Shared helpers for the dense-family parity tests (test/srt/models/test_dense_families.py):
one tiny checkpoint per (family variant, dtype), built once per process, and the HF model on it."""

from __future__ import annotations

import os
import tempfile
from typing import Dict, Tuple

import torch

from sglang.test.tiny_models import make_tiny_model

_DIRS: Dict[Tuple[str, str], str] = {}
_HF: Dict[Tuple[str, str], object] = {}


def family_dir(arch: str, dtype: str = "float32", seed: int = 3) -> str:
    key = (arch, dtype)
    if key not in _DIRS:
        root = os.environ.get("SGLANG_TEST_CACHE_DIR") or tempfile.gettempdir()
        path = tempfile.mkdtemp(prefix=f"family-{arch}-{dtype}-", dir=root if os.path.isdir(root) else None)
        _DIRS[key] = make_tiny_model(path, arch, seed=seed, dtype=dtype)
    return _DIRS[key]


def family_hf(arch: str, dtype: str = "float32"):
    """HF transformers' model on the same folder, eager attention, in the checkpoint's dtype."""
    key = (arch, dtype)
    if key not in _HF:
        from transformers import AutoModelForCausalLM

        _HF[key] = AutoModelForCausalLM.from_pretrained(family_dir(arch, dtype), dtype=getattr(torch, dtype),
                                                        attn_implementation="eager").eval()
    return _HF[key]
