"""Helpers for PD tests: launch prefill/decode servers and the real sglang-router on 127.0.0.1."""

from __future__ import annotations

import subprocess
import sys
from typing import List, Optional, Sequence

from sglang.test.server_utils import find_free_port, popen_launch_server, stop_server, wait_healthy_or_stop


def launch_prefill(model_path: str, port: int, bootstrap_port: int, extra: Sequence[str] = (), log_path=None,
                   backend: str = "mooncake_tcp", env=None) -> subprocess.Popen:
    return popen_launch_server(model_path, port, ["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port",
                                                  str(bootstrap_port), "--disaggregation-transfer-backend", backend,
                                                  *extra], log_path=log_path, env=env)


def launch_decode(model_path: str, port: int, extra: Sequence[str] = (), log_path=None,
                  backend: str = "mooncake_tcp", env=None) -> subprocess.Popen:
    return popen_launch_server(model_path, port, ["--disaggregation-mode", "decode",
                                                  "--disaggregation-transfer-backend", backend, *extra],
                               log_path=log_path, env=env)


def launch_router(prefills: List[tuple], decodes: List[int], port: int, mini_lb: bool = False,
                  log_path: Optional[str] = None, timeout: float = 60) -> subprocess.Popen:
    """`prefills` = [(http_port, bootstrap_port)], `decodes` = [http_port]; the real sglang-router."""
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation"]
    if mini_lb:
        cmd.append("--mini-lb")
    for p, b in prefills:
        cmd += ["--prefill", f"http://127.0.0.1:{p}", str(b)]
    for d in decodes:
        cmd += ["--decode", f"http://127.0.0.1:{d}"]
    # Its metrics exporter defaults to port 29000: give each router its own so tests can run side by side.
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(find_free_port())]
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    if log_path:
        out.close()  # the child keeps its own descriptor
    return wait_healthy_or_stop(proc, port, timeout)


__all__ = ["find_free_port", "launch_prefill", "launch_decode", "launch_router", "stop_server"]
