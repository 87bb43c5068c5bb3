"""The limits are the operator's to move: a server started with other SGLANG_ limits and
--trust-request-chat-template applies them, and a prompt the operator allows, big enough to take
seconds to tokenize, is tokenized on a worker thread while /health and a bystander stay fast."""

import threading
import time

import pytest
import requests

from sglang.test.security_probe import Bystander, assert_server_whole, error_message
from sglang.test.server_utils import find_free_port, popen_launch_server, stop_server

pytestmark = pytest.mark.server

ENV = {
    "SGLANG_MAX_PROMPT_CHARS": "6000000",
    "SGLANG_MAX_REQUEST_BODY_BYTES": "8000000",
    "SGLANG_MAX_TOP_LOGPROBS": "30",
}


@pytest.fixture(scope="module")
def server(tiny_llama, tmp_path_factory):
    port = find_free_port()
    log = str(tmp_path_factory.mktemp("sec_logs") / "limits_flags.log")
    proc = popen_launch_server(tiny_llama, port, ["--dtype", "float32", "--max-total-tokens", "4096",
                                                  "--trust-request-chat-template"], env=ENV, log_path=log)
    yield f"http://127.0.0.1:{port}"
    stop_server(proc)


def test_the_operator_sets_the_limits(server):
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "logprobs": True}
    r = requests.post(server + "/v1/chat/completions", json={**chat, "top_logprobs": 30}, timeout=60)
    assert r.status_code == 200
    r = requests.post(server + "/v1/chat/completions", json={**chat, "top_logprobs": 31}, timeout=60)
    assert r.status_code == 400 and "Expected a value <= 30, but got 31" in error_message(r)
    r = requests.post(server + "/generate", data=b'{"text": "' + b"a" * 8_000_000 + b'"}', timeout=60,
                      headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "larger than the 8000000 bytes" in error_message(r)
    assert_server_whole(server)


def test_a_trusted_request_template_is_rendered(server):
    r = requests.post(server + "/v1/tokenize", timeout=60, json={
        "messages": [{"role": "user", "content": "hi"}],
        "chat_template_kwargs": {"chat_template": "{% for m in messages %}<<{{ m.content }}>>{% endfor %}"}})
    assert r.status_code == 200
    plain = requests.post(server + "/v1/tokenize", json={"prompt": "<<hi>>", "add_special_tokens": False}, timeout=60)
    assert r.json()["tokens"] == plain.json()["tokens"]


def test_a_long_tokenization_does_not_stall_the_event_loop(server):
    """A 5 MB prompt (allowed here) takes seconds to tokenize (1 MB took 1.0 s on this machine);
    it runs on a worker thread, so /health and a bystander's chat answer meanwhile."""
    prompt = "the quick brown fox jumps over the lazy dog " * 120_000  # 5.3 MB
    health, done = [], threading.Event()

    def poll_health():
        while not done.is_set():
            t0 = time.perf_counter()
            assert requests.get(server + "/health", timeout=30).status_code == 200
            health.append(time.perf_counter() - t0)
            time.sleep(0.1)

    poller = threading.Thread(target=poll_health, daemon=True)
    poller.start()
    t0 = time.perf_counter()
    with Bystander(server) as b:
        r = requests.post(server + "/v1/tokenize", json={"prompt": prompt}, timeout=300)
    took = time.perf_counter() - t0
    done.set()
    poller.join(35)
    assert r.status_code == 200 and r.json()["count"] > 900_000
    assert took > 2.0, f"tokenizing took only {took:.2f} s: the probe proves nothing"
    b.assert_responsive()
    assert health and max(health) < 1.0, f"/health took up to {max(health):.2f} s while tokenizing"
    assert_server_whole(server)
