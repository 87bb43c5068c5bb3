"""Qwen3-Next (gated DeltaNet + gated attention + MoE) served for real: a 1P1D deployment over
Mooncake TCP behind the real sglang-router, the decode server's KV pool so small that requests
retract (auto backup: cpu_tensor, KV + DeltaNet state), gives HF transformers' greedy tokens with
nothing recomputed; and the offline Engine (Qwen3.5-MoE) gives HF's tokens with and without a
radix-cache hit on the hybrid state."""

import concurrent.futures as cf

import pytest
import requests

import sglang
from sglang.test.hf_reference import hf_greedy, load_hf_model
from sglang.test.pd_utils import find_free_port, launch_decode, launch_prefill, launch_router, stop_server
from sglang.test.tiny_models import make_tiny_model

pytestmark = pytest.mark.server

COMMON = ["--dtype", "float32"]


def url(port):
    return f"http://127.0.0.1:{port}"


def _prompts(n, length, seed):
    import random

    rng = random.Random(seed)
    return [[rng.randrange(100, 1000) for _ in range(length)] for _ in range(n)]


def test_qwen3_next_1p1d_with_retraction_matches_hf(tmp_path):
    model = make_tiny_model(str(tmp_path / "qwen3_next"), "qwen3_next", seed=5)
    ports = {k: find_free_port() for k in ("prefill", "boot", "decode", "router")}
    procs = []
    try:
        procs.append(launch_prefill(model, ports["prefill"], ports["boot"], COMMON + ["--max-total-tokens", "4096"],
                                    log_path=str(tmp_path / "prefill.log")))
        procs.append(launch_decode(model, ports["decode"], COMMON + [
            "--max-total-tokens", "200", "--num-reserved-decode-tokens", "8"], log_path=str(tmp_path / "decode.log")))
        procs.append(launch_router([(ports["prefill"], ports["boot"])], [ports["decode"]], ports["router"],
                                   log_path=str(tmp_path / "router.log")))
        params = {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}
        prompts = _prompts(8, 20, seed=3)
        with cf.ThreadPoolExecutor(len(prompts)) as ex:
            futs = [ex.submit(requests.post, url(ports["router"]) + "/generate",
                              json={"input_ids": p, "sampling_params": params}, timeout=300) for p in prompts]
            outs = [f.result() for f in futs]
        assert all(o.status_code == 200 for o in outs), [o.text for o in outs]
        outs = [o.json() for o in outs]
        hf = load_hf_model(model)
        assert [o["output_ids"] for o in outs] == [hf_greedy(hf, p, 40) for p in prompts]
        assert sum(o["meta_info"]["num_retractions"] for o in outs) > 0
        state = requests.get(url(ports["decode"]) + "/server_info", timeout=30).json()["internal_states"][0]
        assert state["num_recomputed_tokens"] == 0
        assert state["retraction_backup"]["backend"] == "cpu_tensor"  # auto for a hybrid without the opt-in
        assert state["retraction_backup"]["live_backups"] == 0
    finally:
        for p in reversed(procs):
            stop_server(p)


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
