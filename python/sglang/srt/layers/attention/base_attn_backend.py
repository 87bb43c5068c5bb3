"""The interface every attention backend implements (torch_native on CPU, triton on GPUs).

A backend reads and writes the paged KV pool of `forward_batch.token_to_kv_pool` through
`forward_batch.req_to_token_pool.req_to_token[req_pool_indices, :seq_len]`.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from typing import Any, Optional

import torch


@dataclasses.dataclass
class AttentionInputs:
    """What a backend is built from: the pools it reads and writes, and the attention shapes
    (never the model runner)."""

    device: str = "cpu"
    req_to_token_pool: Any = None
    token_to_kv_pool: Any = None
    num_heads: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    max_kv_splits: Optional[int] = None


class AttentionBackend(ABC):
    def init_forward_metadata(self, forward_batch) -> None:
        """Called once per forward before the layers run; precompute index tensors here."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer, forward_batch, save_kv_cache: bool = True) -> torch.Tensor:
        """q: [num_tokens, num_heads * head_dim]; k, v: [num_tokens, num_kv_heads * head_dim].

        Writes k/v of the new tokens to `forward_batch.out_cache_loc` (when save_kv_cache) and
        returns [num_tokens, num_heads * head_dim].
        """
        if forward_batch.forward_mode.is_decode():
            return self.forward_decode(q, k, v, layer, forward_batch, save_kv_cache)
        return self.forward_extend(q, k, v, layer, forward_batch, save_kv_cache)

    @abstractmethod
    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True) -> torch.Tensor: ...

    @abstractmethod
    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True) -> torch.Tensor: ...
