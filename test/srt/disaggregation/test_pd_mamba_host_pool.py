"""Host-pool retraction backups for hybrid SSM models (--enable-mamba-host-pool-backup, beyond
upstream) through a 1P1D deployment over Mooncake TCP behind the real sglang-router: a decode
server with a tiny KV pool retracts, backs the KV up to its host KV pool and the Mamba state to
its host state pool, resumes with nothing recomputed, and gives exactly HF transformers' greedy
tokens; afterwards every host page and state slot is free and the server keeps serving. Then waves
of long requests are aborted (the decode server's /abort_request) while many of them wait
retracted, until at least 100 were aborted that way: every backup is freed."""

import concurrent.futures as cf
import time

import pytest
import requests
from transformers import AutoTokenizer

from sglang.test.hf_reference import hf_greedy, load_hf_model
from sglang.test.pd_utils import find_free_port, launch_decode, launch_prefill, launch_router, stop_server
from sglang.test.server_utils import start_side_by_side
from sglang.test.tiny_models import make_tiny_model

pytestmark = pytest.mark.server

PROMPTS = ["The capital of France is", "Once upon a time", "1, 2, 3, 4,", "def fibonacci(n):", "Hello"]
COMMON = ["--dtype", "float32"]


def url(port):
    return f"http://127.0.0.1:{port}"


# Falcon-H1 takes the same path; it is covered in-process (test_decode_retraction_mamba.py) to keep CI short.
@pytest.mark.parametrize("arch", ["nemotron_h"])
def test_hybrid_host_pool_retraction_through_the_router(arch, tmp_path):
    model = make_tiny_model(str(tmp_path / arch), arch, seed=5)
    ports = {k: find_free_port() for k in ("prefill", "boot", "decode", "router")}
    procs = []
    try:
        procs += start_side_by_side(
            lambda: launch_prefill(model, ports["prefill"], ports["boot"], COMMON + ["--max-total-tokens", "4096"],
                                   log_path=str(tmp_path / "prefill.log")),
            lambda: launch_decode(model, ports["decode"], COMMON + [
                "--max-total-tokens", "200", "--num-reserved-decode-tokens", "8", "--enable-mamba-host-pool-backup"],
                log_path=str(tmp_path / "decode.log")))
        procs.append(launch_router([(ports["prefill"], ports["boot"])], [ports["decode"]], ports["router"],
                                   log_path=str(tmp_path / "router.log")))
        params = {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}
        tok = AutoTokenizer.from_pretrained(model)
        prompts = [tok.encode(p + " and then") for p in PROMPTS] * 2
        with cf.ThreadPoolExecutor(len(prompts)) as ex:
            futs = [ex.submit(requests.post, url(ports["router"]) + "/generate",
                              json={"input_ids": p, "sampling_params": params}, timeout=300) for p in prompts]
            outs = [f.result().json() for f in futs]
        hf = load_hf_model(model)
        want = [hf_greedy(hf, p, 40) for p in prompts[:len(PROMPTS)]] * 2
        assert [o["output_ids"] for o in outs] == want
        assert sum(o["meta_info"]["num_retractions"] for o in outs) > 0
        info = requests.get(url(ports["decode"]) + "/server_info", timeout=30).json()
        state = info["internal_states"][0]
        backup = state["retraction_backup"]
        assert state["num_recomputed_tokens"] == 0
        assert backup["backend"] == "host_pool" and backup["live_backups"] == 0  # auto picks it with the opt-in
        assert backup["host_pool_available"] == backup["host_pool_size"]
        assert backup["mamba_host_slots_free"] == backup["mamba_host_slots_total"] > 0
        again = requests.post(url(ports["router"]) + "/generate", json={"input_ids": prompts[0], "sampling_params": params},
                              timeout=120)
        assert again.status_code == 200 and again.json()["output_ids"] == want[0]

        aborted_retracted, waves = _abort_while_retracted(url(ports["router"]), url(ports["decode"]), target=100)
        assert aborted_retracted >= 100, (aborted_retracted, waves)
        state = requests.get(url(ports["decode"]) + "/server_info", timeout=30).json()["internal_states"][0]
        backup = state["retraction_backup"]
        assert backup["live_backups"] == 0 and backup["host_pool_available"] == backup["host_pool_size"]
        assert backup["mamba_host_slots_free"] == backup["mamba_host_slots_total"]
        assert state["num_running_reqs"] == 0 and state["num_recomputed_tokens"] == 0
        again = requests.post(url(ports["router"]) + "/generate", json={"input_ids": prompts[1], "sampling_params": params},
                              timeout=120)
        assert again.status_code == 200 and again.json()["output_ids"] == want[1]
    finally:
        for p in reversed(procs):
            stop_server(p)


def _abort_while_retracted(router: str, decode: str, target: int, width: int = 12, max_waves: int = 40):
    """Sends waves of `width` long requests through the router; once several wait in the decode
    server's retracted queue, aborts them all there. Returns (requests that were waiting retracted
    when their abort came, as /server_info counted them just before it; waves)."""
    params = {"temperature": 0, "max_new_tokens": 120, "ignore_eos": True}
    total = 0
    for wave in range(max_waves):
        with cf.ThreadPoolExecutor(width) as ex:
            futs = [ex.submit(requests.post, router + "/generate",
                              json={"text": f"wave {wave}, request {i}: once upon a time", "sampling_params": params},
                              timeout=120) for i in range(width)]
            retracted, deadline = 0, time.monotonic() + 60
            while time.monotonic() < deadline and not all(f.done() for f in futs):
                state = requests.get(decode + "/server_info", timeout=30).json()["internal_states"][0]
                retracted = state["disaggregation"]["num_retracted_queue_reqs"]
                if retracted >= width // 2:
                    break
                time.sleep(0.02)
            requests.post(decode + "/abort_request", json={"rid": "", "abort_all": True}, timeout=30)
            outs = [f.result() for f in futs]
        assert all(o.status_code == 200 for o in outs), [o.text for o in outs if o.status_code != 200]
        reasons = [o.json()["meta_info"]["finish_reason"]["type"] for o in outs]
        assert reasons.count("abort") >= retracted, (reasons, retracted)
        total += retracted
        if total >= target:
            return total, wave + 1
    return total, max_waves
