"""Pooling for embedding servers (`--is-embedding`): one vector per prompt instead of tokens.

What the vector is, per model:
- a `*ForCausalLM` decoder: the final-norm hidden states pooled over the prompt, then L2
  normalised: the last token by default (upstream's `Pooler(LAST, normalize=True)`), or as a
  sentence-transformers folder says (`modules.json` + `1_Pooling/config.json`: mean / CLS /
  last token; normalised only if it has a `Normalize` module);
- a `*ForSequenceClassification` model (a reranker / cross-encoder): the class logits of the
  last token (the model's `score` head), raw unless the config names an activation
  (`sbert_ce_default_activation_function`), as upstream.

A prompt may be prefilled in several chunks, so pooling accumulates per chunk (`accumulate`) and
finishes after the last one (`finish`). Mean and CLS pooling need every prompt token's hidden
state, so those requests never start from a radix-cache prefix.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Optional

import torch

LAST, MEAN, CLS = "last", "mean", "cls"


@dataclass(frozen=True)
class PoolingConfig:
    pooling_type: str = LAST
    normalize: bool = True
    classifier: bool = False  # the vector is the class logits (sequence classification)
    activation: Optional[str] = None  # classifier only: "sigmoid" or None (identity)

    @property
    def needs_all_tokens(self) -> bool:
        return self.pooling_type in (MEAN, CLS)


def read_pooling_config(model_path: str, architecture: str, hf_config: Optional[dict] = None) -> PoolingConfig:
    """How this model's embeddings are pooled (see the module docstring)."""
    hf_config = hf_config or {}
    if architecture.endswith("ForSequenceClassification"):
        act = str(hf_config.get("sbert_ce_default_activation_function") or "")
        return PoolingConfig(LAST, normalize=False, classifier=True,
                             activation="sigmoid" if act.lower().endswith("sigmoid") else None)
    modules = _read_json(os.path.join(model_path, "modules.json"))
    if not isinstance(modules, list):
        return PoolingConfig(LAST, normalize=True)
    pooling_type, normalize = LAST, False
    for module in modules:
        kind = str(module.get("type", ""))
        if kind.endswith("Normalize"):
            normalize = True
        elif kind.endswith("Pooling"):
            cfg = _read_json(os.path.join(model_path, module.get("path", ""), "config.json")) or {}
            if cfg.get("pooling_mode_mean_tokens"):
                pooling_type = MEAN
            elif cfg.get("pooling_mode_cls_token"):
                pooling_type = CLS
    return PoolingConfig(pooling_type, normalize=normalize)


def _read_json(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def accumulate(cfg: PoolingConfig, partial: Optional[torch.Tensor], chunk_hidden: Optional[torch.Tensor],
               last_hidden: torch.Tensor, logits: torch.Tensor, is_first_chunk: bool) -> torch.Tensor:
    """The running pooled state of one request after one more prefill chunk.

    `chunk_hidden` [chunk_len, H]: final-norm hidden states of this chunk's tokens (mean / CLS
    only); `last_hidden` [H]: of its last token; `logits` [num_labels]: the head's output on it."""
    if cfg.classifier:
        return logits.float()
    if cfg.pooling_type == LAST:
        return last_hidden.float()
    if cfg.pooling_type == CLS:
        return chunk_hidden[0].float() if is_first_chunk else partial
    chunk_sum = chunk_hidden.float().sum(dim=0)
    return chunk_sum if partial is None else partial + chunk_sum


def finish(cfg: PoolingConfig, partial: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """The request's vector, from its pooled state once its whole prompt is prefilled."""
    vec = partial.float()
    if cfg.classifier:
        return torch.sigmoid(vec) if cfg.activation == "sigmoid" else vec
    if cfg.pooling_type == MEAN:
        vec = vec / max(num_tokens, 1)
    if cfg.normalize:
        vec = torch.nn.functional.normalize(vec, p=2, dim=-1)
    return vec
