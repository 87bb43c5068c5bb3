"""Faults under tensor parallelism (issue 54): a rank that dies or hangs takes the whole server
down with a non-zero exit and a clear log line within 30 s (never a hang), and a rank that
cannot reach --dist-init-addr fails at start with the address in the message."""

import os
import signal
import subprocess
import sys
import time

import pytest

from sglang.test.server_utils import find_free_port, popen_launch_server, read_log, stop_server
from sglang.test.tiny_models import make_tiny_model
from sglang.test.tp_utils import rank_pids

pytestmark = pytest.mark.server

ARGS = ["--tp-size", "2", "--dtype", "float32", "--max-total-tokens", "2048", "--skip-server-warmup"]
DOWN_WITHIN_S = 30


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("tp_fault_llama")), "llama", seed=5)


def _server_down_after(model, tmp_path, sig):
    port = find_free_port()
    proc = popen_launch_server(model, port, ARGS, log_path=str(tmp_path / "server.log"))
    try:
        pid = rank_pids(read_log(proc))[1]
        os.kill(pid, sig)
        t0 = time.monotonic()
        code = proc.wait(timeout=DOWN_WITHIN_S + 15)
        took = time.monotonic() - t0
        return code, took, read_log(proc)
    finally:
        stop_server(proc)


def test_killed_rank_takes_server_down(model, tmp_path):
    code, took, log = _server_down_after(model, tmp_path, signal.SIGKILL)
    assert code != 0
    assert took < DOWN_WITHIN_S, took
    assert "sglang::scheduler_TP1 process exited unexpectedly" in log or "a peer rank died" in log


def test_hung_rank_takes_server_down(model, tmp_path):
    """SIGSTOP: the rank is alive but answers nothing; rank 0's next collective (a keep-alive
    within a second, idle as it is) times out after SGLANG_TP_COLLECTIVE_TIMEOUT (20 s)."""
    code, took, log = _server_down_after(model, tmp_path, signal.SIGSTOP)
    assert code != 0
    assert took < DOWN_WITHIN_S, took
    assert "a peer rank died, hung or went away" in log


def test_unreachable_dist_init_addr_names_the_address(model, tmp_path):
    addr = f"127.0.0.1:{find_free_port()}"  # nobody serves the group's store there
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", model, "--host", "127.0.0.1",
           "--port", str(find_free_port()), "--tp-size", "2", "--nnodes", "2", "--node-rank", "1",
           "--dist-init-addr", addr, "--dist-timeout", "5", "--dtype", "float32"]
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    took = time.monotonic() - t0
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert f"could not join the group at --dist-init-addr {addr}" in text, text[-3000:]
    assert took < 90, took
