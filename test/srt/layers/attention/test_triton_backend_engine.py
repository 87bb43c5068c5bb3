"""Acceptance: greedy generation through the Engine (real scheduler subprocess) with
`attention_backend="triton"` (Triton's interpreter on CPU) gives HF transformers' greedy tokens
(the torch_native backend is held to the same reference everywhere else)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # inherited by the scheduler subprocess

import pytest

import sglang
from sglang.test.hf_reference import hf_greedy, load_hf_model
from sglang.test.tiny_models import make_tiny_model

GREEDY = {"temperature": 0.0, "max_new_tokens": 6, "ignore_eos": True}
PROMPTS = [[504, 3458, 19213, 8165, 5932, 690, 30, 12, 77, 4000, 21], [19556]]  # one past the 8-token window


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("triton_engine")), "qwen3_swa", seed=5)


def test_engine_greedy_triton_equals_hf(model_dir):
    eng = sglang.Engine(model_path=model_dir, attention_backend="triton", max_total_tokens=1024, page_size=16,
                        dtype="float32")
    try:
        out = [o["output_ids"] for o in eng.generate(input_ids=PROMPTS, sampling_params=GREEDY)]
    finally:
        eng.shutdown()
    hf = load_hf_model(model_dir)
    assert out == [hf_greedy(hf, p, 6) for p in PROMPTS]
