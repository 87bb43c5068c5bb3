"""torch.ops.sgl_kernel.fused_experts (a MoE layer's routed experts in one call) against a plain
torch loop over tokens and choices, for every kernel set this CPU runs (generic, avx2, avx512,
avx512bf16, amx where present): fp32 and bf16 weights as plain stacks and as panels (the gated
gate_up panel path when the expert width is a multiple of 32, the unfused one otherwise), int8
stacks with per-row scales, routings with uneven counts per expert and experts that get no
tokens, one-token decode batches and empty batches. Outputs are NaN-poisoned as in
test_sgl_kernel_ops.py, so a row the op forgets to write fails.

Then the layer: `StackedExperts` (layers/moe) takes the op on CPU and its torch loop
(`fused_experts_torch`, the fallback) otherwise, and both agree.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import sgl_kernel

pytestmark = pytest.mark.skipif(not sgl_kernel.load(), reason=f"sgl-kernel: {sgl_kernel.unavailable_reason()}")
ops = torch.ops.sgl_kernel
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def loop_reference(x, w13, w2, weights, ids, w13_scale=None, w2_scale=None):
    """Token by token, choice by choice: each expert's math in x's dtype (each product rounded as
    a linear layer rounds it), the weighted results added in increasing expert order in x's dtype
    (as HF's expert loop adds them)."""
    dtype = x.dtype
    w13 = w13.float() if w13_scale is None else w13.float() * w13_scale.float()[:, :, None]
    w2 = w2.float() if w2_scale is None else w2.float() * w2_scale.float()[:, :, None]
    inter = w2.shape[-1]
    out = torch.zeros(x.shape, dtype=dtype)
    for t in range(ids.shape[0]):
        for c in sorted(range(ids.shape[1]), key=lambda c: int(ids[t, c])):
            e = int(ids[t, c])
            gate_up = F.linear(x[t:t + 1].float(), w13[e]).to(dtype).float()
            h = (F.silu(gate_up[:, :inter]).to(dtype).float() * gate_up[:, inter:]).to(dtype)
            y = F.linear(h.float(), w2[e]).to(dtype).float()[0]
            out[t] += (float(weights[t, c]) * y).to(dtype)
    return out


# (tokens, top-k, expert ids by rule): uneven counts and idle experts
ROUTINGS = {
    "uneven_idle": lambda T, K, E: torch.tensor([[0, 1]] * (T - 4) + [[1, 3]] * 3 + [[E - 1, 0]])[:, :K],
    "one_expert": lambda T, K, E: torch.stack([torch.full((T,), 2)] + [torch.full((T,), 2 + j) for j in range(1, K)], 1),
    "random": lambda T, K, E: torch.stack([torch.randperm(E, generator=torch.Generator().manual_seed(t))[:K]
                                           for t in range(T)]),
}


def _case(dtype, T, K, E, H, I, routing, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(dtype)
    w13 = (torch.randn(E, 2 * I, H, generator=g) * 0.2).to(dtype)
    w2 = (torch.randn(E, H, I, generator=g) * 0.2).to(dtype)
    weights = torch.rand(T, K, generator=g)
    ids = ROUTINGS[routing](T, K, E) if T else torch.zeros(0, K, dtype=torch.long)
    return x, w13, w2, weights, ids


def _pack(w):
    return torch.stack([ops.pack_linear_weight(w[e]) for e in range(w.shape[0])])


def _check(got, want, dtype):
    assert not got.isnan().any(), "an output element was left unwritten (NaN poison) or is NaN"
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("form", ["plain", "panels"])
@pytest.mark.parametrize("T,K,routing", [(9, 2, "uneven_idle"), (1, 2, "random"), (1, 1, "random"),
                                         (13, 3, "random"), (6, 2, "one_expert"), (40, 2, "random")])
def test_op_matches_the_token_loop(isa, dtype, form, T, K, routing):
    E, H, I = 8, 64, 96  # I a multiple of 32: panels take the gated gate_up path
    x, w13, w2, weights, ids = _case(dtype, T, K, E, H, I, routing, seed=T * 10 + K)
    a, b = (w13, w2) if form == "plain" else (_pack(w13), _pack(w2))
    _check(ops.fused_experts(x, a, b, weights, ids), loop_reference(x, w13, w2, weights, ids), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("H,I", [(48, 40), (64, 48), (33, 17)])
def test_op_widths_off_the_panel_grid(isa, dtype, H, I):
    """Expert widths that are not multiples of 32: gate_up then SiLU-and-mul apart (panels where
    2I is a multiple of 32), row tiles with tails on plain weights."""
    E, T, K = 5, 11, 2
    x, w13, w2, weights, ids = _case(dtype, T, K, E, H, I, "random", seed=H + I)
    want = loop_reference(x, w13, w2, weights, ids)
    _check(ops.fused_experts(x, w13, w2, weights, ids), want, dtype)
    if 2 * I % 32 == 0 and H % 32 == 0:
        _check(ops.fused_experts(x, _pack(w13), _pack(w2), weights, ids), want, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 7])
def test_op_int8_experts_with_row_scales(isa, dtype, T):
    E, K, H, I = 6, 2, 64, 32
    x, w13f, w2f, weights, ids = _case(torch.float32, T, K, E, H, I, "random", seed=T)
    x = x.to(dtype)

    def quantize(w):
        scale = w.abs().amax(-1) / 127
        return torch.round(w / scale[:, :, None]).to(torch.int8), scale

    w13, s13 = quantize(w13f)
    w2, s2 = quantize(w2f)
    _check(ops.fused_experts(x, w13, w2, weights, ids, s13, s2), loop_reference(x, w13, w2, weights, ids, s13, s2),
           dtype)


def test_op_empty_batch_and_bad_ids(isa):
    x, w13, w2, weights, ids = _case(torch.float32, 0, 2, 4, 64, 32, "random")
    assert ops.fused_experts(x, w13, w2, weights, ids).shape == (0, 64)
    x, w13, w2, weights, ids = _case(torch.float32, 3, 2, 4, 64, 32, "random")
    ids[1, 0] = 4
    with pytest.raises(RuntimeError, match="expert id 4 outside"):
        ops.fused_experts(x, w13, w2, weights, ids)
    with pytest.raises(RuntimeError, match="panel weights must be of x's dtype"):
        ops.fused_experts(x.bfloat16(), _pack(w13), _pack(w2), weights, ids.clamp(max=3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_takes_the_op_and_its_torch_loop_agrees(dtype, monkeypatch):
    from sglang.srt.layers import cpu_ops
    from sglang.srt.layers.moe import StackedExperts, fused_experts_torch

    E, H, I, T, K = 8, 64, 64, 10, 2
    x, w13, w2, weights, ids = _case(dtype, T, K, E, H, I, "uneven_idle")
    experts = StackedExperts(E, H, I)
    experts.gate_up_proj.data, experts.down_proj.data = w13, w2
    # the sorted loop is HF's expert loop (rows in another order: GEMM blocking may differ)
    torch.testing.assert_close(fused_experts_torch(x, w13, w2, weights.to(dtype), ids),
                               _torch_loop_in_dtype(x, w13, w2, weights.to(dtype), ids), **TOL[dtype])
    packed = experts.pack()
    assert packed == cpu_ops.linear_panels_enabled(dtype)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fused = experts(x, weights, ids)
    assert "sgl_kernel::fused_experts" in {e.key for e in prof.key_averages()}
    with cpu_ops.torch_fallbacks():
        fallback = experts(x, weights, ids)
    monkeypatch.setenv("SGLANG_CPU_FUSED_MOE", "0")
    assert torch.equal(experts(x, weights, ids), fallback)
    _check(fused, fallback, dtype)


def _torch_loop_in_dtype(x, w13, w2, weights, ids):
    """HF's expert loop (per expert, weighted and added in x's dtype), for the fallback."""
    out = torch.zeros_like(x)
    inter = w2.shape[-1]
    for e in range(w13.shape[0]):
        pos, tok = torch.where(ids.T == e)
        if tok.numel() == 0:
            continue
        gate_up = F.linear(x[tok], w13[e])
        y = F.linear(F.silu(gate_up[:, :inter]) * gate_up[:, inter:], w2[e])
        out.index_add_(0, tok, (y * weights[tok, pos, None]).to(x.dtype))
    return out


def test_layer_int8_experts_take_decode_rows(monkeypatch):
    """--quantization w8a16_int8: the stacks get int8 copies (per-row scales) that decode-sized
    batches read, as the int8 linear layers; larger batches keep the float weights."""
    from sglang.srt.layers.moe import StackedExperts
    from sglang.srt.layers.quantization import quantize_linear_weights_int8

    monkeypatch.setenv("SGLANG_CPU_SMALL_M_LINEAR", "4")  # int8 up to 4 rows, whatever was measured
    E, H, I, K = 8, 64, 64, 2
    experts = StackedExperts(E, H, I)
    x, w13, w2, weights, ids = _case(torch.bfloat16, 4, K, E, H, I, "random")
    experts.gate_up_proj.data, experts.down_proj.data = w13, w2
    float_out = experts(x, weights, ids)
    assert quantize_linear_weights_int8(experts) == 1
    q13, s13, q2, s2 = experts.int8_experts
    assert q13.dtype == torch.int8 and s13.shape == (E, 2 * I) and s2.shape == (E, H)
    int8_out = experts(x, weights, ids)
    _check(int8_out, loop_reference(x, q13, q2, weights, ids, s13, s2), torch.bfloat16)
    assert not torch.equal(int8_out, float_out)
    big = _case(torch.bfloat16, 5, K, E, H, I, "random")
    assert torch.equal(experts(big[0], big[3], big[4]), _float_forward(experts, big))


def _float_forward(experts, case):
    saved, experts.int8_experts = experts.int8_experts, None
    try:
        return experts(case[0], case[3], case[4])
    finally:
        experts.int8_experts = saved
