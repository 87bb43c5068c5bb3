"""The plain-torch Mamba2 ops vs transformers' Bamba/NemotronH torch fallbacks (parity reference)
and vs a token-by-token recurrence written here (for what HF lacks: ragged batches, slots, z)."""

import logging
import os

import pytest
import torch
import torch.nn.functional as F

from sglang.srt.layers.mamba import torch_ops as ops
from transformers.models.bamba import modeling_bamba as hf
from transformers.models.nemotron_h import modeling_nemotron_h as hf_nemotron

logging.getLogger("transformers").setLevel(logging.ERROR)


def _gen():
    """Fresh inputs every run (torch's default seed is the same in every process); printed for replay."""
    seed = int.from_bytes(os.urandom(4), "little") % (2**31 - 1)
    print(f"random seed {seed}")
    return torch.Generator().manual_seed(seed)


def _recurrence(x, dt, A, B, C, D=None, z=None, h0=None):
    """Token-by-token Mamba2 SSM over one sequence. x (L,h,p), dt (L,h) processed, B/C (L,g,n)."""
    L, nh, p = x.shape
    g, n = B.shape[1], B.shape[2]
    h = torch.zeros(nh, p, n) if h0 is None else h0.clone().float()
    ys = []
    for t in range(L):
        Bt = B[t].repeat_interleave(nh // g, 0)
        Ct = C[t].repeat_interleave(nh // g, 0)
        h = torch.exp(dt[t] * A)[:, None, None] * h + dt[t][:, None, None] * x[t][:, :, None] * Bt[:, None, :]
        y = (h * Ct[:, None, :]).sum(-1)
        if D is not None:
            y = y + D[:, None] * x[t]
        if z is not None:
            y = y * F.silu(z[t])
        ys.append(y)
    return torch.stack(ys), h


def test_hf_fallbacks_are_the_same_in_bamba_and_nemotron_h():
    for name in ("mamba2_chunk_scan", "causal_conv1d_fn", "causal_conv1d_update", "mamba2_selective_state_update"):
        a, b = getattr(hf, name), getattr(hf_nemotron, name)
        assert a.__wrapped__.__code__.co_code == b.__wrapped__.__code__.co_code


def test_chunk_scan_matches_hf_with_initial_states_longer_than_chunk():
    gen = _gen()
    b, L, nh, p, g, n, chunk = 2, 37, 4, 8, 2, 16, 8
    x = torch.randn(b, L, nh, p, generator=gen)
    dt = torch.randn(b, L, nh, generator=gen)
    A = -torch.rand(nh, generator=gen) - 0.5
    B = torch.randn(b, L, g, n, generator=gen)
    C = torch.randn(b, L, g, n, generator=gen)
    D = torch.randn(nh, generator=gen)
    dt_bias = torch.randn(nh, generator=gen)
    h0 = torch.randn(b, nh, p, n, generator=gen)
    kw = dict(D=D, dt_bias=dt_bias, initial_states=h0, dt_softplus=True, dt_limit=(0.01, 2.0), return_final_states=True)
    y_hf, s_hf = hf.mamba2_chunk_scan(x, dt, A, B, C, chunk_size=chunk, **kw)
    y, s = ops.mamba_chunk_scan_combined(x, dt, A, B, C, chunk, **kw)
    torch.testing.assert_close(y, y_hf.to(y.dtype), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(s, s_hf, atol=1e-4, rtol=1e-4)
    # Another chunk size gives the same function.
    y2, s2 = ops.mamba_chunk_scan_combined(x, dt, A, B, C, 16, **kw)
    torch.testing.assert_close(y2, y, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(s2, s, atol=1e-4, rtol=1e-4)


def test_chunk_scan_varlen_with_z_matches_recurrence():
    gen = _gen()
    lens = [13, 1, 20]
    nh, p, g, n, chunk = 4, 4, 1, 8, 8
    T = sum(lens)
    cu = torch.tensor([0] + list(torch.cumsum(torch.tensor(lens), 0)))
    x = torch.randn(T, nh, p, generator=gen)
    dt = torch.rand(T, nh, generator=gen)
    A = -torch.rand(nh, generator=gen)
    B = torch.randn(T, g, n, generator=gen)
    C = torch.randn(T, g, n, generator=gen)
    D = torch.randn(nh, p, generator=gen)
    z = torch.randn(T, nh, p, generator=gen)
    h0 = torch.randn(len(lens), nh, p, n, generator=gen)
    y, states = ops.mamba_chunk_scan_combined(x, dt, A, B, C, chunk, D=D, z=z, initial_states=h0, cu_seqlens=cu,
                                              return_varlen_states=True)
    for i in range(len(lens)):
        s, e = int(cu[i]), int(cu[i + 1])
        yr, hr = _recurrence(x[s:e], dt[s:e], A, B[s:e], C[s:e], None, None, h0[i])
        yr = (yr + D * x[s:e]) * F.silu(z[s:e])
        torch.testing.assert_close(y[s:e], yr, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(states[i], hr, atol=1e-4, rtol=1e-4)
    # seq_idx on a batch row gives the same output as cu_seqlens (no initial states)
    seq_idx = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))[None]
    y_a = ops.mamba_chunk_scan_combined(x, dt, A, B, C, chunk, D=D, cu_seqlens=cu)
    y_b = ops.mamba_chunk_scan_combined(x[None], dt[None], A, B[None], C[None], chunk, D=D, seq_idx=seq_idx)[0]
    torch.testing.assert_close(y_a, y_b)


def test_selective_state_update_matches_hf_and_handles_slots():
    gen = _gen()
    bs, nh, p, g, n, slots = 3, 4, 8, 2, 16, 6
    x = torch.randn(bs, nh, p, generator=gen)
    dt = torch.randn(bs, nh, p, generator=gen)
    A = (-torch.rand(nh, generator=gen))[:, None, None].expand(nh, p, n)
    B = torch.randn(bs, g, n, generator=gen)
    C = torch.randn(bs, g, n, generator=gen)
    D = torch.randn(nh, p, generator=gen)
    dt_bias = torch.randn(nh, p, generator=gen)
    pool = torch.randn(slots, nh, p, n, generator=gen)
    idx = torch.tensor([4, -1, 1])
    # HF on the gathered states of the real rows
    real = idx >= 0
    hf_state = pool[idx[real]].clone()
    y_hf = hf.mamba2_selective_state_update(hf_state, x[real], dt[real], A, B[real], C[real], D, dt_bias, True)
    before = pool.clone()
    y = ops.selective_state_update(pool, x, dt, A, B, C, D, dt_bias=dt_bias, dt_softplus=True, state_batch_indices=idx)
    torch.testing.assert_close(y[real], y_hf, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pool[idx[real]], hf_state, atol=1e-5, rtol=1e-5)
    untouched = [s for s in range(slots) if s not in (4, 1)]
    assert torch.equal(pool[untouched], before[untouched])
    # padding row: computed from a zero state (as a fresh request would be), state not stored
    zero = torch.zeros(1, nh, p, n)
    y_zero = hf.mamba2_selective_state_update(zero, x[1:2], dt[1:2], A, B[1:2], C[1:2], D, dt_bias, True)
    torch.testing.assert_close(y[1], y_zero[0], atol=1e-5, rtol=1e-5)


def test_selective_state_update_z_and_dt_limit_vs_recurrence():
    gen = _gen()
    bs, nh, p, g, n = 2, 2, 4, 1, 8
    x = torch.randn(bs, nh, p, generator=gen)
    dt = torch.randn(bs, nh, generator=gen)
    A = -torch.rand(nh, generator=gen)
    B = torch.randn(bs, g, n, generator=gen)
    C = torch.randn(bs, g, n, generator=gen)
    z = torch.randn(bs, nh, p, generator=gen)
    state = torch.randn(bs, nh, p, n, generator=gen)
    h0 = state.clone()
    y = ops.selective_state_update(state, x, dt[..., None].expand(bs, nh, p), A[:, None, None].expand(nh, p, n), B, C,
                                   z=z, dt_softplus=True, dt_limit=(0.2, 0.5))
    dtp = F.softplus(dt).clamp(0.2, 0.5)
    for b in range(bs):
        yr, hr = _recurrence(x[b : b + 1], dtp[b : b + 1], A, B[b : b + 1], C[b : b + 1], z=z[b : b + 1], h0=h0[b])
        torch.testing.assert_close(y[b], yr[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(state[b], hr, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("activation", [None, "silu"])
def test_causal_conv1d_fn_matches_hf_and_update_continues_it(activation):
    gen = _gen()
    b, dim, L, width = 2, 6, 9, 4
    x = torch.randn(b, dim, L, generator=gen)
    w = torch.randn(dim, width, generator=gen)
    bias = torch.randn(dim, generator=gen)
    y_hf = hf.causal_conv1d_fn(x, w, bias, activation=activation)
    states = torch.zeros(b, dim, width - 1)
    y = ops.causal_conv1d_fn(x, w, bias, conv_states=states, activation=activation)
    torch.testing.assert_close(y, y_hf, atol=1e-5, rtol=1e-5)
    assert torch.equal(states, x[:, :, -(width - 1) :])
    # Decode steps continue exactly like HF's update, and like the conv over the longer prompt.
    hf_states = states.clone()
    x_next = torch.randn(b, dim, 2, generator=gen)
    for t in range(2):
        y_t = ops.causal_conv1d_update(x_next[:, :, t], states, w, bias, activation)
        y_hf_t = hf.causal_conv1d_update(x_next[:, :, t : t + 1], hf_states, w, bias, activation)
        torch.testing.assert_close(y_t, y_hf_t[:, :, 0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(states, hf_states)
    y_long = hf.causal_conv1d_fn(torch.cat([x, x_next], -1), w, bias, activation=activation)
    torch.testing.assert_close(y_t, y_long[:, :, -1], atol=1e-5, rtol=1e-5)


def test_causal_conv1d_varlen_initial_states_slots_and_padding():
    gen = _gen()
    dim, width = 5, 4
    lens = [7, 2, 5]
    T = sum(lens)
    qsl = torch.tensor([0, 7, 9, 14])
    x = torch.randn(dim, T, generator=gen)
    w = torch.randn(dim, width, generator=gen)
    pool = torch.randn(4, dim, width - 1, generator=gen)
    before = pool.clone()
    cache_indices = torch.tensor([2, 0, -1])
    has_init = torch.tensor([True, True, False])
    y = ops.causal_conv1d_fn(x, w, None, pool, qsl, cache_indices, has_init, activation="silu")
    for i, (s, e) in enumerate(zip(qsl[:-1].tolist(), qsl[1:].tolist())):
        slot = int(cache_indices[i])
        init = before[slot] if has_init[i] else torch.zeros(dim, width - 1)
        full = torch.cat([init, x[:, s:e]], -1)
        ref = hf.causal_conv1d_fn(full[None], w, None, activation="silu")[0, :, width - 1 :]
        torch.testing.assert_close(y[:, s:e], ref, atol=1e-5, rtol=1e-5)
        if slot >= 0:
            torch.testing.assert_close(pool[slot], full[:, -(width - 1) :])
    assert torch.equal(pool[[1, 3]], before[[1, 3]])  # unused slots untouched
