"""Server lifecycle on real subprocesses: SIGTERM with a request in flight stops every process
(before the main process exits) and removes the ZMQ IPC files; a dead scheduler takes the whole
server down with exit code 1 instead of leaving it half alive.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import psutil
import pytest
import requests

from sglang.test.server_utils import find_free_port, popen_launch_server, read_log, stop_server, wait_for_health
from sglang.test.tiny_models import make_tiny_model

pytestmark = pytest.mark.server

CONTEXT_LEN = 8192  # room for a request far longer than the shutdown drain (3 s)
LONG = {"temperature": 0, "max_new_tokens": 8000, "ignore_eos": True}


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Servers started side by side (one is shut down, one loses its scheduler, one gets a child's SIGQUIT)."""
    model = make_tiny_model(str(tmp_path_factory.mktemp("tiny_llama")), "llama", max_position_embeddings=CONTEXT_LEN)
    logs = tmp_path_factory.mktemp("logs")
    started = {}
    for name, extra in (("term", ["--skip-server-warmup"]), ("dead", []), ("quit", ["--skip-server-warmup"])):
        port = find_free_port()
        proc = popen_launch_server(model, port, ["--max-total-tokens", str(CONTEXT_LEN + 1024), *extra],
                                   log_path=str(logs / f"{name}.log"), wait=False)
        started[name] = {"proc": proc, "url": f"http://127.0.0.1:{port}"}
    try:
        for s in started.values():
            wait_for_health(s["url"], process=s["proc"])
        yield started
    finally:
        for s in started.values():
            stop_server(s["proc"])


def _tree(pid):
    root = psutil.Process(pid)
    return [root] + root.children(recursive=True)


def _ipc_paths(procs):
    paths = set()
    for p in procs:
        for conn in p.net_connections(kind="unix"):
            if isinstance(conn.laddr, str) and conn.laddr.startswith("/"):
                paths.add(conn.laddr)
    return {x for x in paths if x and os.path.exists(x)}


def _engine_children(pid):
    """The scheduler and detokenizer: the multiprocessing 'spawn' children of the server."""
    out = []
    for p in psutil.Process(pid).children():
        if any("spawn_main" in part for part in p.cmdline()):
            out.append(p)
    return out


def _post_in_thread(url, payload, **kw):
    box = {}

    def run():
        try:
            box["response"] = r = requests.post(url + "/generate", json=payload, timeout=60, **kw)
            box["body"] = r.content.decode()
        except requests.RequestException as e:
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def _wait_running(url, timeout=60.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        st = requests.get(url + "/server_info", timeout=30).json()["internal_states"][0]
        if st["num_running_reqs"] >= 1:
            return
        time.sleep(0.05)
    raise AssertionError("the request never started running")


def test_skip_server_warmup_still_declares_ready(servers):
    s = servers["term"]
    log = read_log(s["proc"])
    assert "The server is fired up and ready to roll!" in log
    assert "POST /generate" not in log  # no warm-up request was sent


def test_sigterm_stops_every_process_and_removes_ipc_files(servers):
    s = servers["term"]
    procs = _tree(s["proc"].pid)
    assert len(_engine_children(s["proc"].pid)) == 2
    ipc = _ipc_paths(procs)
    assert ipc, "expected the ZMQ IPC socket files of the engine"
    t, box = _post_in_thread(s["url"], {"text": "in flight", "sampling_params": LONG, "stream": True}, stream=True)
    _wait_running(s["url"])
    s["proc"].send_signal(signal.SIGTERM)
    assert s["proc"].wait(timeout=60) == 0
    # No child outlives the main process (the multiprocessing resource tracker included).
    gone, alive = psutil.wait_procs(procs, timeout=0.2)
    assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []
    assert [x for x in ipc if os.path.exists(x)] == []
    t.join(30)
    assert not t.is_alive()
    # The stream was not cut: it ended with an abort chunk and [DONE].
    events = [e for e in box["body"].split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][len("data: "):])["meta_info"]["finish_reason"]["type"] == "abort"
    log = read_log(s["proc"])
    assert "Aborting 1 unfinished request(s) for shutdown." in log
    assert "Shutting down the engine processes." in log
    assert "leaked semaphore" not in log


def test_dead_scheduler_takes_the_whole_server_down(servers):
    """Issue 13: a scheduler that dies (here: SIGKILL, as the OOM killer would) makes the server
    exit non-zero, with the in-flight request answered and no process left, instead of a
    half-dead server answering 503 forever."""
    s = servers["dead"]
    url = s["url"]
    assert requests.get(url + "/health", timeout=10).status_code == 200
    t, box = _post_in_thread(url, {"text": "in flight", "sampling_params": LONG})
    _wait_running(url)
    procs = _tree(s["proc"].pid)
    _engine_children(s["proc"].pid)[0].kill()  # the scheduler or the detokenizer: either is fatal
    t0 = time.time()
    assert s["proc"].wait(timeout=30) == 1
    assert time.time() - t0 < 20
    _, alive = psutil.wait_procs(procs, timeout=0.5)
    assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []
    t.join(30)
    assert not t.is_alive()
    # Answered with a 5xx before the server went down, or cut by the exit: never left hanging.
    assert "error" in box or box["response"].status_code >= 500, box
    log = read_log(s["proc"])
    assert "exited unexpectedly" in log and "The server exits with code 1" in log


def test_sigquit_from_a_child_takes_the_server_down(servers):
    """A child reports a fatal error with SIGQUIT (as upstream's do): the server exits 1, children first."""
    s = servers["quit"]
    procs = _tree(s["proc"].pid)
    s["proc"].send_signal(signal.SIGQUIT)
    assert s["proc"].wait(timeout=30) == 1
    _, alive = psutil.wait_procs(procs, timeout=0.5)
    assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []
    log = read_log(s["proc"])
    assert "Received sigquit from a child process. It usually means the child failed." in log
