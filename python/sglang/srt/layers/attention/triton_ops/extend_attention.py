"""Prefill ("extend") attention over the paged KV pool.

The new tokens of request b are rows `qo_indptr[b]:qo_indptr[b+1]` of `q_extend/k_extend/v_extend`;
its cached prefix KV lives in the pool at slots `kv_indices[kv_indptr[b]:kv_indptr[b+1]]`.
Each program takes one (request, query head, block of new tokens) and runs an online softmax
first over the prefix (read from the pool, every prefix key precedes every new token) and then
over the new tokens' own K/V with the causal triangle, so the new K/V need not be in the pool yet.

Sliding window (HF convention): key position kp is visible to query position qp iff
kp <= qp and kp > qp - sliding_window_size.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang.srt.layers.attention.triton_ops import dot_needs_fp32, use_interpreter_without_gpu

use_interpreter_without_gpu()


# The online-softmax step is written out in both loops rather than called: under Triton's
# interpreter every call of a jitted helper re-patches triton.language (milliseconds each).


@triton.jit
def _fwd_kernel(
    Q_Extend, K_Extend, V_Extend, O_Extend, K_Buffer, V_Buffer,
    qo_indptr, kv_indptr, kv_indices, sm_scale,
    stride_qbs, stride_qh, stride_kbs, stride_kh, stride_vbs, stride_vh, stride_obs, stride_oh,
    stride_buf_kbs, stride_buf_kh, stride_buf_vbs, stride_buf_vh,
    kv_group_num: tl.constexpr, logit_cap: tl.constexpr, SLIDING_WINDOW: tl.constexpr,
    DOT_FP32: tl.constexpr, Lq: tl.constexpr, Lv: tl.constexpr,
    BLOCK_DMODEL: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    cur_seq = tl.program_id(0)
    cur_head = tl.program_id(1)
    cur_block_m = tl.program_id(2)
    cur_kv_head = cur_head // kv_group_num

    seq_start_extend = tl.load(qo_indptr + cur_seq).to(tl.int64)
    extend_len = (tl.load(qo_indptr + cur_seq + 1) - seq_start_extend).to(tl.int32)
    seq_start_prefix = tl.load(kv_indptr + cur_seq).to(tl.int64)
    prefix_len = (tl.load(kv_indptr + cur_seq + 1) - seq_start_prefix).to(tl.int32)

    if cur_block_m * BLOCK_M < extend_len:
        offs_d = tl.arange(0, BLOCK_DMODEL)
        offs_dv = tl.arange(0, BLOCK_DV)
        offs_m = cur_block_m * BLOCK_M + tl.arange(0, BLOCK_M)
        mask_d = offs_d < Lq
        mask_dv = offs_dv < Lv
        mask_m = offs_m < extend_len
        q_pos = prefix_len + offs_m  # absolute positions of the queries

        offs_q = (seq_start_extend + offs_m[:, None]) * stride_qbs + cur_head * stride_qh + offs_d[None, :]
        q = tl.load(Q_Extend + offs_q, mask=mask_m[:, None] & mask_d[None, :], other=0.0)
        if DOT_FP32:
            q = q.to(tl.float32)

        acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
        deno = tl.zeros([BLOCK_M], dtype=tl.float32)
        e_max = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")

        # Stage 1: the cached prefix, read through kv_indices (skipping keys left of every window).
        prefix_lo = 0
        if SLIDING_WINDOW > 0:
            prefix_lo = tl.maximum(prefix_len + cur_block_m * BLOCK_M - SLIDING_WINDOW + 1, 0)
            prefix_lo = (prefix_lo // BLOCK_N) * BLOCK_N
        for start_n in range(prefix_lo, prefix_len, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            mask_n = offs_n < prefix_len
            kv_loc = tl.load(kv_indices + seq_start_prefix + offs_n, mask=mask_n, other=0).to(tl.int64)
            offs_k = kv_loc[None, :] * stride_buf_kbs + cur_kv_head * stride_buf_kh + offs_d[:, None]
            k = tl.load(K_Buffer + offs_k, mask=mask_n[None, :] & mask_d[:, None], other=0.0)
            offs_v = kv_loc[:, None] * stride_buf_vbs + cur_kv_head * stride_buf_vh + offs_dv[None, :]
            v = tl.load(V_Buffer + offs_v, mask=mask_n[:, None] & mask_dv[None, :], other=0.0)
            if DOT_FP32:
                v = v.to(tl.float32)
            mask = mask_m[:, None] & mask_n[None, :]
            if SLIDING_WINDOW > 0:
                mask &= offs_n[None, :] > q_pos[:, None] - SLIDING_WINDOW
            qk = tl.dot(q, k.to(q.dtype)) * sm_scale
            if logit_cap > 0:
                qk = logit_cap * (1.0 - 2.0 / (tl.exp(2.0 * qk / logit_cap) + 1.0))  # cap * tanh(qk / cap)
            qk = tl.where(mask, qk, float("-inf"))
            n_e_max = tl.maximum(tl.max(qk, 1), e_max)
            # A row can have no visible key in this block (window, padding rows): keep it finite.
            safe_max = tl.where(n_e_max == float("-inf"), 0.0, n_e_max)
            re_scale = tl.exp(e_max - safe_max)
            p = tl.exp(qk - safe_max[:, None])
            deno = deno * re_scale + tl.sum(p, 1)
            acc = acc * re_scale[:, None] + tl.dot(p.to(v.dtype), v)
            e_max = n_e_max

        # Stage 2: the new tokens themselves, causal.
        ext_lo = 0
        if SLIDING_WINDOW > 0:
            ext_lo = tl.maximum(cur_block_m * BLOCK_M - SLIDING_WINDOW + 1, 0)
            ext_lo = (ext_lo // BLOCK_N) * BLOCK_N
        ext_hi = tl.minimum((cur_block_m + 1) * BLOCK_M, extend_len)
        for start_n in range(ext_lo, ext_hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            mask_n = offs_n < extend_len
            offs_k = (seq_start_extend + offs_n[None, :]) * stride_kbs + cur_kv_head * stride_kh + offs_d[:, None]
            k = tl.load(K_Extend + offs_k, mask=mask_n[None, :] & mask_d[:, None], other=0.0)
            offs_v = (seq_start_extend + offs_n[:, None]) * stride_vbs + cur_kv_head * stride_vh + offs_dv[None, :]
            v = tl.load(V_Extend + offs_v, mask=mask_n[:, None] & mask_dv[None, :], other=0.0)
            if DOT_FP32:
                v = v.to(tl.float32)
            mask = mask_m[:, None] & mask_n[None, :] & (offs_n[None, :] <= offs_m[:, None])
            if SLIDING_WINDOW > 0:
                mask &= offs_n[None, :] > offs_m[:, None] - SLIDING_WINDOW
            qk = tl.dot(q, k.to(q.dtype)) * sm_scale
            if logit_cap > 0:
                qk = logit_cap * (1.0 - 2.0 / (tl.exp(2.0 * qk / logit_cap) + 1.0))  # cap * tanh(qk / cap)
            qk = tl.where(mask, qk, float("-inf"))
            n_e_max = tl.maximum(tl.max(qk, 1), e_max)
            # A row can have no visible key in this block (window, padding rows): keep it finite.
            safe_max = tl.where(n_e_max == float("-inf"), 0.0, n_e_max)
            re_scale = tl.exp(e_max - safe_max)
            p = tl.exp(qk - safe_max[:, None])
            deno = deno * re_scale + tl.sum(p, 1)
            acc = acc * re_scale[:, None] + tl.dot(p.to(v.dtype), v)
            e_max = n_e_max

        offs_o = (seq_start_extend + offs_m[:, None]) * stride_obs + cur_head * stride_oh + offs_dv[None, :]
        deno = tl.where(mask_m, deno, 1.0)  # rows past the request's end: avoid 0/0
        tl.store(O_Extend + offs_o, (acc / deno[:, None]).to(O_Extend.dtype.element_ty),
                 mask=mask_m[:, None] & mask_dv[None, :])


def extend_tile_sizes(q_extend: torch.Tensor):
    """(BLOCK_M, BLOCK_N): large tiles on GPUs, small ones for the interpreter (cost per element)."""
    if q_extend.is_cuda:
        return 64, (64 if q_extend.shape[-1] <= 128 else 32)
    return 32, 32


def extend_attention_fwd(
    q_extend: torch.Tensor,  # [T, q_heads, Lq]
    k_extend: torch.Tensor,  # [T, kv_heads, Lq]
    v_extend: torch.Tensor,  # [T, kv_heads, Lv]
    o_extend: torch.Tensor,  # [T, q_heads, Lv]
    k_buffer: torch.Tensor,  # [slots, kv_heads, Lq]
    v_buffer: torch.Tensor,  # [slots, kv_heads, Lv]
    qo_indptr: torch.Tensor,  # [B+1]
    kv_indptr: torch.Tensor,  # [B+1] over the prefix slots
    kv_indices: torch.Tensor,
    max_len_extend: int,
    sm_scale: float = None,
    logit_cap: float = 0.0,
    sliding_window_size: int = -1,
) -> None:
    """Writes causal attention of the new tokens over prefix + themselves into `o_extend`."""
    lq, lv = q_extend.shape[-1], v_extend.shape[-1]
    batch = int(qo_indptr.shape[0]) - 1
    head_num = q_extend.shape[1]
    kv_group_num = head_num // k_extend.shape[1]
    if batch <= 0 or max_len_extend <= 0:
        return
    if sm_scale is None:
        sm_scale = 1.0 / (lq ** 0.5)
    for t in (q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer):
        assert t.stride(-1) == 1
    window = int(sliding_window_size) if sliding_window_size and sliding_window_size > 0 else -1
    block_m, block_n = extend_tile_sizes(q_extend)
    grid = (batch, head_num, triton.cdiv(max_len_extend, block_m))
    _fwd_kernel[grid](
        q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer,
        qo_indptr, kv_indptr, kv_indices, sm_scale,
        q_extend.stride(0), q_extend.stride(1), k_extend.stride(0), k_extend.stride(1),
        v_extend.stride(0), v_extend.stride(1), o_extend.stride(0), o_extend.stride(1),
        k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        kv_group_num=kv_group_num, logit_cap=float(logit_cap), SLIDING_WINDOW=window,
        DOT_FP32=any(dot_needs_fp32(t.dtype) for t in (q_extend, k_extend, v_extend, k_buffer, v_buffer)),
        Lq=lq, Lv=lv,
        BLOCK_DMODEL=max(16, triton.next_power_of_2(lq)), BLOCK_DV=max(16, triton.next_power_of_2(lv)),
        BLOCK_M=block_m, BLOCK_N=block_n,
        num_warps=4, num_stages=1,
    )
