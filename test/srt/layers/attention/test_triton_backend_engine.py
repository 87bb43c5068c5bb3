"""Acceptance: greedy generation through the Engine (real scheduler subprocess) with
`attention_backend="triton"` (Triton's interpreter on CPU) equals the torch_native run."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # inherited by the scheduler subprocess

import pytest

import sglang
from sglang.test.tiny_models import make_tiny_model

GREEDY = {"temperature": 0.0, "max_new_tokens": 6, "ignore_eos": True}
PROMPTS = ["The quick brown fox jumps over", "Hello"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("triton_engine")), "qwen3_swa", seed=5)


def _generate(model_dir, backend):
    eng = sglang.Engine(model_path=model_dir, attention_backend=backend, max_total_tokens=1024, page_size=16,
                        dtype="float32")
    try:
        return [o["output_ids"] for o in eng.generate(PROMPTS, GREEDY)]
    finally:
        eng.shutdown()


def test_engine_greedy_triton_equals_torch_native(model_dir):
    ref = _generate(model_dir, "torch_native")
    out = _generate(model_dir, "triton")
    assert [len(x) for x in out] == [6, 6]
    assert out == ref
