"""Split-KV flash decoding over the paged KV pool (one query token per request).

Stage 1 cuts each request's KV range into `num_kv_splits[b]` pieces and, per piece, computes the
softmax-weighted sum of V and the log-sum-exp of the scores; stage 2 merges the pieces with their
LSE weights. Splitting lets short batches of long sequences fill the GPU. Query heads that share a
KV head (GQA/MQA) are processed together (one tl.dot) so K/V are read once per group; plain MHA
uses a one-head-per-program kernel without tl.dot.

KV rows of request b are `k_buffer[kv_indices[kv_indptr[b]:kv_indptr[b+1]]]` (token slots, any
page size). With `sliding_window_size > 0` only the last `sliding_window_size` keys are visible
(HF convention: key position > query position - window; the query is the last position).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang.srt.layers.attention.triton_ops import dot_needs_fp32, use_interpreter_without_gpu

use_interpreter_without_gpu()

# Query heads handled together by one stage-1 program (tl.dot needs at least 16 rows on GPUs).
_BLOCK_H = 16
# A split covers a multiple of this many tokens.
_MIN_BLOCK_KV = 32


# Kernels inline their small helpers (split bounds, tanh via exp): under Triton's interpreter
# every call of a jitted helper re-patches triton.language, which costs milliseconds.


@triton.jit
def _fwd_kernel_stage1(
    Q, K_Buffer, V_Buffer, sm_scale, kv_indptr, kv_indices, Att_Out, Att_Lse, num_kv_splits,
    stride_qbs, stride_qh, stride_buf_kbs, stride_buf_kh, stride_buf_vbs, stride_buf_vh,
    stride_mid_ob, stride_mid_oh, stride_mid_os, stride_lse_b, stride_lse_h,
    BLOCK_DMODEL: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
    MIN_BLOCK_KV: tl.constexpr, logit_cap: tl.constexpr, SLIDING_WINDOW: tl.constexpr,
    Lk: tl.constexpr, Lv: tl.constexpr,
):
    """One query head per program (MHA: no other head shares its K/V), no tl.dot."""
    cur_batch = tl.program_id(0)
    cur_head = tl.program_id(1)
    split_kv_id = tl.program_id(2)
    offs_d = tl.arange(0, BLOCK_DMODEL)
    offs_dv = tl.arange(0, BLOCK_DV)
    mask_d = offs_d < Lk
    mask_dv = offs_dv < Lv

    kv_start_idx = tl.load(kv_indptr + cur_batch).to(tl.int64)
    seq_len = tl.load(kv_indptr + cur_batch + 1).to(tl.int32) - kv_start_idx.to(tl.int32)
    kv_splits = tl.load(num_kv_splits + cur_batch)
    # Split bounds over the visible positions [win_start, seq_len), in multiples of MIN_BLOCK_KV.
    win_start = 0
    if SLIDING_WINDOW > 0:
        win_start = tl.maximum(seq_len - SLIDING_WINDOW, 0)
    per_split = (((seq_len - win_start) + kv_splits - 1) // kv_splits + MIN_BLOCK_KV - 1) // MIN_BLOCK_KV * MIN_BLOCK_KV
    split_start = win_start + per_split * split_kv_id
    split_end = tl.minimum(split_start + per_split, seq_len)

    if split_end > split_start:
        q = tl.load(Q + cur_batch.to(tl.int64) * stride_qbs + cur_head * stride_qh + offs_d, mask=mask_d, other=0.0)
        q = q.to(tl.float32)
        e_max = -float("inf")
        e_sum = 0.0
        acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
        for start_n in range(split_start, split_end, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            mask_n = offs_n < split_end
            kv_loc = tl.load(kv_indices + kv_start_idx + offs_n, mask=mask_n, other=0).to(tl.int64)
            k = tl.load(K_Buffer + kv_loc[:, None] * stride_buf_kbs + cur_head * stride_buf_kh + offs_d[None, :],
                        mask=mask_n[:, None] & mask_d[None, :], other=0.0)
            qk = tl.sum(q[None, :] * k.to(tl.float32), 1) * sm_scale
            if logit_cap > 0:
                qk = logit_cap * (1.0 - 2.0 / (tl.exp(2.0 * qk / logit_cap) + 1.0))  # cap * tanh(qk / cap)
            qk = tl.where(mask_n, qk, float("-inf"))
            v = tl.load(V_Buffer + kv_loc[:, None] * stride_buf_vbs + cur_head * stride_buf_vh + offs_dv[None, :],
                        mask=mask_n[:, None] & mask_dv[None, :], other=0.0)
            n_e_max = tl.maximum(tl.max(qk, 0), e_max)
            re_scale = tl.exp(e_max - n_e_max)
            p = tl.exp(qk - n_e_max)
            acc = acc * re_scale + tl.sum(p[:, None] * v.to(tl.float32), 0)
            e_sum = e_sum * re_scale + tl.sum(p, 0)
            e_max = n_e_max
        base = cur_batch.to(tl.int64) * stride_mid_ob + cur_head * stride_mid_oh + split_kv_id * stride_mid_os
        tl.store(Att_Out + base + offs_dv, acc / e_sum, mask=mask_dv)
        tl.store(Att_Lse + cur_batch.to(tl.int64) * stride_lse_b + cur_head * stride_lse_h + split_kv_id,
                 e_max + tl.log(e_sum))


@triton.jit
def _fwd_grouped_kernel_stage1(
    Q, K_Buffer, V_Buffer, sm_scale, kv_indptr, kv_indices, Att_Out, Att_Lse, num_kv_splits,
    stride_qbs, stride_qh, stride_buf_kbs, stride_buf_kh, stride_buf_vbs, stride_buf_vh,
    stride_mid_ob, stride_mid_oh, stride_mid_os, stride_lse_b, stride_lse_h,
    kv_group_num: tl.constexpr, q_head_num: tl.constexpr,
    BLOCK_DMODEL: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
    MIN_BLOCK_KV: tl.constexpr, logit_cap: tl.constexpr, SLIDING_WINDOW: tl.constexpr,
    DOT_FP32: tl.constexpr, Lk: tl.constexpr, Lv: tl.constexpr,
):
    cur_batch = tl.program_id(0)
    cur_head_id = tl.program_id(1)
    split_kv_id = tl.program_id(2)
    if BLOCK_H < kv_group_num:
        VALID_BLOCK_H: tl.constexpr = BLOCK_H
    else:
        VALID_BLOCK_H: tl.constexpr = kv_group_num
    cur_kv_head = cur_head_id // ((kv_group_num + BLOCK_H - 1) // BLOCK_H)
    cur_head = cur_head_id * VALID_BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = (cur_head < (cur_head_id + 1) * VALID_BLOCK_H) & (cur_head < q_head_num)

    offs_d = tl.arange(0, BLOCK_DMODEL)
    offs_dv = tl.arange(0, BLOCK_DV)
    mask_d = offs_d < Lk
    mask_dv = offs_dv < Lv

    kv_start_idx = tl.load(kv_indptr + cur_batch).to(tl.int64)
    seq_len = tl.load(kv_indptr + cur_batch + 1).to(tl.int32) - kv_start_idx.to(tl.int32)
    kv_splits = tl.load(num_kv_splits + cur_batch)
    # Split bounds over the visible positions [win_start, seq_len), in multiples of MIN_BLOCK_KV.
    win_start = 0
    if SLIDING_WINDOW > 0:
        win_start = tl.maximum(seq_len - SLIDING_WINDOW, 0)
    per_split = (((seq_len - win_start) + kv_splits - 1) // kv_splits + MIN_BLOCK_KV - 1) // MIN_BLOCK_KV * MIN_BLOCK_KV
    split_start = win_start + per_split * split_kv_id
    split_end = tl.minimum(split_start + per_split, seq_len)

    e_max = tl.zeros([BLOCK_H], dtype=tl.float32) - float("inf")
    e_sum = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float32)

    if split_end > split_start:
        offs_q = cur_batch.to(tl.int64) * stride_qbs + cur_head[:, None] * stride_qh + offs_d[None, :]
        q = tl.load(Q + offs_q, mask=mask_h[:, None] & mask_d[None, :], other=0.0)
        if DOT_FP32:
            q = q.to(tl.float32)
        for start_n in range(split_start, split_end, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            mask_n = offs_n < split_end
            kv_loc = tl.load(kv_indices + kv_start_idx + offs_n, mask=mask_n, other=0).to(tl.int64)
            offs_k = kv_loc[None, :] * stride_buf_kbs + cur_kv_head * stride_buf_kh + offs_d[:, None]
            k = tl.load(K_Buffer + offs_k, mask=mask_n[None, :] & mask_d[:, None], other=0.0)
            qk = tl.dot(q, k.to(q.dtype))
            qk *= sm_scale
            if logit_cap > 0:
                qk = logit_cap * (1.0 - 2.0 / (tl.exp(2.0 * qk / logit_cap) + 1.0))  # cap * tanh(qk / cap)
            qk = tl.where(mask_h[:, None] & mask_n[None, :], qk, float("-inf"))

            offs_v = kv_loc[:, None] * stride_buf_vbs + cur_kv_head * stride_buf_vh + offs_dv[None, :]
            v = tl.load(V_Buffer + offs_v, mask=mask_n[:, None] & mask_dv[None, :], other=0.0)
            if DOT_FP32:
                v = v.to(tl.float32)

            n_e_max = tl.maximum(tl.max(qk, 1), e_max)
            # Rows of masked-out heads stay at -inf; keep their arithmetic finite.
            n_e_max = tl.where(n_e_max == float("-inf"), 0.0, n_e_max)
            re_scale = tl.exp(e_max - n_e_max)
            p = tl.exp(qk - n_e_max[:, None])
            acc *= re_scale[:, None]
            acc += tl.dot(p.to(v.dtype), v)
            e_sum = e_sum * re_scale + tl.sum(p, 1)
            e_max = n_e_max

        offs_mid_o = (
            cur_batch.to(tl.int64) * stride_mid_ob + cur_head[:, None] * stride_mid_oh
            + split_kv_id * stride_mid_os + offs_dv[None, :]
        )
        e_sum = tl.where(mask_h, e_sum, 1.0)  # padding head rows: avoid 0/0
        tl.store(Att_Out + offs_mid_o, acc / e_sum[:, None], mask=mask_h[:, None] & mask_dv[None, :])
        offs_lse = cur_batch.to(tl.int64) * stride_lse_b + cur_head * stride_lse_h + split_kv_id
        tl.store(Att_Lse + offs_lse, e_max + tl.log(e_sum), mask=mask_h)


@triton.jit
def _fwd_kernel_stage2(
    Mid_O, Mid_Lse, O, kv_indptr, num_kv_splits,
    stride_mid_ob, stride_mid_oh, stride_mid_os, stride_lse_b, stride_lse_h, stride_obs, stride_oh,
    MAX_KV_SPLITS: tl.constexpr, MIN_BLOCK_KV: tl.constexpr, SLIDING_WINDOW: tl.constexpr,
    BLOCK_DV: tl.constexpr, Lv: tl.constexpr,
):
    cur_batch = tl.program_id(0)
    cur_head = tl.program_id(1)
    seq_len = (tl.load(kv_indptr + cur_batch + 1) - tl.load(kv_indptr + cur_batch)).to(tl.int32)
    kv_splits = tl.load(num_kv_splits + cur_batch)
    offs_d = tl.arange(0, BLOCK_DV)
    mask_d = offs_d < Lv

    e_sum = 0.0
    e_max = -float("inf")
    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    base_o = cur_batch.to(tl.int64) * stride_mid_ob + cur_head * stride_mid_oh
    base_lse = cur_batch.to(tl.int64) * stride_lse_b + cur_head * stride_lse_h
    win_start = 0
    if SLIDING_WINDOW > 0:
        win_start = tl.maximum(seq_len - SLIDING_WINDOW, 0)
    per_split = (((seq_len - win_start) + kv_splits - 1) // kv_splits + MIN_BLOCK_KV - 1) // MIN_BLOCK_KV * MIN_BLOCK_KV
    for split_kv_id in range(0, MAX_KV_SPLITS):
        split_start = win_start + per_split * split_kv_id
        split_end = tl.minimum(split_start + per_split, seq_len)
        if split_end > split_start:
            tv = tl.load(Mid_O + base_o + split_kv_id * stride_mid_os + offs_d, mask=mask_d, other=0.0)
            tlogic = tl.load(Mid_Lse + base_lse + split_kv_id)
            n_e_max = tl.maximum(tlogic, e_max)
            old_scale = tl.exp(e_max - n_e_max)
            acc *= old_scale
            exp_logic = tl.exp(tlogic - n_e_max)
            acc += exp_logic * tv
            e_sum = e_sum * old_scale + exp_logic
            e_max = n_e_max
    tl.store(
        O + cur_batch.to(tl.int64) * stride_obs + cur_head * stride_oh + offs_d,
        (acc / e_sum).to(O.dtype.element_ty),
        mask=mask_d,
    )


def mha_block_n(q: torch.Tensor) -> int:
    """KV tokens per step of the MHA stage-1 kernel (splits are multiples of _MIN_BLOCK_KV = 32)."""
    return 64 if q.is_cuda else 32


def get_num_kv_splits(seq_lens: torch.Tensor, max_kv_splits: int, sliding_window_size: int = -1,
                      min_tokens_per_split: int = 256) -> torch.Tensor:
    """Splits per request: about one per `min_tokens_per_split` visible tokens, at most max_kv_splits."""
    vis = seq_lens if sliding_window_size <= 0 else torch.clamp(seq_lens, max=sliding_window_size)
    n = torch.div(vis + min_tokens_per_split - 1, min_tokens_per_split, rounding_mode="floor")
    return torch.clamp(n, min=1, max=max_kv_splits).to(torch.int32)


def decode_attention_fwd(
    q: torch.Tensor,  # [B, q_heads, Lk]
    k_buffer: torch.Tensor,  # [slots, kv_heads, Lk]
    v_buffer: torch.Tensor,  # [slots, kv_heads, Lv]
    o: torch.Tensor,  # [B, q_heads, Lv]
    kv_indptr: torch.Tensor,  # [B+1]
    kv_indices: torch.Tensor,  # [kv_indptr[-1]]
    attn_logits: torch.Tensor,  # [B, q_heads, max_kv_splits, Lv] fp32 scratch
    attn_lse: torch.Tensor,  # [B, q_heads, max_kv_splits] fp32 scratch
    num_kv_splits: torch.Tensor,  # [B] int32, each in [1, max_kv_splits]
    max_kv_splits: int,
    sm_scale: float,
    logit_cap: float = 0.0,
    sliding_window_size: int = -1,
) -> None:
    """Writes softmax(q·Kᵀ·sm_scale)·V of each request into `o` (same argument order as upstream)."""
    assert q.dim() == 3 and o.dim() == 3
    batch, head_num, lk = q.shape
    kv_head_num = k_buffer.shape[1]
    lv = v_buffer.shape[-1]
    assert head_num % kv_head_num == 0
    assert k_buffer.stride(-1) == 1 and v_buffer.stride(-1) == 1 and q.stride(-1) == 1
    kv_group_num = head_num // kv_head_num
    if batch == 0:
        return
    window = int(sliding_window_size) if sliding_window_size and sliding_window_size > 0 else -1
    block_dmodel = max(16, triton.next_power_of_2(lk))
    block_dv = max(16, triton.next_power_of_2(lv))
    common = (
        q, k_buffer, v_buffer, sm_scale, kv_indptr, kv_indices, attn_logits, attn_lse, num_kv_splits,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        attn_logits.stride(0), attn_logits.stride(1), attn_logits.stride(2), attn_lse.stride(0), attn_lse.stride(1),
    )
    if kv_group_num == 1:
        _fwd_kernel_stage1[(batch, head_num, max_kv_splits)](
            *common, BLOCK_DMODEL=block_dmodel, BLOCK_DV=block_dv, BLOCK_N=mha_block_n(q),
            MIN_BLOCK_KV=_MIN_BLOCK_KV, logit_cap=float(logit_cap), SLIDING_WINDOW=window, Lk=lk, Lv=lv,
            num_warps=4 if lk <= 128 else 8, num_stages=2,
        )
    else:
        dot_fp32 = any(dot_needs_fp32(t.dtype) for t in (q, k_buffer, v_buffer))
        _launch_grouped_stage1(common, batch, head_num, kv_group_num, max_kv_splits, block_dmodel, block_dv,
                               logit_cap, window, dot_fp32, lk, lv)
    _fwd_kernel_stage2[(batch, head_num)](
        attn_logits, attn_lse, o, kv_indptr, num_kv_splits,
        attn_logits.stride(0), attn_logits.stride(1), attn_logits.stride(2), attn_lse.stride(0), attn_lse.stride(1),
        o.stride(0), o.stride(1),
        MAX_KV_SPLITS=max_kv_splits, MIN_BLOCK_KV=_MIN_BLOCK_KV, SLIDING_WINDOW=window,
        BLOCK_DV=block_dv, Lv=lv,
        num_warps=4, num_stages=2,
    )


def _launch_grouped_stage1(common, batch, head_num, kv_group_num, max_kv_splits, block_dmodel, block_dv,
                           logit_cap, window, dot_fp32, lk, lv):
    grid = (batch, triton.cdiv(head_num, min(_BLOCK_H, kv_group_num)), max_kv_splits)
    _fwd_grouped_kernel_stage1[grid](
        *common,
        kv_group_num=kv_group_num, q_head_num=head_num,
        BLOCK_DMODEL=block_dmodel, BLOCK_DV=block_dv, BLOCK_N=32, BLOCK_H=_BLOCK_H,
        MIN_BLOCK_KV=_MIN_BLOCK_KV, logit_cap=float(logit_cap), SLIDING_WINDOW=window,
        DOT_FP32=dot_fp32, Lk=lk, Lv=lv,
        num_warps=4, num_stages=2,
    )
