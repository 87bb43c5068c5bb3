"""Fixtures shared across test packages."""

import pytest

PD_COMMON = ["--max-total-tokens", "4096", "--dtype", "float32"]


@pytest.fixture(scope="session")
def pd_llama_cluster(tmp_path_factory):
    """A plain server and a PD pair (prefill + decode, Mooncake over loopback TCP) on one tiny
    Llama, started side by side once for the whole run: the PD and load-balancer tests only send
    requests to these three (each module puts its own router or LB in front, and starts its own
    extra servers for anything it kills or restarts), and starting them costs ~35 s.

    Returns {"plain", "prefill", "boot", "decode": ports, "model": folder, "logs": log folder}."""
    from sglang.test.pd_utils import find_free_port, launch_decode, launch_prefill, stop_server
    from sglang.test.server_utils import popen_launch_server, start_side_by_side
    from sglang.test.tiny_models import make_tiny_model

    model = make_tiny_model(str(tmp_path_factory.mktemp("pd_llama")), "llama", seed=6)
    logs = tmp_path_factory.mktemp("pd_logs")
    ports = {k: find_free_port() for k in ("plain", "prefill", "boot", "decode")}
    procs = start_side_by_side(
        lambda: popen_launch_server(model, ports["plain"], PD_COMMON, log_path=str(logs / "plain.log")),
        lambda: launch_prefill(model, ports["prefill"], ports["boot"], PD_COMMON, log_path=str(logs / "prefill.log")),
        lambda: launch_decode(model, ports["decode"], PD_COMMON, log_path=str(logs / "decode.log")))
    yield {**ports, "model": model, "logs": logs}
    for p in reversed(procs):
        stop_server(p)
