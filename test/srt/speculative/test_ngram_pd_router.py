"""NGRAM speculative decoding on the decode server of a 1P1D deployment (Mooncake over loopback TCP)
behind the real sglang-router: NGRAM needs nothing from the prefill server; the decode server's
tiny KV pool forces retractions (KV backed up to its host pool, resumed without recomputation);
HF transformers' greedy tokens; drafts accepted (meta_info); every backup and KV slot free
afterwards."""

import concurrent.futures as cf

import pytest
import requests

from sglang.test.hf_reference import hf_greedy, load_hf_model
from sglang.test.pd_utils import find_free_port, launch_decode, launch_prefill, launch_router, stop_server
from sglang.test.scheduler_utils import random_prompts
from sglang.test.server_utils import start_side_by_side
from sglang.test.tiny_models import make_tiny_model

pytestmark = pytest.mark.server

COMMON = ["--dtype", "float32", "--skip-server-warmup"]  # the warm-up text is out of a 16-token vocabulary


def url(port):
    return f"http://127.0.0.1:{port}"


def test_ngram_decode_server_behind_the_router_with_retraction(tmp_path):
    model = make_tiny_model(str(tmp_path / "v16"), "llama", seed=0, vocab_size=16, bos_token_id=1, eos_token_id=2,
                            pad_token_id=0)
    ports = {k: find_free_port() for k in ("prefill", "boot", "decode", "router")}
    procs = []
    try:
        procs += start_side_by_side(
            lambda: launch_prefill(model, ports["prefill"], ports["boot"], COMMON + ["--max-total-tokens", "4096"],
                                   log_path=str(tmp_path / "prefill.log")),
            lambda: launch_decode(model, ports["decode"], COMMON + [
                "--max-total-tokens", "200", "--num-reserved-decode-tokens", "8",
                "--disaggregation-decode-retraction-backup", "host_pool",
                "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "6"],
                log_path=str(tmp_path / "decode.log")))
        procs.append(launch_router([(ports["prefill"], ports["boot"])], [ports["decode"]], ports["router"],
                                   log_path=str(tmp_path / "router.log")))
        params = {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}
        prompts = [p * 3 for p in random_prompts([9, 11, 7, 13, 10, 8], seed=4, vocab_hi=16)]
        with cf.ThreadPoolExecutor(len(prompts)) as ex:
            futs = [ex.submit(requests.post, url(ports["router"]) + "/generate",
                              json={"input_ids": p, "sampling_params": params}, timeout=300) for p in prompts]
            outs = [f.result().json() for f in futs]
        hf = load_hf_model(model)
        assert [o["output_ids"] for o in outs] == [hf_greedy(hf, p, 40) for p in prompts]
        assert sum(o["meta_info"]["num_retractions"] for o in outs) > 0
        assert sum(o["meta_info"].get("spec_num_correct_drafts", 0) for o in outs) > 0
        state = requests.get(url(ports["decode"]) + "/server_info", timeout=30).json()["internal_states"][0]
        backup = state["retraction_backup"]
        assert state["num_recomputed_tokens"] == 0 and state["num_running_reqs"] == 0
        assert backup["backend"] == "host_pool" and backup["live_backups"] == 0
        assert backup["host_pool_available"] == backup["host_pool_size"]
        assert state["protected_kv_tokens"] == 0
        assert state["available_kv_tokens"] + state["evictable_kv_tokens"] == state["max_total_num_tokens"]
    finally:
        for p in reversed(procs):
            stop_server(p)
