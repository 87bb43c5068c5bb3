"""Path tricks against the built-in page and the key check, sent as raw HTTP (clients such as
requests normalise `..` away; an attacker's socket does not): nothing outside the page's two
files is served, no route is reached around the key, and the server stays whole."""

import socket

import pytest

from sglang.test.security_probe import Bystander, assert_server_whole
from sglang.test.server_utils import find_free_port, popen_launch_server, stop_server

pytestmark = pytest.mark.server

KEY = "sk-web-paths-test"

TRAVERSALS = [
    "/web/../../../../etc/passwd",
    "/web/..%2f..%2f..%2f..%2fetc%2fpasswd",
    "/web/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
    "/web/..%5c..%5cserver_args.py",
    "/web/app.js%00.html",
    "/web/%2e%2e%2fhttp_server.py",
    "/web//etc/passwd",
    "/web/index.html",             # the page itself is served at / only
    "/web/../web/../../entrypoints/http_server.py",
]

# Routes that need the key, reached through a public-looking prefix.
AROUND_THE_KEY = [
    "/web/../server_info",
    "/web/..%2fserver_info",
    "/web/%2e%2e/server_info",
    "//server_info",
    "/./server_info",
    "/health/../server_info",
    "/web/../flush_cache",
]


def raw_get(port: int, path: str, headers: str = "") -> tuple:
    """(status, body) of one GET with the path sent byte for byte."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{headers}Connection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


@pytest.fixture(scope="module")
def keyed_server(tiny_llama, tmp_path_factory):
    port = find_free_port()
    log = str(tmp_path_factory.mktemp("web_paths") / "server.log")
    proc = popen_launch_server(tiny_llama, port, ["--dtype", "float32", "--max-total-tokens", "4096"],
                               api_key=KEY, log_path=log)
    yield port
    stop_server(proc)


def test_page_files_only(keyed_server):
    port = keyed_server
    status, body = raw_get(port, "/web/app.js")
    assert status == 200 and body, "the page's own script must still load without a key"
    with Bystander(f"http://127.0.0.1:{port}", api_key=KEY) as b:
        answers = {p: raw_get(port, p) for p in TRAVERSALS}
    for path, (status, body) in answers.items():
        assert status in (400, 404), f"{path} answered {status}"
        assert b"root:" not in body and b"import " not in body, f"{path} leaked a file: {body[:200]!r}"
    b.assert_responsive()
    assert_server_whole(f"http://127.0.0.1:{port}", api_key=KEY)


def test_no_route_around_the_key(keyed_server):
    port = keyed_server
    status, _ = raw_get(port, "/server_info")
    assert status == 401, "the baseline: /server_info needs the key"
    for path in AROUND_THE_KEY:
        status, body = raw_get(port, path)
        assert status in (400, 401, 404), f"{path} answered {status}: {body[:200]!r}"
        assert b"max_total_num_tokens" not in body and b"internal_states" not in body, f"{path} leaked server state"
    status, _ = raw_get(port, "/server_info", f"Authorization: Bearer {KEY}\r\n")
    assert status == 200
