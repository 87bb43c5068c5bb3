"""/health means the scheduler is alive, and the watchdog covers the whole step.

Issue 51, finding 2: while one request froze the scheduler, `/health` answered 200 in 0.02 s
(it never asks the scheduler), and the watchdog timed only the model forward. Now the scheduler
loop ticks a heartbeat in shared memory that `/health` reads (503 when it is older than
`SGLANG_HEALTH_CHECK_TIMEOUT`), and the watchdog reads the same heartbeat. The scheduler is
stalled from outside with the test hook `SGLANG_TEST_SCHEDULER_STALL_FILE` (the loop sleeps while
the file exists: a stuck step outside any forward).
"""

import os
import time

import pytest
import requests

from sglang.test.security_probe import assert_server_whole
from sglang.test.server_utils import find_free_port, popen_launch_server, read_log, stop_server

pytestmark = pytest.mark.server

HEALTH_BOUND_S = 3


def _start(model, tmp_path, name, extra_args=(), health_bound=HEALTH_BOUND_S):
    stall = str(tmp_path / f"{name}.stall")
    port = find_free_port()
    proc = popen_launch_server(model, port, ["--dtype", "float32", "--max-total-tokens", "4096", *extra_args],
                               env={"SGLANG_TEST_SCHEDULER_STALL_FILE": stall,
                                    "SGLANG_HEALTH_CHECK_TIMEOUT": str(health_bound)},
                               log_path=str(tmp_path / f"{name}.log"))
    return proc, f"http://127.0.0.1:{port}", stall


def _health(url):
    t0 = time.perf_counter()
    r = requests.get(url + "/health", timeout=10)
    return r, time.perf_counter() - t0


def _wait_status(url, status, within):
    """Seconds until /health answers `status` (each answer itself fast: it never waits on the scheduler)."""
    t0 = time.monotonic()
    while True:
        r, took = _health(url)
        assert took < 2, f"/health took {took:.2f} s"
        if r.status_code == status:
            return time.monotonic() - t0, r
        assert time.monotonic() - t0 < within, f"/health still {r.status_code} after {within} s"
        time.sleep(0.2)


@pytest.mark.parametrize("role", ["plain", "pd_decode"])
def test_stuck_scheduler_turns_health_503_within_the_bound(tiny_llama, tmp_path, role):
    extra = [] if role == "plain" else ["--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "fake"]
    proc, url, stall = _start(tiny_llama, tmp_path, role, extra)
    try:
        # Idle for longer than the bound: the loop still turns (its poll has a timeout), so 200.
        time.sleep(HEALTH_BOUND_S + 1.5)
        assert _health(url)[0].status_code == 200
        open(stall, "w").close()
        took, r = _wait_status(url, 503, within=HEALTH_BOUND_S + 10)
        assert HEALTH_BOUND_S - 0.5 <= took <= HEALTH_BOUND_S + 5, took
        assert "scheduler loop has not turned" in r.text and "SGLANG_HEALTH_CHECK_TIMEOUT=3" in r.text
        assert requests.get(url + "/health_generate", timeout=10).status_code == 503
        os.remove(stall)
        took, _ = _wait_status(url, 200, within=10)
        assert took < 5
        if role == "plain":
            g = requests.post(url + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 4}},
                              timeout=60)
            assert g.status_code == 200, g.text
            assert_server_whole(url)
        assert proc.poll() is None
    finally:
        if os.path.exists(stall):
            os.remove(stall)
        stop_server(proc)


def test_watchdog_ends_a_server_whose_step_is_stuck_outside_the_forward(tiny_llama, tmp_path):
    proc, url, stall = _start(tiny_llama, tmp_path, "watchdog", ["--watchdog-timeout", "4"], health_bound=60)
    try:
        time.sleep(6)  # idle longer than the timeout: the watchdog stays quiet
        assert proc.poll() is None and _health(url)[0].status_code == 200
        open(stall, "w").close()  # the loop sleeps at the start of a turn: no forward runs
        code = proc.wait(timeout=60)
        assert code == 1
        assert "Scheduler watchdog timeout (self.watchdog_timeout=4.0, self.soft=False)" in read_log(proc)
    finally:
        if os.path.exists(stall):
            os.remove(stall)
        stop_server(proc)
