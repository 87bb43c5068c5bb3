"""Triton gated delta rule ops vs the plain-torch references (`torch_ops`), under Triton's interpreter.

Buffers the kernels' callers allocate with `torch.empty` are NaN-poisoned (`nan_empty`) so unwritten
elements fail; state pools are random so a row that is read or written where it must not be shows
up bit-exactly. Inputs are strided views, as the serving engine passes split projections.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
import torch.nn.functional as F

from sglang.srt.layers.gdn import torch_ops as ref
from sglang.srt.layers.gdn.ops.gated_delta_rule import (
    chunk_gated_delta_rule,
    fused_recurrent_gated_delta_rule_update,
)

SHAPES = [(2, 6, 12, 20), (3, 3, 16, 40)]  # (Hk, Hv, Dk, Dv): grouped heads, odd dims; 2 blocks of Dv


def _gen():
    """Fresh inputs every run (torch's default seed is the same in every process); printed for replay."""
    seed = int.from_bytes(os.urandom(4), "little") % (2**31 - 1)
    print(f"random seed {seed}")
    return torch.Generator().manual_seed(seed)


def _tol(dtype):
    return dict(atol=2e-5, rtol=2e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)


@pytest.fixture
def nan_empty(monkeypatch):
    """Makes torch.empty return NaN-filled floating tensors while a test runs."""
    real_empty = torch.empty

    def empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", empty)


def _inputs(gen, T, Hk, Hv, Dk, Dv, dtype, k_scale=1.0):
    """q, k, v as views into one fused projection row; g, beta head-major ([Hv, T] transposed)."""
    width = 2 * Hk * Dk + Hv * Dv + 3
    proj = torch.randn(T, width, generator=gen).to(dtype)
    q = proj[:, : Hk * Dk].view(T, Hk, Dk)
    k = (proj[:, Hk * Dk : 2 * Hk * Dk] * k_scale).view(T, Hk, Dk)
    v = proj[:, 2 * Hk * Dk : 2 * Hk * Dk + Hv * Dv].view(T, Hv, Dv)
    g = F.logsigmoid(torch.randn(Hv, T, generator=gen) + 2.0).t()  # fp32, <= 0, stride (1, T)
    beta = torch.sigmoid(torch.randn(Hv, T, generator=gen)).to(dtype).t()
    return q, k, v, g, beta


def _cu(lens):
    return torch.tensor([0] + torch.cumsum(torch.tensor(lens), 0).tolist(), dtype=torch.int32)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_init", [False, True])
def test_chunk_ragged_vs_recurrent(shape, dtype, with_init, nan_empty):
    gen = _gen()
    Hk, Hv, Dk, Dv = shape
    lens = [5, 1, 0, 9]
    cu = _cu(lens)
    q, k, v, g, beta = _inputs(gen, sum(lens), Hk, Hv, Dk, Dv, dtype)
    init = torch.randn(len(lens), Hv, Dk, Dv, generator=gen).to(dtype) if with_init else None
    o_ref, s_ref = ref.recurrent_gated_delta_rule(q, k, v, g, beta, init, cu)
    o, s = chunk_gated_delta_rule(q, k, v, g, beta, init, cu)
    assert o.dtype == dtype and o.shape == o_ref.shape
    assert s.dtype == torch.float32 and s.shape == s_ref.shape
    torch.testing.assert_close(o.float(), o_ref.float(), **_tol(dtype))
    torch.testing.assert_close(s, s_ref, **_tol(torch.float32))  # same fp32 math on the same inputs
    # the empty sequence hands its initial state (or zeros) back unchanged
    assert torch.equal(s[2], init[2].float() if with_init else torch.zeros_like(s[2]))


def test_chunk_matches_torch_chunk_form(nan_empty):
    gen = _gen()
    Hk, Hv, Dk, Dv = SHAPES[0]
    lens = [7, 1, 0, 12]
    cu = _cu(lens).to(torch.int64)
    q, k, v, g, beta = _inputs(gen, sum(lens), Hk, Hv, Dk, Dv, torch.float32)
    init = torch.randn(len(lens), Hv, Dk, Dv, generator=gen)
    o_ref, s_ref = ref.chunk_gated_delta_rule(q, k, v, g, beta, init, cu, chunk_size=4)
    o, s = chunk_gated_delta_rule(q, k, v, g, beta, init, cu, chunk_size=4)
    torch.testing.assert_close(o, o_ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(s, s_ref, atol=1e-4, rtol=1e-4)


def test_chunk_single_sequence_no_l2norm_bf16_states(nan_empty):
    gen = _gen()
    Hk, Hv, Dk, Dv = 2, 2, 12, 20
    # unnormalised keys: keep beta |k|^2 < 2 so the recurrence stays bounded
    q, k, v, g, beta = _inputs(gen, 6, Hk, Hv, Dk, Dv, torch.float32, k_scale=0.3)
    init = torch.randn(1, Hv, Dk, Dv, generator=gen)
    o_ref, s_ref = ref.recurrent_gated_delta_rule(q, k, v, g, beta, init, None, use_qk_l2norm=False,
                                                  state_dtype=torch.bfloat16)
    o, s = chunk_gated_delta_rule(q, k, v, g, beta, init, None, use_qk_l2norm=False,
                                  state_dtype=torch.bfloat16)
    assert s.dtype == torch.bfloat16
    torch.testing.assert_close(o, o_ref, **_tol(torch.float32))
    torch.testing.assert_close(s.float(), s_ref.float(), atol=1e-2, rtol=1e-2)


def test_chunk_no_tokens(nan_empty):
    gen = _gen()
    Hk, Hv, Dk, Dv = SHAPES[0]
    q, k, v, g, beta = _inputs(gen, 0, Hk, Hv, Dk, Dv, torch.float32)
    init = torch.randn(2, Hv, Dk, Dv, generator=gen)
    o, s = chunk_gated_delta_rule(q, k, v, g, beta, init, torch.zeros(3, dtype=torch.int32))
    assert o.shape == (0, Hv, Dv)
    assert torch.equal(s, init)


def _pool(gen, slots, Hv, Dk, Dv, dtype):
    """A strided pool view: [slots, Hv, Dk, Dv] out of a [slots, 2, Hv, Dk, Dv] buffer (two layers)."""
    return torch.randn(slots, 2, Hv, Dk, Dv, generator=gen).to(dtype)[:, 1]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16])
def test_decode_update_slots_and_padding(shape, dtype, pool_dtype, nan_empty):
    gen = _gen()
    Hk, Hv, Dk, Dv = shape
    idx = torch.tensor([4, -1, 0, 6, -1], dtype=torch.int32)
    B = idx.numel()
    q, k, v, g, beta = _inputs(gen, B, Hk, Hv, Dk, Dv, dtype)
    pool = _pool(gen, 8, Hv, Dk, Dv, pool_dtype)
    before = pool.clone()
    pool_ref = pool.clone()
    o_ref = ref.fused_recurrent_gated_delta_rule_update(q, k, v, g, beta, pool_ref, idx)
    o = fused_recurrent_gated_delta_rule_update(q, k, v, g, beta, pool, idx)
    assert o.dtype == dtype and o.shape == (B, Hv, Dv)
    torch.testing.assert_close(o.float(), o_ref.float(), **_tol(dtype))
    assert torch.equal(o[idx == -1], torch.zeros_like(o[idx == -1]))  # pad rows: exact zeros
    used = idx[idx >= 0].long()
    untouched = torch.ones(pool.shape[0], dtype=torch.bool)
    untouched[used] = False
    assert torch.equal(pool[untouched], before[untouched])  # bit-exact, pad rows wrote nothing
    tol = _tol(torch.float32) if pool_dtype == dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(pool[used].float(), pool_ref[used].float(), **tol)


def test_decode_custom_pad_slot_and_int64_indices(nan_empty):
    gen = _gen()
    Hk, Hv, Dk, Dv = 1, 2, 8, 8
    idx = torch.tensor([[2], [7], [0]], dtype=torch.int64)  # 7 marks padding here
    q, k, v, g, beta = _inputs(gen, 3, Hk, Hv, Dk, Dv, torch.float32)
    pool = _pool(gen, 8, Hv, Dk, Dv, torch.float32)
    before = pool.clone()
    pool_ref = pool.clone()
    o_ref = ref.fused_recurrent_gated_delta_rule_update(q, k, v, g, beta, pool_ref, idx, pad_slot_id=7)
    o = fused_recurrent_gated_delta_rule_update(q, k, v, g, beta, pool, idx, pad_slot_id=7)
    torch.testing.assert_close(o, o_ref, **_tol(torch.float32))
    assert torch.equal(o[1], torch.zeros_like(o[1]))
    torch.testing.assert_close(pool, pool_ref, **_tol(torch.float32))
    assert torch.equal(pool[7], before[7]) and torch.equal(pool[1], before[1])


def test_decode_empty_batch():
    gen = _gen()
    q, k, v, g, beta = _inputs(gen, 0, 2, 4, 8, 8, torch.float32)
    pool = _pool(gen, 3, 4, 8, 8, torch.float32)
    before = pool.clone()
    o = fused_recurrent_gated_delta_rule_update(q, k, v, g, beta, pool, torch.zeros(0, dtype=torch.int32))
    assert o.shape == (0, 4, 8)
    assert torch.equal(pool, before)


@pytest.mark.parametrize("shape", SHAPES)
def test_multistep_decode_equals_prefill(shape, nan_empty):
    """Ragged sequences fed one token per step (finished ones as padding rows) == one prefill."""
    gen = _gen()
    Hk, Hv, Dk, Dv = shape
    lens = [4, 1, 3]
    slots = [5, 2, 0]
    cu = _cu(lens)
    q, k, v, g, beta = _inputs(gen, sum(lens), Hk, Hv, Dk, Dv, torch.float32)
    init = torch.randn(len(lens), Hv, Dk, Dv, generator=gen)
    o_pre, s_pre = chunk_gated_delta_rule(q, k, v, g, beta, init, cu)

    pool = _pool(gen, 6, Hv, Dk, Dv, torch.float32)
    pool[slots] = init
    before = pool.clone()
    o_dec = torch.full_like(o_pre, float("nan"))
    for step in range(max(lens)):
        live = [i for i, n in enumerate(lens) if step < n]
        rows = [int(cu[i]) + step if step < lens[i] else 0 for i in range(len(lens))]
        idx = torch.tensor([slots[i] if i in live else -1 for i in range(len(lens))], dtype=torch.int32)
        o = fused_recurrent_gated_delta_rule_update(q[rows], k[rows], v[rows], g[rows], beta[rows], pool, idx)
        for i in live:
            o_dec[rows[i]] = o[i]
    torch.testing.assert_close(o_dec, o_pre, **_tol(torch.float32))
    torch.testing.assert_close(pool[slots], s_pre, **_tol(torch.float32))
    others = [s for s in range(pool.shape[0]) if s not in slots]
    assert torch.equal(pool[others], before[others])
