"""Triton Mamba2 ops vs the plain-torch references (`torch_ops`), under Triton's interpreter.

Outputs are poisoned with NaN before the kernels so unwritten elements fail; state pools are
random so a state that is not read, or written where it must not be, shows up.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from sglang.srt.layers.mamba import torch_ops as ref
from sglang.srt.layers.mamba.ops.causal_conv1d import causal_conv1d_fn, causal_conv1d_update
from sglang.srt.layers.mamba.ops.selective_state_update import selective_state_update
from sglang.srt.layers.mamba.ops.ssd_combined import mamba_chunk_scan_combined


def _gen():
    """Fresh inputs every run (torch's default seed is the same in every process); printed for replay."""
    seed = int.from_bytes(os.urandom(4), "little") % (2**31 - 1)
    print(f"random seed {seed}")
    return torch.Generator().manual_seed(seed)


def _tol(dtype):
    return dict(atol=2e-3, rtol=2e-3) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)


def _r(gen, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_causal_conv1d_fn_varlen_slots_initial_states(dtype):
    gen = _gen()
    dim, width = 40, 4
    lens = [37, 2, 9, 1]
    qsl = torch.tensor([0] + torch.cumsum(torch.tensor(lens), 0).tolist(), dtype=torch.int32)
    x_tok_major = _r(gen, sum(lens), dim, dtype=dtype)
    x = x_tok_major.t()  # (dim, tokens) view with token stride dim, like a split projection
    w = _r(gen, dim, width, dtype=dtype)
    bias = _r(gen, dim, dtype=dtype)
    pool = _r(gen, 6, dim, width - 1, dtype=dtype)
    idx = torch.tensor([3, 0, -1, 5], dtype=torch.int32)
    has_init = torch.tensor([True, False, True, True])
    pool_ref = pool.clone()
    y_ref = ref.causal_conv1d_fn(x, w, bias, pool_ref, qsl, idx, has_init, "silu")
    out = torch.full_like(x, float("nan"))
    y = causal_conv1d_fn(x, w, bias, pool, qsl, idx, has_init, "silu", out=out)
    assert y is out
    torch.testing.assert_close(y.float(), y_ref.float(), **_tol(dtype))
    torch.testing.assert_close(pool, pool_ref)


def test_causal_conv1d_fn_batched_no_states_no_activation():
    gen = _gen()
    x = _r(gen, 2, 20, 11)
    w = _r(gen, 20, 3)
    out = torch.full_like(x, float("nan"))
    torch.testing.assert_close(causal_conv1d_fn(x, w, None, activation=None, out=out),
                               ref.causal_conv1d_fn(x, w, None, activation=None), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("seqlen", [1, 3])
def test_causal_conv1d_update_slots_and_padding(dtype, seqlen):
    gen = _gen()
    batch, dim, width, state_len = 4, 24, 4, 5  # state longer than width-1 is allowed
    x = _r(gen, batch, dim, seqlen, dtype=dtype)
    if seqlen == 1:
        x = x[:, :, 0]
    w = _r(gen, dim, width, dtype=dtype)
    bias = _r(gen, dim, dtype=dtype)
    pool = _r(gen, 7, dim, state_len, dtype=dtype)
    idx = torch.tensor([6, -1, 2, 0], dtype=torch.int32)
    pool_ref = pool.clone()
    y_ref = ref.causal_conv1d_update(x, pool_ref, w, bias, "silu", idx)
    out = torch.full_like(y_ref, float("nan"))
    y = causal_conv1d_update(x, pool, w, bias, "silu", idx, out=out)
    real = idx >= 0
    assert torch.isnan(out[~real]).all()  # padding rows are not written
    torch.testing.assert_close(y[real].float(), y_ref[real].float(), **_tol(dtype))
    torch.testing.assert_close(pool, pool_ref)  # padding row's slot is untouched in both


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_selective_state_update_grouped_slots_padding(dtype):
    gen = _gen()
    bs, nh, p, g, n, slots = 4, 4, 8, 2, 16, 6
    x = _r(gen, bs, nh, p, dtype=dtype)
    dt = _r(gen, bs, nh, p, dtype=dtype)
    A = (-torch.rand(nh, generator=gen) - 0.1)[:, None, None].expand(nh, p, n)  # stride-0, as models pass it
    B = _r(gen, bs, g, n, dtype=dtype)
    C = _r(gen, bs, g, n, dtype=dtype)
    D = _r(gen, nh, p)
    z = _r(gen, bs, nh, p, dtype=dtype)
    dt_bias = _r(gen, nh, p)
    state = _r(gen, slots, nh, p, n)
    idx = torch.tensor([5, -1, 0, 3], dtype=torch.int32)
    state_ref = state.clone()
    kw = dict(D=D, z=z, dt_bias=dt_bias, dt_softplus=True, state_batch_indices=idx, dt_limit=(0.05, 3.0))
    y_ref = ref.selective_state_update(state_ref, x, dt, A, B, C, **kw)
    out = torch.full_like(x, float("nan"))
    y = selective_state_update(state, x, dt, A, B, C, out=out, **kw)
    assert y is out
    torch.testing.assert_close(y.float(), y_ref.float(), **_tol(dtype))
    torch.testing.assert_close(state, state_ref, atol=1e-4, rtol=1e-4)


def test_selective_state_update_without_head_axis():
    gen = _gen()
    bs, p, n = 3, 16, 8
    state = _r(gen, bs, p, n)
    x, dt = _r(gen, bs, p), _r(gen, bs, p)
    A = -torch.rand(p, n, generator=gen)
    B, C = _r(gen, bs, n), _r(gen, bs, n)
    state_ref = state.clone()
    y_ref = ref.selective_state_update(state_ref, x, dt, A, B, C, dt_softplus=True)
    y = selective_state_update(state, x, dt, A, B, C, dt_softplus=True)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state, state_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_chunk_scan_varlen_initial_states_z(dtype):
    gen = _gen()
    lens = [40, 1, 17, 0, 5]
    nh, p, g, n, chunk = 4, 8, 2, 16, 16
    T = sum(lens)
    cu = torch.tensor([0] + torch.cumsum(torch.tensor(lens), 0).tolist(), dtype=torch.int32)
    x = _r(gen, T, nh, p, dtype=dtype)
    dt = _r(gen, T, nh, dtype=dtype)
    A = -torch.rand(nh, generator=gen) - 0.2
    B = _r(gen, T, g, n, dtype=dtype)
    C = _r(gen, T, g, n, dtype=dtype)
    D = _r(gen, nh)
    z = _r(gen, T, nh, p, dtype=dtype)
    dt_bias = _r(gen, nh)
    h0 = _r(gen, len(lens), nh, p, n)
    kw = dict(D=D, z=z, dt_bias=dt_bias, initial_states=h0, cu_seqlens=cu, dt_softplus=True,
              dt_limit=(0.0, 4.0), return_varlen_states=True)
    y_ref, s_ref = ref.mamba_chunk_scan_combined(x, dt, A, B, C, chunk, **kw)
    out = torch.full_like(x, float("nan"))
    y, s = mamba_chunk_scan_combined(x, dt, A, B, C, chunk, out=out, **kw)
    assert y is out
    torch.testing.assert_close(y.float(), y_ref.float(), **_tol(dtype))
    torch.testing.assert_close(s, s_ref, **_tol(dtype))


def test_chunk_scan_batched_final_states_and_per_dim_d():
    gen = _gen()
    b, L, nh, p, g, n = 2, 75, 2, 12, 1, 8  # headdim not a power of two; dstate below the 16-wide tile
    x = _r(gen, b, L, nh, p)
    dt = torch.rand(b, L, nh, generator=gen)
    A = -torch.rand(nh, generator=gen)
    B, C = _r(gen, b, L, g, n), _r(gen, b, L, g, n)
    D = _r(gen, nh, p)
    h0 = _r(gen, b, nh, p, n)
    kw = dict(D=D, initial_states=h0, return_final_states=True)
    # chunk_size 256 (as models use): the kernel walks 64-token tiles, as on a GPU
    y_ref, s_ref = ref.mamba_chunk_scan_combined(x, dt, A, B, C, 256, **kw)
    y, s = mamba_chunk_scan_combined(x, dt, A, B, C, 256, **kw)
    torch.testing.assert_close(y, y_ref, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(s, s_ref, atol=1e-3, rtol=1e-3)
