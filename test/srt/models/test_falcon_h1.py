"""FalconH1ForCausalLM (attention and Mamba2 in parallel in every layer, muP multipliers) vs HF
transformers, fp32, tiny random weights. The tiny config sets every multiplier (embedding,
lm_head, key, attention in/out, ssm in/out, mlp, per-segment ssm_multipliers) away from 1, so
parity checks each of them; variants cover the Mamba gate forms, tied embeddings and dt limits."""

import pytest
import torch

from mamba_hybrid_driver import hybrid_batch_logits, hybrid_greedy, hybrid_logits
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.test.hf_parity import assert_trace_close, hf_reference, load_hf_model, random_prompt
from sglang.test.tiny_models import make_tiny_model

N_DECODE = 6


@pytest.fixture(scope="module")
def falcon_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("falcon_h1")), "falcon_h1", seed=1)


@pytest.fixture(scope="module")
def hf_falcon(falcon_dir):
    return load_hf_model(falcon_dir)


def _runner(path, page_size=1, **kw):
    return ModelRunner(path, max_total_tokens=4096, page_size=page_size, max_running_requests=8,
                       disable_tqdm=True, **kw)


@pytest.fixture(scope="module")
def runner(falcon_dir):
    return _runner(falcon_dir)


def test_every_layer_has_kv_and_mamba_state(runner):
    cfg = ModelConfig.from_path(runner.model_config.model_path)
    assert cfg.is_hybrid_ssm and cfg.attention_layer_ids == [0, 1]
    assert runner.memory.token_to_kv_pool.layer_ids == [0, 1]
    assert runner.memory.mamba_pool.num_mamba_layers == 2
    assert tuple(runner.memory.mamba_pool.ssm_state.shape[2:]) == (8, 8, 16)


def test_prefill_and_decode_match_hf(hf_falcon, runner):
    prompt = random_prompt(45, seed=0)
    ref = hf_reference(hf_falcon, prompt, N_DECODE)
    assert_trace_close(hybrid_logits(runner, prompt, ref.tokens), ref)


@pytest.mark.parametrize("chunk", [6, 16])
def test_chunked_prefill_carries_state(hf_falcon, runner, chunk):
    prompt = random_prompt(41, seed=1)
    ref = hf_reference(hf_falcon, prompt, 3)
    whole = hybrid_logits(runner, prompt, ref.tokens)
    chunked = hybrid_logits(runner, prompt, ref.tokens, chunk_size=chunk)
    torch.testing.assert_close(chunked.prefill, whole.prefill, atol=1e-5, rtol=1e-5)
    assert_trace_close(chunked, ref)


def test_ragged_batch_then_batched_decode_in_scattered_slots(falcon_dir, hf_falcon):
    prompts = [random_prompt(n, seed=20 + n) for n in (3, 30, 9, 17)]
    refs = [hf_reference(hf_falcon, p, 4) for p in prompts]
    runner = _runner(falcon_dir, page_size=16, max_mamba_cache_size=16)
    assert runner.memory.mamba_pool.size == 16
    traces = hybrid_batch_logits(runner, prompts, [r.tokens for r in refs], slot_stride=3)
    for ours, ref in zip(traces, refs):
        assert_trace_close(ours, ref)


def test_greedy_tokens_match_hf_generate(hf_falcon, runner):
    prompt = random_prompt(19, seed=2)
    n = 12
    hf_out = hf_falcon.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                use_cache=True, pad_token_id=0)
    assert hybrid_greedy(runner, prompt, n) == hf_out[0, len(prompt):].tolist()


@pytest.mark.parametrize("overrides", [
    dict(mamba_rms_norm=False),  # plain silu(z) gating (z goes into the decode step)
    dict(mamba_norm_before_gate=True),  # norm(x) * w * silu(z)
    dict(tie_word_embeddings=True, mamba_n_groups=1),
    dict(time_step_limit=[0.05, 0.5]),  # the scan clamps dt; HF's decode step does not
])
def test_variants_match_hf(tmp_path, overrides):
    path = make_tiny_model(str(tmp_path / "v"), "falcon_h1", seed=3, **overrides)
    prompt = random_prompt(23, seed=4)
    ref = hf_reference(path, prompt, 4)
    runner = _runner(path)
    assert_trace_close(hybrid_logits(runner, prompt, ref.tokens), ref)
    assert_trace_close(hybrid_logits(runner, prompt, ref.tokens, chunk_size=7), ref)


def test_triton_kernels_match_hf(falcon_dir, hf_falcon, monkeypatch):
    """The CUDA path's Triton Mamba2 kernels (run by Triton's interpreter here) wired through the
    mixer: chunked prefill and decode, one request and a batch in scattered slots."""
    monkeypatch.setenv("SGLANG_MAMBA_OPS", "triton")
    runner = _runner(falcon_dir)
    prompt = random_prompt(20, seed=5)
    ref = hf_reference(hf_falcon, prompt, 3)
    assert_trace_close(hybrid_logits(runner, prompt, ref.tokens, chunk_size=9), ref)
    prompts = [random_prompt(n, seed=30 + n) for n in (3, 12)]
    refs = [hf_reference(hf_falcon, p, 2) for p in prompts]
    for ours, r in zip(hybrid_batch_logits(runner, prompts, [r.tokens for r in refs], slot_stride=2), refs):
        assert_trace_close(ours, r)
