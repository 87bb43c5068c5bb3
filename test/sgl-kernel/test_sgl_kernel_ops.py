"""Each torch.ops.sgl_kernel op against the torch expression it replaces, for every kernel set
this CPU runs (generic, avx2, avx512, avx512bf16), odd shapes, fp32 and bf16.

Outputs are NaN-poisoned: with deterministic mode and `fill_uninitialized_memory`, torch fills
every tensor the ops allocate with NaN, so an element a kernel forgets to write fails the test.
"""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

import sgl_kernel

pytestmark = pytest.mark.skipif(not sgl_kernel.load(), reason=f"sgl-kernel: {sgl_kernel.unavailable_reason()}")
ops = torch.ops.sgl_kernel
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def test_poisoning_is_on(isa):
    assert torch.empty(4).isnan().all()  # the premise of every test here


def _close(got, want, dtype, **kw):
    assert not got.isnan().any(), "an output element was left unwritten (NaN poison) or is NaN"
    torch.testing.assert_close(got.float(), want.float(), **(kw or TOL[dtype]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (1, 7, 13), (2, 64, 64), (3, 130, 257), (5, 33, 96), (17, 9, 200)])
def test_linear(isa, dtype, M, N, K):
    g = torch.Generator().manual_seed(M * 1000 + N * 10 + K)
    x = torch.randn(M, K, generator=g).to(dtype)
    w = torch.randn(N, K, generator=g).to(dtype)
    bias = torch.randn(N, generator=g).to(dtype)
    want = F.linear(x.float(), w.float(), bias.float()).to(dtype)
    _close(ops.linear(x, w, None, bias), want, dtype)
    _close(ops.linear(x, w, None, None), F.linear(x.float(), w.float()).to(dtype), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M", [4, 7, 16, 33])
@pytest.mark.parametrize("N,K", [(48, 64), (50, 576), (19, 95)])
def test_linear_register_tiles(isa, dtype, M, N, K):
    """Row counts of whole register tiles, of 2 + 2 and of tails; N leaving one-row columns after
    whole tiles; K with a tail after the vector steps (32 for vdpbf16ps, 16/8/4 otherwise)."""
    g = torch.Generator().manual_seed(M * 7 + N * 3 + K)
    x = torch.randn(M, K, generator=g).to(dtype)
    w = torch.randn(N, K, generator=g).to(dtype)
    bias = torch.randn(N, generator=g).to(dtype)
    _close(ops.linear(x, w, None, bias), F.linear(x.float(), w.float(), bias.float()).to(dtype), dtype)


def test_linear_keeps_leading_dims_and_strided_rows(isa):
    x = torch.randn(2, 3, 40)[..., :32]  # strided rows
    w = torch.randn(10, 32)
    _close(ops.linear(x, w, None, None), F.linear(x, w), torch.float32)
    assert ops.linear(torch.randn(0, 32), w, None, None).shape == (0, 10)
    xb = torch.randn(5, 100).bfloat16()[:, :64]  # bf16 rows read in place (vdpbf16ps path)
    wb = torch.randn(20, 64).bfloat16()
    _close(ops.linear(xb, wb, None, None), F.linear(xb.float(), wb.float()).bfloat16(), torch.bfloat16)


@pytest.mark.parametrize("M", [1, 2, 5])
def test_linear_int8_weights(isa, M):
    w = torch.randint(-127, 128, (37, 65), dtype=torch.int8)
    scale = torch.rand(37) * 0.01
    x = torch.randn(M, 65)
    want = F.linear(x, w.float() * scale[:, None])
    _close(ops.linear(x, w, scale, None), want, torch.float32, atol=1e-4, rtol=1e-4)


def test_avx512bf16_linear_multiplies_bf16_pairs(isa):
    """The avx512bf16 and amx sets must really take the vdpbf16ps path for bf16 x bf16 (a dispatch slip
    would pass every accuracy test on the FMA path). Its fingerprint: the instruction flushes a
    denormal input to zero, which an fp32 FMA does not."""
    x = torch.zeros(1, 32, dtype=torch.bfloat16)
    w = torch.zeros(4, 32, dtype=torch.bfloat16)
    x[0, 0] = 2.0 ** -130  # a bf16 denormal
    w[:, 0] = 2.0 ** 100
    got = ops.linear(x, w, None, None).float()
    want = 0.0 if isa in ("avx512bf16", "amx") else 2.0 ** -30
    assert torch.equal(got, torch.full((1, 4), want)), (isa, got)


def test_amx_set_multiplies_bf16_panels_on_tiles():
    """The amx set must really take the tile path for bf16 panels (every accuracy test passes on the
    vdpbf16ps tiles too). Its fingerprint: tdpbf16ps sums a k block in another order than
    vdpbf16ps, so a sum whose last bits depend on the order (1 + 2^-24 + 2^-24(1 + 2^-6) - 1)
    comes out differently, while both stay within bf16 rounding of the exact 2^-23 + 2^-30."""
    if "amx" not in sgl_kernel.supported_isas():
        pytest.skip("needs a CPU with AMX-BF16 (and the tile state granted by Linux)")
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 2], x[0, 3], x[0, 4] = 1.0, 1.0, 1 + 2.0 ** -6, 1.0
    w = torch.zeros(32, 32)
    w[:, 0], w[:, 2], w[:, 3], w[:, 4] = 1.0, 2.0 ** -24, 2.0 ** -24, -1.0
    packed = ops.pack_linear_weight(w.bfloat16())
    got = {}
    before = sgl_kernel.isa()
    try:
        for name in ("amx", "avx512bf16"):
            sgl_kernel.use_isa(name)
            got[name] = ops.linear(x.bfloat16(), packed, None, None).float()
    finally:
        sgl_kernel.use_isa(before)
    assert not torch.equal(got["amx"], got["avx512bf16"]), got
    for v in got.values():
        assert ((v > 0) & (v <= 2.0 ** -22)).all(), got


@pytest.mark.parametrize("M", [1, 4, 16])
@pytest.mark.parametrize("K", [65, 576, 2100])
def test_linear_int8_weights_bf16_activations(isa, M, K):
    """What --quantization w8a16_int8 runs in a bf16 model: int8 rows, bf16 activations (with
    AVX512-BF16: converted to bf16 in registers, or once per column into a buffer when several
    row passes read it, K <= 2048)."""
    g = torch.Generator().manual_seed(M + K)
    w = torch.randint(-127, 128, (37, K), dtype=torch.int8, generator=g)
    scale = torch.rand(37, generator=g) * 0.01
    bias = torch.randn(37, generator=g)
    x = torch.randn(M, K, generator=g).bfloat16()
    want = F.linear(x.float(), w.float() * scale[:, None], bias).bfloat16()
    _close(ops.linear(x, w, scale, bias), want, torch.bfloat16)


def test_pack_linear_weight_layout():
    """Panel p, pair q holds w[32p + c, 2q + e] at 2c + e; past K, zeros (the odd K's last pair)."""
    N, K = 64, 7
    w = torch.arange(N * K, dtype=torch.float32).reshape(N, K).bfloat16()
    packed = ops.pack_linear_weight(w)
    assert packed.shape == (2, 4, 64) and packed.dtype == torch.bfloat16
    for p, q, c, e in [(0, 0, 0, 0), (0, 0, 0, 1), (1, 2, 31, 1), (1, 3, 5, 0), (0, 1, 17, 0)]:
        assert packed[p, q, 2 * c + e] == w[32 * p + c, 2 * q + e]
    assert (packed[:, 3, 1::2] == 0).all()
    # fp32: panel p, row k holds w[32p + c, k] at c (no padding)
    w32 = w.float()
    packed32 = ops.pack_linear_weight(w32)
    assert packed32.shape == (2, 7, 32) and packed32.dtype == torch.float32
    assert torch.equal(packed32, w32.reshape(2, 32, 7).transpose(1, 2))
    with pytest.raises(RuntimeError, match="multiple of 32"):
        ops.pack_linear_weight(torch.randn(48, 16).bfloat16())
    with pytest.raises(RuntimeError, match="bf16 or fp32"):
        ops.pack_linear_weight(torch.randn(32, 16).half())


@pytest.mark.parametrize("M", [1, 2, 3, 5, 7, 12, 13, 16, 25, 33, 48, 200])
@pytest.mark.parametrize("N,K", [(32, 1), (96, 33), (64, 64), (32, 577)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_linear_panels(isa, M, N, K, dtype):
    """Weights packed in panels, bf16 and fp32: whole register tiles and every tail (AVX512-BF16:
    12 rows; AVX2: the asm tiles of 3 to 6 rows and the one-pass tile of 1-2 rows), M past the row
    block (192 rows; AVX2: as many as fit 256 KB of fp32 rows), odd K (the last k alone), one and
    several panels; elsewhere the plain loop over the same layout. AMX (K a multiple of 32): tiles
    of M < 16 rows, pairs of 16-row groups, a group alone, the zero-padded last group, 200 rows past
    the 192-row block."""
    g = torch.Generator().manual_seed(M * 31 + N + K)
    x = torch.randn(M, K, generator=g).to(dtype)
    w = torch.randn(N, K, generator=g).to(dtype)
    bias = torch.randn(N, generator=g).to(dtype)
    packed = ops.pack_linear_weight(w)
    tol = {} if dtype == torch.bfloat16 else dict(atol=1e-4, rtol=1e-4)  # fp32: a k-ordered sum of up to 577
    _close(ops.linear(x, packed, None, bias), F.linear(x.float(), w.float(), bias.float()).to(dtype), dtype, **tol)
    _close(ops.linear(x, packed, None, None), F.linear(x.float(), w.float()).to(dtype), dtype, **tol)


def test_linear_panels_strided_rows_leading_dims_and_checks(isa):
    for k, n in ((64, 3), (64, 20), (40, 7)):  # K = 64: AMX tiles read the strided rows in place
        wk = torch.randn(64, k).bfloat16()
        x = torch.randn(2, n, k + 16).bfloat16()[..., :k]  # strided rows under two leading dims
        got = ops.linear(x, ops.pack_linear_weight(wk), None, None)
        assert got.shape == (2, n, 64)
        _close(got, F.linear(x.float(), wk.float()).bfloat16(), torch.bfloat16)
    w = torch.randn(64, 40).bfloat16()
    packed = ops.pack_linear_weight(w)
    with pytest.raises(RuntimeError, match="bf16 activations"):
        ops.linear(torch.randn(3, 40), packed, None, None)
    with pytest.raises(RuntimeError, match="panel weights"):
        ops.linear(torch.randn(3, 41).bfloat16(), packed, None, None)
    packed32 = ops.pack_linear_weight(w.float())
    with pytest.raises(RuntimeError, match="fp32 activations"):
        ops.linear(torch.randn(3, 40).bfloat16(), packed32, None, None)
    with pytest.raises(RuntimeError, match="panel weights"):
        ops.linear(torch.randn(3, 41), packed32, None, None)


@pytest.mark.parametrize("M", [1, 7, 13, 64, 200])
@pytest.mark.parametrize("N,K,packed", [(64, 576, True), (96, 33, True), (32, 1, True), (50, 96, False),
                                        (7, 13, False)])
def test_linear_fp32_out_is_the_bf16_linear_widened_or_the_fp32_sums(isa, M, N, K, packed):
    """out_dtype=float32 for bf16 x (the LM head's logits): round_to_x stores exactly what the
    bf16 linear then .float() gives (panel tiles and row-major tiles, the vector and the scalar
    epilogue, round in their store); round_to_x=False stores the fp32 sums (--enable-fp32-lm-head),
    which bf16's rounding does not hide."""
    g = torch.Generator().manual_seed(M * 7 + N + K)
    x = torch.randn(M, K, generator=g).bfloat16()
    w = torch.randn(N, K, generator=g).bfloat16()
    bias = torch.randn(N, generator=g).bfloat16()
    weight = ops.pack_linear_weight(w) if packed else w
    for b in (bias, None):
        widened = ops.linear(x, weight, None, b, torch.float32)
        assert widened.dtype == torch.float32 and widened.shape == (M, N)
        assert not widened.isnan().any()
        assert torch.equal(widened, ops.linear(x, weight, None, b).float())
        sums = ops.linear(x, weight, None, b, torch.float32, False)
        assert sums.dtype == torch.float32 and not sums.isnan().any()
        want = F.linear(x.float(), w.float(), None if b is None else b.float())
        torch.testing.assert_close(sums, want, atol=1e-4, rtol=1e-4)
        if K > 1:  # sums of products of bf16 values are rarely bf16 values themselves
            assert not torch.equal(sums, widened)
    assert torch.equal(ops.linear(x.float(), w.float(), None, bias.float(), torch.float32),
                       ops.linear(x.float(), w.float(), None, bias.float()))
    with pytest.raises(RuntimeError, match="out_dtype"):
        ops.linear(x, weight, None, None, torch.float16)


@pytest.mark.parametrize("M", [1, 7, 16, 64, 200])
@pytest.mark.parametrize("N,K", [(64, 576), (96, 33), (32, 1), (320, 64)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_linear_argmax_is_the_argmax_of_the_stored_logits(isa, M, N, K, dtype):
    """linear_argmax(x, panels) is torch.argmax of linear(x, panels, out_dtype=float32): the same
    values compared (bf16's widened logits or the fp32 sums), ties to the first column (duplicated
    weight rows in different panels and lanes, and bf16 rounding), NaN above every number (a NaN
    bias column; NaN x makes the whole row NaN), all -inf giving 0; every kernel set, one and
    several panels and threads' ranges, AMX's tiles and the vector tiles."""
    g = torch.Generator().manual_seed(M * 13 + N + K)
    x = torch.randn(M, K, generator=g).to(dtype)
    w = torch.randn(N, K, generator=g).to(dtype)
    w[N - 1] = w[N // 2] = w[3]  # equal logits in columns 3, N / 2, N - 1
    packed = ops.pack_linear_weight(w)
    nan_bias = torch.randn(N, generator=g).to(dtype)
    nan_bias[N - 2] = float("nan")
    x_nan = x.clone()
    x_nan[M // 2, 0] = float("nan")
    for xs, bias in ((x, None), (x, torch.randn(N, generator=g).to(dtype)), (x, nan_bias), (x_nan, None),
                     (x, torch.full((N,), float("-inf")).to(dtype))):
        for round_to_x in (True, False):
            logits = ops.linear(xs, packed, None, bias, torch.float32, round_to_x)
            got = ops.linear_argmax(xs, packed, bias, round_to_x)
            assert got.dtype == torch.int64 and got.shape == (M,)
            assert torch.equal(got, torch.argmax(logits, dim=-1)), (bias, round_to_x)
    # ties at each row's maximum: equal weight rows in one lane of two panels and in another lane
    # (another thread's range for N = 320), the rows' x positive so that those columns win
    tied = [c for c in (3, 35, N - 1) if c < N]
    w2 = (torch.rand(N, K, generator=g) * 0.01).to(dtype)
    w2[tied] = 1.0
    x2 = x.abs() + 0.1
    want = torch.full((M,), 3, dtype=torch.int64)
    packed2 = ops.pack_linear_weight(w2)
    for round_to_x in (True, False):
        assert torch.equal(torch.argmax(ops.linear(x2, packed2, None, None, torch.float32, round_to_x), -1), want)
        assert torch.equal(ops.linear_argmax(x2, packed2, None, round_to_x), want)
    w3 = torch.zeros(N, K).to(dtype)  # every logit equal: column 0
    assert torch.equal(ops.linear_argmax(x, ops.pack_linear_weight(w3), None), torch.zeros(M, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="panel weights"):
        ops.linear_argmax(x, w, None)


def test_linear_fp32_out_of_int8_weights(isa):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 96, generator=g).bfloat16()
    q = torch.randint(-127, 128, (40, 96), generator=g, dtype=torch.int8)
    scale = torch.rand(40, generator=g) / 64
    assert torch.equal(ops.linear(x, q, scale, None, torch.float32), ops.linear(x, q, scale, None).float())
    want = F.linear(x.float(), q.float() * scale[:, None])
    torch.testing.assert_close(ops.linear(x, q, scale, None, torch.float32, False), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("M", [1, 5, 6, 7, 13, 40, 200])
@pytest.mark.parametrize("I,K,packed", [(32, 1, True), (64, 33, True), (96, 576, True), (48, 64, True),
                                         (16, 40, False), (96, 33, False)])
def test_linear_silu_mul_is_silu_and_mul_of_linear(isa, M, I, K, packed):
    """linear_silu_mul(x, gate_up) is bit-identical to silu_and_mul(linear(x, gate_up)): over panel
    weights one pass (6-row gated tiles and every tail, M past the 192-row block, odd K, one and
    several gate panels, a bias; bf16 and fp32 panels); I not a multiple of 32 (gate and up panels
    would straddle) and plain weights take the two-op path."""
    g = torch.Generator().manual_seed(M * 7 + I + K)
    x = torch.randn(M, K, generator=g).bfloat16()
    w = (torch.randn(2 * I, K, generator=g) / K ** 0.5 * 3).bfloat16()
    bias = torch.randn(2 * I, generator=g).bfloat16()
    if packed and (2 * I) % 32:
        pytest.skip("not packable")
    wt = ops.pack_linear_weight(w) if packed else w
    for b in (bias, None):
        got = ops.linear_silu_mul(x, wt, None, b)
        assert got.shape == (M, I) and not got.isnan().any()
        assert torch.equal(got, ops.silu_and_mul(ops.linear(x, wt, None, b)))
    if packed:
        _close(ops.linear_silu_mul(x, wt, None, bias),
               ops.silu_and_mul(F.linear(x.float(), w.float(), bias.float()).bfloat16()), torch.bfloat16)
    x32 = x.float()
    assert torch.equal(ops.linear_silu_mul(x32, w.float(), None, None), ops.silu_and_mul(ops.linear(x32, w.float(), None, None)))
    if packed:  # fp32 panels: the same one pass
        wt32 = ops.pack_linear_weight(w.float())
        got = ops.linear_silu_mul(x32, wt32, None, bias.float())
        assert torch.equal(got, ops.silu_and_mul(ops.linear(x32, wt32, None, bias.float())))
        _close(got, ops.silu_and_mul(F.linear(x32, w.float(), bias.float())), torch.float32)


def test_fp32_panel_tiles_give_the_same_bits_on_every_set():
    """The AVX2 tiles and the 512-bit ones sum every fp32 output as one FMA chain in k order, so a
    model's fp32 results do not depend on which of those kernel sets the machine picks (odd K,
    every tile size, gated and plain, a bias)."""
    sets = [s for s in sgl_kernel.supported_isas() if s in ("avx2", "avx512", "avx512bf16", "amx")]
    if len(sets) < 2:
        pytest.skip(f"needs the AVX2 and a 512-bit kernel set, this CPU runs {sets}")
    g = torch.Generator().manual_seed(5)
    w = torch.randn(128, 577, generator=g) / 24
    bias = torch.randn(128, generator=g)
    packed = ops.pack_linear_weight(w)
    before = sgl_kernel.isa()
    try:
        for M in (1, 2, 5, 13, 200):
            x = torch.randn(M, 577, generator=g)
            got = {}
            for name in sets:
                sgl_kernel.use_isa(name)
                got[name] = (ops.linear(x, packed, None, bias), ops.linear_silu_mul(x, packed, None, bias))
            for name in sets[1:]:
                assert torch.equal(got[name][0], got[sets[0]][0]), (M, name)
                assert torch.equal(got[name][1], got[sets[0]][1]), (M, name)
    finally:
        sgl_kernel.use_isa(before)


def _torch_rmsnorm(x, w, eps):  # the layer's arithmetic (layers/layernorm.py)
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    return w * F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,H", [(1, 1), (3, 7), (17, 576), (2, 1000)])
def test_rmsnorm_and_add_rmsnorm(isa, dtype, rows, H):
    x = torch.randn(rows, H).to(dtype)
    r = torch.randn(rows, H).to(dtype)
    w = (torch.rand(H) + 0.5).to(dtype)
    _close(ops.rmsnorm(x, w, 1e-6), _torch_rmsnorm(x, w, 1e-6), dtype)
    out, summed = ops.add_rmsnorm(x, r, w, 1e-5)
    assert torch.equal(summed, x + r)  # rounded to the dtype exactly as torch's add
    _close(out, _torch_rmsnorm(x + r, w, 1e-5), dtype)


def test_rmsnorm_propagates_nan_per_row(isa):
    x = torch.randn(3, 16)
    x[1, 5] = float("nan")
    out = ops.rmsnorm(x, torch.ones(16), 1e-6)
    assert out[1].isnan().all() and not out[[0, 2]].isnan().any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,d", [(1, 1), (3, 17), (9, 1536)])
def test_silu_and_mul(isa, dtype, rows, d):
    x = (torch.randn(rows, 2 * d) * 4).to(dtype)
    x[0, 0] = -100.0  # silu's far tails
    want = (F.silu(x[:, :d]) * x[:, d:])
    _close(ops.silu_and_mul(x), want, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,hq,hk,head,rd", [(1, 1, 1, 2, 2), (5, 9, 3, 64, 64), (4, 4, 2, 80, 32)])
def test_rotary_embedding_on_strided_views(isa, dtype, T, hq, hk, head, rd):
    from sglang.srt.layers import cpu_ops
    from sglang.srt.layers.rotary_embedding import RotaryEmbedding

    rope = RotaryEmbedding(head, rd, 512, 10000.0)
    qkv = torch.randn(T, (hq + 2 * hk) * head).to(dtype)
    q, k, _ = qkv.split([hq * head, hk * head, hk * head], dim=-1)
    before = qkv.clone()
    positions = torch.randint(0, 512, (T,))
    with cpu_ops.torch_fallbacks():
        want_q, want_k = rope(positions, q, k)
    got_q, got_k = ops.rotary_embedding(positions, q, k, head, rope.cos_cached, rope.sin_cached)
    assert torch.equal(qkv, before)  # inputs untouched
    exact = dict(atol=0, rtol=0) if dtype == torch.bfloat16 else {}  # bf16: every rounding as torch's
    _close(got_q, want_q, dtype, **exact)
    _close(got_k, want_k, dtype, **exact)


def test_rotary_embedding_refuses_positions_outside_the_table(isa):
    q, k = torch.randn(2, 8), torch.randn(2, 8)
    with pytest.raises(RuntimeError, match="outside the table"):  # C++ checks too, not only the layer
        ops.rotary_embedding(torch.tensor([0, 64]), q, k, 8, torch.randn(64, 8), torch.randn(64, 8))


def _ref_decode(q, k_cache, v_cache, r2t, rows, lens, slot_map, scale, window, cap):
    B, hk, d = q.shape[0], k_cache.shape[1], k_cache.shape[2]
    hq = q.shape[1] // d
    out = []
    for b in range(B):
        n = int(lens[b])
        lo = max(0, n - window) if window > 0 else 0
        slots = r2t[rows[b], lo:n].long()
        if slot_map is not None:
            slots = slot_map[slots]
        k = k_cache[slots].float().repeat_interleave(hq // hk, dim=1)  # [L, hq, d]
        v = v_cache[slots].float().repeat_interleave(hq // hk, dim=1)
        s = torch.einsum("hd,lhd->hl", q[b].float().view(hq, d), k) * scale
        if cap > 0:
            s = cap * torch.tanh(s / cap)
        out.append(torch.einsum("hl,lhd->hd", s.softmax(-1), v).reshape(-1))
    return torch.stack(out)


def _random_pool(g, dtype, hk, d, dv, lens, width, index_dtype):
    """A 2048-slot K/V pool of random values and req_to_token rows 4, 1, 3 holding `lens` random
    distinct slots each (slot 0, the padding slot, unused)."""
    S = 2048
    k_cache = torch.randn(S, hk, d, generator=g).to(dtype)
    v_cache = torch.randn(S, hk, dv, generator=g).to(dtype)
    r2t = torch.zeros(5, width, dtype=index_dtype)
    rows = torch.tensor([4, 1, 3][: len(lens)])
    for b, n in enumerate(lens):
        r2t[rows[b], :n] = (torch.randperm(S - 1, generator=g)[:n] + 1).to(index_dtype)
    return k_cache, v_cache, r2t, rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq,hk,d,lens,window,cap", [
    (1, 1, 8, [1], -1, 0.0),
    (9, 3, 64, [1, 33, 300], -1, 0.0),     # GQA, a context split across threads
    (4, 4, 16, [700, 2, 65], 48, 0.0),     # sliding window
    (6, 2, 32, [5, 129], -1, 30.0),        # logit cap
    (2, 1, 8, [1000], -1, 0.0),            # batch 1, long: split-K
    (8, 2, 24, [45, 1, 64], -1, 0.0),      # head dim not a whole number of vectors; exact blocks
])
def test_decode_attention(isa, dtype, hq, hk, d, lens, window, cap):
    g = torch.Generator().manual_seed(len(lens) * 7 + hq)
    k_cache, v_cache, r2t, rows = _random_pool(g, dtype, hk, d, d, lens, 1100, torch.int32)
    q = torch.randn(len(lens), hq * d, generator=g).to(dtype)
    lens_t = torch.tensor(lens)
    got = ops.decode_attention(q, k_cache, v_cache, r2t, rows, lens_t, None, d ** -0.5, window, cap)
    want = _ref_decode(q, k_cache, v_cache, r2t, rows, lens_t, None, d ** -0.5, window, cap)
    _close(got, want, dtype, **(dict(atol=2e-4, rtol=2e-4) if dtype == torch.float32 else {}))


@pytest.mark.parametrize("lens", [[70, 3], [1500]])  # one split per (request, kv head) / split-K
def test_decode_attention_value_dim_differs_from_key_dim(isa, lens):
    g = torch.Generator().manual_seed(5)
    S, hq, hk, d, dv = 4096, 6, 2, 24, 40
    k_cache, v_cache = torch.randn(S, hk, d, generator=g), torch.randn(S, hk, dv, generator=g)
    r2t = torch.randperm(S - 1, generator=g)[: 2 * 1500].view(2, 1500) + 1
    rows, lens_t = torch.arange(len(lens)), torch.tensor(lens)
    q = torch.randn(len(lens), hq * d, generator=g)
    got = ops.decode_attention(q, k_cache, v_cache, r2t, rows, lens_t, None, 0.3, -1, 0.0)
    assert got.shape == (len(lens), hq * dv)
    want = _ref_decode(q, k_cache, v_cache, r2t, rows, lens_t, None, 0.3, -1, 0.0)
    _close(got, want, torch.float32, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq,hk,d,dv,prefix,extend,window,cap", [
    (1, 1, 8, 8, [0], [1], -1, 0.0),
    (9, 3, 64, 64, [0, 40, 0], [37, 5, 1], -1, 0.0),   # GQA; a cached prefix; a 1-token extend
    (4, 4, 16, 16, [300, 0], [20, 90], 48, 0.0),       # sliding window over prefix and new tokens
    (6, 2, 32, 32, [5, 0], [17, 3], -1, 30.0),         # logit cap
    (8, 2, 24, 40, [100, 0, 7], [0, 33, 2], -1, 0.0),  # dims not whole vectors, dv != d, empty extend
    (4, 2, 128, 128, [30, 0], [50, 19], 40, 20.0),     # head dim 128 (compiled as a constant), window, cap
    (2, 1, 64, 64, [17], [70], 25, 0.0),               # head dim 64 with a window and a partial last block
    # longer than the AMX kernel's 512-key chunks (merged online), with and without a window;
    # head dim 96 (three 32-dim tiles, value dims past one group of four 16-dim tiles)
    (9, 3, 64, 64, [700, 0], [90, 45], -1, 0.0),
    (6, 3, 64, 64, [900], [100], 600, 0.0),
    (4, 2, 96, 96, [300, 530], [70, 20], -1, 0.0),
    # a window narrower than a work item's tokens (16 lanes = 5-6 tokens at 3 heads a group), d != dv
    (6, 2, 64, 32, [40, 0], [70, 33], 3, 0.0),
])
def test_extend_attention(isa, dtype, hq, hk, d, dv, prefix, extend, window, cap):
    """Each new token is a decode query over its request's slots up to its own position."""
    g = torch.Generator().manual_seed(sum(extend) + hq)
    seq = [p + n for p, n in zip(prefix, extend)]
    k_cache, v_cache, r2t, rows = _random_pool(g, dtype, hk, d, dv, seq, max(600, *seq), torch.int64)
    T = sum(extend)
    q = torch.randn(T, hq * d, generator=g).to(dtype)
    got = ops.extend_attention(q, k_cache, v_cache, r2t, rows, torch.tensor(prefix), torch.tensor(extend), None,
                               d ** -0.5, window, cap)
    assert got.shape == (T, hq * dv) and got.dtype == dtype
    tok_rows = torch.cat([torch.full((n,), int(rows[b])) for b, n in enumerate(extend)])
    tok_lens = torch.cat([torch.arange(prefix[b] + 1, prefix[b] + n + 1) for b, n in enumerate(extend)])
    want = _ref_decode(q, k_cache, v_cache, r2t, tok_rows, tok_lens, None, d ** -0.5, window, cap)
    _close(got, want, dtype, **(dict(atol=2e-4, rtol=2e-4) if dtype == torch.float32 else {}))


# Runs the AMX extend attention 220 times, each from a new Python thread: each such thread is the
# master of its own 2-thread OpenMP team, which ends with it (as torch's workers end when the thread
# count changes or the OpenMP runtime is paused); prints the RSS growth (MB) from call 20 to 220.
SCRATCH_WORKER = r"""
import threading, torch, sgl_kernel
sgl_kernel.load(); sgl_kernel.use_isa("amx"); torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
S, hk, hq, d = 4096, 2, 8, 64
k, v = torch.randn(S, hk, d, generator=g).bfloat16(), torch.randn(S, hk, d, generator=g).bfloat16()
r2t = torch.arange(1, 2 * 1024 + 1).view(2, 1024)
q = torch.randn(2 * 300, hq * d, generator=g).bfloat16()
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
def call():
    torch.set_num_threads(2)
    torch.ops.sgl_kernel.extend_attention(q, k, v, r2t, torch.arange(2), torch.tensor([0, 100]),
                                          torch.tensor([300, 300]), None, d ** -0.5, -1, 0.0)
for i in range(220):
    t = threading.Thread(target=call)
    t.start(); t.join()
    if i == 19:
        base = rss()
print(rss() - base)
"""


def test_amx_extend_scratch_goes_with_its_thread():
    """The AMX extend kernel's per-thread scratch is freed when its thread ends (it leaked ~330 KB a
    thread: a server whose OpenMP workers are ever replaced would grow with each)."""
    if "amx" not in sgl_kernel.supported_isas():
        pytest.skip("needs a CPU with AMX-BF16 (and the tile state granted by Linux)")
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", SCRATCH_WORKER], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout.strip().splitlines()[-1]) < 8.0, out.stdout


@pytest.mark.parametrize("dtype,d", [(torch.float32, 16), (torch.bfloat16, 64)])  # bf16 64: the AMX kernel's
def test_extend_attention_through_a_slot_map_and_int32_rows(isa, dtype, d):
    S, hk = 256, 2
    k_cache, v_cache = torch.randn(S, hk, d).to(dtype), torch.randn(S, hk, d).to(dtype)
    slot_map = torch.randperm(S)
    r2t = torch.arange(200, dtype=torch.int32).view(2, 100)
    q = torch.randn(30, 4 * d).to(dtype)
    prefix, extend = torch.tensor([50, 10]), torch.tensor([25, 5])
    got = ops.extend_attention(q, k_cache, v_cache, r2t, torch.tensor([1, 0]), prefix, extend, slot_map, 0.25, 12, 0.0)
    tok_rows = torch.tensor([1] * 25 + [0] * 5)
    tok_lens = torch.cat([torch.arange(51, 76), torch.arange(11, 16)])
    want = _ref_decode(q, k_cache, v_cache, r2t, tok_rows, tok_lens, slot_map, 0.25, 12, 0.0)
    _close(got, want, dtype, **(dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else {}))


def test_extend_attention_refuses_bad_lengths(isa):
    args = (torch.randn(4, 8), torch.randn(8, 1, 8), torch.randn(8, 1, 8), torch.zeros(1, 6, dtype=torch.int64),
            torch.tensor([0]))
    with pytest.raises(RuntimeError, match="outside req_to_token"):
        ops.extend_attention(*args, torch.tensor([3]), torch.tensor([4]), None, 1.0, -1, 0.0)
    with pytest.raises(RuntimeError, match="add up to 3, q has 4 rows"):
        ops.extend_attention(*args, torch.tensor([0]), torch.tensor([3]), None, 1.0, -1, 0.0)
    with pytest.raises(RuntimeError, match="empty cache dimensions"):  # not a division by zero
        ops.extend_attention(torch.randn(4, 8), torch.randn(8, 1, 0), torch.randn(8, 1, 0), *args[3:],
                             torch.tensor([0]), torch.tensor([4]), None, 1.0, -1, 0.0)
    with pytest.raises(RuntimeError, match="empty cache dimensions"):
        ops.decode_attention(torch.randn(1, 8), torch.randn(8, 0, 8), torch.randn(8, 0, 8), *args[3:],
                             torch.tensor([4]), None, 1.0, -1, 0.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B,V", [(1, 1), (3, 7), (2, 16), (5, 100), (16, 49152), (4, 49155)])
def test_argmax_matches_torch(isa, dtype, B, V):
    g = torch.Generator().manual_seed(B * V)
    x = torch.randn(B, V + 3, generator=g).to(dtype)[:, :V]  # rows with a stride
    x[0, V // 2] = x[0].max()  # a tie: the first index wins
    if B > 2:
        x[1, V - 1] = float("nan")  # NaN beats every number
        x[1, V // 3] = float("nan")  # ... and the first NaN wins
        x[2] = float("-inf")  # all -inf: 0
    assert torch.equal(ops.argmax(x), torch.argmax(x, dim=-1))


def test_decode_attention_through_a_slot_map(isa):
    S, hk, d = 64, 2, 16
    k_cache, v_cache = torch.randn(S, hk, d), torch.randn(S, hk, d)
    slot_map = torch.randperm(S)
    r2t = torch.arange(40, dtype=torch.int64).view(1, 40)
    q = torch.randn(1, 4 * d)
    got = ops.decode_attention(q, k_cache, v_cache, r2t, torch.tensor([0]), torch.tensor([40]), slot_map,
                               0.25, 10, 0.0)
    want = _ref_decode(q, k_cache, v_cache, r2t, [0], [40], slot_map, 0.25, 10, 0.0)
    _close(got, want, torch.float32, atol=1e-5, rtol=1e-5)


def test_decode_attention_refuses_lengths_outside_req_to_token(isa):
    with pytest.raises(RuntimeError, match="outside req_to_token"):
        ops.decode_attention(torch.randn(1, 8), torch.randn(4, 1, 8), torch.randn(4, 1, 8),
                             torch.zeros(1, 3, dtype=torch.int64), torch.tensor([0]), torch.tensor([4]),
                             None, 1.0, -1, 0.0)


def test_isa_choice():
    assert sgl_kernel.isa() in sgl_kernel.supported_isas()
    assert "generic" in sgl_kernel.supported_isas()
    with pytest.raises(RuntimeError):
        sgl_kernel.use_isa("sve")


@pytest.mark.parametrize("rows,width,vocab", [(1, 64, 64), (3, 100, 100), (4, 130, 97), (16, 49152, 49152),
                                              (2, 49216, 49152)])
def test_apply_token_bitmask_matches_xgrammar(rows, width, vocab):
    """Whole-word fast paths (all allowed / all banned) and mixed words, bit 31 included; columns at
    or beyond vocab_size (padded logits) are left alone, as xgrammar does."""
    xgr = pytest.importorskip("xgrammar")
    g = torch.Generator().manual_seed(rows * 7 + width)
    words = (vocab + 31) // 32
    mask = torch.randint(-2**31, 2**31 - 1, (rows, words), dtype=torch.int32, generator=g)
    mask[:, ::3] = 0
    mask[:, 1::5] = -1
    mask[:, 2::7] = -2**31  # only bit 31 allowed
    logits = torch.randn(rows, width, generator=g)
    want = logits.clone()
    xgr.apply_token_bitmask_inplace(want, mask, vocab_size=vocab)
    ops.apply_token_bitmask_(logits, mask, vocab)
    assert torch.equal(logits, want)
    with pytest.raises(RuntimeError, match="float32"):
        ops.apply_token_bitmask_(logits.to(torch.bfloat16), mask, vocab)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_store_kv_scatters_rows_like_index_copy(dtype):
    """k/v rows (strided views of a fused qkv output, int32 or int64 slots) land in their slots,
    nothing else changes; slots outside the cache are refused."""
    g = torch.Generator().manual_seed(3)
    S, H, D, Dv, T = 300, 3, 16, 24, 70
    k_cache, v_cache = torch.randn(S, H, D, generator=g).to(dtype), torch.randn(S, H, Dv, generator=g).to(dtype)
    qkv = torch.randn(T, 40 + H * D + H * Dv, generator=g).to(dtype)
    k, v = qkv[:, 40:40 + H * D], qkv[:, 40 + H * D:]
    loc = torch.randperm(S, generator=g)[:T]
    want_k, want_v = k_cache.clone(), v_cache.clone()
    want_k.index_copy_(0, loc, k.reshape(T, H, D))
    want_v.index_copy_(0, loc, v.reshape(T, H, Dv))
    ops.store_kv_(k_cache, v_cache, loc.int(), k, v)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)
    ops.store_kv_(k_cache, v_cache, loc[:0], k[:0], v[:0])  # no tokens: nothing to do
    with pytest.raises(RuntimeError, match="outside the 300-slot cache"):
        ops.store_kv_(k_cache, v_cache, torch.tensor([0, S]), k[:2], v[:2])
    with pytest.raises(RuntimeError, match="one cache row per slot"):
        ops.store_kv_(k_cache, v_cache, loc[:3], k[:2], v[:2])
    with pytest.raises(RuntimeError, match="outside the 300-slot cache"):
        ops.store_kv_(k_cache, v_cache, torch.tensor([-1]), k[:1], v[:1])
    with pytest.raises(RuntimeError, match="int64 or int32"):
        ops.store_kv_(k_cache, v_cache, loc[:2].float(), k[:2], v[:2])
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)  # refused calls wrote nothing
