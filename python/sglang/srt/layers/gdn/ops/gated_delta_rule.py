"""Triton gated delta rule (Qwen3-Next / Qwen3.5 linear attention): prefill and decode.

Same signatures and semantics as `sglang.srt.layers.gdn.torch_ops` (read it for the math).

One kernel serves both ops. A program owns one (sequence, value head, block of BLOCK_V value
dims): it keeps the fp32 state slice S[:, v0:v0 + BLOCK_V] ([BLOCK_K >= Dk, BLOCK_V]) in
registers and walks the sequence's tokens in order, per token

    S <- exp(g) S;   S <- S + k (beta (v - S^T k))^T;   o = S^T q

Value columns of S never mix (S^T k is a per-column reduction over Dk), so blocks of Dv are
independent programs; each program reloads the full q and k rows of its key head (L2 norm and
the Dk^-1/2 scale need the whole row). Grid: (cdiv(Dv, BLOCK_V), sequences, value heads).

* Prefill (`chunk_gated_delta_rule`): token range from `cu_seqlens`; state read from
  `initial_states[b]` (or zeros), final state written to a fresh [B, Hv, Dk, Dv] tensor.
* Decode (`fused_recurrent_gated_delta_rule_update`): token b only; state read from and written
  back to `state_pool[state_indices[b]]`; a `pad_slot_id` row loads a zero state, stores no
  state and outputs zeros.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from sglang.srt.layers.gdn.ops import use_interpreter_without_gpu
from sglang.srt.layers.gdn.torch_ops import DEFAULT_CHUNK_SIZE, PAD_SLOT_ID, _check

use_interpreter_without_gpu()

_MAX_BLOCK_V = 32  # value dims per program: the fp32 state tile is BLOCK_K x BLOCK_V registers
_L2_EPS = 1e-6


@triton.jit
def _gated_delta_rule_kernel(
    Q, K, V, G, Beta, Out, StateIn, StateOut, CuSeqlens, Idx,
    group, Dk, Dv, pad_slot_id, scale, eps,
    q_t, q_h, q_d, k_t, k_h, k_d, v_t, v_h, v_d, g_t, g_h, b_t, b_h, o_t, o_h, o_d,
    si_b, si_h, si_k, si_v, so_b, so_h, so_k, so_v, idx_b,
    VARLEN: tl.constexpr, HAS_STATE_IN: tl.constexpr, HAS_IDX: tl.constexpr, L2NORM: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
):
    pid_v = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    h = tl.program_id(2)
    hk = h // group  # key head serving this value head
    if VARLEN:
        bos = tl.load(CuSeqlens + b).to(tl.int64)
        eos = tl.load(CuSeqlens + b + 1).to(tl.int64)
    else:
        bos = b
        eos = b + 1
    slot = b
    if HAS_IDX:
        slot = tl.load(Idx + b * idx_b).to(tl.int64)
    valid = slot != pad_slot_id

    offs_k = tl.arange(0, BLOCK_K)
    offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_k = offs_k < Dk
    mask_v = offs_v < Dv
    mask_s = mask_k[:, None] & mask_v[None, :] & valid
    if HAS_STATE_IN:
        s_ptrs = StateIn + slot * si_b + h * si_h + offs_k[:, None] * si_k + offs_v[None, :] * si_v
        state = tl.load(s_ptrs, mask=mask_s, other=0.0).to(tl.float32)
    else:
        state = tl.zeros([BLOCK_K, BLOCK_V], dtype=tl.float32)

    for t in range(bos, eos):
        q = tl.load(Q + t * q_t + hk * q_h + offs_k * q_d, mask=mask_k, other=0.0).to(tl.float32)
        k = tl.load(K + t * k_t + hk * k_h + offs_k * k_d, mask=mask_k, other=0.0).to(tl.float32)
        v = tl.load(V + t * v_t + h * v_h + offs_v * v_d, mask=mask_v, other=0.0).to(tl.float32)
        g = tl.load(G + t * g_t + h * g_h).to(tl.float32)
        beta = tl.load(Beta + t * b_t + h * b_h).to(tl.float32)
        if L2NORM:
            q = q * tl.rsqrt(tl.sum(q * q, axis=0) + eps)
            k = k * tl.rsqrt(tl.sum(k * k, axis=0) + eps)
        q = q * scale
        state = state * tl.exp(g)
        delta = (v - tl.sum(state * k[:, None], axis=0)) * beta  # what S does not yet predict
        state = state + k[:, None] * delta[None, :]
        o = tl.sum(state * q[:, None], axis=0)
        o = tl.where(valid, o, 0.0)
        tl.store(Out + t * o_t + h * o_h + offs_v * o_d, o.to(Out.dtype.element_ty), mask=mask_v)

    so_ptrs = StateOut + slot * so_b + h * so_h + offs_k[:, None] * so_k + offs_v[None, :] * so_v
    tl.store(so_ptrs, state.to(StateOut.dtype.element_ty), mask=mask_s)


def _launch(q, k, v, g, beta, out, state_in, state_out, cu_seqlens, idx, num_seqs, use_qk_l2norm,
            pad_slot_id):
    Hk, Dk = q.shape[1], q.shape[2]
    Hv, Dv = v.shape[1], v.shape[2]
    block_k = triton.next_power_of_2(Dk)
    block_v = min(triton.next_power_of_2(Dv), _MAX_BLOCK_V)
    grid = (triton.cdiv(Dv, block_v), num_seqs, Hv)
    _gated_delta_rule_kernel[grid](
        q, k, v, g, beta, out,
        state_in if state_in is not None else state_out, state_out,
        cu_seqlens if cu_seqlens is not None else out, idx if idx is not None else out,
        Hv // Hk, Dk, Dv, pad_slot_id, Dk ** -0.5, _L2_EPS,
        *q.stride(), *k.stride(), *v.stride(), *g.stride(), *beta.stride(), *out.stride(),
        *(state_in.stride() if state_in is not None else (0,) * 4), *state_out.stride(),
        idx.stride(0) if idx is not None else 0,
        VARLEN=cu_seqlens is not None, HAS_STATE_IN=state_in is not None, HAS_IDX=idx is not None,
        L2NORM=use_qk_l2norm, BLOCK_K=block_k, BLOCK_V=block_v,
        num_warps=4 if block_k * block_v >= 2048 else 1,
    )


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_states: Optional[torch.Tensor] = None,
    cu_seqlens: Optional[torch.Tensor] = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    use_qk_l2norm: bool = True,
    state_dtype: Optional[torch.dtype] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Prefill / extend over ragged sequences; see `torch_ops.chunk_gated_delta_rule`.

    q, k [T, Hk, Dk]; v [T, Hv, Dv]; g, beta [T, Hv]; cu_seqlens [B + 1] (None: one sequence);
    initial_states [B, Hv, Dk, Dv] (None: zeros). Returns (o [T, Hv, Dv] in v's dtype, final
    states [B, Hv, Dk, Dv] in `state_dtype`, fp32 by default). Evaluated as a varlen fused
    recurrence (token loop per program), so `chunk_size` is accepted and ignored.
    """
    _check(q, k, v, g, beta)
    T, Hv, Dv = v.shape
    Dk = q.shape[-1]
    if cu_seqlens is None:
        cu_seqlens = torch.tensor([0, T], dtype=torch.int64)
    cu_seqlens = cu_seqlens.to(device=v.device).contiguous()
    B = cu_seqlens.numel() - 1
    out = torch.empty((T, Hv, Dv), dtype=v.dtype, device=v.device)
    finals = torch.empty((B, Hv, Dk, Dv), dtype=state_dtype or torch.float32, device=v.device)
    if initial_states is not None and initial_states.shape != finals.shape:
        raise ValueError(f"initial_states {tuple(initial_states.shape)} must be {tuple(finals.shape)}")
    if B == 0:
        return out, finals
    _launch(q, k, v, g, beta, out, initial_states, finals, cu_seqlens, None, B, use_qk_l2norm, PAD_SLOT_ID)
    return out, finals


def fused_recurrent_gated_delta_rule_update(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state_pool: torch.Tensor,
    state_indices: torch.Tensor,
    use_qk_l2norm: bool = True,
    pad_slot_id: int = PAD_SLOT_ID,
) -> torch.Tensor:
    """Decode, one token per sequence; see `torch_ops.fused_recurrent_gated_delta_rule_update`.

    q, k [B, Hk, Dk]; v [B, Hv, Dv]; g, beta [B, Hv]; state_pool [S, Hv, Dk, Dv] (any strides,
    fp32 or bf16), rows `state_indices` [B] advanced in place; a `pad_slot_id` row is neither
    read nor written and outputs zeros. Returns o [B, Hv, Dv] in v's dtype.
    """
    _check(q, k, v, g, beta)
    B, Hv, Dv = v.shape
    idx = state_indices.reshape(-1)
    if idx.numel() != B:
        raise ValueError(f"state_indices has {idx.numel()} entries for {B} tokens")
    out = torch.empty((B, Hv, Dv), dtype=v.dtype, device=v.device)
    if B == 0:
        return out
    _launch(q, k, v, g, beta, out, state_pool, state_pool, None, idx, B, use_qk_l2norm, pad_slot_id)
    return out
