"""The in-tree PD load balancer (`sglang.srt.router.mini_lb`, started by upstream's module path
`python -m sglang.srt.disaggregation.mini_lb`) in front of our real
prefill and decode servers (Mooncake over TCP on loopback): every route it serves must give what a
single plain server gives, and a dead backend must give an error status at once, not a hang."""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import requests

from sglang.srt.disaggregation import pd_auth
from sglang.srt.router.mini_lb import build_prefill_configs, get_request_batch_size, inject_bootstrap
from sglang.test.pd_utils import find_free_port, stop_server
from sglang.test.server_utils import wait_for_health

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):"]
GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}


def url(port):
    return f"http://127.0.0.1:{port}"


def launch_lb(port, prefills=(), decodes=(), bootstrap_ports=(), log_path=None, secret=None):
    cmd = [sys.executable, "-m", "sglang.srt.disaggregation.mini_lb", "--host", "127.0.0.1", "--port", str(port)]
    if prefills:
        cmd += ["--prefill", *prefills]
    if decodes:
        cmd += ["--decode", *decodes]
    if bootstrap_ports:
        cmd += ["--prefill-bootstrap-ports", *map(str, bootstrap_ports)]
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL
    env = {**os.environ, pd_auth.SECRET_ENV: secret} if secret else None
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_for_health(url(port), timeout=30, process=proc)
    except BaseException:
        stop_server(proc)
        raise
    return proc


# --- pure helpers (no servers) ----------------------------------------------------------------
def test_bootstrap_ports_broadcast_and_mismatch():
    assert [c.bootstrap_port for c in build_prefill_configs(["http://a:1", "http://b:2"], [8998])] == [8998, 8998]
    assert [c.bootstrap_port for c in build_prefill_configs(["http://a:1"], None)] == [None]
    with pytest.raises(ValueError, match="Number of prefill URLs must match number of bootstrap ports"):
        build_prefill_configs(["http://a:1", "http://b:2", "http://c:3"], [1, 2])


def test_injection_scalars_lists_and_ipv6():
    single = inject_bootstrap({"text": "hi"}, "http://10.0.0.1:30100", 8998, allow_batch=True)
    assert (single["bootstrap_host"], single["bootstrap_port"]) == ("10.0.0.1", 8998)
    assert 0 <= single["bootstrap_room"] < 2**63
    batch = inject_bootstrap({"input_ids": [[1, 2], [3], [4]]}, "http://[::1]:30100", 7, allow_batch=True)
    assert batch["bootstrap_host"] == ["[::1]"] * 3 and batch["bootstrap_port"] == [7] * 3
    assert len(batch["bootstrap_room"]) == 3 and len(set(batch["bootstrap_room"])) == 3
    assert get_request_batch_size({"input_ids": [1, 2, 3]}) is None
    chat = inject_bootstrap({"messages": [], "text": ["a", "b"]}, "http://h:1", None, allow_batch=False)
    assert chat["bootstrap_host"] == "h" and chat["bootstrap_port"] is None and isinstance(chat["bootstrap_room"], int)


# --- a real 1P1D cluster behind the LB ----------------------------------------------------------
@pytest.fixture(scope="module")
def cluster(pd_llama_cluster, tmp_path_factory):
    """The shared plain server and PD pair (test/srt/conftest.py) behind this module's LB."""
    ports = {**pd_llama_cluster, "lb": find_free_port()}
    lb = launch_lb(ports["lb"], [url(ports["prefill"])], [url(ports["decode"])], [ports["boot"]],
                   log_path=str(tmp_path_factory.mktemp("minilb_logs") / "lb.log"))
    yield ports
    stop_server(lb)


def generate(port, body, timeout=120):
    r = requests.post(url(port) + "/generate", json=body, timeout=timeout)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.server
def test_generate_single_text_batch_and_input_ids_batch_match_plain(cluster):
    for body in ({"text": PROMPTS[0]}, {"text": PROMPTS}, {"input_ids": [[11, 12, 13, 14, 15], [21, 22, 23]]}):
        body = {**body, "sampling_params": GREEDY}
        plain, pd = generate(cluster["plain"], body), generate(cluster["lb"], body)
        if isinstance(plain, dict):
            plain, pd = [plain], [pd]
        assert isinstance(pd, list) and len(pd) == len(plain)
        assert [o["text"] for o in pd] == [o["text"] for o in plain]
        assert [o["output_ids"] for o in pd] == [o["output_ids"] for o in plain]
        assert all(o["meta_info"]["completion_tokens"] == GREEDY["max_new_tokens"] for o in pd)


def stream_events(port, body):
    with requests.post(url(port) + "/generate", json={**body, "stream": True}, stream=True, timeout=120) as r:
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("text/event-stream")
        return [line for line in r.iter_lines() if line]


@pytest.mark.server
def test_stream_passes_decode_sse_through(cluster):
    body = {"text": PROMPTS[1], "sampling_params": GREEDY}
    lines = stream_events(cluster["lb"], body)
    assert lines[-1] == b"data: [DONE]"
    chunks = [json.loads(line[len(b"data: "):]) for line in lines[:-1]]
    assert len(chunks) > 1  # really streamed, not one blob
    assert chunks[-1]["text"] == generate(cluster["plain"], body)["text"]


@pytest.mark.server
def test_openai_chat_and_completions_match_plain(cluster):
    import openai

    plain = openai.OpenAI(base_url=url(cluster["plain"]) + "/v1", api_key="x")
    pd = openai.OpenAI(base_url=url(cluster["lb"]) + "/v1", api_key="x")
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    want_chat = plain.chat.completions.create(model="m", messages=msgs, max_tokens=10, temperature=0)
    got_chat = pd.chat.completions.create(model="m", messages=msgs, max_tokens=10, temperature=0)
    assert got_chat.choices[0].message.content == want_chat.choices[0].message.content
    assert got_chat.usage.completion_tokens == want_chat.usage.completion_tokens
    want = plain.completions.create(model="m", prompt=PROMPTS[1], max_tokens=10, temperature=0)
    got = pd.completions.create(model="m", prompt=PROMPTS[1], max_tokens=10, temperature=0)
    assert got.choices[0].text == want.choices[0].text
    chunks = list(pd.chat.completions.create(model="m", messages=msgs, max_tokens=10, temperature=0, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == want_chat.choices[0].message.content


def _logprob_values(entries):
    return [e[0] for e in entries]


@pytest.mark.server
def test_return_logprob_prepends_prefill_input_logprobs(cluster):
    """Only the prefill server computed the prompt's logprobs; the LB's answer must carry them
    like a plain server's, for a single request, per batch item, and in every stream chunk."""
    params = {**GREEDY, "max_new_tokens": 4}
    for body in ({"text": PROMPTS[0]}, {"text": PROMPTS[:2]}):
        body = {**body, "sampling_params": params, "return_logprob": True, "logprob_start_len": 0}
        plain, pd = generate(cluster["plain"], body), generate(cluster["lb"], body)
        plain, pd = (plain, pd) if isinstance(plain, list) else ([plain], [pd])
        for p, d in zip(plain, pd):
            want, got = p["meta_info"]["input_token_logprobs"], d["meta_info"]["input_token_logprobs"]
            assert len(got) == len(want) == p["meta_info"]["prompt_tokens"]
            assert [e[1] for e in got] == [e[1] for e in want]  # token ids
            assert _logprob_values(got)[0] is None and want[0][0] is None
            assert _logprob_values(got)[1:] == pytest.approx(_logprob_values(want)[1:], abs=1e-4)
            assert d["output_ids"] == p["output_ids"]
    body = {"text": PROMPTS[0], "sampling_params": params, "return_logprob": True, "logprob_start_len": 0}
    want = generate(cluster["plain"], body)["meta_info"]["input_token_logprobs"]
    lines = stream_events(cluster["lb"], body)
    assert lines[-1] == b"data: [DONE]"
    for line in lines[:-1]:
        got = json.loads(line[len(b"data: "):])["meta_info"]["input_token_logprobs"]
        assert [e[1] for e in got] == [e[1] for e in want]


@pytest.mark.server
def test_info_and_control_routes(cluster):
    lb, prefill, decode = url(cluster["lb"]), url(cluster["prefill"]), url(cluster["decode"])
    assert requests.get(lb + "/health", timeout=10).status_code == 200
    assert requests.get(lb + "/health_generate", timeout=60).status_code == 200
    assert requests.post(lb + "/flush_cache", timeout=60).status_code == 200

    info = requests.get(lb + "/get_server_info", timeout=30).json()
    assert len(info["prefill"]) == 1 and len(info["decode"]) == 1
    assert info["prefill"][0]["disaggregation_mode"] == "prefill"
    assert info["decode"][0]["disaggregation_mode"] == "decode"
    assert info["internal_states"] == info["decode"][0]["internal_states"] and info["internal_states"]

    want = requests.get(prefill + "/model_info", timeout=10).json()
    for path in ("/model_info", "/get_model_info"):
        r = requests.get(lb + path, timeout=10)
        assert r.status_code == 200 and r.json() == want
    def cards(body):  # `created` is the request's second (as upstream): two requests may differ
        return [{k: v for k, v in c.items() if k != "created"} for c in body["data"]]

    r = requests.get(lb + "/v1/models", timeout=10)
    assert r.status_code == 200 and cards(r.json()) == cards(requests.get(prefill + "/v1/models", timeout=10).json())
    assert requests.get(decode + "/model_info", timeout=10).json()["disaggregation_mode"] == "decode"


@pytest.mark.server
def test_register_adds_servers_and_empty_lb_answers_503(cluster):
    port = find_free_port()
    secret = pd_auth.generate_secret()
    lb = launch_lb(port, log_path=str(cluster["logs"] / "lb_empty.log"), secret=secret)

    def register(reg, key=secret.encode()):  # signed with the deployment secret, as a server would
        body = json.dumps(reg).encode()
        return requests.post(url(port) + "/register", data=body, timeout=10,
                             headers=pd_auth.signed_headers(key, "POST /register", body))

    try:
        r = requests.get(url(port) + "/model_info", timeout=10)
        assert r.status_code == 503 and r.json()["detail"] == "There is no server registered"
        assert requests.post(url(port) + "/generate", json={"text": "x"}, timeout=10).status_code == 503
        assert register({"mode": "neither", "registry_url": "http://x:1"}).status_code == 400
        for reg in ({"mode": "prefill", "registry_url": url(cluster["prefill"]), "bootstrap_port": cluster["boot"]},
                    {"mode": "decode", "registry_url": url(cluster["decode"])}):
            assert register(reg).status_code == 200
        body = {"text": PROMPTS[2], "sampling_params": GREEDY}
        assert generate(port, body)["text"] == generate(cluster["plain"], body)["text"]
    finally:
        stop_server(lb)


class HangUpServer:
    """A "decode server" that accepts a connection, reads the request, and hangs up a second later:
    by then the LB's prefill leg has certainly reached the prefill server."""

    def __init__(self, delay=1.0):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.delay = delay
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Timer(self.delay, conn.close).start()

    def close(self):
        self.sock.close()


def wait_prefill_idle(cluster, timeout=20):
    """No request left in the prefill server's queues, e.g. waiting for a decode that never comes
    (its own bootstrap timeout would be minutes)."""
    deadline = time.time() + timeout
    while True:
        state = requests.get(url(cluster["prefill"]) + "/server_info", timeout=10).json()["internal_states"][0]
        pd_state = state["disaggregation"]
        if (pd_state["num_bootstrap_queue_reqs"], pd_state["num_inflight_queue_reqs"], state["num_waiting_reqs"],
                state["num_running_reqs"]) == (0, 0, 0, 0):
            return
        assert time.time() < deadline, state
        time.sleep(0.5)


def disconnect_count(cluster):
    return (cluster["logs"] / "prefill.log").read_text(errors="replace").count(
        "Request is disconnected from the client side")


@pytest.mark.server
def test_dead_decode_gives_an_error_status_quickly(cluster):
    port, dead = find_free_port(), find_free_port()
    lb = launch_lb(port, [url(cluster["prefill"])], [url(dead)], [cluster["boot"]],
                   log_path=str(cluster["logs"] / "lb_dead.log"))
    try:
        for stream in (False, True):
            t0 = time.time()
            r = requests.post(url(port) + "/generate", json={"text": PROMPTS[0], "sampling_params": GREEDY,
                                                             "stream": stream}, timeout=30)
            assert r.status_code in (502, 503), r.text
            assert str(dead) in r.json()["error"]["message"]
            assert time.time() - t0 < 5
        assert requests.get(url(port) + "/health_generate", timeout=30).status_code == 503
        wait_prefill_idle(cluster)
    finally:
        stop_server(lb)


@pytest.mark.server
def test_decode_hanging_up_aborts_the_prefill_leg(cluster):
    """The LB drops the prefill leg when the decode leg fails, and our prefill server aborts a
    request whose client went away, so nothing waits there for a transfer that never comes."""
    port, hangup = find_free_port(), HangUpServer()
    before = disconnect_count(cluster)
    lb = launch_lb(port, [url(cluster["prefill"])], [url(hangup.port)], [cluster["boot"]],
                   log_path=str(cluster["logs"] / "lb_hangup.log"))
    try:
        for stream in (False, True):
            t0 = time.time()
            r = requests.post(url(port) + "/generate", json={"text": PROMPTS[1], "sampling_params": GREEDY,
                                                             "stream": stream}, timeout=30)
            assert r.status_code == 502, r.text
            assert time.time() - t0 < 5
        wait_prefill_idle(cluster)
        assert disconnect_count(cluster) - before == 2
    finally:
        stop_server(lb)
        hangup.close()
