"""`sglang.Engine(tp_size=2, ...)` (issue 54): the Python engine starts both TP ranks and its
greedy tokens equal tp=1's and HF's on tiny fp32 Llama and Qwen3 checkpoints."""

import pytest

import sglang
from sglang.test.tiny_models import make_tiny_model
from sglang.test.tp_utils import GREEDY, hf_tokens, prompts, tp1_tokens

pytestmark = pytest.mark.server


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_engine_tp2_greedy_equals_tp1_and_hf(arch, tmp_path):
    model = make_tiny_model(str(tmp_path / arch), arch, seed=8)
    ids = prompts(seed=5)
    expected = hf_tokens(model, ids)
    assert tp1_tokens(model, ids) == expected
    eng = sglang.Engine(model_path=model, tp_size=2, dtype="float32", max_total_tokens=2048)
    try:
        outs = eng.generate(input_ids=ids, sampling_params=GREEDY)
        assert [o["output_ids"] for o in outs] == expected
        assert eng.get_server_info()["tp_size"] == 2
    finally:
        eng.shutdown()
