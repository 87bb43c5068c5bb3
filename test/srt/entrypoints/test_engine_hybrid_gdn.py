"""The gated-DeltaNet family served for real, beyond the in-process tests: the offline Engine
(Qwen3.5-MoE) gives HF transformers' greedy tokens with and without a radix-cache hit on the
hybrid state. (Qwen3-Next through a 1P1D deployment behind the real router: test_fuzz_pd.py, HF's
tokens after the fuzzer's mix; decode retraction with cpu_tensor and the host pool, over the real
Mooncake engine: test_decode_retraction_mamba.py.)"""

import pytest

import sglang
from sglang.test.hf_reference import hf_greedy, load_hf_model
from sglang.test.tiny_models import make_tiny_model

pytestmark = pytest.mark.server


def _prompts(n, length, seed):
    import random

    rng = random.Random(seed)
    return [[rng.randrange(100, 1000) for _ in range(length)] for _ in range(n)]


def test_qwen3_5_moe_engine_with_and_without_a_radix_hit(tmp_path):
    model = make_tiny_model(str(tmp_path / "qwen3_5_moe"), "qwen3_5_moe", seed=6)
    hf = load_hf_model(model)
    params = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
    prompts = _prompts(3, 45, seed=4)
    eng = sglang.Engine(model_path=model, dtype="float32", max_total_tokens=4096, chunked_prefill_size=16)
    try:
        first = eng.generate(input_ids=prompts, sampling_params=params)
        assert [o["output_ids"] for o in first] == [hf_greedy(hf, p, 12) for p in prompts]
        # The same prompts again: the prefix (with its DeltaNet state at a chunk boundary) comes
        # from the radix tree, the rest is computed from that state.
        again = eng.generate(input_ids=prompts, sampling_params=params)
        assert all(o["meta_info"]["cached_tokens"] >= 32 for o in again), [o["meta_info"]["cached_tokens"] for o in again]
        assert [o["output_ids"] for o in again] == [o["output_ids"] for o in first]
        longer = [p + o["output_ids"] + [7, 8, 9] for p, o in zip(prompts, first)]
        cont = eng.generate(input_ids=longer, sampling_params=params)
        assert all(o["meta_info"]["cached_tokens"] > 45 for o in cont), [o["meta_info"]["cached_tokens"] for o in cont]
        assert [o["output_ids"] for o in cont] == [hf_greedy(hf, p, 12) for p in longer]
    finally:
        eng.shutdown()
