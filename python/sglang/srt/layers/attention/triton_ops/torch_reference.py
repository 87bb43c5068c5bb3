"""Plain-torch definitions of what the Triton attention kernels compute (fp32 math, per request).

The kernel tests compare against these; they read the KV pool exactly like the kernels
(through kv_indptr/kv_indices), but with dense masks and a materialised softmax.
"""

from __future__ import annotations

import torch


def _attend(q, k, v, sm_scale, logit_cap, visible):
    """q [M, H, D], k/v [N, KVH, D] -> [M, H, Dv]; visible [M, N] bool."""
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    s = torch.einsum("mhd,nhd->hmn", q.float(), k) * sm_scale
    if logit_cap > 0:
        s = logit_cap * torch.tanh(s / logit_cap)
    s = s.masked_fill(~visible[None], float("-inf"))
    return torch.einsum("hmn,nhd->mhd", torch.softmax(s, dim=-1), v)


def _visible(q_pos, k_pos, window):
    vis = k_pos[None, :] <= q_pos[:, None]
    if window > 0:
        vis &= k_pos[None, :] > q_pos[:, None] - window
    return vis


def decode_attention_ref(q, k_buffer, v_buffer, kv_indptr, kv_indices, sm_scale, logit_cap=0.0, sliding_window_size=-1):
    """q [B, H, D]: the last token of each request attends to all its KV (window-limited)."""
    out = []
    for b in range(q.shape[0]):
        idx = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])].long()
        n = idx.numel()
        pos = torch.arange(n, device=q.device)
        vis = _visible(pos[-1:], pos, sliding_window_size)
        out.append(_attend(q[b : b + 1], k_buffer[idx], v_buffer[idx], sm_scale, logit_cap, vis))
    return torch.cat(out).to(q.dtype)


def extend_attention_ref(q_extend, k_extend, v_extend, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices,
                         sm_scale, logit_cap=0.0, sliding_window_size=-1):
    """q_extend [T, H, D]: new tokens attend to their pool prefix plus themselves, causally."""
    out = []
    for b in range(int(qo_indptr.shape[0]) - 1):
        qs, qe = int(qo_indptr[b]), int(qo_indptr[b + 1])
        idx = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])].long()
        p = idx.numel()
        k = torch.cat([k_buffer[idx].to(k_extend.dtype), k_extend[qs:qe]])
        v = torch.cat([v_buffer[idx].to(v_extend.dtype), v_extend[qs:qe]])
        k_pos = torch.arange(p + qe - qs, device=q_extend.device)
        vis = _visible(k_pos[p:], k_pos, sliding_window_size)
        out.append(_attend(q_extend[qs:qe], k, v, sm_scale, logit_cap, vis))
    return torch.cat(out).to(q_extend.dtype)
