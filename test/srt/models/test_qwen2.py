"""Qwen2ForCausalLM (q/k/v bias) vs HF transformers, dense and with mixed sliding/full layers."""

import pytest

from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.test.hf_parity import assert_trace_close, hf_reference, our_batch_logits, our_logits, random_prompt
from sglang.test.tiny_models import make_tiny_model


def _runner(path, page_size=1):
    return ModelRunner(path, max_total_tokens=4096, page_size=page_size, max_running_requests=8, disable_tqdm=True)


@pytest.mark.parametrize("page_size", [1, 16])
def test_qwen2_matches_hf(tmp_path, page_size):
    path = make_tiny_model(str(tmp_path / "q2"), "qwen2", seed=3)
    prompt = random_prompt(70, seed=7)
    ref = hf_reference(path, prompt, 6)
    assert_trace_close(our_logits(_runner(path, page_size), prompt, ref.tokens, chunk_size=32), ref)


def test_qwen2_sliding_window_matches_hf(tmp_path):
    path = make_tiny_model(str(tmp_path / "q2swa"), "qwen2_swa", seed=4)
    runner = _runner(path, 16)
    assert [l.self_attn.attn.sliding_window_size for l in runner.model.model.layers] == [8, -1, 8, -1]
    prompts = [random_prompt(n, seed=n) for n in (5, 40)]
    refs = [hf_reference(path, p, 5) for p in prompts]
    for ours, ref in zip(our_batch_logits(runner, prompts, [r.tokens for r in refs]), refs):
        assert_trace_close(ours, ref)
