"""LlamaForCausalLM vs HF transformers (fp32, tiny random weights): prefill logits of every
prompt token and each greedy decode step, over the paged KV pool and the torch_native backend."""

import pytest
import torch

from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.test.hf_parity import (assert_trace_close, hf_reference, load_hf_model, our_batch_logits,
                                   our_logits, random_prompt)
from sglang.test.tiny_models import make_tiny_model

N_DECODE = 6


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("llama")), "llama", seed=1)


@pytest.fixture(scope="module")
def hf_llama(llama_dir):
    return load_hf_model(llama_dir)


def _runner(path, page_size=1, **kw):
    return ModelRunner(path, max_total_tokens=4096, page_size=page_size, max_running_requests=8,
                       disable_tqdm=True, **kw)


@pytest.mark.parametrize("page_size", [1, 16])
def test_prefill_and_decode_match_hf(llama_dir, hf_llama, page_size):
    prompt = random_prompt(45, seed=0)
    ref = hf_reference(hf_llama, prompt, N_DECODE)
    ours = our_logits(_runner(llama_dir, page_size), prompt, ref.tokens)
    assert_trace_close(ours, ref)


@pytest.mark.parametrize("page_size", [1, 16])
def test_chunked_prefill_matches_unchunked_and_hf(llama_dir, hf_llama, page_size):
    prompt = random_prompt(101, seed=1)
    ref = hf_reference(hf_llama, prompt, 3)
    runner = _runner(llama_dir, page_size)
    whole = our_logits(runner, prompt, ref.tokens)
    chunked = our_logits(runner, prompt, ref.tokens, chunk_size=32)
    torch.testing.assert_close(chunked.prefill, whole.prefill, atol=1e-5, rtol=1e-5)
    assert_trace_close(chunked, ref)


@pytest.mark.parametrize("page_size", [1, 16])
def test_ragged_batch_in_one_extend(llama_dir, hf_llama, page_size):
    prompts = [random_prompt(n, seed=10 + n) for n in (1, 7, 33, 50)]
    refs = [hf_reference(hf_llama, p, 4) for p in prompts]
    traces = our_batch_logits(_runner(llama_dir, page_size), prompts, [r.tokens for r in refs])
    for ours, ref in zip(traces, refs):
        assert_trace_close(ours, ref)


@pytest.mark.parametrize("arch", ["llama_tied", "llama3_rope"])
def test_variants_match_hf(tmp_path, arch):
    path = make_tiny_model(str(tmp_path / arch), arch, seed=2)
    prompt = random_prompt(300, seed=3)  # past llama3's original 256-token context
    ref = hf_reference(path, prompt, 3)
    assert_trace_close(our_logits(_runner(path), prompt, ref.tokens), ref)


def test_linear_rope_scaling_matches_hf(tmp_path):
    path = make_tiny_model(str(tmp_path / "lin"), "llama", seed=4,
                           rope_scaling={"rope_type": "linear", "factor": 4.0})
    prompt = random_prompt(60, seed=5)
    ref = hf_reference(path, prompt, 2)
    assert_trace_close(our_logits(_runner(path), prompt, ref.tokens), ref)


def test_bfloat16_runs_close_to_fp32(llama_dir):
    prompt = random_prompt(20, seed=6)
    fp32 = our_logits(_runner(llama_dir), prompt, [])
    runner = _runner(llama_dir, dtype="bfloat16")
    assert runner.dtype == torch.bfloat16
    assert runner.memory.token_to_kv_pool.dtype == torch.bfloat16
    bf16 = our_logits(runner, prompt, [])
    assert bf16.prefill.dtype == torch.float32
    assert (bf16.prefill - fp32.prefill).abs().max() < 0.1
    assert (bf16.prefill.argmax(-1) == fp32.prefill.argmax(-1)).float().mean() > 0.8


def test_bfloat16_head_dim_64_prefill_on_each_kernel_set(tmp_path):
    """Head dim 64 is what the AMX set's extend attention takes (bf16, dims in 32-wide tiles); a
    600-token prompt spans two of its 512-key chunks. Every compiled kernel set's bf16 prefill
    stays as close to the fp32 model as bf16 allows."""
    sgl_kernel = pytest.importorskip("sgl_kernel")
    if not sgl_kernel.load():
        pytest.skip(f"sgl-kernel: {sgl_kernel.unavailable_reason()}")
    path = make_tiny_model(str(tmp_path / "hd64"), "llama", seed=7, head_dim=64)
    prompt = random_prompt(600, seed=8)
    fp32 = our_logits(_runner(path), prompt, [])
    before = sgl_kernel.isa()
    try:
        for isa in sgl_kernel.supported_isas():
            sgl_kernel.use_isa(isa)
            bf16 = our_logits(_runner(path, dtype="bfloat16"), prompt, [])
            assert (bf16.prefill - fp32.prefill).abs().max() < 0.1, isa
            assert (bf16.prefill.argmax(-1) == fp32.prefill.argmax(-1)).float().mean() > 0.9, isa
    finally:
        sgl_kernel.use_isa(before)
