"""The attention layer models use: holds the layer's shape and delegates to the batch's backend."""

from __future__ import annotations

import torch
from torch import nn


class RadixAttention(nn.Module):
    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        scaling: float,
        num_kv_heads: int,
        layer_id: int,
        logit_cap: float = 0.0,
        sliding_window_size: int = -1,
        v_head_dim: int = -1,
    ):
        super().__init__()
        self.tp_q_head_num = num_heads
        self.tp_k_head_num = num_kv_heads
        self.tp_v_head_num = num_kv_heads
        self.head_dim = head_dim
        self.qk_head_dim = head_dim
        self.v_head_dim = v_head_dim if v_head_dim != -1 else head_dim
        self.scaling = scaling
        self.layer_id = layer_id
        self.logit_cap = logit_cap
        # -1 means full attention; otherwise a token attends to the last `sliding_window_size`
        # positions (HF convention: key position > query position - window).
        self.sliding_window_size = sliding_window_size if sliding_window_size else -1

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, forward_batch, save_kv_cache: bool = True) -> torch.Tensor:
        return forward_batch.attn_backend.forward(q, k, v, self, forward_batch, save_kv_cache)
