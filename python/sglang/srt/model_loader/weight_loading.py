"""The one loop that copies HF-named checkpoint tensors into a model's parameters.

Every model's `load_weights` calls `load_weights_into(model, weights, stacked_params_mapping)`:
- `stacked_params_mapping`: (merged parameter fragment, HF fragment, shard id) triples: HF's
  separate q/k/v and gate/up projections go into one slice of the merged `qkv_proj` /
  `gate_up_proj` each (`weight_loader(param, tensor, shard)`);
- a checkpoint that already has the merged tensor (Phi-3's `qkv_proj`, `gate_up_proj`) loads it
  whole, and every shard of it counts as loaded;
- `canonical(name)`: renames a checkpoint name to the model's (None: a tensor the model knowingly
  ignores, e.g. a multi-token-prediction head);
- `special(name, tensor)`: a model's own loader for names the loop does not know (stacked experts);
  returns the keys it loaded, or None to let the loop go on.
Rotary-embedding buffers some checkpoints carry are skipped; a tied LM head is the embedding.
A parameter whose module has a `weight_loader` (linear layers, embedding, LM head) is copied by
it: under tensor parallelism each rank's loader takes only its slice (sharding at load time).

The keys it returns are parameter names, or `name:shard` for a merged linear layer's slices;
`expected_weight_keys(model)` lists those a complete checkpoint provides, so the loader
(model_loader/loader.py) names a missing weight in one line. Names that match no parameter are
collected in `model.unused_weights`, which the loader reports in one warning.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, List, Optional, Sequence, Set, Tuple

import torch
from torch import nn

from sglang.srt.layers.linear import MergedLinear, default_weight_loader

# The Llama-style merges: q/k/v -> qkv_proj (shards "q", "k", "v"), gate/up -> gate_up_proj (0, 1).
LLAMA_STACKED_PARAMS: List[Tuple[str, str, Any]] = [
    (".qkv_proj", ".q_proj", "q"),
    (".qkv_proj", ".k_proj", "k"),
    (".qkv_proj", ".v_proj", "v"),
    (".gate_up_proj", ".gate_proj", 0),
    (".gate_up_proj", ".up_proj", 1),
]

_ROTARY_BUFFERS = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")


def _shard_keys(module: nn.Module, param_name: str) -> Optional[List[str]]:
    """`name:shard` for each slice of a merged linear layer's weight or bias, else None."""
    if isinstance(module, MergedLinear) and param_name.rsplit(".", 1)[-1] in ("weight", "bias"):
        return [f"{param_name}:{shard}" for shard in module._offsets]
    return None


def load_weights_into(model: nn.Module, weights: Iterable[Tuple[str, torch.Tensor]],
                      stacked_params_mapping: Sequence[Tuple[str, str, Any]] = (),
                      canonical: Optional[Callable[[str], Optional[str]]] = None,
                      special: Optional[Callable[[str, torch.Tensor], Optional[Iterable[str]]]] = None,
                      skip_merged: Callable[[str], bool] = lambda name: False) -> Set[str]:
    """Copies `weights` into `model`'s parameters; returns the keys loaded (see the module doc).
    `skip_merged(name)`: names the stacked mapping must not touch (e.g. expert weights)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    tied = bool(getattr(model, "tie_word_embeddings", False))
    loaded: Set[str] = set()
    unused: List[str] = []
    for name, tensor in weights:
        if canonical is not None:
            name = canonical(name)
            if name is None:
                continue
        if any(buf in name for buf in _ROTARY_BUFFERS) or (tied and name == "lm_head.weight"):
            continue
        if special is not None:
            keys = special(name, tensor)
            if keys is not None:
                loaded.update(keys)
                continue
        for merged, fragment, shard in stacked_params_mapping:
            if fragment not in name or skip_merged(name):
                continue
            target = name.replace(fragment, merged)
            if target not in params:
                continue
            model.get_submodule(target.rsplit(".", 1)[0]).weight_loader(params[target], tensor, shard)
            loaded.add(f"{target}:{shard}")
            break
        else:
            if name not in params:
                unused.append(name)
                continue
            module = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            loader = getattr(module, "weight_loader", None)  # TP layers copy only this rank's slice
            if loader is not None:
                loader(params[name], tensor)
            else:
                default_weight_loader(params[name], tensor)
            loaded.update(_shard_keys(module, name) or [name])
    model.unused_weights = unused
    return loaded


def expected_weight_keys(model: nn.Module, skip: Callable[[str], bool] = lambda name: False) -> Set[str]:
    """The keys `load_weights_into` returns for a complete checkpoint (names for which `skip` is
    true are left to the model, e.g. its experts)."""
    out: Set[str] = set()
    for name, _ in model.named_parameters():
        if skip(name):
            continue
        module = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
        out.update(_shard_keys(module, name) or [name])
    return out
