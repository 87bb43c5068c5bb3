"""PD faults seen from a client of the real sglang-router (issue 13): a request one side refuses
(the decode for its pool, the prefill for its context), a client abort before the decode server
bootstrapped, and a decode server that dies while requests wait on it. Each: the affected
requests end with a clear answer within a bounded time (the router must not wait out a
bootstrap timeout), nothing leaks, and whatever survives keeps serving. (A prefill killed while
the decode waits for its KV, and an unreachable bootstrap server: test_pd_faults.py.)
"""

import concurrent.futures as cf
import time

import pytest
import requests

from sglang.test.fuzz.runner import assert_pools_restored
from sglang.test.pd_utils import find_free_port, launch_decode, launch_prefill, launch_router, stop_server
from sglang.test.server_utils import start_side_by_side
from sglang.test.tiny_models import make_tiny_model

pytestmark = pytest.mark.server

FAST_FAIL = {
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "6",
    "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "6",
    "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "0.5",
    "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "2",
}
PARAMS = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
DECODE_POOL = 256
PREFILL_CONTEXT = 160


def url(port):
    return f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("pd_router_faults")), "llama", seed=19)


@pytest.fixture(scope="module")
def deployment(model_dir, tmp_path_factory):
    """Prefill with a big pool and a short context, decode with a small pool and the model's
    context, the real router in front. The test that kills the decode server runs last."""
    tmp_path = tmp_path_factory.mktemp("logs")
    ports = {k: find_free_port() for k in ("prefill", "boot", "decode", "router")}
    procs = {}
    try:
        procs["prefill"], procs["decode"] = start_side_by_side(
            lambda: launch_prefill(model_dir, ports["prefill"], ports["boot"],
                                   ["--max-total-tokens", "4096", "--context-length", str(PREFILL_CONTEXT)],
                                   env=FAST_FAIL, log_path=str(tmp_path / "prefill.log")),
            lambda: launch_decode(model_dir, ports["decode"], ["--max-total-tokens", str(DECODE_POOL)],
                                  env=FAST_FAIL, log_path=str(tmp_path / "decode.log")))
        procs["router"] = launch_router([(ports["prefill"], ports["boot"])], [ports["decode"]], ports["router"],
                                        log_path=str(tmp_path / "router.log"))
        yield ports, procs
    finally:
        for name in ("router", "decode", "prefill"):
            if name in procs:
                stop_server(procs[name])


def _timed_post(u, body, timeout=60):
    t0 = time.time()
    r = requests.post(u, json=body, timeout=timeout)
    return r, time.time() - t0


def test_refusals_aborts_and_pool_exhaustion_end_promptly(deployment):
    ports, _ = deployment
    router = url(ports["router"])
    # A prompt the decode pool cannot hold: the decode server refuses it (400) and tells the
    # prefill, so the router does not wait out the prefill's bootstrap timeout.
    r, took = _timed_post(router + "/generate", {"input_ids": list(range(1, 300)), "sampling_params": PARAMS})
    assert r.status_code == 400 and took < 4, (took, r.text)
    assert "exceeds the maximum allowed length" in r.text
    # A prompt only the prefill server refuses (longer than its context): its refusal reaches
    # the decode server, which answers the same 400 instead of waiting for KV that never comes.
    r, took = _timed_post(router + "/generate", {"input_ids": list(range(1, 181)), "sampling_params": PARAMS})
    assert r.status_code == 400 and took < 4, (took, r.text)
    assert "The prefill server refused the request" in r.text and "context length (160 tokens)" in r.text
    # (A request whose output alone would exhaust the pool is clamped, as upstream: test_scheduler.py.)
    # An abort that reaches the decode server before it has bootstrapped with the prefill.
    with cf.ThreadPoolExecutor(1) as ex:
        fut = ex.submit(_timed_post, router + "/generate",
                        {"text": "abort me early", "rid": "early-abort", "sampling_params": {**PARAMS, "max_new_tokens": 140}})
        time.sleep(0.02)  # a 64-token answer could finish within 50 ms on a fast machine
        requests.post(url(ports["decode"]) + "/abort_request", json={"rid": "early-abort"}, timeout=10)
        r, took = fut.result(timeout=60)
    assert r.status_code == 200 and took < 4, (took, r.text)
    assert r.json()["meta_info"]["completion_tokens"] < 140  # aborted, not retried to completion
    assert_pools_restored([url(ports["prefill"]), url(ports["decode"])])
    r = requests.post(router + "/generate", json={"text": "still serving", "sampling_params": PARAMS}, timeout=60)
    assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 8


def test_decode_killed_while_requests_wait_on_it(deployment):
    """Requests whose decode server dies get an error from the router quickly; the prefill server
    drops what it held for them (bootstrap timeout) and stays healthy."""
    ports, procs = deployment
    router = url(ports["router"])
    with cf.ThreadPoolExecutor(4) as ex:
        futs = [ex.submit(_timed_post, router + "/generate",
                          {"text": f"long one {i}", "sampling_params": {**PARAMS, "max_new_tokens": 140}})
                for i in range(4)]
        time.sleep(1.0)
        procs["decode"].kill()
        results = [f.result(timeout=90) for f in futs]
    for r, took in results:
        assert took < 45, took  # the router's own give-up takes ~30 s (30.5 s seen on a loaded machine)
        assert r.status_code >= 500 or r.json()["meta_info"]["completion_tokens"] == 140, r.text
    assert requests.get(url(ports["prefill"]) + "/health", timeout=10).status_code == 200
    assert_pools_restored([url(ports["prefill"])], timeout=30)
