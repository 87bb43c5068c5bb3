"""`--optimistic-prefill-attempts 1` on a prefill server (what `launch_pd` sets): a prompt is prefilled
before the decode server's KV slots arrive, in chunks whose pages wait in the prefill's pool, and the
whole KV goes out when the slots come; the decode's greedy text is the one a local prefill gives. A
decode side that never comes fails the request at the bootstrap timeout, and an abort frees it; every
pool is back to its initial free size afterwards. Real servers, Mooncake over loopback TCP."""

import concurrent.futures as cf
import time

import pytest
import requests

from sglang.srt.disaggregation.utils import FAKE_BOOTSTRAP_HOST
from sglang.test.fuzz.runner import internal_state, pool_violations, wait_idle
from sglang.test.pd_utils import find_free_port, launch_decode, launch_prefill, stop_server
from sglang.test.server_utils import start_side_by_side
from sglang.test.tiny_models import make_tiny_model

pytestmark = pytest.mark.server

ENV = {"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "6", "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "30"}
COMMON = ["--max-total-tokens", "2048", "--dtype", "float32"]
PARAMS = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
PROMPT = "An optimistic prefill computes this prompt in several chunks before the decode server is ready " * 3


def url(port):
    return f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    model_dir = make_tiny_model(str(tmp_path_factory.mktemp("optimistic_llama")), "llama", seed=11)
    logs = tmp_path_factory.mktemp("logs")
    ports = {"decode": find_free_port(), "prefill": find_free_port(), "boot": find_free_port()}
    decode_proc, prefill_proc = start_side_by_side(
        lambda: launch_decode(model_dir, ports["decode"], COMMON, env=ENV, log_path=str(logs / "decode.log")),
        lambda: launch_prefill(model_dir, ports["prefill"], ports["boot"],
                               COMMON + ["--chunked-prefill-size", "32", "--optimistic-prefill-attempts", "1"],
                               env=ENV, log_path=str(logs / "prefill.log")))
    yield ports
    for proc in (decode_proc, prefill_proc):
        stop_server(proc)


def _post(port, body, timeout=120):
    return requests.post(url(port) + "/generate", json=body, timeout=timeout)


def _pd_body(ports, room, rid):
    return {"text": PROMPT, "rid": rid, "sampling_params": PARAMS, "bootstrap_host": "127.0.0.1",
            "bootstrap_port": ports["boot"], "bootstrap_room": room}


def _wait_prefilled_without_slots(port, timeout=60.0) -> dict:
    """Until the prompt left the bootstrap queue and its forwards ran, with no decode slots yet."""
    deadline = time.time() + timeout
    while True:
        st = internal_state(url(port))
        d = st["disaggregation"]
        if (d["num_inflight_queue_reqs"] == 1 and d["num_bootstrap_queue_reqs"] == 0
                and st["num_waiting_reqs"] == 0 and st["num_running_reqs"] == 0):
            return st
        assert time.time() < deadline, f"the prompt was not prefilled ahead of the decode's slots: {st}"
        time.sleep(0.1)


def _assert_clean(*ports):
    for port in ports:
        assert pool_violations(wait_idle(url(port))) == []


def test_prefilled_before_the_decode_slots_then_sent_whole(servers):
    ports = servers
    reference = _post(ports["decode"], {"text": PROMPT, "sampling_params": PARAMS, "bootstrap_host": FAKE_BOOTSTRAP_HOST,
                                        "bootstrap_room": 0})
    assert reference.status_code == 200, reference.text
    n_prompt = reference.json()["meta_info"]["prompt_tokens"]
    with cf.ThreadPoolExecutor(2) as ex:
        prefill = ex.submit(_post, ports["prefill"], _pd_body(ports, 901, "opt-p"))
        st = _wait_prefilled_without_slots(ports["prefill"])
        held = st["max_total_num_tokens"] - st["available_kv_tokens"] - st["evictable_kv_tokens"]
        assert held >= n_prompt > 32  # the whole prompt's KV (more than one chunk) waits in the pool
        assert not prefill.done()
        decode = _post(ports["decode"], _pd_body(ports, 901, "opt-d"))
        assert prefill.result(timeout=60).status_code == 200
    assert decode.status_code == 200, decode.text
    out = decode.json()
    assert out["text"] == reference.json()["text"]
    assert out["meta_info"]["completion_tokens"] == PARAMS["max_new_tokens"]
    _assert_clean(ports["prefill"], ports["decode"])


def test_decode_side_that_never_comes_fails_at_the_bootstrap_timeout(servers):
    ports = servers
    t0 = time.monotonic()
    r = _post(ports["prefill"], _pd_body(ports, 902, "opt-lonely"))
    assert r.status_code >= 500 and "timed out" in r.text, r.text
    assert time.monotonic() - t0 < 30
    _assert_clean(ports["prefill"], ports["decode"])


def test_abort_of_a_prefilled_prompt_waiting_for_slots_frees_it(servers):
    ports = servers
    with cf.ThreadPoolExecutor(1) as ex:
        fut = ex.submit(_post, ports["prefill"], _pd_body(ports, 903, "opt-abort"))
        _wait_prefilled_without_slots(ports["prefill"])
        requests.post(url(ports["prefill"]) + "/abort_request", json={"rid": "opt-abort"}, timeout=10)
        r = fut.result(timeout=30)
    assert r.status_code == 200 and r.json()["meta_info"]["finish_reason"]["type"] == "abort", r.text
    _assert_clean(ports["prefill"], ports["decode"])
