"""Plain-torch Mamba2 ops with the signatures of upstream's kernels; the CPU path runs these.

They compute what transformers' NemotronH / Bamba / Mamba2 torch fallbacks compute (the parity
reference), extended with what a serving engine needs and HF does not have: ragged batches
(`query_start_loc` / `cu_seqlens` over a flat token axis), per-request state slots in a state pool
(`cache_indices` / `conv_state_indices` / `state_batch_indices`, where `pad_slot_id` marks a padding
row whose state is neither read nor written), and z gating in the chunked scan.

Layouts (as upstream):
* conv: x is (dim, total_tokens) for varlen prefill or (batch, dim, seqlen); weight (dim, width);
  conv_states (num_slots, dim, state_len >= width - 1) holds the last inputs of each request.
* SSM: state (num_slots, nheads, headdim, dstate); B/C grouped (ngroups, dstate), head h uses
  group h // (nheads // ngroups).
All math is fp32; results are cast back to the input dtype, states to the pool dtype.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

PAD_SLOT_ID = -1


def _activate(x: torch.Tensor, activation: Optional[str]) -> torch.Tensor:
    if activation in (None, "identity"):
        return x
    if activation in ("silu", "swish"):
        return F.silu(x)
    raise NotImplementedError(f"activation {activation!r} is not supported; use None, 'silu' or 'swish'")


def _slot(indices, i: int) -> int:
    return i if indices is None else int(indices[i])


# ---------------------------------------------------------------------------------------------
# causal depthwise conv1d
# ---------------------------------------------------------------------------------------------
def causal_conv1d_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    conv_states: Optional[torch.Tensor] = None,
    query_start_loc: Optional[torch.Tensor] = None,
    cache_indices: Optional[torch.Tensor] = None,
    has_initial_state: Optional[torch.Tensor] = None,
    activation: Optional[str] = "silu",
    pad_slot_id: int = PAD_SLOT_ID,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Prefill conv over each sequence, continuing from its conv state when `has_initial_state`.

    x: (dim, total_tokens) with `query_start_loc` [num_seqs + 1], or (batch, dim, seqlen).
    When `conv_states` is given, each sequence's last `state_len` inputs (its initial state
    included when the sequence is short) are written to `conv_states[cache_indices[i]]`.
    """
    width = weight.shape[1]
    if x.dim() == 3:
        seqs = [(b, x[b]) for b in range(x.shape[0])]
    else:
        assert query_start_loc is not None, "a (dim, tokens) input needs query_start_loc"
        qsl = query_start_loc.tolist()
        seqs = [(i, x[:, qsl[i] : qsl[i + 1]]) for i in range(len(qsl) - 1)]
    outs = []
    w = weight.float()[:, None, :]
    b_ = bias.float() if bias is not None else None
    for i, xs in seqs:
        slot = _slot(cache_indices, i)
        state_len = conv_states.shape[-1] if conv_states is not None else width - 1
        init = torch.zeros((x.shape[-2], state_len), dtype=torch.float32, device=x.device)
        usable = conv_states is not None and slot != pad_slot_id
        if usable and has_initial_state is not None and bool(has_initial_state[i]):
            init = conv_states[slot].float()
        full = torch.cat([init, xs.float()], dim=-1)
        y = F.conv1d(full[None, :, -(width - 1 + xs.shape[-1]) :], w, b_, groups=full.shape[0])[0]
        outs.append(_activate(y, activation).to(x.dtype))
        if usable:
            conv_states[slot].copy_(full[:, -state_len:].to(conv_states.dtype))
    if x.dim() == 3:
        res = torch.stack(outs)
    else:
        res = torch.cat(outs, dim=-1) if outs else x.new_zeros(x.shape)
    if out is not None:
        out.copy_(res)
        return out
    return res


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    activation: Optional[str] = None,
    conv_state_indices: Optional[torch.Tensor] = None,
    pad_slot_id: int = PAD_SLOT_ID,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Decode conv: x (batch, dim) or (batch, dim, seqlen) continues conv_state[slot], shifted in place.

    Rows whose slot is `pad_slot_id` are skipped: their state is untouched, their output is
    unspecified (zero here; the Triton kernel does not write it).
    """
    squeeze = x.dim() == 2
    xs = x.unsqueeze(-1) if squeeze else x
    batch, dim, seqlen = xs.shape
    width = weight.shape[1]
    state_len = conv_state.shape[-1]
    slots = conv_state_indices.long() if conv_state_indices is not None else torch.arange(batch, device=x.device)
    valid = slots != pad_slot_id
    res = torch.zeros(xs.shape, dtype=x.dtype, device=x.device)
    if bool(valid.any()):
        vs = slots[valid]
        full = torch.cat([conv_state[vs].float(), xs[valid].float()], dim=-1)
        y = F.conv1d(full[:, :, -(width - 1 + seqlen) :], weight.float()[:, None, :],
                     bias.float() if bias is not None else None, groups=dim)
        res[valid] = _activate(y, activation).to(x.dtype)
        conv_state[vs] = full[:, :, -state_len:].to(conv_state.dtype)
    res = res.squeeze(-1) if squeeze else res
    if out is not None:
        out.copy_(res)
        return out
    return res


# ---------------------------------------------------------------------------------------------
# SSM decode step
# ---------------------------------------------------------------------------------------------
def _process_dt(dt, dt_bias, dt_softplus, dt_limit):
    dt = dt.float()
    if dt_bias is not None:
        dt = dt + dt_bias.float()
    if dt_softplus:
        dt = F.softplus(dt)
    if dt_limit is not None and tuple(dt_limit) != (0.0, float("inf")):
        dt = dt.clamp(min=dt_limit[0], max=dt_limit[1])
    return dt


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
    """One recurrent step: h <- exp(dt*A)*h + dt*B*x; y = C.h + D*x; y *= silu(z).

    state (slots, nheads, dim, dstate) updated in place at `state_batch_indices`; x, dt, z
    (batch, nheads, dim); A (nheads, dim, dstate); B, C (batch, ngroups, dstate); D, dt_bias
    (nheads, dim). Without the nheads axis everything is one head. Padding rows (slot ==
    pad_slot_id) see a zero state that is not written back (their output is D*x gated).
    """
    if state.dim() == 3:  # no head axis
        state = state.unsqueeze(1)
        x, dt, B, C = x.unsqueeze(1), dt.unsqueeze(1), B.unsqueeze(1), C.unsqueeze(1)
        A = A.unsqueeze(0)
        D = D.unsqueeze(0) if D is not None else None
        z = z.unsqueeze(1) if z is not None else None
        dt_bias = dt_bias.unsqueeze(0) if dt_bias is not None else None
        y = selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices,
                                   pad_slot_id, None, dt_limit)
        y = y.squeeze(1)
        if out is not None:
            out.copy_(y)
            return out
        return y
    batch, nheads, dim = x.shape
    ngroups = B.shape[1]
    slots = state_batch_indices.long() if state_batch_indices is not None else torch.arange(batch, device=x.device)
    valid = slots != pad_slot_id
    h = torch.zeros((batch,) + tuple(state.shape[1:]), dtype=torch.float32, device=x.device)
    h[valid] = state[slots[valid]].float()
    dt = _process_dt(dt, dt_bias, dt_softplus, dt_limit)  # (b, h, p)
    Bh = B.float().repeat_interleave(nheads // ngroups, dim=1)  # (b, h, n)
    Ch = C.float().repeat_interleave(nheads // ngroups, dim=1)
    dA = torch.exp(dt[..., None] * A.float())
    h = h * dA + (dt[..., None] * Bh[:, :, None, :]) * x.float()[..., None]
    y = (h * Ch[:, :, None, :]).sum(-1)
    if D is not None:
        y = y + x.float() * D.float()
    if z is not None:
        y = y * F.silu(z.float())
    state[slots[valid]] = h[valid].to(state.dtype)
    if out is None:
        return y.to(x.dtype)
    out.copy_(y.to(out.dtype))
    return out


# ---------------------------------------------------------------------------------------------
# SSD chunked scan (prefill)
# ---------------------------------------------------------------------------------------------
def _segsum(a: torch.Tensor) -> torch.Tensor:
    """a [..., L] -> [..., L, L] with out[i, j] = sum(a[j+1..i]) for j <= i, -inf above the diagonal."""
    L = a.shape[-1]
    cs = torch.cumsum(a, dim=-1)
    seg = cs[..., :, None] - cs[..., None, :]
    mask = torch.tril(torch.ones(L, L, dtype=torch.bool, device=a.device))
    return seg.masked_fill(~mask, float("-inf"))


def ssd_one_sequence(x, dt, A, B, C, chunk_size: int, initial_state=None):
    """SSD over one sequence in fp32. x (L, h, p), dt (L, h) already processed, B/C (L, h, n).

    Returns (y (L, h, p) without the D/z terms, final state (h, p, n)). Within a chunk the
    output is the masked "attention" C.B^T * decay; across chunks a state is carried.
    """
    L, nheads, hdim = x.shape
    n = B.shape[-1]
    pad = (-L) % chunk_size
    if pad:
        x, dt, B, C = (F.pad(t, (0,) * (2 * (t.dim() - 1)) + (0, pad)) for t in (x, dt, B, C))
    nc = x.shape[0] // chunk_size
    x, dt, B, C = (t.reshape((nc, chunk_size) + tuple(t.shape[1:])) for t in (x, dt, B, C))
    dA = dt * A[None, None, :]  # (c, l, h)
    cum = torch.cumsum(dA, dim=1)
    decay = torch.exp(_segsum(dA.permute(0, 2, 1)))  # (c, h, l, s)
    scores = torch.einsum("clhn,cshn->chls", C, B) * decay
    y = torch.einsum("chls,csh,cshp->clhp", scores, dt, x)
    to_end = torch.exp(cum[:, -1:, :] - cum)  # (c, l, h): decay from position l to chunk end
    chunk_states = torch.einsum("clhn,clh,clhp->chpn", B, to_end * dt, x)
    h = initial_state.float() if initial_state is not None else x.new_zeros((nheads, hdim, n))
    for c in range(nc):
        y[c] += torch.einsum("lhn,hpn->lhp", C[c], h) * torch.exp(cum[c])[..., None]
        h = h * torch.exp(cum[c, -1])[:, None, None] + chunk_states[c]
    return y.reshape(nc * chunk_size, nheads, hdim)[:L], h


def _sequence_bounds(seqlen: int, batch: int, cu_seqlens, seq_idx):
    """[(batch_row, start, end, sequence_number)] of every sequence."""
    if cu_seqlens is not None:
        assert batch == 1, "cu_seqlens needs batch size 1 (all sequences concatenated)"
        cu = cu_seqlens.tolist()
        return [(0, cu[i], cu[i + 1], i) for i in range(len(cu) - 1)]
    out = []
    for b in range(batch):
        if seq_idx is None:
            out.append((b, 0, seqlen, b))
            continue
        ids = seq_idx[b].tolist()
        start = 0
        for t in range(1, seqlen + 1):
            if t == seqlen or ids[t] != ids[start]:
                out.append((b, start, t, b if start == 0 else -1))
                start = t
    return out


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
    """Mamba2 SSD prefill. x (batch, seqlen, nheads, headdim) or (seqlen, nheads, headdim) with
    cu_seqlens; dt (.., seqlen, nheads); A (nheads,); B, C (.., seqlen, ngroups, dstate);
    D (nheads,) or (nheads, headdim); z like x. dt gets dt_bias, softplus, then the clamp to
    dt_limit (always, as mamba_ssm and HF do).

    Sequences (cu_seqlens, or runs of equal seq_idx) never see each other's state; with
    cu_seqlens, initial_states is (num_seqs, nheads, headdim, dstate) and
    return_varlen_states returns each sequence's final state in that layout; otherwise
    initial_states / final states are per batch row. Returns out, then the requested states.
    """
    flat = x.dim() == 3
    if flat:
        x, dt, B, C = x[None], dt[None], B[None], C[None]
        z = z[None] if z is not None else None
    batch, seqlen, nheads, hdim = x.shape
    ngroups, n = B.shape[2], B.shape[3]
    dtp = _process_dt(dt, dt_bias, dt_softplus, None).clamp(min=dt_limit[0], max=dt_limit[1])
    Af = A.float()
    Bh = B.float().repeat_interleave(nheads // ngroups, dim=2)
    Ch = C.float().repeat_interleave(nheads // ngroups, dim=2)
    y = torch.zeros((batch, seqlen, nheads, hdim), dtype=torch.float32, device=x.device)
    bounds = _sequence_bounds(seqlen, batch, cu_seqlens, seq_idx)
    row_final = torch.zeros((batch, nheads, hdim, n), dtype=torch.float32, device=x.device)
    varlen_states = torch.zeros((len(bounds), nheads, hdim, n), dtype=torch.float32, device=x.device)
    for k, (b, s, e, seq_no) in enumerate(bounds):
        init = initial_states[seq_no] if (initial_states is not None and seq_no >= 0) else None
        if e > s:
            y[b, s:e], h = ssd_one_sequence(x[b, s:e].float(), dtp[b, s:e], Af, Bh[b, s:e], Ch[b, s:e], chunk_size, init)
        else:
            h = init.float() if init is not None else row_final.new_zeros((nheads, hdim, n))
        varlen_states[k] = h
        row_final[b] = h
    if D is not None:
        Df = D.float() if D.dim() == 2 else D.float()[:, None]
        y = y + x.float() * Df
    if z is not None:
        y = y * F.silu(z.float())
    res = y.to(x.dtype)
    if flat:
        res = res[0]
    if out is not None:
        out.copy_(res)
        res = out
    sd = state_dtype or torch.float32
    rets = [res]
    if return_final_states:
        rets.append(row_final.to(sd))
    if return_varlen_states:
        assert cu_seqlens is not None, "return_varlen_states needs cu_seqlens"
        rets.append(varlen_states.to(sd))
    return rets[0] if len(rets) == 1 else tuple(rets)
