"""Who may call what (issue 51, findings 5, 8 and the key findings of 9), on real servers:

* a server with `--api-key` and `--admin-api-key` on its command line: the control routes
  (`/flush_cache`, `/abort_request`, `abort_all` included) take only the admin key; the other
  routes take either key; `/health_generate` needs a key; a `custom_logit_processor` (code the
  client sends) runs only for the admin key, and for the ordinary key is never even unpickled;
* a server whose keys come from SGLANG_API_KEY / SGLANG_ADMIN_API_KEY (not on its command line,
  where `ps` shows them to every user) behaves the same;
* a server without keys on 0.0.0.0: control routes answer clients on this machine only, and a
  custom logit processor is refused with a message saying the server has no admin key.
"""

from __future__ import annotations

import os
import pickle
import socket
import threading
import time

import psutil
import pytest
import requests

from sglang.test.logit_processors import force_token_processor
from sglang.test.security_probe import Bystander, assert_server_whole, auth, error_message
from sglang.test.server_utils import find_free_port, popen_launch_server, stop_server

pytestmark = pytest.mark.server

USER_KEY = "sk-user-5f1c"
ADMIN_KEY = "sk-admin-9e27"
LONG_TOKENS = 1500  # seconds of decoding for the tiny model: an abort must cut it short
LONG = {"temperature": 0, "max_new_tokens": LONG_TOKENS, "ignore_eos": True}
SERVER_FLAGS = ["--dtype", "float32", "--max-total-tokens", "4096", "--enable-custom-logit-processor"]

CONTROL_ROUTES = [("GET", "/flush_cache", None), ("POST", "/flush_cache", None),
                  ("POST", "/abort_request", {"rid": "no-such-request"}), ("POST", "/abort_request", {"abort_all": True})]


def _start(model, tmp_path_factory, name, extra=(), env=None, host="127.0.0.1"):
    port = find_free_port()
    log = str(tmp_path_factory.mktemp("auth_logs") / f"{name}.log")
    proc = popen_launch_server(model, port, list(SERVER_FLAGS) + ["--host", host] + list(extra), env=env, log_path=log)
    return proc, port


@pytest.fixture(scope="module")
def keyed(tiny_llama, tmp_path_factory):
    proc, port = _start(tiny_llama, tmp_path_factory, "keyed", ["--api-key", USER_KEY, "--admin-api-key", ADMIN_KEY])
    yield {"url": f"http://127.0.0.1:{port}", "proc": proc}
    stop_server(proc)


@pytest.fixture(scope="module")
def env_keyed(tiny_llama, tmp_path_factory):
    proc, port = _start(tiny_llama, tmp_path_factory, "env_keyed",
                        env={"SGLANG_API_KEY": USER_KEY, "SGLANG_ADMIN_API_KEY": ADMIN_KEY})
    yield {"url": f"http://127.0.0.1:{port}", "proc": proc}
    stop_server(proc)


@pytest.fixture(scope="module")
def open_wildcard(tiny_llama, tmp_path_factory):
    """No key at all, bound to every interface."""
    env = {k: "" for k in ("SGLANG_API_KEY", "SGLANG_ADMIN_API_KEY")}
    proc, port = _start(tiny_llama, tmp_path_factory, "open", env=env, host="0.0.0.0")
    yield {"url": f"http://127.0.0.1:{port}", "port": port, "proc": proc}
    stop_server(proc)


def _call(url, method, path, body, key=None, headers=None):
    h = dict(auth(key))
    h.update(headers or {})
    if body is None:
        return requests.request(method, url + path, headers=h, timeout=60)
    return requests.request(method, url + path, json=body, headers=h, timeout=60)


class LongRequest:
    """A long /generate in a thread; `.result()` is its JSON answer."""

    def __init__(self, url, key):
        self.answer = None
        self.thread = threading.Thread(target=self._run, args=(url, key), daemon=True)
        self.thread.start()

    def _run(self, url, key):
        r = requests.post(url + "/generate", headers=auth(key), timeout=300, json={"text": "long", "sampling_params": LONG})
        self.answer = (r.status_code, r.json())

    def result(self):
        self.thread.join(300)
        assert self.answer is not None, "the long request never answered"
        assert self.answer[0] == 200, self.answer
        return self.answer[1]


def _wait_running(url, key, n=1, timeout=60.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        st = requests.get(url + "/server_info", headers=auth(key), timeout=30).json()["internal_states"][0]
        if st["num_running_reqs"] >= n:
            return
        time.sleep(0.05)
    raise AssertionError("the long request never started running")


def _finish_type(answer):
    return answer["meta_info"]["finish_reason"]["type"]


# ---------------------------------------------------------------------------- keys on the command line


@pytest.mark.parametrize("method,path,body", CONTROL_ROUTES)
def test_control_routes_take_only_the_admin_key(keyed, method, path, body):
    url = keyed["url"]
    for key in (None, "wrong", USER_KEY):
        r = _call(url, method, path, body, key)
        assert r.status_code == 401, (key, r.status_code, r.text)
        assert r.json() == {"error": "Unauthorized"}
    assert _call(url, method, path, body, ADMIN_KEY).status_code == 200
    # upstream's other header for the key (Anthropic clients)
    assert _call(url, method, path, body, headers={"x-api-key": ADMIN_KEY}).status_code == 200
    assert _call(url, method, path, body, headers={"x-api-key": USER_KEY}).status_code == 401


def test_abort_all_with_the_ordinary_key_aborts_nothing(keyed):
    url = keyed["url"]
    long = LongRequest(url, USER_KEY)
    _wait_running(url, USER_KEY)
    r = _call(url, "POST", "/abort_request", {"abort_all": True}, USER_KEY)
    assert r.status_code == 401
    answer = long.result()
    assert _finish_type(answer) == "length" and answer["meta_info"]["completion_tokens"] == LONG_TOKENS
    # the admin key does abort
    long = LongRequest(url, USER_KEY)
    _wait_running(url, USER_KEY)
    assert _call(url, "POST", "/abort_request", {"abort_all": True}, ADMIN_KEY).status_code == 200
    answer = long.result()
    assert _finish_type(answer) == "abort" and answer["meta_info"]["completion_tokens"] < LONG_TOKENS
    assert_server_whole(url, USER_KEY)


@pytest.mark.parametrize("method,path", [("GET", "/v1/models"), ("GET", "/server_info"), ("GET", "/model_info"),
                                         ("GET", "/dashboard/state")])
def test_other_routes_take_either_key(keyed, method, path):
    url = keyed["url"]
    assert _call(url, method, path, None).status_code == 401
    assert _call(url, method, path, None, "wrong").status_code == 401
    assert _call(url, method, path, None, USER_KEY).status_code == 200
    assert _call(url, method, path, None, ADMIN_KEY).status_code == 200  # the admin may do what a user may


def test_health_generate_needs_a_key_and_health_does_not(keyed):
    url = keyed["url"]
    r = requests.get(url + "/health_generate", timeout=60)
    assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}
    assert requests.get(url + "/health_generate", headers=auth(USER_KEY), timeout=60).status_code == 200
    assert requests.get(url + "/health", timeout=60).status_code == 200  # probes carry no secret (upstream)


class _Marker:
    """Unpickling this creates a file: proof that `dill.loads` ran on the client's bytes."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _marker_processor(path) -> str:
    import json

    return json.dumps({"callable": pickle.dumps(_Marker(path)).hex()})




def test_custom_logit_processor_runs_only_for_the_admin_key(keyed, tmp_path):
    url = keyed["url"]
    marker = str(tmp_path / "ran")
    with Bystander(url, USER_KEY) as b:
        for body in ({"input_ids": [1, 2, 3], "custom_logit_processor": _marker_processor(marker)},
                     {"input_ids": [[1, 2], [3, 4]], "custom_logit_processor": [None, _marker_processor(marker)]}):
            body["sampling_params"] = {"max_new_tokens": 2}
            r = _call(url, "POST", "/generate", body, USER_KEY)
            assert r.status_code == 403, r.text
            assert "admin API key" in error_message(r) and "Bearer" in error_message(r)
    assert not os.path.exists(marker), "the ordinary key's processor was unpickled"
    b.assert_responsive()
    body = {"input_ids": [1, 2, 3], "custom_logit_processor": force_token_processor(),
            "sampling_params": {"max_new_tokens": 5, "temperature": 0.9, "custom_params": {"token_id": 42}}}
    r = _call(url, "POST", "/generate", body, ADMIN_KEY)
    assert r.status_code == 200, r.text
    assert r.json()["output_ids"] == [42] * 5  # the processor ran and forced its token
    assert_server_whole(url, USER_KEY)


# ---------------------------------------------------------------------------- keys from the environment


def test_keys_from_the_environment_stay_off_the_command_line(env_keyed):
    url = env_keyed["url"]
    for p in [psutil.Process(env_keyed["proc"].pid)] + psutil.Process(env_keyed["proc"].pid).children(recursive=True):
        cmdline = " ".join(p.cmdline())
        assert USER_KEY not in cmdline and ADMIN_KEY not in cmdline, cmdline
    assert _call(url, "GET", "/v1/models", None).status_code == 401
    assert _call(url, "GET", "/v1/models", None, USER_KEY).status_code == 200
    for method, path, body in CONTROL_ROUTES:
        assert _call(url, method, path, body, USER_KEY).status_code == 401, path
        assert _call(url, method, path, body, ADMIN_KEY).status_code == 200, path
    info = _call(url, "GET", "/server_info", None, USER_KEY).json()
    assert info["api_key"] == "<redacted>" and info["admin_api_key"] == "<redacted>"
    assert info["resolution_sources"]["admin_api_key"] == "_handle_api_keys_from_environment"


# ---------------------------------------------------------------------------- no key at all


def _lan_address():
    """This machine's address on its default route (not loopback), or None."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # UDP: nothing is sent
            ip = s.getsockname()[0]
    except OSError:
        return None
    return None if ip.startswith("127.") else ip


@pytest.mark.parametrize("method,path,body", CONTROL_ROUTES)
def test_without_keys_control_routes_answer_only_this_machine(open_wildcard, method, path, body):
    assert _call(open_wildcard["url"], method, path, body).status_code == 200
    ip = _lan_address()
    if ip is None:
        pytest.skip("no non-loopback address to call from")
    remote = f"http://{ip}:{open_wildcard['port']}"
    r = _call(remote, method, path, body)
    assert r.status_code == 403, r.text
    assert "control route" in error_message(r) and "--admin-api-key" in error_message(r)
    # other routes stay open, and a wildcard bind answers any Host name
    assert _call(remote, "GET", "/v1/models", None).status_code == 200
    assert _call(remote, "GET", "/v1/models", None, headers={"Host": "any.name.example"}).status_code == 200


def test_without_an_admin_key_a_custom_logit_processor_is_refused(open_wildcard, tmp_path):
    marker = str(tmp_path / "ran")
    body = {"input_ids": [1, 2, 3], "custom_logit_processor": _marker_processor(marker),
            "sampling_params": {"max_new_tokens": 2}}
    r = _call(open_wildcard["url"], "POST", "/generate", body)
    assert r.status_code == 403, r.text
    assert "started without one" in error_message(r) and "--admin-api-key" in error_message(r)
    assert not os.path.exists(marker)
    assert_server_whole(open_wildcard["url"])


def test_keys_are_redacted_and_a_flag_wins_over_the_environment(monkeypatch):
    from sglang.srt.server_args import ServerArgs

    monkeypatch.setenv("SGLANG_API_KEY", "env-user")
    monkeypatch.setenv("SGLANG_ADMIN_API_KEY", "env-admin")
    sa = ServerArgs(model_path="default", api_key="flag-user")
    assert (sa.api_key, sa.admin_api_key) == ("flag-user", "env-admin")
    shown = repr(sa) + sa.explain() + str(sa.resolved_dict())
    for secret in ("flag-user", "env-admin"):
        assert secret not in shown
