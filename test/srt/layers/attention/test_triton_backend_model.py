"""`--attention-backend triton` through the real ModelRunner on a tiny hybrid-SWA Qwen3 (under the
interpreter): logits equal HF transformers, ragged batches equal torch_native (greedy generation
through the Engine: test_triton_backend_engine.py)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from paged_kv_fixtures import fresh_seed

from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.test.hf_parity import assert_trace_close, hf_reference, our_batch_logits, our_logits, random_prompt
from sglang.test.tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # 4 layers: sliding window 8 on layers 0 and 2, full attention on 1 and 3.
    return make_tiny_model(str(tmp_path_factory.mktemp("m")), "qwen3_swa", seed=7)


def _runner(model_dir, backend, page_size=16):
    return ModelRunner(model_dir, attention_backend=backend, page_size=page_size, max_total_tokens=512,
                       max_running_requests=4, disable_tqdm=True)


def test_logits_match_hf_with_chunked_prefill_and_decode(model_dir):
    runner = _runner(model_dir, "triton")
    assert isinstance(runner.attn_backend, TritonAttnBackend)
    prompt = random_prompt(21, seed=fresh_seed())
    ref = hf_reference(model_dir, prompt, n_decode=4)
    ours = our_logits(runner, prompt, ref.tokens, chunk_size=8)  # chunks attend to a cached prefix
    assert_trace_close(ours, ref, atol=2e-4, rtol=2e-4)


def test_ragged_batch_equals_torch_native(model_dir):
    seed = fresh_seed()
    prompts = [random_prompt(n, seed=seed + n) for n in (5, 17, 11)]
    feed = [random_prompt(3, seed=seed + 100 + i) for i in range(3)]
    traces = {b: our_batch_logits(_runner(model_dir, b), prompts, feed) for b in ("torch_native", "triton")}
    for ours, ref in zip(traces["triton"], traces["torch_native"]):
        assert_trace_close(ours, ref, atol=2e-4, rtol=2e-4)
