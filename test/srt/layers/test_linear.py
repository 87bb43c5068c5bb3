"""Merged projections: each HF tensor lands in its own slice; shape mismatches are rejected."""

import os

import pytest
import torch
import torch.nn.functional as F

from sglang.srt.layers.activation import SiluAndMul
from sglang.srt.layers.linear import MergedColumnParallelLinear, QKVParallelLinear


def test_qkv_shards_equal_separate_projections():
    g = torch.Generator().manual_seed(0)
    wq, wk, wv = (torch.randn(n, 8, generator=g) for n in (12, 6, 6))
    bq, bk, bv = (torch.randn(n, generator=g) for n in (12, 6, 6))
    layer = QKVParallelLinear(8, 3, 4, 2, bias=True)
    for shard, w, b in (("q", wq, bq), ("k", wk, bk), ("v", wv, bv)):
        layer.weight_loader(layer.weight, w, shard)
        layer.weight_loader(layer.bias, b, shard)
    x = torch.randn(5, 8, generator=g)
    q, k, v = layer(x).split([12, 6, 6], dim=-1)
    torch.testing.assert_close(q, F.linear(x, wq, bq))
    torch.testing.assert_close(k, F.linear(x, wk, bk))
    torch.testing.assert_close(v, F.linear(x, wv, bv))
    with pytest.raises(ValueError, match="Weight shape mismatch"):
        layer.weight_loader(layer.weight, torch.zeros(5, 8), "k")


def test_gate_up_and_silu_and_mul():
    g = torch.Generator().manual_seed(1)
    wg, wu = torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g)
    layer = MergedColumnParallelLinear(3, [4, 4])
    layer.weight_loader(layer.weight, wg, 0)
    layer.weight_loader(layer.weight, wu, 1)
    x = torch.randn(2, 3, generator=g)
    torch.testing.assert_close(SiluAndMul()(layer(x)), F.silu(x @ wg.T) * (x @ wu.T))


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
def test_packed_weight_matches_f_linear():
    from torch import nn

    from sglang.srt.layers.linear import ReplicatedLinear, pack_linear_weights
    from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead

    g = torch.Generator().manual_seed(2)
    model = nn.Module()
    model.proj = ReplicatedLinear(64, 96, bias=True)
    model.head = ParallelLMHead(200, 64)
    model.norm_like = nn.LayerNorm(64)  # has a weight but no packed slot: left alone
    for p in (model.proj.weight, model.proj.bias, model.head.weight):
        p.data.copy_(torch.randn(p.shape, generator=g))
    assert pack_linear_weights(model) == 2
    assert model.proj.packed_weight is not None and model.head.packed_weight is not None
    for shape in [(1, 64), (17, 64), (3, 5, 64), (0, 64)]:
        x = torch.randn(shape, generator=g)
        out = model.proj(x)
        assert out.shape == (*shape[:-1], 96)
        torch.testing.assert_close(out, F.linear(x, model.proj.weight, model.proj.bias), rtol=1e-5, atol=1e-4)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
def test_packed_bf16_weight_keeps_bf16_semantics():
    """bf16 layers stay bf16 in and out; on CPUs without native bf16 GEMMs the packed copy is
    the exact fp32 upcast, so the result is the fp32-accumulated product rounded to bf16."""
    from torch import nn

    from sglang.srt.layers.linear import ReplicatedLinear, pack_linear_weights

    g = torch.Generator().manual_seed(3)
    model = nn.Module()
    model.proj = ReplicatedLinear(128, 64, bias=True).to(torch.bfloat16)
    for p in (model.proj.weight, model.proj.bias):
        p.data.copy_(torch.randn(p.shape, generator=g))
    assert pack_linear_weights(model) == 1
    x = torch.randn(9, 128, generator=g).to(torch.bfloat16)
    out = model.proj(x)
    assert out.dtype == torch.bfloat16
    exact = F.linear(x.double(), model.proj.weight.double(), model.proj.bias.double())
    torch.testing.assert_close(out.double(), exact, rtol=1e-2, atol=2e-2)  # bf16 output rounding
    one = model.proj(x[:1])  # single row: torch's bf16 GEMV, same semantics
    torch.testing.assert_close(one.double(), exact[:1], rtol=1e-2, atol=2e-2)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
def test_packing_skipped_when_copies_exceed_the_memory_budget():
    from torch import nn

    from sglang.srt.layers.linear import ReplicatedLinear, pack_linear_weights

    model = nn.Module()
    model.a, model.b = ReplicatedLinear(32, 32), ReplicatedLinear(32, 32)
    for p in (model.a.weight, model.b.weight):
        p.data.normal_()
    need = 2 * 32 * 32 * 4
    assert pack_linear_weights(model, max_bytes=need - 1) == 0
    assert model.a.packed_weight is None and model.b.packed_weight is None
    x = torch.randn(3, 32)
    torch.testing.assert_close(model.a(x), F.linear(x, model.a.weight))
    assert pack_linear_weights(model, max_bytes=need) == 2


def test_crossover_search_stops_at_the_first_row_count_where_the_other_path_wins():
    import time

    from sglang.srt.layers.linear import ReplicatedLinear
    from sglang.srt.layers.linear_crossover import _crossover

    mod = ReplicatedLinear(8, 8)
    mod.weight.data.normal_()
    other = lambda x, m: time.sleep(0.002)  # noqa: E731
    small_until_4 = lambda x, m: time.sleep(0.0 if x.shape[0] <= 4 else 0.004)  # noqa: E731
    assert _crossover([mod], torch.float32, (1, 2, 4, 8, 16), small_until_4, other) == 4
    # not monotonic: the search ends at the first loss (8), 16 is not tried
    assert _crossover([mod], torch.float32, (1, 2, 8, 16),
                      lambda x, m: time.sleep(0.004 if x.shape[0] == 8 else 0.0), other) == 2
    assert _crossover([mod], torch.float32, (1, 2), lambda x, m: time.sleep(0.004), other) == 0


def test_crossover_margin_and_a_burst_of_noise(monkeypatch):
    """Scripted timings: with a margin the other path must win by that much (but not at the last
    candidate, where winning drops the other path for every larger row count); a loss is timed again
    before it ends the search, so a burst of load during one row count's rounds does not decide it."""
    from sglang.srt.layers import linear_crossover
    from sglang.srt.layers.linear import ReplicatedLinear

    mod = ReplicatedLinear(8, 8)
    seen = []
    record = lambda x, m: seen.append(x.shape[0])  # noqa: E731
    timings = {}  # rows -> list of (small, other) per timing, the last one repeating
    timed = []

    def scripted(passes):
        passes[0]()
        rows = seen[-1]
        timed.append(rows)
        script = timings[rows]
        return script[min(timed.count(rows), len(script)) - 1]

    monkeypatch.setattr(linear_crossover, "_least_seconds", scripted)
    crossover = lambda margin: linear_crossover._crossover([mod], torch.float32, (1, 2, 4), record, record,  # noqa: E731
                                                           margin=margin)
    timings.update({1: [(1.05, 1.0)], 2: [(1.05, 1.0)], 4: [(1.0, 1.0)]})  # the other path 5% faster
    assert crossover(0.0) == 0 and crossover(0.1) == 4
    timings.update({4: [(1.05, 1.0)]})  # ... at the last candidate too: not dropped for larger rows
    timed.clear()
    assert crossover(0.1) == 2
    timings.update({1: [(1.0, 1.0)], 2: [(3.0, 1.0), (1.0, 1.0)], 4: [(1.0, 1.0)]})  # a burst at 2 rows
    timed.clear()
    assert crossover(0.0) == 4 and timed.count(2) == 2  # timed twice, the least time counts
    timings.update({2: [(3.0, 1.0), (2.0, 1.0)]})  # slower both times: the search stops there
    timed.clear()
    assert crossover(0.0) == 1


@pytest.mark.parametrize("dtype,quantize", [(torch.float32, False), (torch.bfloat16, False), (torch.bfloat16, True)])
def test_measured_crossover_is_recorded_and_both_sides_of_it_compute_the_linear(monkeypatch, tmp_path, dtype, quantize):
    from torch import nn

    from sglang.srt.layers import cpu_ops, quantization
    from sglang.srt.layers.linear import ReplicatedLinear, pack_linear_weights
    from sglang.srt.layers.linear_crossover import SMALL_M_CANDIDATE_ROWS, measure_small_m_rows

    if not cpu_ops.available():
        pytest.skip("sgl-kernel is not built")
    monkeypatch.delenv("SGLANG_CPU_SMALL_M_LINEAR", raising=False)
    monkeypatch.setenv("SGLANG_CPU_TUNING_CACHE", str(tmp_path / "rows.json"))
    monkeypatch.setenv("SGLANG_CPU_LINEAR_PANELS", "0")  # the plain weights, where the crossover is
    # a sentinel no measurement gives (and this test's measurement stays in the test)
    monkeypatch.setitem(cpu_ops._state, "max_rows", {dtype: 99, torch.int8: 99})
    g = torch.Generator().manual_seed(5)
    model = nn.Module()
    model.a, model.b = ReplicatedLinear(256, 384, bias=True), ReplicatedLinear(384, 256)
    for p in model.parameters():
        p.data.copy_(torch.randn(p.shape, generator=g))
    model.to(dtype)
    if quantize:
        assert quantization.quantize_linear_weights_int8(model) == 2
    pack_linear_weights(model)
    found, source = measure_small_m_rows(model)
    assert set(found) == ({dtype, torch.int8} if quantize else {dtype}), source
    for kind, rows in found.items():
        assert rows in SMALL_M_CANDIDATE_ROWS  # at least 1: the fused decode layer needs it
        assert cpu_ops.linear_max_rows(kind) == rows
    rows = max(found.values())
    for n in {rows, rows + 1}:  # the kernel's side and oneDNN's side of the crossover
        x = torch.randn(n, 256, generator=g).to(dtype)
        ref = F.linear(x.double(), model.a.weight.double(), model.a.bias.double())
        tol = dict(rtol=2e-2, atol=0.5) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-3)
        if quantize:
            tol = dict(rtol=5e-2, atol=2.0)  # int8 weights: per-channel rounding
        torch.testing.assert_close(model.a(x).double(), ref, **tol)
    monkeypatch.setenv("SGLANG_CPU_SMALL_M_LINEAR", "3")  # the override: nothing measured
    assert measure_small_m_rows(model) == ({}, "") and cpu_ops.linear_max_rows(dtype) == 3


_MEASURE_IN_A_FRESH_PROCESS = """
import json, torch
from torch import nn
from sglang.srt.layers.linear import ReplicatedLinear, pack_linear_weights
from sglang.srt.layers.linear_crossover import measure_small_m_rows
torch.manual_seed(0)
model = nn.Module()
model.a, model.b = ReplicatedLinear(256, 512), ReplicatedLinear(512, 256)
for p in model.parameters():
    p.data.normal_()
model.to(torch.bfloat16)
pack_linear_weights(model)
found, source = measure_small_m_rows(model)
print(json.dumps({"rows": found[torch.bfloat16], "source": source}))
"""


def _measure_in_a_fresh_process(cache: str, threads: int = 1) -> dict:
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "SGLANG_CPU_TUNING_CACHE": cache, "OMP_NUM_THREADS": str(threads),
           "SGLANG_CPU_LINEAR_PANELS": "0"}
    env.pop("SGLANG_CPU_SMALL_M_LINEAR", None)
    out = subprocess.run([sys.executable, "-c", _MEASURE_IN_A_FRESH_PROCESS], env=env, check=True,
                         capture_output=True, text=True, timeout=300).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_the_crossover_is_measured_once_per_machine_and_kept_for_later_processes(tmp_path):
    """Seeded sampling depends on the choice (the two paths round differently), so a second
    server on the machine must make the first one's choice, not time it again."""
    import json

    from sglang.srt.layers import cpu_ops

    if not cpu_ops.available():
        pytest.skip("sgl-kernel is not built")
    cache = tmp_path / "sub" / "rows.json"  # the directory is made too
    first = _measure_in_a_fresh_process(str(cache))
    assert first["source"].startswith("measured on these weights"), first
    (entry,) = json.loads(cache.read_text()).values()
    assert entry["rows"] == {"torch.bfloat16": first["rows"]} and entry["key"]["threads"] == 1
    # a later process reads it: proven by a value no timing would give on its own here
    entry["rows"] = {"torch.bfloat16": 2 if first["rows"] != 2 else 4}
    cache.write_text(json.dumps({k: entry for k in json.loads(cache.read_text())}))
    second = _measure_in_a_fresh_process(str(cache))
    assert second == {"rows": entry["rows"]["torch.bfloat16"], "source": f"cached in {cache}"}
    # other threads: another key, measured and added next to the first (a measurement taken while
    # something else held a core is used but not kept, by design: such a moment is measured again)
    for _ in range(3):
        other = _measure_in_a_fresh_process(str(cache), threads=2)
        assert other["source"].startswith("measured"), other
        if "not kept" not in other["source"]:
            break
    assert len(json.loads(cache.read_text())) == 2
    # a damaged file is measured again and rewritten; "0" turns the cache off
    cache.write_text("{not json")
    assert _measure_in_a_fresh_process(str(cache))["source"].startswith("measured")
    assert len(json.loads(cache.read_text())) == 1
    assert _measure_in_a_fresh_process("0")["source"].startswith("measured")


def test_a_crossover_measured_while_other_processes_hold_the_cores_is_not_kept(tmp_path):
    """A measurement taken while another process computes (a build, a benchmark) picks the wrong
    path, and a kept one would stay wrong for every later server on the machine: here two busy
    processes hold both cores while a fresh process measures, and nothing is written."""
    import json
    import subprocess
    import sys

    from sglang.srt.layers import cpu_ops

    if not cpu_ops.available():
        pytest.skip("sgl-kernel is not built")
    cache = tmp_path / "rows.json"
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(max(os.cpu_count() or 1, 2))]
    try:
        busy = _measure_in_a_fresh_process(str(cache), threads=2)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert "not kept" in busy["source"], busy
    assert not cache.exists() or json.loads(cache.read_text()) == {}
    quiet = _measure_in_a_fresh_process(str(cache), threads=2)  # the cores are free again: kept
    assert "not kept" not in quiet["source"], quiet
    (entry,) = json.loads(cache.read_text()).values()
    assert entry["core_share"] >= 0.8


@pytest.mark.parametrize("isa", ["amx", "avx512bf16", "avx2"])
def test_bf16_weights_go_into_panels_and_take_every_batch_size(monkeypatch, tmp_path, isa):
    """On the kernel sets with a panel kernel (AVX512-BF16, AVX2) a bf16 weight of 32k rows is
    packed in panels, its kernel takes 1 row to prefill sizes (nothing to measure), and a weight
    of other rows keeps oneDNN."""
    from torch import nn

    import sgl_kernel
    from sglang.srt.layers import cpu_ops
    from sglang.srt.layers.linear import ReplicatedLinear, is_panel_weight, pack_linear_weights
    from sglang.srt.layers.linear_crossover import measure_small_m_rows

    if isa not in sgl_kernel.supported_isas():
        pytest.skip(f"needs a CPU with the {isa} kernel set")
    monkeypatch.delenv("SGLANG_CPU_SMALL_M_LINEAR", raising=False)
    monkeypatch.setenv("SGLANG_CPU_TUNING_CACHE", str(tmp_path / "rows.json"))
    before = sgl_kernel.use_isa(isa)
    try:
        g = torch.Generator().manual_seed(3)
        model = nn.Module()
        model.a, model.b = ReplicatedLinear(96, 64, bias=True), ReplicatedLinear(64, 48)
        for p in model.parameters():
            p.data.copy_(torch.randn(p.shape, generator=g))
        model.to(torch.bfloat16)
        assert pack_linear_weights(model) == 2
        assert is_panel_weight(model.a.packed_weight) and not is_panel_weight(model.b.packed_weight)
        del model.b  # only panel weights left: nothing to time
        assert measure_small_m_rows(model) == ({}, "")
        for rows in (1, 16, 100, 300):
            x = torch.randn(rows, 96, generator=g).bfloat16()
            want = F.linear(x.float(), model.a.weight.float(), model.a.bias.float()).bfloat16()
            torch.testing.assert_close(model.a(x), want, rtol=2e-2, atol=2e-2)
            with cpu_ops.torch_fallbacks():  # the torch path ignores the panels
                torch.testing.assert_close(model.a(x), F.linear(x, model.a.weight, model.a.bias))
        monkeypatch.setenv("SGLANG_CPU_LINEAR_PANELS", "0")
        pack_linear_weights(model)
        assert not is_panel_weight(model.a.packed_weight)
    finally:
        sgl_kernel.use_isa(before)


def _panels_with_a_onednn_copy_dtype():
    """A dtype whose weights this CPU packs in panels and oneDNN multiplies natively (bf16 on
    AVX512-BF16 CPUs, fp32 on AVX2 ones), or None."""
    from sglang.srt.layers import cpu_ops

    for dtype in (torch.bfloat16, torch.float32):
        if cpu_ops.linear_panels_enabled(dtype) and torch.backends.mkldnn.is_available():
            try:
                torch.ops.mkldnn._reorder_linear_weight(torch.ones(32, 8, dtype=dtype), None)
                return dtype
            except RuntimeError:
                continue
    return None


def test_panels_hand_the_rows_past_their_crossover_to_onednn(monkeypatch, tmp_path):
    """Where oneDNN multiplies the panels' dtype natively (AMX machines: 2-7x the panels' rate
    from 8-16 rows), a panel weight keeps a oneDNN copy; `linear`, the fused gate_up + SiLU and
    the fused decode layer take the panels up to `cpu_ops.panel_max_rows` and oneDNN beyond, each
    side bit for bit what its own kernel computes. A crossover at the last candidate (the panels
    win throughout) drops the copies."""
    from torch import nn

    from sglang.srt.layers import cpu_ops, fused_decode
    from sglang.srt.layers.linear import MergedColumnParallelLinear, ReplicatedLinear, pack_linear_weights
    from sglang.srt.layers.linear_crossover import PANEL_CANDIDATE_ROWS, measure_panel_rows

    dtype = _panels_with_a_onednn_copy_dtype() if cpu_ops.available() else None
    if dtype is None:
        pytest.skip("no panel kernel whose dtype oneDNN multiplies natively on this CPU")
    monkeypatch.setitem(cpu_ops._state, "panel_rows", {})
    monkeypatch.setenv("SGLANG_CPU_TUNING_CACHE", str(tmp_path / "rows.json"))
    g = torch.Generator().manual_seed(6)
    model = nn.Module()
    model.a, model.gate_up = ReplicatedLinear(96, 64, bias=True), MergedColumnParallelLinear(96, [64, 64])
    for p in model.parameters():
        p.data.copy_(torch.randn(p.shape, generator=g))
    model.to(dtype)
    assert pack_linear_weights(model) == 2
    a, gu = model.a, model.gate_up
    assert a.onednn_weight is not None and gu.onednn_weight is not None

    monkeypatch.setenv("SGLANG_CPU_PANEL_ROWS", "4")
    assert measure_panel_rows(model) == (4, "SGLANG_CPU_PANEL_ROWS") and cpu_ops.panel_max_rows(dtype) == 4
    onednn = torch.ops.mkldnn._linear_pointwise
    for rows in (1, 4, 5, 40):
        x = torch.randn(rows, 96, generator=g).to(dtype)
        if rows <= 4:
            want = torch.ops.sgl_kernel.linear(x, a.packed_weight, None, a.bias)
            want_gated = torch.ops.sgl_kernel.linear_silu_mul(x, gu.packed_weight, None, None)
        else:
            want = onednn(x, a.onednn_weight, a.bias, "none", [], "")
            want_gated = SiluAndMul()(onednn(x, gu.onednn_weight, None, "none", [], ""))
        assert torch.equal(a(x), want), rows
        assert torch.equal(gu.silu_mul(x), want_gated), rows
        ref = F.linear(x.double(), a.weight.double(), a.bias.double())
        tol = dict(rtol=2e-2, atol=0.5) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-3)
        torch.testing.assert_close(a(x).double(), ref, **tol)
        # the fused decode layer multiplies by the panels only where `linear` would
        args = fused_decode._linear_args(a, rows, dtype)
        assert (args is not None and args[0] is a.packed_weight) == (rows <= 4), rows

    monkeypatch.setenv("SGLANG_CPU_PANEL_ROWS", str(PANEL_CANDIDATE_ROWS[-1]))
    assert measure_panel_rows(model) == (None, "SGLANG_CPU_PANEL_ROWS")
    assert a.onednn_weight is None and gu.onednn_weight is None  # freed
    x = torch.randn(300, 96, generator=g).to(dtype)
    assert torch.equal(a(x), torch.ops.sgl_kernel.linear(x, a.packed_weight, None, a.bias))


def test_the_panel_crossover_is_measured_on_the_weights_and_kept(monkeypatch, tmp_path):
    from torch import nn

    from sglang.srt.layers import cpu_ops
    from sglang.srt.layers.linear import ReplicatedLinear, pack_linear_weights
    from sglang.srt.layers.linear_crossover import PANEL_CANDIDATE_ROWS, PANEL_RULE, measure_panel_rows

    dtype = _panels_with_a_onednn_copy_dtype() if cpu_ops.available() else None
    if dtype is None:
        pytest.skip("no panel kernel whose dtype oneDNN multiplies natively on this CPU")
    monkeypatch.setitem(cpu_ops._state, "panel_rows", {})
    monkeypatch.delenv("SGLANG_CPU_PANEL_ROWS", raising=False)
    monkeypatch.setenv("SGLANG_CPU_TUNING_CACHE", str(tmp_path / "rows.json"))
    model = nn.Module()
    model.a, model.b = ReplicatedLinear(256, 512), ReplicatedLinear(512, 256)
    for p in model.parameters():
        p.data.normal_()
    model.to(dtype)
    pack_linear_weights(model)
    rows, source = measure_panel_rows(model, candidates=PANEL_CANDIDATE_ROWS[:6])
    assert source.startswith("measured on these weights"), source
    if rows is None:  # the panels won at every candidate: the copies are gone
        assert model.a.onednn_weight is None and cpu_ops.panel_max_rows(dtype) > 10 ** 9
    else:
        assert rows in PANEL_CANDIDATE_ROWS[:5] and model.a.onednn_weight is not None
        assert cpu_ops.panel_max_rows(dtype) == rows
        assert measure_panel_rows(model, candidates=PANEL_CANDIDATE_ROWS[:6]) == (
            rows, "measured earlier in this process")
    import json
    (entry,) = json.loads((tmp_path / "rows.json").read_text()).values()
    assert entry["key"]["what"] == PANEL_RULE


def test_the_panel_crossover_times_a_gate_up_projection_as_the_model_runs_it(monkeypatch):
    """Both timed passes compute what MergedColumnParallelLinear.silu_mul computes on their path
    (the panels' fused linear_silu_mul, oneDNN's GEMM then silu_and_mul); a plain projection is
    timed as its linear."""
    from torch import nn

    from sglang.srt.layers import cpu_ops
    from sglang.srt.layers.activation import SiluAndMul
    from sglang.srt.layers.linear import MergedColumnParallelLinear, ReplicatedLinear, pack_linear_weights
    from sglang.srt.layers.linear_crossover import _onednn_pass, _panel_pass

    dtype = _panels_with_a_onednn_copy_dtype() if cpu_ops.available() else None
    if dtype is None:
        pytest.skip("no panel kernel whose dtype oneDNN multiplies natively on this CPU")
    g = torch.Generator().manual_seed(11)
    model = nn.Module()
    model.gate_up, model.down = MergedColumnParallelLinear(64, [96, 96]), ReplicatedLinear(96, 64)
    for p in model.parameters():
        p.data.copy_(torch.randn(p.shape, generator=g))
    model.to(dtype)
    pack_linear_weights(model)
    assert model.gate_up.onednn_weight is not None
    x, h = torch.randn(40, 64, generator=g).to(dtype), torch.randn(40, 96, generator=g).to(dtype)
    want = SiluAndMul()(F.linear(x.float(), model.gate_up.weight.float())).to(dtype)
    for timed in (_panel_pass, _onednn_pass):
        got = timed(x, model.gate_up)
        assert got.shape == (40, 96)
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=0.5)
        torch.testing.assert_close(timed(h, model.down).float(), F.linear(h.float(), model.down.weight.float()),
                                   rtol=2e-2, atol=0.5)
