"""Builds a model from a folder: config -> class from the registry -> weights from safetensors.

dtype ("--dtype"): "float32"/"float", "bfloat16", "float16"/"half" are used as given. "auto"
takes the checkpoint's `torch_dtype`/`dtype` on accelerators (fp32 checkpoints run in bf16
there, as upstream) but is always float32 on CPU: CPU matmuls in fp32 are the accurate
reference path and what the parity tests use; pass --dtype bfloat16 to trade accuracy for speed.

Parameters are created uninitialised (no random init of weights that are overwritten) and a
checkpoint that leaves any parameter unfilled is rejected with the list of missing names, in one
line; tensors the model has no parameter for are listed in one warning
(model_loader/weight_loading.py).
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import torch
from torch import nn

from sglang.srt.configs.gguf_file import gguf_config_dict, is_gguf_file
from sglang.srt.model_loader.weight_utils import list_safetensors_files, safetensors_weights_iterator
from sglang.srt.models.registry import ModelRegistry

logger = logging.getLogger(__name__)

_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
}


def _config_dtype(hf_config: Any) -> Optional[torch.dtype]:
    for key in ("dtype", "torch_dtype"):
        val = hf_config.get(key) if isinstance(hf_config, dict) else getattr(hf_config, key, None)
        if isinstance(val, torch.dtype):
            return val
        if isinstance(val, str) and val in _DTYPES:
            return _DTYPES[val]
    return None


def resolve_dtype(dtype: Any, hf_config: Any = None, device: str = "cpu") -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    dtype = "auto" if dtype is None else str(dtype)
    if dtype in _DTYPES:
        return _DTYPES[dtype]
    if dtype != "auto":
        raise ValueError(f"Unknown dtype: {dtype!r}; choose one of auto, {', '.join(_DTYPES)}")
    if str(device).startswith("cpu"):
        return torch.float32
    cfg = _config_dtype(hf_config) if hf_config is not None else None
    if cfg is None or cfg == torch.float32:
        return torch.bfloat16
    return cfg


class ModelConfigError(ValueError):
    """A config.json the server cannot serve; the message is one line naming the field."""


def check_model_servable(model_path: str) -> None:
    """What start-up checks before any process is spawned (and `check_server_args` too): the
    architecture is one the registry has (upstream's message otherwise), the RoPE scaling is
    one the rotary embedding computes, a DeepSeek config's or a sparse-MoE family's router
    and weights are ones the model computes, and a GGUF file's header and metadata are read and
    checked. Skips folders without a config.json ("default")."""
    import json
    import os

    if is_gguf_file(model_path):  # its header and metadata: type, truncation, architecture (one line each)
        from sglang.srt.configs.gguf_file import GGUFError

        try:
            gguf_config_dict(str(model_path))
        except GGUFError as e:
            raise ModelConfigError(str(e)) from None
        return
    path = os.path.join(str(model_path), "config.json")
    if not os.path.isfile(path):
        return
    with open(path) as f:
        cfg = json.load(f)
    archs = cfg.get("architectures") or []
    supported = ModelRegistry.get_supported_archs()
    if not any(a in supported for a in archs):
        raise ModelConfigError(f"Model architectures {archs} are not supported for now. "
                               f"Supported architectures: {supported}")
    from sglang.srt.layers.rotary_embedding import check_rope_config

    text = cfg["text_config"] if isinstance(cfg.get("text_config"), dict) else cfg
    try:
        check_rope_config(text)
        if "DeepseekV2ForCausalLM" in archs or "DeepseekV3ForCausalLM" in archs:  # router, quantization
            from sglang.srt.models.deepseek_v2 import check_deepseek_config

            check_deepseek_config(text, 3 if "DeepseekV3ForCausalLM" in archs else 2)
        moe = getattr(getattr(ModelRegistry.resolve_model_cls(archs), "spec", None), "moe", None)
        if moe is not None:  # a sparse-MoE family: its router and experts
            from types import SimpleNamespace

            from sglang.srt.layers.moe.block import check_moe_config

            check_moe_config(SimpleNamespace(**text), moe)
    except ValueError as e:
        raise ModelConfigError(str(e)) from None


def check_tp_servable(model_path: str, tp_size: int) -> None:
    """With --tp-size > 1: the family is one this build splits across ranks, and its heads and
    MLP divide by the TP size; else one line (ModelConfigError) before any process starts, never
    a wrong answer later. Skips folders without a config.json."""
    import json
    import os

    if tp_size <= 1:
        return
    path = os.path.join(str(model_path), "config.json")
    if not os.path.isfile(path):
        path = None
    cfg = {}
    if path is not None:
        with open(path) as f:
            cfg = json.load(f)
    else:  # "default": the packaged SmolLM2 (a Llama)
        cfg = {"architectures": ["LlamaForCausalLM"]}
    archs = cfg.get("architectures") or []
    cls = ModelRegistry.resolve_model_cls(archs)
    if not getattr(cls, "supports_tensor_parallel", False):
        raise ModelConfigError(
            f"--tp-size {tp_size}: {cls.__name__} is not tensor-parallel in this build (tensor parallelism "
            f"serves LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM and MistralForCausalLM); "
            f"serve it with --tp-size 1")
    text = cfg["text_config"] if isinstance(cfg.get("text_config"), dict) else cfg
    if path is not None:
        from sglang.srt.configs.model_config import ModelConfig

        if ModelConfig.from_dict(cfg, str(model_path)).is_hybrid_swa:
            raise ModelConfigError(f"--tp-size {tp_size}: sliding-window layers beside full ones (hybrid SWA pools) "
                                   "are not tensor-parallel in this build; serve it with --tp-size 1")
    heads = text.get("num_attention_heads")
    kv = text.get("num_key_value_heads") or heads
    checks = [("num_attention_heads", heads, heads is not None and heads % tp_size == 0),
              ("num_key_value_heads", kv, kv is None or kv % tp_size == 0 or tp_size % kv == 0),
              ("intermediate_size", text.get("intermediate_size"),
               text.get("intermediate_size") is None or text["intermediate_size"] % tp_size == 0)]
    for name, value, ok in checks:
        if path is not None and not ok:
            raise ModelConfigError(f"--tp-size {tp_size} does not divide the model's {name} ({value})")


def load_hf_config(model_path: str):
    from transformers import AutoConfig

    if is_gguf_file(model_path):  # the config its metadata describes (configs/gguf_file.py)
        cfg = dict(gguf_config_dict(model_path))
        return AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    return AutoConfig.from_pretrained(model_path, trust_remote_code=False)


class _default_dtype:
    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype

    def __enter__(self):
        self.old = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)

    def __exit__(self, *exc):
        torch.set_default_dtype(self.old)


def get_model(model_config, dtype: torch.dtype, device: str = "cpu", hf_config: Any = None,
              show_progress: bool = True) -> nn.Module:
    """Instantiates `model_config.architecture` and loads its safetensors weights."""
    if hf_config is None:
        hf_config = load_hf_config(model_config.model_path)
    archs = getattr(hf_config, "architectures", None) or [model_config.architecture]
    model_cls = ModelRegistry.resolve_model_cls(archs)
    with _default_dtype(dtype), torch.device(device):
        model = model_cls(hf_config, model_config)
    if is_gguf_file(model_config.model_path):
        from sglang.srt.model_loader.gguf_loader import load_gguf_weights

        loaded = load_gguf_weights(model, model_config.model_path, dtype)
    else:
        files = list_safetensors_files(model_config.model_path)
        loaded = model.load_weights(safetensors_weights_iterator(files, show_progress=show_progress))
    if hasattr(model, "expected_weight_keys"):
        missing = sorted(model.expected_weight_keys() - set(loaded))
        if missing:
            shown = ", ".join(missing[:10]) + (" ..." if len(missing) > 10 else "")
            raise ValueError(f"Checkpoint at {model_config.model_path} is missing weights: {shown}")
    unused = list(getattr(model, "unused_weights", None) or [])
    if unused:
        shown = ", ".join(unused[:20]) + (f" ... ({len(unused)} in all)" if len(unused) > 20 else "")
        logger.warning("Checkpoint at %s has weights the model does not use (ignored): %s",
                       model_config.model_path, shown)
    return model.eval()
