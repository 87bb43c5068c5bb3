"""Qwen3ForCausalLM (per-head q/k RMSNorm) vs HF transformers, including a config that mixes
sliding-window and full-attention layers with a window (8) much shorter than the prompts."""

import pytest
import torch

from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.test.hf_parity import (assert_trace_close, hf_reference, load_hf_model, our_batch_logits,
                                   our_logits, random_prompt)
from sglang.test.tiny_models import make_tiny_model


def _runner(path, page_size=1):
    return ModelRunner(path, max_total_tokens=4096, page_size=page_size, max_running_requests=8, disable_tqdm=True)


@pytest.fixture(scope="module")
def swa_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("q3swa")), "qwen3_swa", seed=5)


@pytest.fixture(scope="module")
def hf_swa(swa_dir):
    return load_hf_model(swa_dir)


@pytest.mark.parametrize("page_size", [1, 16])
def test_qwen3_matches_hf(tmp_path, page_size):
    path = make_tiny_model(str(tmp_path / "q3"), "qwen3", seed=6)
    prompt = random_prompt(50, seed=8)
    ref = hf_reference(path, prompt, 6)
    assert_trace_close(our_logits(_runner(path, page_size), prompt, ref.tokens), ref)


def test_swa_layers_come_from_model_config(swa_dir):
    runner = _runner(swa_dir)
    assert runner.model_config.swa_layer_ids == [0, 2]
    assert runner.model_config.sliding_window_size == 8
    assert [l.self_attn.attn.sliding_window_size for l in runner.model.model.layers] == [8, -1, 8, -1]


@pytest.mark.parametrize("page_size", [1, 16])
def test_qwen3_hybrid_swa_matches_hf(swa_dir, hf_swa, page_size):
    prompt = random_prompt(40, seed=9)  # 5x the window
    ref = hf_reference(hf_swa, prompt, 8)
    assert_trace_close(our_logits(_runner(swa_dir, page_size), prompt, ref.tokens), ref)


@pytest.mark.parametrize("page_size", [1, 16])
def test_qwen3_hybrid_swa_chunked_prefill(swa_dir, hf_swa, page_size):
    prompt = random_prompt(90, seed=10)
    ref = hf_reference(hf_swa, prompt, 3)
    runner = _runner(swa_dir, page_size)
    chunked = our_logits(runner, prompt, ref.tokens, chunk_size=32)
    whole = our_logits(runner, prompt, ref.tokens)
    torch.testing.assert_close(chunked.prefill, whole.prefill, atol=1e-5, rtol=1e-5)
    assert_trace_close(chunked, ref)
    # Odd chunk sizes put chunk borders inside the window and inside pages.
    assert_trace_close(our_logits(runner, prompt, ref.tokens, chunk_size=7), ref)


def test_qwen3_hybrid_swa_ragged_batch(swa_dir, hf_swa):
    prompts = [random_prompt(n, seed=20 + n) for n in (3, 8, 9, 31)]
    refs = [hf_reference(hf_swa, p, 10) for p in prompts]
    traces = our_batch_logits(_runner(swa_dir, 16), prompts, [r.tokens for r in refs])
    for ours, ref in zip(traces, refs):
        assert_trace_close(ours, ref)


def test_window_actually_matters(swa_dir, hf_swa):
    """Guards the SWA tests against passing trivially: a full-attention run differs from HF."""
    runner = _runner(swa_dir)
    for layer in runner.model.model.layers:
        layer.self_attn.attn.sliding_window_size = -1
    prompt = random_prompt(40, seed=9)
    ref = hf_reference(hf_swa, prompt, 0)
    ours = our_logits(runner, prompt, [])
    assert (ours.prefill[:8] - ref.prefill[:8]).abs().max() < 1e-4  # inside the window: same
    assert (ours.prefill[20:] - ref.prefill[20:]).abs().max() > 1e-2


@pytest.mark.parametrize("page_size", [1, 4])
def test_qwen3_hybrid_swa_pool_reads_only_the_window(swa_dir, hf_swa, page_size):
    """With a hybrid SWAKVPool, SWA slots of tokens that slid out of the window are freed
    (their mapping reset to the padding slot) between forwards and the logits still match HF."""
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
    from sglang.test.runner_utils import ManualDriver

    runner = ModelRunner(swa_dir, max_total_tokens=512, page_size=page_size, max_running_requests=4,
                         disable_tqdm=True, swa_full_tokens_ratio=0.5)
    assert runner.memory.is_hybrid_swa and isinstance(runner.memory.token_to_kv_pool, SWAKVPool)
    assert runner.memory.swa_max_total_num_tokens == 256
    alloc = runner.memory.allocator
    # Hold a few SWA pages so that full and SWA slot numbers differ (translation is not identity).
    held = alloc.swa_attn_allocator.alloc(3 * page_size)
    window = 8
    prompt = random_prompt(45, seed=30)
    ref = hf_reference(hf_swa, prompt, 6)
    drv = ManualDriver(runner)
    req = drv.new_request(prompt)
    freed = 0

    def free_out_of_window():
        nonlocal freed
        # the next query (position kv_len) needs keys at positions >= kv_len + 1 - window
        upto = max(0, req.kv_len + 1 - window) // page_size * page_size
        if upto > freed:
            alloc.free_swa(runner.memory.req_to_token_pool.req_to_token[req.req_pool_idx, freed:upto].clone())
            freed = upto

    prefill = []
    for start in range(0, len(prompt), 10):
        free_out_of_window()
        prefill.append(drv.extend([req], [prompt[start : start + 10]]).full_logits)
    torch.testing.assert_close(torch.cat(prefill), ref.prefill, atol=1e-4, rtol=1e-4)
    assert freed > 0
    for step, tok in enumerate(ref.tokens):
        free_out_of_window()
        out = drv.decode([req], [tok]).next_token_logits[0]
        torch.testing.assert_close(out, ref.decode[step], atol=1e-4, rtol=1e-4)
    drv.free(req)
    alloc.swa_attn_allocator.free(held)
    assert alloc.full_available_size() == 512 and alloc.swa_available_size() == 256
