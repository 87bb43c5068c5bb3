"""Triton Mamba2 decode step (upstream's `selective_state_update`), in place on the state pool.

One program per (request, head, block of head dims) loads its [dim, dstate] state tile from the
request's slot, advances it one token and writes it back. Semantics as
`torch_ops.selective_state_update`: a padding slot reads a zero state and writes nothing.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from sglang.srt.layers.mamba.ops import use_interpreter_without_gpu
from sglang.srt.layers.mamba.torch_ops import PAD_SLOT_ID

use_interpreter_without_gpu()


@triton.jit
def _selective_scan_update_kernel(
    State, X, Dt, DtBias, A, B, C, D, Z, Out, Idx,
    dim, dstate, nheads_ngroups_ratio, pad_slot_id, dt_min, dt_max,
    s_slot, s_head, s_dim, s_n,
    x_b, x_h, x_d, dt_b, dt_h, dt_d, db_h, db_d, a_h, a_d, a_n,
    b_b, b_g, b_n, c_b, c_g, c_n, d_h, d_d, z_b, z_h, z_d, o_b, o_h, o_d,
    DT_SOFTPLUS: tl.constexpr, DT_CLAMP: tl.constexpr, HAS_DT_BIAS: tl.constexpr, HAS_D: tl.constexpr,
    HAS_Z: tl.constexpr, HAS_IDX: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    h = tl.program_id(2)
    g = h // nheads_ngroups_ratio
    slot = b
    if HAS_IDX:
        slot = tl.load(Idx + b).to(tl.int64)
    valid = slot != pad_slot_id

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    mask_m = offs_m < dim
    mask_n = offs_n < dstate
    st_ptrs = State + slot * s_slot + h * s_head + offs_m[:, None] * s_dim + offs_n[None, :] * s_n
    st_mask = mask_m[:, None] & mask_n[None, :] & valid
    state = tl.load(st_ptrs, mask=st_mask, other=0.0).to(tl.float32)

    x = tl.load(X + b * x_b + h * x_h + offs_m * x_d, mask=mask_m, other=0.0).to(tl.float32)
    dt = tl.load(Dt + b * dt_b + h * dt_h + offs_m * dt_d, mask=mask_m, other=0.0).to(tl.float32)
    if HAS_DT_BIAS:
        dt += tl.load(DtBias + h * db_h + offs_m * db_d, mask=mask_m, other=0.0).to(tl.float32)
    if DT_SOFTPLUS:
        dt = tl.where(dt <= 20.0, tl.log(1.0 + tl.exp(dt)), dt)
    if DT_CLAMP:
        dt = tl.minimum(tl.maximum(dt, dt_min), dt_max)
    a = tl.load(A + h * a_h + offs_m[:, None] * a_d + offs_n[None, :] * a_n,
                mask=mask_m[:, None] & mask_n[None, :], other=0.0).to(tl.float32)
    bv = tl.load(B + b * b_b + g * b_g + offs_n * b_n, mask=mask_n, other=0.0).to(tl.float32)
    cv = tl.load(C + b * c_b + g * c_g + offs_n * c_n, mask=mask_n, other=0.0).to(tl.float32)

    state = state * tl.exp(a * dt[:, None]) + (dt * x)[:, None] * bv[None, :]
    tl.store(st_ptrs, state.to(State.dtype.element_ty), mask=st_mask)

    out = tl.sum(state * cv[None, :], axis=1)
    if HAS_D:
        out += x * tl.load(D + h * d_h + offs_m * d_d, mask=mask_m, other=0.0).to(tl.float32)
    if HAS_Z:
        z = tl.load(Z + b * z_b + h * z_h + offs_m * z_d, mask=mask_m, other=0.0).to(tl.float32)
        out *= z / (1.0 + tl.exp(-z))  # silu(z)
    tl.store(Out + b * o_b + h * o_h + offs_m * o_d, out.to(Out.dtype.element_ty), mask=mask_m)


def _s(t: Optional[torch.Tensor], n: int):
    return tuple(t.stride()) if t is not None else (0,) * n


def selective_state_update(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: Optional[torch.Tensor] = None,
    z: Optional[torch.Tensor] = None,
    dt_bias: Optional[torch.Tensor] = None,
    dt_softplus: bool = False,
    state_batch_indices: Optional[torch.Tensor] = None,
    pad_slot_id: int = PAD_SLOT_ID,
    out: Optional[torch.Tensor] = None,
    dt_limit: Optional[Tuple[float, float]] = None,
) -> torch.Tensor:
    """See `torch_ops.selective_state_update` (same shapes; the nheads axis may be absent)."""
    if state.dim() == 3:
        state, x, dt, B, C = state.unsqueeze(1), x.unsqueeze(1), dt.unsqueeze(1), B.unsqueeze(1), C.unsqueeze(1)
        A = A.unsqueeze(0)
        D = D.unsqueeze(0) if D is not None else None
        z = z.unsqueeze(1) if z is not None else None
        dt_bias = dt_bias.unsqueeze(0) if dt_bias is not None else None
        if out is not None:
            out = out.unsqueeze(1)
        return selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices,
                                      pad_slot_id, out, dt_limit).squeeze(1)
    batch, nheads, dim = x.shape
    dstate = state.shape[-1]
    ngroups = B.shape[1]
    assert nheads % ngroups == 0
    if out is None:
        out = torch.empty_like(x)
    if batch == 0:
        return out
    clamp = dt_limit is not None and tuple(dt_limit) != (0.0, float("inf"))
    lo, hi = (float(dt_limit[0]), float(dt_limit[1])) if clamp else (0.0, 0.0)
    block_n = max(2, triton.next_power_of_2(dstate))
    block_m = min(max(2, triton.next_power_of_2(dim)), 4 if block_n >= 128 else 16)
    grid = (triton.cdiv(dim, block_m), batch, nheads)
    _selective_scan_update_kernel[grid](
        state, x, dt, dt_bias if dt_bias is not None else dt, A, B, C,
        D if D is not None else dt, z if z is not None else x, out,
        state_batch_indices if state_batch_indices is not None else dt,
        dim, dstate, nheads // ngroups, pad_slot_id, lo, hi,
        *state.stride(), *x.stride(), *dt.stride(), *_s(dt_bias, 2), *A.stride(),
        *B.stride(), *C.stride(), *_s(D, 2), *_s(z, 3), *out.stride(),
        DT_SOFTPLUS=dt_softplus, DT_CLAMP=clamp, HAS_DT_BIAS=dt_bias is not None, HAS_D=D is not None,
        HAS_Z=z is not None, HAS_IDX=state_batch_indices is not None, BLOCK_M=block_m, BLOCK_N=block_n,
    )
    return out
