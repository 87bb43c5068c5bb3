"""Loads a GGUF file's tensors into a model (`--model-path FILE.gguf`, `--load-format gguf`).

1-D tensors (norms, biases) go through the model's own `load_weights` under their HF names.
Every 2-D weight stays as the file has it, quantized or F32/F16/BF16 (so that a merged projection
whose parts differ in type is one thing): each goes to its linear layer's (or the embedding's)
`gguf_weight` (layers/gguf_linear.py) as a segment of
output rows, at the same offset a merged projection (qkv_proj, gate_up_proj) gives that HF tensor,
and the module's float `weight` becomes a zero-stride placeholder of the right shape (no memory).
A tied LM head shares the embedding's blocks.

llama.cpp's converter interleaves the rows of llama q/k projections for its rope kernel; they are
put back in HF order here (a permutation of whole rows, so it applies to blocks as they are).
"""

from __future__ import annotations

import logging
from typing import Dict, Iterator, List, Optional, Set, Tuple

import numpy as np
import torch
from torch import nn

from sglang.srt.configs.gguf_file import GGUFTensorInfo, gguf_config_dict, read_header
from sglang.srt.layers.gguf_linear import GGUFWeight

logger = logging.getLogger(__name__)

# llama.cpp tensor names -> HF names ("{i}" is the layer index).
_GGUF_TO_HF = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_q.bias": "model.layers.{i}.self_attn.q_proj.bias",
    "blk.{i}.attn_k.bias": "model.layers.{i}.self_attn.k_proj.bias",
    "blk.{i}.attn_v.bias": "model.layers.{i}.self_attn.v_proj.bias",
    "blk.{i}.attn_q_norm.weight": "model.layers.{i}.self_attn.q_norm.weight",
    "blk.{i}.attn_k_norm.weight": "model.layers.{i}.self_attn.k_norm.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}


def hf_name(gguf_name: str) -> Optional[str]:
    if gguf_name in _GGUF_TO_HF:
        return _GGUF_TO_HF[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) >= 3 and parts[0] == "blk" and parts[1].isdigit():
        key = ".".join(["blk", "{i}"] + parts[2:])
        if key in _GGUF_TO_HF:
            return _GGUF_TO_HF[key].format(i=parts[1])
    return None


def unpermute_rows(rows: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undoes llama.cpp's rotary row interleaving of a q/k projection ([out, ...] rows)."""
    n = rows.shape[0]
    return rows.reshape(n_head, n // n_head // 2, 2, *rows.shape[1:]).transpose(1, 2).reshape(rows.shape)


def _raw(mm: np.ndarray, info: GGUFTensorInfo) -> torch.Tensor:
    """The tensor's bytes as uint8 [rows, bytes per row], copied out of the mapping."""
    data = np.array(mm[info.offset:info.offset + info.nbytes()])
    return torch.from_numpy(data).reshape(info.rows(), -1)


def _as_float(raw: torch.Tensor, info: GGUFTensorInfo) -> torch.Tensor:
    shape = tuple(reversed(info.shape))
    if info.ggml_type == 0:
        return raw.view(torch.float32).reshape(shape)
    if info.ggml_type == 1:
        return raw.view(torch.float16).reshape(shape)
    return raw.view(torch.bfloat16).reshape(shape)


def gguf_tensors(path: str) -> Iterator[Tuple[str, GGUFTensorInfo, torch.Tensor]]:
    """(HF name, tensor info, bytes [rows, bytes per row] in HF row order) of every tensor the
    model has a name for; names it has none for are yielded as their GGUF names."""
    cfg = gguf_config_dict(path)
    llama = cfg["model_type"] == "llama"
    mm = np.memmap(path, mode="r", dtype=np.uint8)
    for info in read_header(path).tensors:
        name = hf_name(info.name)
        raw = _raw(mm, info)
        if llama and name is not None and (name.endswith("q_proj.weight") or name.endswith("k_proj.weight")):
            heads = cfg["num_attention_heads"] if "q_proj" in name else cfg["num_key_value_heads"]
            raw = unpermute_rows(raw, heads).contiguous()
        yield name or info.name, info, raw


def _placeholder(module: nn.Module, weight: GGUFWeight, dtype: torch.dtype) -> None:
    """The module's float weight as a zero-stride view of the right shape (nothing allocated)."""
    module.weight = nn.Parameter(torch.zeros(1, 1, dtype=dtype).expand(weight.out_features, weight.in_features),
                                 requires_grad=False)


def load_gguf_weights(model: nn.Module, path: str, dtype: torch.dtype) -> Set[str]:
    """Loads the file into `model`; returns the loaded keys (as `load_weights_into` does)."""
    stacked = list(getattr(model, "stacked_params_mapping", ()))
    canonical = getattr(model, "canonical_name", None)
    floats: List[Tuple[str, torch.Tensor]] = []
    blocks: Dict[str, GGUFWeight] = {}  # module name -> its blocks
    loaded: Set[str] = set()
    tied = bool(getattr(model, "tie_word_embeddings", False))
    counts: Dict[str, int] = {}
    for name, info, raw in gguf_tensors(path):
        counts[info.type_name] = counts.get(info.type_name, 0) + 1
        if len(info.shape) != 2:  # norms, biases
            floats.append((name, _as_float(raw, info)))
            continue
        if canonical is not None:
            name = canonical(name)
            if name is None:
                continue
        if tied and name == "lm_head.weight":
            continue
        target, key, start = name, name, 0
        for merged, fragment, shard in stacked:
            if fragment in name:
                target = name.replace(fragment, merged)
                module = model.get_submodule(target.rsplit(".", 1)[0])
                start = module._offsets[shard][0]
                key = f"{target}:{shard}"
                break
        module_name = target.rsplit(".", 1)[0]
        try:
            module = model.get_submodule(module_name)
        except AttributeError:
            module = None
        if module is None or not hasattr(module, "gguf_weight") or not target.endswith(".weight"):
            floats.append((name, _as_float(raw, info) if info.ggml_type in (0, 1, 30) else torch.from_numpy(
                _dequantize_np(raw, info)).reshape(tuple(reversed(info.shape)))))
            continue
        out_features, in_features = module.weight.shape
        if in_features != info.row_values():
            raise ValueError(f"GGUF tensor {info.name} has rows of {info.row_values()} values; "
                             f"{module_name} takes {in_features}")
        blocks.setdefault(module_name, GGUFWeight(out_features, in_features)).add(start, info.ggml_type, raw)
        loaded.add(key)
    loaded |= set(model.load_weights(iter(floats)))
    for module_name, weight in blocks.items():
        module = model.get_submodule(module_name)
        weight.finish(module_name)
        shard_keys = [k for k in loaded if k.startswith(f"{module_name}.weight:")]
        if not shard_keys:
            loaded.add(f"{module_name}.weight")
        module.gguf_weight = weight
        _placeholder(module, weight, dtype)
    if tied and "model.embed_tokens" in blocks:
        model.lm_head.gguf_weight = blocks["model.embed_tokens"]
        model.lm_head.weight = model.model.embed_tokens.weight
    quantized = sum(w.nbytes() for w in blocks.values())
    logger.info("GGUF %s: tensors by type %s; %d weights kept in their blocks (%.1f MiB)", path,
                dict(sorted(counts.items())), len(blocks), quantized / 2**20)
    return loaded


def _dequantize_np(raw: torch.Tensor, info: GGUFTensorInfo) -> np.ndarray:
    from gguf.quants import dequantize

    return np.asarray(dequantize(raw.numpy(), info.ggml_type), dtype=np.float32)

