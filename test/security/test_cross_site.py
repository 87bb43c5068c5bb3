"""What a web page can make a browser send to a local server (issue 51, finding 6), on real servers:
a cross-site `abort_all` (the CSRF the review sent) aborts nothing, form and text bodies are
refused with a 415, a cross-site `<img>`-style GET of a control route is refused, CORS is off unless
origins are configured, and a Host header that is not the server's (DNS rebinding) gets a 400.
Requests the built-in page and local clients send keep working."""

from __future__ import annotations

import threading
import time

import pytest
import requests

from sglang.test.security_probe import Bystander, assert_server_whole, error_message
from sglang.test.server_utils import find_free_port, popen_launch_server, stop_server

pytestmark = pytest.mark.server

EVIL = "http://evil.example"
APP = "http://app.example:8080"
LONG_TOKENS = 1500
CHAT = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "temperature": 0}


@pytest.fixture(scope="module")
def with_origins(tiny_llama, tmp_path_factory):
    """A server that lets one web app call it (CORS) and answers one more Host name."""
    port = find_free_port()
    log = str(tmp_path_factory.mktemp("xsite_logs") / "origins.log")
    proc = popen_launch_server(tiny_llama, port, ["--dtype", "float32", "--max-total-tokens", "4096",
                                                  "--allowed-origins", APP, "--allowed-hosts", "llm.internal"],
                               log_path=log)
    yield {"url": f"http://127.0.0.1:{port}", "port": port}
    stop_server(proc)


def _long_request(url):
    box = {}

    def run():
        r = requests.post(url + "/generate", timeout=300, json={
            "text": "long", "sampling_params": {"temperature": 0, "max_new_tokens": LONG_TOKENS, "ignore_eos": True}})
        box["answer"] = r.json()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    deadline = time.time() + 60
    while time.time() < deadline:
        st = requests.get(url + "/server_info", timeout=30).json()["internal_states"][0]
        if st["num_running_reqs"] >= 1:
            return t, box
        time.sleep(0.05)
    raise AssertionError("the long request never started")


def test_cross_site_abort_all_aborts_nothing(plain_server):
    """The review's probe: a page on evil.example POSTs {"abort_all": true} as text/plain."""
    url = plain_server["url"]
    thread, box = _long_request(url)
    with Bystander(url) as b:
        r = requests.post(url + "/abort_request", data='{"abort_all": true}', timeout=30,
                          headers={"Origin": EVIL, "Content-Type": "text/plain;charset=UTF-8",
                                   "Sec-Fetch-Site": "cross-site"})
        # the same without a Content-Type (a Blob body): the Origin alone decides
        blob = requests.post(url + "/abort_request", data='{"abort_all": true}', timeout=30, headers={"Origin": EVIL})
    assert r.status_code == 403 and "Cross-site request refused" in error_message(r), r.text
    assert blob.status_code == 403, blob.text
    thread.join(300)
    meta = box["answer"]["meta_info"]
    assert meta["finish_reason"]["type"] == "length" and meta["completion_tokens"] == LONG_TOKENS
    b.assert_responsive()
    assert_server_whole(url)


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"])
def test_bodies_a_form_can_send_are_415(plain_server, ctype):
    url = plain_server["url"]
    for path, body in (("/abort_request", '{"abort_all": true}'), ("/generate", '{"text": "hi"}'),
                       ("/v1/chat/completions", '{"model": "default", "messages": []}')):
        r = requests.post(url + path, data=body, headers={"Content-Type": ctype}, timeout=30)
        assert r.status_code == 415, (path, r.status_code, r.text)
        assert "Only 'application/json' is allowed" in error_message(r)


def test_an_empty_post_may_carry_any_content_type_but_not_a_foreign_origin(plain_server):
    """aiohttp (mini_lb's fan-out) labels an empty POST application/octet-stream: nothing to parse.
    An empty cross-site form POST is still refused, by its Origin."""
    url = plain_server["url"]
    r = requests.post(url + "/flush_cache", data=b"", headers={"Content-Type": "application/octet-stream"}, timeout=60)
    assert r.status_code == 200, r.text
    r = requests.post(url + "/flush_cache", data=b"", timeout=60,
                      headers={"Content-Type": "application/x-www-form-urlencoded", "Origin": EVIL})
    assert r.status_code == 403, r.text


def test_cross_site_get_of_a_control_route_is_refused(plain_server):
    """An <img src=http://127.0.0.1:PORT/flush_cache> sends no Origin, but the browser marks it."""
    r = requests.get(plain_server["url"] + "/flush_cache", headers={"Sec-Fetch-Site": "cross-site"}, timeout=30)
    assert r.status_code == 403 and "Sec-Fetch-Site" in error_message(r)
    # following a link to the web page itself is fine
    page = requests.get(plain_server["url"] + "/", headers={"Sec-Fetch-Site": "cross-site"}, timeout=30)
    assert page.status_code == 200


def test_same_origin_and_local_pages_and_plain_clients_still_work(plain_server):
    url = plain_server["url"]
    port = url.rsplit(":", 1)[1]
    for headers in ({"Origin": url, "Sec-Fetch-Site": "same-origin"},  # the built-in page
                    {"Origin": f"http://localhost:{int(port) + 1}", "Sec-Fetch-Site": "same-site"},  # a page on this machine
                    {}):  # curl, python clients, the router
        r = requests.post(url + "/v1/chat/completions", json=CHAT, headers=headers, timeout=60)
        assert r.status_code == 200, (headers, r.text)
        assert "access-control-allow-origin" not in r.headers
    r = requests.post(url + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 1}},
                      headers={"Content-Type": "application/json; charset=utf-8"}, timeout=60)
    assert r.status_code == 200, r.text


def test_cors_is_off_without_configured_origins(plain_server):
    r = requests.options(plain_server["url"] + "/v1/chat/completions", timeout=30, headers={
        "Origin": EVIL, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
    assert "access-control-allow-origin" not in r.headers, r.headers
    r = requests.get(plain_server["url"] + "/v1/models", headers={"Origin": EVIL}, timeout=30)
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers


def test_a_configured_origin_may_call_and_others_may_not(with_origins):
    url = with_origins["url"]
    pre = requests.options(url + "/v1/chat/completions", timeout=30, headers={
        "Origin": APP, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type, authorization"})
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == APP
    r = requests.post(url + "/v1/chat/completions", json=CHAT, headers={"Origin": APP, "Sec-Fetch-Site": "cross-site"},
                      timeout=60)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == APP
    pre = requests.options(url + "/v1/chat/completions", timeout=30, headers={
        "Origin": EVIL, "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in pre.headers
    r = requests.post(url + "/v1/chat/completions", json=CHAT, headers={"Origin": EVIL}, timeout=60)
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers


def test_a_foreign_host_header_is_400(plain_server, with_origins):
    """DNS rebinding: evil.example resolves to 127.0.0.1, the page is then same-origin with its
    requests, and only the Host header tells that they were not meant for this server."""
    url = plain_server["url"]
    port = url.rsplit(":", 1)[1]
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}"):
        r = requests.post(url + "/abort_request", json={"abort_all": True}, timeout=30,
                          headers={"Host": host, "Origin": f"http://{host}"})
        assert r.status_code == 400 and "Invalid Host header" in error_message(r), (host, r.text)
        assert requests.get(url + "/v1/models", headers={"Host": host}, timeout=30).status_code == 400
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "localhost"):
        assert requests.get(url + "/v1/models", headers={"Host": host}, timeout=30).status_code == 200, host
    # --allowed-hosts adds a name
    o = with_origins
    assert requests.get(o["url"] + "/v1/models", headers={"Host": f"llm.internal:{o['port']}"}, timeout=30).status_code == 200
    assert requests.get(o["url"] + "/v1/models", headers={"Host": f"evil.example:{o['port']}"}, timeout=30).status_code == 400
