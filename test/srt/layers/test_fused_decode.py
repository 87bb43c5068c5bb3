"""The fused CPU decode layer (`sgl_kernel.decode_layer`, layers/fused_decode.py) against the
per-op path it replaces: the same model, prompt and decode steps with `SGLANG_CPU_FUSED_DECODE`
on and off give bit-identical logits and KV cache rows, for Llama, Qwen2 (qkv bias),
Qwen3 (per-head q/k norms, odd head sizes), fp32, bf16 and int8 weights, batches of 1 and 3, the two
widest kernel sets this CPU runs, and uninitialised memory poisoned with NaN. A profiler check makes sure
the fused op really ran (and that it steps aside where it does not apply)."""

from __future__ import annotations

import pytest
import torch

import sgl_kernel
from sglang.srt.layers import cpu_ops
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.test.hf_parity import random_prompt
from sglang.test.runner_utils import ManualDriver
from sglang.test.tiny_models import make_tiny_model

pytestmark = pytest.mark.skipif(not sgl_kernel.load(), reason=f"sgl-kernel: {sgl_kernel.unavailable_reason()}")

ODD_QWEN3 = dict(hidden_size=72, intermediate_size=100, num_attention_heads=6, num_key_value_heads=2, head_dim=12)
# qwen3_swa runs on a hybrid SWA pool: its full-attention layers fuse, its sliding ones do not
MODELS = {"llama": ("llama", {}), "qwen2": ("qwen2", {}), "qwen3_odd": ("qwen3", ODD_QWEN3),
          "qwen3_swa": ("qwen3_swa", {})}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    return {name: make_tiny_model(str(tmp_path_factory.mktemp(name)), arch, seed=21, **over)
            for name, (arch, over) in MODELS.items()}


@pytest.fixture
def poisoned():
    torch.use_deterministic_algorithms(True, warn_only=True)
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.utils.deterministic.fill_uninitialized_memory = True
    yield
    torch.utils.deterministic.fill_uninitialized_memory = fill
    torch.use_deterministic_algorithms(False)


def _decode_trace(runner, prompts, steps):
    """Prefill `prompts` as one batch, then `steps` greedy decode steps; the logits of every
    decode step and the KV pool's contents at the end."""
    drv = ManualDriver(runner)
    reqs = [drv.new_request(p) for p in prompts]
    out = drv.extend(reqs, [list(p) for p in prompts], return_full_logits=False)
    trace = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            toks = out.next_token_logits.argmax(-1).tolist()
            out = drv.decode(reqs, toks)
            trace.append(out.next_token_logits.clone())
    pool = runner.memory.token_to_kv_pool
    r2t = runner.memory.req_to_token_pool.req_to_token
    kv = []  # each request's K/V rows of every layer (slots may differ between runs)
    for lid in pool.layer_ids:
        idx = torch.cat([r2t[r.req_pool_idx, : r.kv_len] for r in reqs])
        if getattr(pool, "is_swa_layer", lambda _: False)(lid):
            idx = pool.translate_loc_from_full_to_swa(idx)
        kv += [t[idx].clone() for t in pool.get_kv_buffer(lid)]
    for r in reqs:
        drv.free(r)
    keys = {e.key for e in prof.key_averages()}
    ran_fused = "sgl_kernel::decode_layer" in keys or "sgl_kernel::decode_layers" in keys
    _ran_ops.clear()
    _ran_ops.update(keys)
    return trace, kv, ran_fused


_ran_ops: set = set()  # the ops the last _decode_trace ran


def _runner(model_dir, **kw):
    return ModelRunner(model_dir, max_total_tokens=256, disable_tqdm=True, **kw)


# the two widest kernel sets (each op's kernels are compared on every set in test/sgl-kernel)
@pytest.mark.parametrize("isa", sgl_kernel.supported_isas()[-2:])
@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("dtype,quant", [("float32", None), ("bfloat16", None), ("bfloat16", "w8a16_int8")])
@pytest.mark.parametrize("batch", [1, 3])
def test_fused_layer_equals_the_per_op_path(model_dirs, poisoned, monkeypatch, isa, model, dtype, quant, batch):
    before = sgl_kernel.use_isa(isa)
    # batches of 3 take the small-M kernel (and so the fused layer) for every dtype
    monkeypatch.setenv("SGLANG_CPU_SMALL_M_LINEAR", "4")
    try:
        runner = _runner(model_dirs[model], dtype=dtype, quantization=quant)
        prompts = [random_prompt(9 + 4 * i, seed=30 + i) for i in range(batch)]
        monkeypatch.setenv("SGLANG_CPU_FUSED_DECODE", "1")
        fused, kv_fused, ran = _decode_trace(runner, prompts, 5)
        assert ran, "the fused decode layer did not run"
        # the whole stack in one call, except on a hybrid SWA pool (its sliding layers run their modules)
        whole = "sgl_kernel::decode_layers" in _ran_ops
        assert whole == (model != "qwen3_swa"), _ran_ops
        monkeypatch.setenv("SGLANG_CPU_FUSED_DECODE", "0")
        ref, kv_ref, ran = _decode_trace(runner, prompts, 5)
        assert not ran
    finally:
        sgl_kernel.use_isa(before)
    for step, (a, b) in enumerate(zip(fused, ref)):
        assert not a.isnan().any(), f"step {step}: NaN in the fused path's logits"
        assert torch.equal(a, b), f"step {step}: logits differ by {(a - b).abs().max()}"
    for a, b in zip(kv_fused, kv_ref):
        assert torch.equal(a, b)


def test_fused_layer_steps_aside_for_batches_beyond_the_small_m_kernel(tmp_path, monkeypatch):
    # the crossover fixed (measured, it may be 0 rows on a loaded machine, and then nothing is fused)
    monkeypatch.setenv("SGLANG_CPU_SMALL_M_LINEAR", "2")
    monkeypatch.setenv("SGLANG_CPU_LINEAR_PANELS", "0")  # plain weights: panels take any rows (below)
    runner = _runner(make_tiny_model(str(tmp_path / "llama"), "llama", seed=4))
    _, _, ran = _decode_trace(runner, [random_prompt(8, seed=1)], 2)
    assert ran
    # more rows than the small-M kernel takes in fp32: the layer runs its modules (oneDNN)
    rows = cpu_ops.linear_max_rows(torch.float32) + 1
    _, _, ran = _decode_trace(runner, [random_prompt(8, seed=i) for i in range(rows)], 2)
    assert not ran


def test_fused_layer_takes_any_batch_over_panel_weights(tmp_path, monkeypatch):
    """Where the weights are packed in panels (fp32 on the AVX2 and 512-bit kernel sets, bf16 on
    AVX2, AVX512-BF16 and AMX), the fused layer runs beyond the small-M kernel's rows too, bit-identical to the
    per-op path over the same panels."""
    monkeypatch.setenv("SGLANG_CPU_SMALL_M_LINEAR", "2")
    if not cpu_ops.linear_panels_enabled(torch.float32):
        pytest.skip(f"no fp32 panel kernel on the {cpu_ops.isa_name()} kernel set")
    runner = _runner(make_tiny_model(str(tmp_path / "llama"), "llama", seed=4))
    prompts = [random_prompt(8, seed=i) for i in range(7)]  # 7 rows: a 4- and a 3-row tile
    fused, kv_fused, ran = _decode_trace(runner, prompts, 2)
    assert ran
    monkeypatch.setenv("SGLANG_CPU_FUSED_DECODE", "0")
    ref, kv_ref, ran = _decode_trace(runner, prompts, 2)
    assert not ran
    assert all(torch.equal(a, b) for a, b in zip(fused, ref))
    assert all(torch.equal(a, b) for a, b in zip(kv_fused, kv_ref))
