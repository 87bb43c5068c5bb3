"""One plain server shared by the security tests that need no special flags (starting one costs
~10 s): a tiny random Llama in fp32. Tests that need other flags start their own."""

import pytest

from sglang.test.server_utils import find_free_port, popen_launch_server, stop_server
from sglang.test.tiny_models import make_tiny_model


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> str:
    return make_tiny_model(str(tmp_path_factory.mktemp("sec_llama")), "llama", seed=3)


@pytest.fixture(scope="session")
def plain_server(tiny_llama, tmp_path_factory):
    """{"url": base URL, "model": folder, "log": log path} of a plain server with default flags."""
    port = find_free_port()
    log = str(tmp_path_factory.mktemp("sec_logs") / "plain.log")
    proc = popen_launch_server(tiny_llama, port, ["--dtype", "float32", "--max-total-tokens", "4096"], log_path=log)
    yield {"url": f"http://127.0.0.1:{port}", "model": tiny_llama, "log": log, "proc": proc}
    stop_server(proc)
