"""Triton causal depthwise conv1d for Mamba2: varlen prefill with conv states, and the decode update.

Same semantics and signatures as `torch_ops.causal_conv1d_fn` / `causal_conv1d_update`: the conv
of a request continues from the last `state_len` inputs kept in its conv-state slot, and the
slot is overwritten with the request's newest inputs afterwards. One program handles one
sequence and a block of channels, so state reads happen before the state write in that program.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from sglang.srt.layers.mamba.ops import use_interpreter_without_gpu
from sglang.srt.layers.mamba.torch_ops import PAD_SLOT_ID

use_interpreter_without_gpu()


def _act_flag(activation: Optional[str]) -> bool:
    if activation in (None, "identity"):
        return False
    if activation in ("silu", "swish"):
        return True
    raise NotImplementedError(f"activation {activation!r} is not supported; use None, 'silu' or 'swish'")


@triton.jit
def _conv1d_fwd_kernel(
    X, W, Bias, States, Qsl, CacheIdx, HasInit, Out,
    dim, seqlen_batched, pad_slot_id,
    stride_x_seq, stride_x_dim, stride_x_tok, stride_o_seq, stride_o_dim, stride_o_tok,
    stride_w_dim, stride_s_slot, stride_s_dim, stride_s_pos,
    state_len: tl.constexpr, WIDTH: tl.constexpr, BATCHED: tl.constexpr, HAS_BIAS: tl.constexpr,
    HAS_STATES: tl.constexpr, HAS_CACHE_IDX: tl.constexpr, HAS_INIT: tl.constexpr, SILU: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_S: tl.constexpr,
):
    seq = tl.program_id(0)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = offs_d < dim
    if BATCHED:
        x_base = X + seq.to(tl.int64) * stride_x_seq
        o_base = Out + seq.to(tl.int64) * stride_o_seq
        seqlen = seqlen_batched
    else:
        start = tl.load(Qsl + seq).to(tl.int64)
        seqlen = (tl.load(Qsl + seq + 1) - start).to(tl.int32)
        x_base = X + start * stride_x_tok
        o_base = Out + start * stride_o_tok
    slot = seq.to(tl.int64)
    if HAS_CACHE_IDX:
        slot = tl.load(CacheIdx + seq).to(tl.int64)
    use_state = slot != pad_slot_id
    if not HAS_STATES:
        use_state = slot != slot  # a false scalar of the same type
    read_init = use_state
    if HAS_INIT:
        read_init = read_init & (tl.load(HasInit + seq) != 0)
    else:
        read_init = slot != slot
    s_base = States + slot * stride_s_slot

    bias = tl.zeros([BLOCK_D], dtype=tl.float32)
    if HAS_BIAS:
        bias = tl.load(Bias + offs_d, mask=mask_d, other=0.0).to(tl.float32)

    for l0 in range(0, seqlen, BLOCK_L):
        offs_l = l0 + tl.arange(0, BLOCK_L)
        mask_l = offs_l < seqlen
        acc = tl.zeros([BLOCK_D, BLOCK_L], dtype=tl.float32) + bias[:, None]
        for k in tl.static_range(WIDTH):
            w = tl.load(W + offs_d * stride_w_dim + k, mask=mask_d, other=0.0).to(tl.float32)
            pos = offs_l - (WIDTH - 1) + k  # input position; negative = from the initial state
            xv = tl.load(x_base + offs_d[:, None] * stride_x_dim + pos[None, :] * stride_x_tok,
                         mask=mask_d[:, None] & (pos[None, :] >= 0) & mask_l[None, :], other=0.0).to(tl.float32)
            sv = tl.load(s_base + offs_d[:, None] * stride_s_dim + (state_len + pos[None, :]) * stride_s_pos,
                         mask=read_init & mask_d[:, None] & (pos[None, :] < 0) & (state_len + pos[None, :] >= 0),
                         other=0.0).to(tl.float32)
            acc += w[:, None] * (xv + sv)
        if SILU:
            acc = acc / (1.0 + tl.exp(-acc))  # silu
        tl.store(o_base + offs_d[:, None] * stride_o_dim + offs_l[None, :] * stride_o_tok,
                 acc.to(Out.dtype.element_ty), mask=mask_d[:, None] & mask_l[None, :])

    if use_state:
        offs_s = tl.arange(0, BLOCK_S)
        pos = seqlen - state_len + offs_s  # the newest state_len inputs
        mask_s = offs_s < state_len
        xv = tl.load(x_base + offs_d[:, None] * stride_x_dim + pos[None, :] * stride_x_tok,
                     mask=mask_d[:, None] & mask_s[None, :] & (pos[None, :] >= 0), other=0.0)
        sv = tl.load(s_base + offs_d[:, None] * stride_s_dim + (state_len + pos[None, :]) * stride_s_pos,
                     mask=read_init & mask_d[:, None] & mask_s[None, :] & (pos[None, :] < 0), other=0.0)
        new = tl.where(pos[None, :] >= 0, xv.to(tl.float32), sv.to(tl.float32))
        tl.store(s_base + offs_d[:, None] * stride_s_dim + offs_s[None, :] * stride_s_pos,
                 new.to(States.dtype.element_ty), mask=mask_d[:, None] & mask_s[None, :])


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
    """See `torch_ops.causal_conv1d_fn`: x (dim, total_tokens) + query_start_loc, or (batch, dim, seqlen)."""
    silu = _act_flag(activation)
    dim, width = weight.shape
    out = torch.empty_like(x) if out is None else out
    batched = x.dim() == 3
    if batched:
        nseq, seqlen = x.shape[0], x.shape[2]
        sx, so = (x.stride(0), x.stride(1), x.stride(2)), (out.stride(0), out.stride(1), out.stride(2))
    else:
        assert query_start_loc is not None, "a (dim, tokens) input needs query_start_loc"
        nseq, seqlen = int(query_start_loc.shape[0]) - 1, 0
        sx, so = (0, x.stride(0), x.stride(1)), (0, out.stride(0), out.stride(1))
    if nseq == 0 or x.numel() == 0:
        return out
    state_len = conv_states.shape[-1] if conv_states is not None else width - 1
    st = conv_states if conv_states is not None else out
    ss = (conv_states.stride(0), conv_states.stride(1), conv_states.stride(2)) if conv_states is not None else (0, 0, 0)
    block_d = min(64, triton.next_power_of_2(dim))
    _conv1d_fwd_kernel[(nseq, triton.cdiv(dim, block_d))](
        x, weight, bias if bias is not None else weight, st,
        query_start_loc if query_start_loc is not None else weight,
        cache_indices if cache_indices is not None else weight,
        has_initial_state.to(torch.int32) if has_initial_state is not None else weight,
        out, dim, seqlen, pad_slot_id, *sx, *so, weight.stride(0), *ss,
        state_len=state_len, WIDTH=width, BATCHED=batched, HAS_BIAS=bias is not None,
        HAS_STATES=conv_states is not None, HAS_CACHE_IDX=cache_indices is not None,
        HAS_INIT=has_initial_state is not None, SILU=silu,
        BLOCK_D=block_d, BLOCK_L=32, BLOCK_S=max(2, triton.next_power_of_2(state_len)),
    )
    return out


@triton.jit
def _conv1d_update_kernel(
    X, W, Bias, State, Idx, Out,
    dim, seqlen, pad_slot_id,
    stride_x_b, stride_x_dim, stride_x_tok, stride_o_b, stride_o_dim, stride_o_tok,
    stride_w_dim, stride_s_slot, stride_s_dim, stride_s_pos,
    state_len: tl.constexpr, WIDTH: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_IDX: tl.constexpr,
    SILU: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
):
    b = tl.program_id(0)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = offs_d < dim
    slot = b.to(tl.int64)
    if HAS_IDX:
        slot = tl.load(Idx + b).to(tl.int64)
    if slot != pad_slot_id:
        s_base = State + slot * stride_s_slot
        x_base = X + b.to(tl.int64) * stride_x_b
        bias = tl.zeros([BLOCK_D], dtype=tl.float32)
        if HAS_BIAS:
            bias = tl.load(Bias + offs_d, mask=mask_d, other=0.0).to(tl.float32)
        # Column c of (state ++ x): c < state_len from the state, else x[c - state_len].
        for t in range(seqlen):
            acc = bias
            for k in tl.static_range(WIDTH):
                c = state_len + t - (WIDTH - 1) + k
                w = tl.load(W + offs_d * stride_w_dim + k, mask=mask_d, other=0.0).to(tl.float32)
                sv = tl.load(s_base + offs_d * stride_s_dim + c * stride_s_pos,
                             mask=mask_d & (c < state_len), other=0.0).to(tl.float32)
                xv = tl.load(x_base + offs_d * stride_x_dim + (c - state_len) * stride_x_tok,
                             mask=mask_d & (c >= state_len), other=0.0).to(tl.float32)
                acc += w * (sv + xv)
            if SILU:
                acc = acc / (1.0 + tl.exp(-acc))  # silu
            tl.store(Out + b.to(tl.int64) * stride_o_b + offs_d * stride_o_dim + t * stride_o_tok,
                     acc.to(Out.dtype.element_ty), mask=mask_d)
        offs_s = tl.arange(0, BLOCK_S)
        mask_s = offs_s < state_len
        c = seqlen + offs_s
        from_state = c < state_len
        sv = tl.load(s_base + offs_d[:, None] * stride_s_dim + c[None, :] * stride_s_pos,
                     mask=mask_d[:, None] & mask_s[None, :] & from_state[None, :], other=0.0)
        xv = tl.load(x_base + offs_d[:, None] * stride_x_dim + (c[None, :] - state_len) * stride_x_tok,
                     mask=mask_d[:, None] & mask_s[None, :] & ~from_state[None, :], other=0.0)
        new = tl.where(from_state[None, :], sv.to(tl.float32), xv.to(tl.float32))
        tl.store(s_base + offs_d[:, None] * stride_s_dim + offs_s[None, :] * stride_s_pos,
                 new.to(State.dtype.element_ty), mask=mask_d[:, None] & mask_s[None, :])


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
    """See `torch_ops.causal_conv1d_update`; rows with a padding slot are not written at all."""
    silu = _act_flag(activation)
    squeeze = x.dim() == 2
    xs = x.unsqueeze(-1) if squeeze else x
    batch, dim, seqlen = xs.shape
    if out is None:
        out = torch.empty_like(xs)
    elif squeeze:
        out = out.unsqueeze(-1)
    if batch == 0:
        return out.squeeze(-1) if squeeze else out
    width = weight.shape[1]
    state_len = conv_state.shape[-1]
    assert state_len >= width - 1
    block_d = min(64, triton.next_power_of_2(dim))
    _conv1d_update_kernel[(batch, triton.cdiv(dim, block_d))](
        xs, weight, bias if bias is not None else weight, conv_state,
        conv_state_indices if conv_state_indices is not None else weight, out,
        dim, seqlen, pad_slot_id, *xs.stride(), *out.stride(), weight.stride(0), *conv_state.stride(),
        state_len=state_len, WIDTH=width, HAS_BIAS=bias is not None, HAS_IDX=conv_state_indices is not None,
        SILU=silu, BLOCK_D=block_d, BLOCK_S=max(2, triton.next_power_of_2(state_len)),
    )
    return out.squeeze(-1) if squeeze else out
