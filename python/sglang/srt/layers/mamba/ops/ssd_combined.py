"""Triton Mamba2 SSD prefill (`mamba_chunk_scan_combined`), one fused kernel.

Upstream splits the SSD into five kernels over global chunks (dt cumsum, chunk states, state
passing, C·Bᵀ, chunk scan). Here one program owns one (sequence, head, block of head dims) and
walks its sequence chunk by chunk, keeping the running [headdim, dstate] state in registers:
per chunk, the intra-chunk output is the masked "attention" (C·Bᵀ ∘ decay ∘ dt)·x, the
inter-chunk output is C·stateᵀ scaled by the decay since the chunk start, and the state is
advanced to the chunk end. Sequences therefore start at chunk boundaries and never mix, which
is what `cu_seqlens` / `seq_idx` require. The chunk length is a tile size here: any value gives
the same function up to rounding (it is capped at 64 to bound register use).
Semantics and signature: `torch_ops.mamba_chunk_scan_combined`.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from sglang.srt.layers.mamba.ops import use_interpreter_without_gpu
from sglang.srt.layers.mamba.torch_ops import _sequence_bounds

use_interpreter_without_gpu()


@triton.jit
def _ssd_fused_kernel(
    X, Dt, DtBias, A, B, C, D, Z, Out, Init, InitIdx, Final, SeqStart, SeqEnd,
    headdim, dstate, nheads_ngroups_ratio, dt_min, dt_max,
    x_t, x_h, x_p, dt_t, dt_h, b_t, b_g, b_n, c_t, c_g, c_n, d_h, d_p, z_t, z_h, z_p, o_t, o_h, o_p,
    i_s, i_h, i_p, i_n, f_s, f_h, f_p, f_n,
    DT_SOFTPLUS: tl.constexpr, HAS_DT_BIAS: tl.constexpr, HAS_D: tl.constexpr, D_PER_DIM: tl.constexpr,
    HAS_Z: tl.constexpr, HAS_INIT: tl.constexpr,
    BLOCK_L: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
):
    seq = tl.program_id(0)
    h = tl.program_id(1)
    pid_p = tl.program_id(2)
    g = h // nheads_ngroups_ratio
    start = tl.load(SeqStart + seq).to(tl.int64)
    seqlen = (tl.load(SeqEnd + seq) - start).to(tl.int32)

    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    offs_l = tl.arange(0, BLOCK_L)
    mask_p = offs_p < headdim
    mask_n = offs_n < dstate
    causal = offs_l[:, None] >= offs_l[None, :]

    a = tl.load(A + h).to(tl.float32)
    dt_bias = 0.0
    if HAS_DT_BIAS:
        dt_bias = tl.load(DtBias + h).to(tl.float32)
    if HAS_D:
        if D_PER_DIM:
            dskip = tl.load(D + h * d_h + offs_p * d_p, mask=mask_p, other=0.0).to(tl.float32)
        else:
            dskip = tl.load(D + h * d_h).to(tl.float32)

    state = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
    if HAS_INIT:
        init_idx = tl.load(InitIdx + seq).to(tl.int64)
        state = tl.load(Init + init_idx * i_s + h * i_h + offs_p[:, None] * i_p + offs_n[None, :] * i_n,
                        mask=(init_idx >= 0) & mask_p[:, None] & mask_n[None, :], other=0.0).to(tl.float32)

    for l0 in range(0, seqlen, BLOCK_L):
        tok = start + l0 + offs_l
        mask_l = l0 + offs_l < seqlen
        dt = tl.load(Dt + tok * dt_t + h * dt_h, mask=mask_l, other=0.0).to(tl.float32) + dt_bias
        if DT_SOFTPLUS:
            dt = tl.where(dt <= 20.0, tl.log(1.0 + tl.exp(dt)), dt)
        dt = tl.minimum(tl.maximum(dt, dt_min), dt_max)
        dt = tl.where(mask_l, dt, 0.0)  # padding tokens leave the state alone
        cum = tl.cumsum(dt * a, axis=0)  # [L] log-decay from the chunk start
        total = tl.sum(dt * a, axis=0)

        x = tl.load(X + tok[:, None] * x_t + h * x_h + offs_p[None, :] * x_p,
                    mask=mask_l[:, None] & mask_p[None, :], other=0.0).to(tl.float32)
        bm = tl.load(B + tok[:, None] * b_t + g * b_g + offs_n[None, :] * b_n,
                     mask=mask_l[:, None] & mask_n[None, :], other=0.0).to(tl.float32)
        cm = tl.load(C + tok[:, None] * c_t + g * c_g + offs_n[None, :] * c_n,
                     mask=mask_l[:, None] & mask_n[None, :], other=0.0).to(tl.float32)

        # intra-chunk: y_l = sum_{s<=l} (C_l·B_s) exp(cum_l - cum_s) dt_s x_s
        cb = tl.dot(cm, tl.trans(bm))
        seg = tl.where(causal, cum[:, None] - cum[None, :], float("-inf"))
        y = tl.dot(cb * tl.exp(seg) * dt[None, :], x)
        # inter-chunk: the state at the chunk start, decayed to position l
        y += tl.dot(cm, tl.trans(state)) * tl.exp(cum)[:, None]
        if HAS_D:
            if D_PER_DIM:
                y += x * dskip[None, :]
            else:
                y += x * dskip
        if HAS_Z:
            z = tl.load(Z + tok[:, None] * z_t + h * z_h + offs_p[None, :] * z_p,
                        mask=mask_l[:, None] & mask_p[None, :], other=0.0).to(tl.float32)
            y *= z / (1.0 + tl.exp(-z))  # silu(z)
        tl.store(Out + tok[:, None] * o_t + h * o_h + offs_p[None, :] * o_p, y.to(Out.dtype.element_ty),
                 mask=mask_l[:, None] & mask_p[None, :])

        # state at the chunk end
        w = tl.exp(total - cum) * dt
        state = state * tl.exp(total) + tl.dot(tl.trans(x * w[:, None]), bm)

    tl.store(Final + seq.to(tl.int64) * f_s + h * f_h + offs_p[:, None] * f_p + offs_n[None, :] * f_n,
             state, mask=mask_p[:, None] & mask_n[None, :])


def mamba_chunk_scan_combined(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    D: Optional[torch.Tensor] = None,
    z: Optional[torch.Tensor] = None,
    dt_bias: Optional[torch.Tensor] = None,
    initial_states: Optional[torch.Tensor] = None,
    seq_idx: Optional[torch.Tensor] = None,
    cu_seqlens: Optional[torch.Tensor] = None,
    dt_softplus: bool = False,
    dt_limit: Tuple[float, float] = (0.0, float("inf")),
    return_final_states: bool = False,
    return_varlen_states: bool = False,
    out: Optional[torch.Tensor] = None,
    state_dtype: Optional[torch.dtype] = None,
):
    """See `torch_ops.mamba_chunk_scan_combined` (same arguments, layouts and return values)."""
    flat = x.dim() == 3
    if flat:
        x, dt, B, C = x[None], dt[None], B[None], C[None]
        z = z[None] if z is not None else None
    batch, seqlen, nheads, headdim = x.shape
    ngroups, dstate = B.shape[2], B.shape[3]
    assert nheads % ngroups == 0
    # One flat token axis: (batch * seqlen, ...) views (batch rows are contiguous sequences).
    xf, dtf, Bf, Cf = (t.reshape((batch * seqlen,) + tuple(t.shape[2:])) for t in (x, dt, B, C))
    zf = z.reshape(batch * seqlen, nheads, headdim) if z is not None else None
    res = torch.empty((batch * seqlen, nheads, headdim), dtype=x.dtype, device=x.device)
    bounds = _sequence_bounds(seqlen, batch, cu_seqlens, seq_idx)
    dev = x.device
    starts = torch.tensor([b * seqlen + s for b, s, _, _ in bounds], dtype=torch.int64, device=dev)
    ends = torch.tensor([b * seqlen + e for b, _, e, _ in bounds], dtype=torch.int64, device=dev)
    init_idx = torch.tensor([k for _, _, _, k in bounds], dtype=torch.int64, device=dev)
    final = torch.empty((len(bounds), nheads, headdim, dstate), dtype=torch.float32, device=dev)
    block_l = max(16, min(64, triton.next_power_of_2(chunk_size)))
    block_p = max(16, min(32, triton.next_power_of_2(headdim)))
    block_n = max(16, triton.next_power_of_2(dstate))
    D_ = D if D is not None else A
    init = initial_states if initial_states is not None else final
    grid = (len(bounds), nheads, triton.cdiv(headdim, block_p))
    if len(bounds):
        _ssd_fused_kernel[grid](
            xf, dtf, dt_bias if dt_bias is not None else A, A, Bf, Cf, D_, zf if zf is not None else xf, res,
            init, init_idx, final, starts, ends,
            headdim, dstate, nheads // ngroups, float(dt_limit[0]), float(dt_limit[1]),
            *xf.stride(), *dtf.stride(), *Bf.stride(), *Cf.stride(),
            D_.stride(0), D_.stride(1) if D_.dim() == 2 else 0,
            *(zf.stride() if zf is not None else (0, 0, 0)), *res.stride(),
            *init.stride(), *final.stride(),
            DT_SOFTPLUS=dt_softplus, HAS_DT_BIAS=dt_bias is not None, HAS_D=D is not None,
            D_PER_DIM=D is not None and D.dim() == 2, HAS_Z=z is not None, HAS_INIT=initial_states is not None,
            BLOCK_L=block_l, BLOCK_P=block_p, BLOCK_N=block_n,
            num_warps=8 if block_l * block_n >= 8192 else 4,
        )
    res = res.view(batch, seqlen, nheads, headdim)
    if flat:
        res = res[0]
    if out is not None:
        out.copy_(res)
        res = out
    sd = state_dtype or torch.float32
    rets = [res]
    if return_final_states:
        last_of_row = {}
        for k, (b, _, _, _) in enumerate(bounds):
            last_of_row[b] = k
        rows = torch.tensor([last_of_row[b] for b in range(batch)], dtype=torch.int64, device=dev)
        rets.append(final[rows].to(sd))
    if return_varlen_states:
        assert cu_seqlens is not None, "return_varlen_states needs cu_seqlens"
        rets.append(final.to(sd))
    return rets[0] if len(rets) == 1 else tuple(rets)
