"""Helpers for tests that run the real server as a subprocess on 127.0.0.1.

`popen_launch_server` starts `python -m sglang.launch_server` with the given model and extra
flags and waits until `/health` answers 200 (which, as upstream, happens only after the
warm-up request unless `--skip-server-warmup`); `stop_server` sends SIGTERM and makes sure the
whole process tree is gone even if the server misbehaves.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence

DEFAULT_STARTUP_TIMEOUT = 180.0


_ports_given: set = set()


def find_free_port() -> int:
    """A port free now and not handed out before in this process. The kernel may offer a port
    again as soon as the probe socket closes, so two calls made before either server binds
    could return the same port (a router launched on its decode server's port then "answered"
    through that server, and the test's requests reached the decode server without bootstrap
    fields)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _ports_given:
            _ports_given.add(port)
            return port


def wait_for_health(base_url: str, timeout: float = DEFAULT_STARTUP_TIMEOUT, process: Optional[subprocess.Popen] = None,
                    api_key: Optional[str] = None, path: str = "/health") -> None:
    """Polls `base_url + path` until it answers 200; fails early if `process` exits."""
    import requests

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"The server exited during start-up with code {process.returncode}.")
        try:
            r = requests.get(base_url + path, headers=headers, timeout=5)
            if r.status_code == 200:
                return
            last = f"status {r.status_code}"
        except requests.RequestException as e:
            last = repr(e)
        time.sleep(0.25)
    raise TimeoutError(f"{base_url}{path} was not healthy within {timeout:.0f} s (last: {last}).")


def popen_launch_server(model_path: str, port: int, extra_args: Sequence[str] = (), env: Optional[Dict[str, str]] = None,
                        timeout: float = DEFAULT_STARTUP_TIMEOUT, api_key: Optional[str] = None,
                        log_path: Optional[str] = None, wait: bool = True) -> subprocess.Popen:
    """Starts the server on 127.0.0.1:`port`; returns the Popen once it is healthy.

    Output goes to `log_path` (or is inherited when None). With `api_key`, `--api-key` is
    passed too. On a start-up failure the process tree is stopped before raising."""
    cmd: List[str] = [sys.executable, "-m", "sglang.launch_server", "--model-path", model_path,
                      "--host", "127.0.0.1", "--port", str(port)]
    if api_key:
        cmd += ["--api-key", api_key]
    cmd += list(extra_args)
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env.update(env or {})
    out = open(log_path, "ab") if log_path else None
    proc = subprocess.Popen(cmd, env=full_env, stdout=out, stderr=subprocess.STDOUT if out else None)
    proc.log_path = log_path  # type: ignore[attr-defined]
    if out is not None:
        out.close()
    if not wait:
        return proc
    return wait_healthy_or_stop(proc, port, timeout)


def start_side_by_side(*starts: Callable[[], subprocess.Popen]) -> List[subprocess.Popen]:
    """Runs server start functions (each returns a healthy Popen) concurrently: start-up is
    mostly imports and model loading, so two servers come up in ~0.7x the time of one after the
    other. Returns the Popens in order; if one fails, the others are stopped and it raises."""
    import concurrent.futures as cf

    with cf.ThreadPoolExecutor(len(starts)) as ex:
        futs = [ex.submit(fn) for fn in starts]
        cf.wait(futs)
    failed = [f for f in futs if f.exception() is not None]
    if failed:
        for f in futs:
            if f.exception() is None:
                stop_server(f.result())
        raise failed[0].exception()
    return [f.result() for f in futs]


def wait_healthy_or_stop(proc: subprocess.Popen, port: int, timeout: float) -> subprocess.Popen:
    """Waits for 127.0.0.1:`port`/health; stops the process if it never gets there."""
    try:
        wait_for_health(f"http://127.0.0.1:{port}", timeout=timeout, process=proc)
    except BaseException:
        stop_server(proc)
        raise
    return proc


def stop_server(proc: subprocess.Popen, timeout: float = 30.0) -> Optional[int]:
    """SIGTERM, wait; whatever of the tree is still alive afterwards gets SIGKILL."""
    import psutil

    try:
        tree = [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        code = None
    for p in tree:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    if code is None:
        code = proc.wait(timeout=10)
    return code


def read_log(proc: subprocess.Popen) -> str:
    path = getattr(proc, "log_path", None)
    if not path or not os.path.exists(path):
        return ""
    with open(path, errors="replace") as f:
        return f.read()


def hf_greedy_reference(model_path: str, input_ids: List[int], max_new_tokens: int, top_k: int = 0):
    """Greedy continuation of `input_ids` by HF transformers (fp32, no EOS stop): the reference
    the server's outputs are checked against. Returns (output_ids, logprobs of the chosen tokens,
    top-k [(logprob, id)] per step)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model.eval()
    ids = list(input_ids)
    out_ids, logprobs, tops = [], [], []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            lp = torch.log_softmax(logits, dim=-1)
            tok = int(torch.argmax(lp))
            out_ids.append(tok)
            logprobs.append(float(lp[tok]))
            if top_k:
                v, i = torch.topk(lp, top_k)
                tops.append(list(zip(v.tolist(), i.tolist())))
            ids.append(tok)
    return out_ids, logprobs, tops
