"""--nnodes 2 (issue 54): two "nodes" as two launch_server processes on 127.0.0.1, one TP rank
each, meeting at --dist-init-addr. Node 0 serves HTTP, node 1 runs its rank only; greedy tokens
equal HF's; killing node 1 takes node 0 down (non-zero, within 30 s), and a clean stop of node 0
stops node 1 with exit code 0."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import requests

from sglang.test.server_utils import find_free_port, read_log, stop_server, wait_healthy_or_stop
from sglang.test.tiny_models import make_tiny_model
from sglang.test.tp_utils import GREEDY, hf_tokens, prompts

pytestmark = pytest.mark.server


def _node(model, port, node_rank, addr, log_path, cores):
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", model, "--host", "127.0.0.1",
           "--port", str(port), "--tp-size", "2", "--nnodes", "2", "--node-rank", str(node_rank),
           "--dist-init-addr", addr, "--dtype", "float32", "--max-total-tokens", "2048"]
    # One core per node: the two "nodes" share this host (SGLANG_CPU_OMP_THREADS_BIND, upstream's syntax).
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SGLANG_CPU_OMP_THREADS_BIND": cores}
    out = open(log_path, "ab")
    proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    proc.log_path = log_path
    out.close()
    return proc


def _kill_tree(proc):
    try:
        procs = [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


@pytest.fixture
def nodes(tmp_path):
    model = make_tiny_model(str(tmp_path / "llama"), "llama", seed=7)
    cores = sorted(os.sched_getaffinity(0))
    addr, port = f"127.0.0.1:{find_free_port()}", find_free_port()
    port1 = find_free_port()
    node1 = _node(model, port1, 1, addr, str(tmp_path / "node1.log"), str(cores[-1]))
    node0 = _node(model, port, 0, addr, str(tmp_path / "node0.log"), str(cores[0]))
    try:
        wait_healthy_or_stop(node0, port, timeout=240)
    except BaseException:
        _kill_tree(node1)
        raise
    yield {"url": f"http://127.0.0.1:{port}", "url1": f"http://127.0.0.1:{port1}", "model": model, "node0": node0,
           "node1": node1}
    stop_server(node0)
    _kill_tree(node1)
    node1.wait(timeout=30)


def test_two_nodes_greedy_equal_hf_then_node1_dies(nodes):
    ids = prompts()
    r = requests.post(nodes["url"] + "/generate", json={"input_ids": ids, "sampling_params": GREEDY}, timeout=120)
    assert r.status_code == 200, r.text
    assert [o["output_ids"] for o in r.json()] == hf_tokens(nodes["model"], ids)
    log1 = read_log(nodes["node1"])
    assert "node 0 serves HTTP" in log1 and "Uvicorn running" not in log1
    # As upstream, node 1 answers health probes only.
    assert requests.get(nodes["url1"] + "/health", timeout=10).status_code == 200
    assert requests.post(nodes["url1"] + "/generate", json={"text": "x"}, timeout=10).status_code in (404, 501)

    _kill_tree(nodes["node1"])  # the whole second node goes away
    t0 = time.monotonic()
    code = nodes["node0"].wait(timeout=60)
    assert code != 0
    assert time.monotonic() - t0 < 30


def test_stopping_node0_stops_node1_cleanly(nodes):
    nodes["node0"].send_signal(signal.SIGTERM)
    assert nodes["node0"].wait(timeout=60) == 0
    assert nodes["node1"].wait(timeout=60) == 0, read_log(nodes["node1"])[-2000:]
