"""Attention over the paged KV pool with plain torch (CPU, and any device as a fallback).

Extend (prefill, possibly after a cached prefix): per request, the prefix K/V are gathered
from the pool through `req_to_token[req_pool_idx, :prefix_len]` and the new tokens' K/V are
used as given, so the result does not depend on whether they were saved. The mask is causal;
sliding-window layers (`layer.sliding_window_size = W > 0`, HF convention) additionally keep
only keys with position > query position - W, and only those keys are gathered.

Decode: one query per request, batched: every request's KV indices are padded to the longest
sequence of the batch (padding points at slot 0, the pool's padding page) and masked out.

Index tensors are built once per forward in `init_forward_metadata` and shared by all layers.
"""

from __future__ import annotations

from typing import List, Optional

import torch
import torch.nn.functional as F

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend


class TorchNativeAttnBackend(AttentionBackend):
    def __init__(self, model_runner=None):
        self.device = getattr(model_runner, "device", "cpu") if model_runner is not None else "cpu"
        self._seq_kv_indices: List[torch.Tensor] = []
        self._decode_kv_indices: Optional[torch.Tensor] = None
        self._decode_positions: Optional[torch.Tensor] = None

    # ---- metadata -----------------------------------------------------------------------
    def init_forward_metadata(self, forward_batch) -> None:
        req_to_token = forward_batch.req_to_token_pool.req_to_token
        rows = forward_batch.req_pool_indices.tolist()
        seq_lens = forward_batch.seq_lens_cpu
        self._seq_kv_indices = [req_to_token[r, :s] for r, s in zip(rows, seq_lens)]
        if forward_batch.forward_mode.is_decode():
            max_len = max(seq_lens) if seq_lens else 0
            padded = torch.zeros((len(rows), max_len), dtype=torch.int64, device=req_to_token.device)
            for i, idx in enumerate(self._seq_kv_indices):
                padded[i, : idx.numel()] = idx
            self._decode_kv_indices = padded
            self._decode_positions = torch.arange(max_len, device=req_to_token.device)
        else:
            self._decode_kv_indices = None

    # ---- extend -------------------------------------------------------------------------
    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True) -> torch.Tensor:
        pool = forward_batch.token_to_kv_pool
        if save_kv_cache:
            pool.set_kv_buffer(layer.layer_id, forward_batch.out_cache_loc, k, v)
        k_buf, v_buf = pool.get_kv_buffer(layer.layer_id)
        hq, hkv = layer.tp_q_head_num, layer.tp_k_head_num
        T = q.shape[0]
        qh = q.view(T, hq, layer.qk_head_dim)
        kh = k.view(T, hkv, layer.qk_head_dim).to(q.dtype)
        vh = v.view(T, hkv, layer.v_head_dim).to(q.dtype)
        out = q.new_empty((T, hq, layer.v_head_dim))
        window = layer.sliding_window_size
        starts = forward_batch.extend_start_loc_cpu
        for i, (start, n, prefix) in enumerate(zip(starts, forward_batch.extend_seq_lens_cpu,
                                                   forward_batch.extend_prefix_lens_cpu)):
            if n == 0:
                continue
            # Keys visible to any query of this request: [kv_lo, prefix + n).
            kv_lo = max(0, prefix + 1 - window) if window > 0 else 0
            kv_lo = min(kv_lo, prefix)
            pre_idx = self._seq_kv_indices[i][kv_lo:prefix]
            keys = torch.cat((k_buf[pre_idx].to(q.dtype), kh[start : start + n]), dim=0)
            vals = torch.cat((v_buf[pre_idx].to(q.dtype), vh[start : start + n]), dim=0)
            q_pos = torch.arange(prefix, prefix + n, device=q.device)
            k_pos = torch.arange(kv_lo, prefix + n, device=q.device)
            mask = k_pos[None, :] <= q_pos[:, None]
            if window > 0:
                mask &= k_pos[None, :] > q_pos[:, None] - window
            out[start : start + n] = _attend(qh[start : start + n].transpose(0, 1).unsqueeze(0),
                                             keys.transpose(0, 1).unsqueeze(0),
                                             vals.transpose(0, 1).unsqueeze(0),
                                             mask, layer)[0].transpose(0, 1)
        return out.reshape(T, hq * layer.v_head_dim)

    # ---- decode -------------------------------------------------------------------------
    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True) -> torch.Tensor:
        pool = forward_batch.token_to_kv_pool
        if save_kv_cache:
            pool.set_kv_buffer(layer.layer_id, forward_batch.out_cache_loc, k, v)
        k_buf, v_buf = pool.get_kv_buffer(layer.layer_id)
        hq, hkv = layer.tp_q_head_num, layer.tp_k_head_num
        B = q.shape[0]
        idx = self._decode_kv_indices  # [B, L]
        keys = k_buf[idx].to(q.dtype)  # [B, L, hkv, d]
        vals = v_buf[idx].to(q.dtype)
        seq_lens = forward_batch.seq_lens.to(idx.device)
        last = seq_lens - 1
        if not save_kv_cache:  # the new token's K/V are not in the pool: put them in place
            b = torch.arange(B, device=idx.device)
            keys[b, last] = k.view(B, hkv, layer.qk_head_dim).to(q.dtype)
            vals[b, last] = v.view(B, hkv, layer.v_head_dim).to(q.dtype)
        pos = self._decode_positions[None, :]
        mask = pos < seq_lens[:, None]
        if layer.sliding_window_size > 0:
            mask &= pos > (last[:, None] - layer.sliding_window_size)
        qh = q.view(B, hq, 1, layer.qk_head_dim)
        o = _attend(qh, keys.transpose(1, 2), vals.transpose(1, 2), mask[:, None, None, :], layer)
        return o.reshape(B, hq * layer.v_head_dim)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, layer) -> torch.Tensor:
    """q [N, hq, Lq, d], k/v [N, hkv, Lk, d], boolean mask broadcastable to [N, hq, Lq, Lk]."""
    hq, hkv = q.shape[1], k.shape[1]
    if layer.logit_cap and layer.logit_cap > 0:
        if hq != hkv:
            k = k.repeat_interleave(hq // hkv, dim=1)
            v = v.repeat_interleave(hq // hkv, dim=1)
        scores = torch.matmul(q, k.transpose(-1, -2)) * layer.scaling
        scores = layer.logit_cap * torch.tanh(scores / layer.logit_cap)
        scores = scores.masked_fill(~mask, float("-inf"))
        return torch.matmul(torch.softmax(scores.float(), dim=-1).to(v.dtype), v)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=layer.scaling, enable_gqa=hq != hkv)
