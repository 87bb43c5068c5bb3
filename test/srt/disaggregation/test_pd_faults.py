"""PD failures end promptly with a clear error and leak nothing (issue 6): a dead bootstrap port, a
prefill server SIGKILLed while it sends KV (and more requests wait for theirs), and aborts while a
transfer is pending."""

import concurrent.futures as cf
import time

import pytest
import requests

from sglang.srt.disaggregation.utils import FAKE_BOOTSTRAP_HOST
from sglang.test.pd_utils import find_free_port, launch_decode, launch_prefill, stop_server
from sglang.test.server_utils import start_side_by_side
from sglang.test.tiny_models import make_tiny_model

pytestmark = pytest.mark.server

FAST_FAIL = {
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "8",
    "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "8",
    "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "0.5",
    "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "2",
}
COMMON = ["--max-total-tokens", "2048", "--dtype", "float32"]
PARAMS = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}


def url(port):
    return f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("pd_fault_llama")), "llama", seed=7)


@pytest.fixture(scope="module")
def servers(model_dir, tmp_path_factory):
    """A decode server and a prefill server, started side by side; the last test kills the prefill."""
    logs = tmp_path_factory.mktemp("logs")
    ports = {"decode": find_free_port(), "prefill": find_free_port(), "boot": find_free_port()}
    decode_proc, prefill_proc = start_side_by_side(
        lambda: launch_decode(model_dir, ports["decode"], COMMON, env=FAST_FAIL, log_path=str(logs / "decode.log")),
        lambda: launch_prefill(model_dir, ports["prefill"], ports["boot"], COMMON + ["--chunked-prefill-size", "32"],
                               env=FAST_FAIL,
                               log_path=str(logs / "prefill.log")))
    procs = {"decode": decode_proc, "prefill": prefill_proc}
    yield ports, procs
    for proc in procs.values():
        if proc is not None:
            stop_server(proc)


@pytest.fixture(scope="module")
def decode(servers):
    return servers[0]["decode"]


def state(port):
    return requests.get(url(port) + "/server_info", timeout=30).json()["internal_states"][0]


def assert_idle_and_clean(port):
    s = state(port)
    assert s["num_running_reqs"] == 0 and s["num_waiting_reqs"] == 0
    assert s["available_kv_tokens"] + s["evictable_kv_tokens"] == s["max_total_num_tokens"]
    assert s["protected_kv_tokens"] == 0
    assert s["available_req_slots"] == s["req_pool_size"]
    d = s["disaggregation"]
    assert d.get("num_prealloc_queue_reqs", 0) == 0 and d.get("num_transfer_queue_reqs", 0) == 0
    assert d.get("num_bootstrap_queue_reqs", 0) == 0 and d.get("num_inflight_queue_reqs", 0) == 0
    if "available_metadata_rows" in d:
        assert d["available_metadata_rows"] == 2 * s["max_running_requests"]


def test_dead_bootstrap_port_fails_promptly(decode):
    dead = find_free_port()
    t0 = time.time()
    r = requests.post(url(decode) + "/generate", timeout=60, json={
        "text": "hello", "sampling_params": PARAMS, "bootstrap_host": "127.0.0.1", "bootstrap_port": dead,
        "bootstrap_room": 42})
    assert time.time() - t0 < 30
    assert r.status_code >= 500, r.text
    body = r.json()
    message = body["error"]["message"] if "error" in body else body["message"]
    assert "Failed to receive the KV cache" in message and "Connection refused" in message
    assert_idle_and_clean(decode)


def test_abort_during_transfer_on_both_sides(servers):
    ports, _ = servers
    decode, p, b = ports["decode"], ports["prefill"], ports["boot"]
    with cf.ThreadPoolExecutor(2) as ex:
        # Decode-only: waits for KV that never comes (the prefill never gets this request).
        dec = ex.submit(requests.post, url(decode) + "/generate", timeout=90, json={
            "text": "abort me", "rid": "abort-d", "sampling_params": PARAMS, "bootstrap_host": "127.0.0.1",
            "bootstrap_port": b, "bootstrap_room": 99})
        # Prefill-only: waits in its bootstrap queue for a decode that never asks.
        pre = ex.submit(requests.post, url(p) + "/generate", timeout=90, json={
            "text": "abort me too", "rid": "abort-p", "sampling_params": PARAMS, "bootstrap_host": "127.0.0.1",
            "bootstrap_port": b, "bootstrap_room": 100})
        time.sleep(2)
        assert not dec.done() and not pre.done()
        requests.post(url(decode) + "/abort_request", json={"rid": "abort-d"}, timeout=10)
        requests.post(url(p) + "/abort_request", json={"rid": "abort-p"}, timeout=10)
        for fut in (dec, pre):
            body = fut.result(timeout=30).json()
            reason = body["meta_info"]["finish_reason"] if "meta_info" in body else {"type": "abort"}
            assert reason["type"] == "abort", body
    assert_idle_and_clean(decode)
    assert_idle_and_clean(p)


def _cpu_seconds(proc) -> float:
    """CPU time of a server process and its children (scheduler, detokenizer) so far."""
    import psutil

    procs = [psutil.Process(proc.pid)]
    procs += procs[0].children(recursive=True)
    return sum(sum(p.cpu_times()[:2]) for p in procs)


def test_requests_waiting_on_the_other_side_do_not_spin(servers):
    """A decode request waiting for KV and a prefill request waiting for its decode side leave
    the cores to others (on a shared machine, the other server's forwards): each scheduler waits
    for its next message between polls instead of stepping in a busy loop."""
    ports, procs = servers
    decode, p, b = ports["decode"], ports["prefill"], ports["boot"]
    with cf.ThreadPoolExecutor(2) as ex:
        futs = [ex.submit(requests.post, url(port) + "/generate", timeout=90, json={
            "text": "waiting", "rid": f"wait-{role}", "sampling_params": PARAMS, "bootstrap_host": "127.0.0.1",
            "bootstrap_port": b, "bootstrap_room": room}) for role, port, room in (("d", decode, 201), ("p", p, 202))]
        time.sleep(1.5)  # both have bootstrapped and wait
        before = {role: _cpu_seconds(procs[role]) for role in ("decode", "prefill")}
        t0 = time.monotonic()
        time.sleep(3)
        used = {role: _cpu_seconds(procs[role]) - before[role] for role in ("decode", "prefill")}
        wall = time.monotonic() - t0
        assert not any(f.done() for f in futs)
        for rid in ("wait-d", "wait-p"):
            requests.post(url(decode if rid == "wait-d" else p) + "/abort_request", json={"rid": rid}, timeout=10)
        for fut in futs:
            fut.result(timeout=30)
    for role, seconds in used.items():
        assert seconds < 0.25 * wall, f"{role} server used {seconds:.2f} s of CPU in {wall:.1f} s while waiting"
    assert_idle_and_clean(decode)
    assert_idle_and_clean(p)


def _kill_tree(proc) -> None:
    """SIGKILL a server and its children at once (an OOM kill or a lost machine: no shutdown path)."""
    import psutil

    parent = psutil.Process(proc.pid)
    for p in parent.children(recursive=True) + [parent]:  # children first: they die with the parent
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait(timeout=30)


def test_prefill_killed_mid_transfer(servers):
    """Runs last: it SIGKILLs the module's prefill server while it prefills and sends the KV of
    long prompts in 32-token chunks, with more requests bootstrapped behind them. Every decode
    request ends within a bounded time (200 if its KV had fully arrived, else a 5xx), the decode
    server's pools are whole again, and it goes on serving."""
    ports, procs = servers
    decode, prefill, b = ports["decode"], ports["prefill"], ports["boot"]
    params = {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}

    def body(room):
        return {"input_ids": [5 + (room + i) % 900 for i in range(300)], "sampling_params": params,
                "bootstrap_host": "127.0.0.1", "bootstrap_port": b, "bootstrap_room": room}

    # 12 x 300 tokens of prefill work (in 32-token chunks), so that the poll below catches the
    # server busy: with 6, one full-suite run after the faster fp32 kernels never saw it busy
    rooms = list(range(100, 112))
    with cf.ThreadPoolExecutor(2 * len(rooms)) as ex:
        dfuts = [ex.submit(requests.post, url(decode) + "/generate", json=body(r), timeout=120) for r in rooms]
        pfuts = [ex.submit(requests.post, url(prefill) + "/generate", json=body(r), timeout=120) for r in rooms]
        deadline, busy = time.time() + 60, False
        while not busy and time.time() < deadline:  # until a request prefills or its KV is on its way
            info = state(prefill)
            busy = info["disaggregation"].get("num_inflight_queue_reqs", 0) + info["num_running_reqs"] > 0
            time.sleep(0.01)
        assert busy, "the prefill server never started on the requests"
        _kill_tree(procs["prefill"])
        procs["prefill"] = None
        t0 = time.time()
        results = [f.result() for f in dfuts]
        for f in pfuts:  # the prefill's own answers: connection errors or whatever it sent before dying
            f.exception()
    assert time.time() - t0 < 30
    codes = [r.status_code for r in results]
    assert all(c == 200 or c >= 500 for c in codes), [(r.status_code, r.text[:200]) for r in results]
    assert any(c >= 500 for c in codes), codes  # the kill came before the last transfer
    assert_idle_and_clean(decode)
    local = {"text": "still serving", "sampling_params": PARAMS, "bootstrap_host": FAKE_BOOTSTRAP_HOST,
             "bootstrap_room": 0}  # computed by the decode server itself (the warm-up path)
    r = requests.post(url(decode) + "/generate", json=local, timeout=60)
    assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == PARAMS["max_new_tokens"], r.text
    assert_idle_and_clean(decode)
