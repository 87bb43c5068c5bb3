"""PD components no longer trust each other blindly (issue 51, finding 7).

A real PD pair (prefill + decode, Mooncake over loopback TCP) that shares a deployment secret
serves through the real sglang-router; beside it every forgery fails: an unsigned `PUT /route`,
unsigned or wrongly signed ZMQ control frames to both KV managers' ports, a client `bootstrap_host`
that names no prefill (no connection is made), an unsigned mini_lb `/register`, and a same-host
peer whose identity does not check out (real processes, real process_vm_writev)."""

import http.client
import json
import multiprocessing as mp
import os
import re
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import requests
import zmq

from sglang.srt.disaggregation import pd_auth
from sglang.srt.disaggregation.bootstrap_server import KVBootstrapServer
from sglang.srt.disaggregation.launch_pd import parse_args as launch_pd_args
from sglang.srt.disaggregation.launch_pd import role_flags, router_cmd, trust_env
from sglang.srt.disaggregation.mooncake import same_host
from sglang.srt.disaggregation.mooncake.messages import KVArgsRegisterInfo, TransferInfo, build_abort_message
from sglang.srt.disaggregation.mooncake.messages import build_status_message
from sglang.srt.router.mini_lb import parse_args as mini_lb_args
from sglang.test.pd_utils import find_free_port, launch_decode, launch_prefill, launch_router, stop_server
from sglang.test.security_probe import Bystander, assert_server_whole, error_message
from sglang.test.server_utils import start_side_by_side, wait_for_health

COMMON = ["--max-total-tokens", "4096", "--dtype", "float32"]
ROUTE_RANK0 = "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0"
T = 10


def chat(url, content="hi", max_tokens=4, **extra):
    return requests.post(url + "/v1/chat/completions", timeout=120, json={
        "model": "default", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
        "temperature": 0, **extra})


@pytest.fixture(scope="module")
def pd(tiny_llama, tmp_path_factory):
    logs = tmp_path_factory.mktemp("pd_trust_logs")
    secret = pd_auth.generate_secret()
    env = {pd_auth.SECRET_ENV: secret}
    ports = {k: find_free_port() for k in ("prefill", "boot", "decode", "router")}
    procs = start_side_by_side(
        lambda: launch_prefill(tiny_llama, ports["prefill"], ports["boot"], COMMON, env=env,
                               log_path=str(logs / "prefill.log")),
        lambda: launch_decode(tiny_llama, ports["decode"], COMMON, env=env, log_path=str(logs / "decode.log")))
    try:
        router = launch_router([(ports["prefill"], ports["boot"])], [ports["decode"]], ports["router"],
                               log_path=str(logs / "router.log"))
    except BaseException:
        for p in procs:
            stop_server(p)
        raise
    url = lambda k: f"http://127.0.0.1:{ports[k]}"  # noqa: E731
    yield {"secret": secret.encode(), "ports": ports, "router": url("router"), "prefill": url("prefill"),
           "decode": url("decode"), "boot": url("boot"), "prefill_log": logs / "prefill.log",
           "decode_log": logs / "decode.log"}
    stop_server(router)
    for p in reversed(procs):
        stop_server(p)


def control_port(log_path, side: str) -> int:
    m = re.findall(rf"PD KV control frames \({side} side\) on tcp://127\.0\.0\.1:(\d+), authenticated",
                   log_path.read_text(errors="replace"))
    assert m, f"the {side} server did not log an authenticated control port"
    return int(m[-1])


def assert_pair_whole(pd):
    r = chat(pd["router"])
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None, r.text
    for side in ("prefill", "decode"):
        assert_server_whole(pd[side])


@pytest.mark.server
def test_a_pair_with_a_secret_serves_through_the_real_router(pd):
    r = chat(pd["router"], "The capital of France is", max_tokens=8)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 8
    # the bootstrap server signs what it tells decode servers
    r = requests.get(pd["boot"] + ROUTE_RANK0, timeout=T)
    assert r.status_code == 200
    assert pd_auth.verify_http(pd["secret"], "GET " + ROUTE_RANK0, r.content, r.headers.get(pd_auth.SIGNATURE_HEADER))
    assert "UNAUTHENTICATED" not in pd["prefill_log"].read_text() + pd["decode_log"].read_text()


@pytest.mark.server
def test_a_forged_put_route_is_refused_and_the_entry_stays(pd):
    before = requests.get(pd["boot"] + ROUTE_RANK0, timeout=T).json()
    forged = json.dumps({"rank_ip": "127.0.0.2", "rank_port": 1, "attn_tp_rank": 0, "pp_rank": 0}).encode()
    for headers in ({"Content-Type": "application/json"},
                    pd_auth.signed_headers(b"not the secret", "PUT /route", forged),
                    pd_auth.signed_headers(pd["secret"], "POST /register_dp_rank", forged)):  # another route's
        r = requests.put(pd["boot"] + "/route", data=forged, headers=headers, timeout=T)
        assert r.status_code == 401 and "deployment secret" in r.text, r.text
    r = requests.post(pd["boot"] + "/register_dp_rank", json={"bootstrap_room": 5, "dp_rank": 3}, timeout=T)
    assert r.status_code == 401
    assert requests.get(pd["boot"] + ROUTE_RANK0, timeout=T).json() == before
    assert before["rank_ip"] == "127.0.0.1"
    assert_pair_whole(pd)


def _forged_frames(room: int):
    reg = KVArgsRegisterInfo("127.0.0.2", 1, "127.0.0.2:1", [4096], [8192], [], same_host=b"").to_zmq()
    info = TransferInfo(room, "127.0.0.2", 1, "127.0.0.2:1", np.arange(4, dtype=np.int32), 0, []).to_zmq()
    return [reg, info, build_abort_message(room, "127.0.0.2:1", "forged"),
            build_status_message(room, 4, 0), [b"garbage"], [b""]]


@pytest.mark.server
def test_forged_zmq_frames_to_both_kv_managers_are_dropped(pd):
    wrong = pd_auth.FrameAuth(b"not the secret", pd_auth.TO_PREFILL, pd_auth.TO_DECODE)
    # a genuine tag, but for the other direction: a frame the prefill sent cannot be bounced back to it
    mirrored = pd_auth.FrameAuth(pd["secret"], pd_auth.TO_DECODE, pd_auth.TO_PREFILL)
    ctx = zmq.Context()
    try:
        with Bystander(pd["router"]) as b:
            for side in ("prefill", "decode"):
                port = control_port(pd[f"{side}_log"], side)
                sock = ctx.socket(zmq.PUSH)
                sock.setsockopt(zmq.LINGER, 2000)
                sock.connect(f"tcp://127.0.0.1:{port}")
                for i in range(50):  # a flood: the control thread drops each, the log says so once
                    for frames in _forged_frames(1000 + i):
                        for forged in (frames, wrong.sign(frames), mirrored.sign(frames)):
                            sock.send_multipart(forged, flags=zmq.NOBLOCK)
                sock.close()
            time.sleep(2)
        b.assert_responsive()
    finally:
        ctx.destroy(linger=0)
    for side in ("prefill", "decode"):
        log = pd[f"{side}_log"].read_text(errors="replace")
        assert "Dropped a KV control message" in log, side
        assert log.count("Dropped a KV control message") < 10, "the refusals are rate-limited"
        assert "Traceback" not in log, side
    assert_pair_whole(pd)


class Listener:
    """A TCP listener that records every connection made to it."""

    def __init__(self, host="127.0.0.2"):
        self.sock = socket.socket()
        self.sock.bind((host, 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                conn, addr = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self.connections.append(addr)
            conn.close()

    def close(self):
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


@pytest.mark.server
def test_a_client_bootstrap_host_that_is_no_prefill_is_refused_without_connecting(pd):
    listener = Listener("127.0.0.2")
    try:
        pd_fields = {"bootstrap_host": "127.0.0.2", "bootstrap_port": listener.port, "bootstrap_room": 4242}
        r = requests.post(pd["decode"] + "/generate", timeout=30,
                          json={"text": "hi", "sampling_params": {"max_new_tokens": 2}, **pd_fields})
        assert r.status_code == 400, r.text
        assert f"bootstrap_host 127.0.0.2:{listener.port} is not a prefill server" in error_message(r)
        r = chat(pd["decode"], **pd_fields)
        assert r.status_code == 400 and "is not a prefill server" in error_message(r), r.text
        # nor through another spelling of the same host
        r = chat(pd["decode"], **{**pd_fields, "bootstrap_host": "[127.0.0.2]"})
        assert r.status_code == 400, r.text
        time.sleep(2)  # the refusal is told to the "prefill" only when it is allowed: never here
        assert listener.connections == []
    finally:
        listener.close()
    assert_pair_whole(pd)


def test_put_route_without_a_secret_only_from_the_registering_address(monkeypatch):
    monkeypatch.delenv(pd_auth.SECRET_ENV, raising=False)
    port = find_free_port()
    server = KVBootstrapServer("127.0.0.1", port)

    def put(source, rank_ip):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=T, source_address=(source, 0))
        conn.request("PUT", "/route", json.dumps({"rank_ip": rank_ip, "rank_port": 7}),
                     {"Content-Type": "application/json"})
        status = conn.getresponse().status
        conn.close()
        return status

    try:
        assert put("127.0.0.1", "127.0.0.1") == 200
        assert put("127.0.0.2", "127.0.0.2") == 403  # another address cannot move the rank
        assert requests.get(f"http://127.0.0.1:{port}{ROUTE_RANK0}", timeout=T).json()["rank_ip"] == "127.0.0.1"
        assert put("127.0.0.1", "127.0.0.3") == 200  # a restarted prefill on the same host can
        assert requests.get(f"http://127.0.0.1:{port}{ROUTE_RANK0}", timeout=T).json()["rank_ip"] == "127.0.0.3"
    finally:
        server.close()


def _start_mini_lb(port, secret=None):
    env = {k: v for k, v in os.environ.items() if k != pd_auth.SECRET_ENV}
    if secret:
        env[pd_auth.SECRET_ENV] = secret
    proc = subprocess.Popen([sys.executable, "-m", "sglang.srt.router.mini_lb", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_for_health(f"http://127.0.0.1:{port}", timeout=30, process=proc)
    except BaseException:
        stop_server(proc)
        raise
    return proc


@pytest.mark.server
def test_mini_lb_binds_loopback_and_register_needs_the_secret():
    assert mini_lb_args([]).host == "127.0.0.1"
    secret = pd_auth.generate_secret()
    port, open_port = find_free_port(), find_free_port()
    lb, open_lb = _start_mini_lb(port, secret), _start_mini_lb(open_port)
    try:
        body = json.dumps({"mode": "decode", "registry_url": "http://127.0.0.2:1"}).encode()
        url = f"http://127.0.0.1:{port}/register"
        for headers in ({"Content-Type": "application/json"},
                        pd_auth.signed_headers(b"not the secret", "POST /register", body)):
            r = requests.post(url, data=body, headers=headers, timeout=T)
            assert r.status_code == 401 and "deployment secret" in error_message(r), r.text
        r = requests.post(f"http://127.0.0.1:{open_port}/register", data=body, timeout=T,
                          headers=pd_auth.signed_headers(secret.encode(), "POST /register", body))
        assert r.status_code == 403 and pd_auth.SECRET_ENV in error_message(r)  # no secret: no /register
        # nothing was registered: still no server to send to
        assert requests.post(f"http://127.0.0.1:{port}/generate", json={"text": "x"}, timeout=T).status_code == 503
        r = requests.post(url, data=body, headers=pd_auth.signed_headers(secret.encode(), "POST /register", body),
                          timeout=T)
        assert r.status_code == 200, r.text
    finally:
        stop_server(lb)
        stop_server(open_lb)


def test_launch_pd_hands_one_secret_through_the_environment_not_argv(monkeypatch):
    monkeypatch.delenv(pd_auth.SECRET_ENV, raising=False)
    args, common = launch_pd_args(["--bootstrap-port", "9123", "--router", "in-tree"])
    trust = trust_env({}, args)
    secret = trust["prefill"][pd_auth.SECRET_ENV]
    assert len(secret) == 64 and trust["decode"][pd_auth.SECRET_ENV] == secret == trust["router"][pd_auth.SECRET_ENV]
    assert trust["decode"][pd_auth.BOOTSTRAP_HOSTS_ENV] == "127.0.0.1:9123"
    argv = " ".join(role_flags("prefill", common, args) + role_flags("decode", common, args) + router_cmd(args))
    assert secret not in argv
    assert trust_env({}, args)["prefill"][pd_auth.SECRET_ENV] != secret  # one per deployment
    mine = {pd_auth.SECRET_ENV: "mine", pd_auth.BOOTSTRAP_HOSTS_ENV: "*"}
    assert trust_env(mine, args)["decode"] == {pd_auth.SECRET_ENV: "mine"}  # the user's own values stand


def test_frame_tags_and_bootstrap_host_rules():
    p2d = pd_auth.FrameAuth(b"s", pd_auth.TO_DECODE, pd_auth.TO_PREFILL)  # a prefill
    d2p = pd_auth.FrameAuth(b"s", pd_auth.TO_PREFILL, pd_auth.TO_DECODE)  # a decode
    frames = [b"1", b"4", b"0"]
    assert d2p.open(p2d.sign(frames)) == frames
    assert p2d.open(p2d.sign(frames)) is None  # the other direction's tag
    assert d2p.open(frames) is None and d2p.open([]) is None
    assert pd_auth.FrameAuth(b"t", pd_auth.TO_PREFILL, pd_auth.TO_DECODE).open(p2d.sign(frames)) is None
    tampered = p2d.sign(frames)
    tampered[1] = b"5"
    assert d2p.open(tampered) is None
    assert d2p.open([b"14", b"0"] + p2d.sign(frames)[2:]) is None  # frame boundaries are covered
    open_side = pd_auth.FrameAuth(None, pd_auth.TO_PREFILL, pd_auth.TO_DECODE)
    assert open_side.open(p2d.sign(frames)) == frames and open_side.sign(frames) == frames

    default = pd_auth.BootstrapHostPolicy("10.0.0.5", environ={})
    for host in ("127.0.0.1", "localhost", "::1", "[::1]", "10.0.0.5"):
        assert default.problem(host, 8998) is None, host
    for host in ("127.0.0.2", "10.0.0.6", "169.254.169.254", "evil.example", "127.0.0.1:80/x"):
        assert default.problem(host, 8998) is not None, host
    assert pd_auth.BootstrapHostPolicy("0.0.0.0", environ={}).problem("0.0.0.0", 8998) is not None
    listed = pd_auth.BootstrapHostPolicy("127.0.0.1", environ={pd_auth.BOOTSTRAP_HOSTS_ENV: "p1:8998, [fd00::1]:9, p2"})
    assert listed.problem("p1", 8998) is None and listed.problem("p1", 8999) is not None
    assert listed.problem("fd00::1", 9) is None and listed.problem("p2", 1) is None
    assert listed.problem("127.0.0.1", 8998) is not None  # the list replaces the default
    assert pd_auth.BootstrapHostPolicy(None, environ={pd_auth.BOOTSTRAP_HOSTS_ENV: "*"}).problem("x", 1) is None
    with pytest.raises(ValueError, match=pd_auth.BOOTSTRAP_HOSTS_ENV):
        pd_auth.BootstrapHostPolicy(None, environ={pd_auth.BOOTSTRAP_HOSTS_ENV: "p1:http"})


# --- the same-host copy: real processes ------------------------------------------------------------
def _decode_main(conn):
    """A decode: a registered buffer offered through its identity socket, and a private one."""
    buf = np.zeros(4096, dtype=np.uint8)
    private = np.zeros(4096, dtype=np.uint8)
    identity = same_host.HostIdentity([(buf.ctypes.data, buf.nbytes)])
    conn.send((identity.frame(), buf.ctypes.data, private.ctypes.data))
    while conn.recv() != "stop":
        conn.send((buf.copy(), private.copy()))


def _impostor_main(conn, answer: bytes, other_uid: bool):
    """Listens on an identity socket name of its own and answers with the real decode's identity
    (its token's address, its token, its buffers), as a process that learned them would."""
    if other_uid:
        os.setgid(65534)
        os.setuid(65534)
    name = "sglang-pd-identity-" + os.urandom(16).hex()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(b"\0" + name.encode())
    sock.listen(4)
    conn.send(name)
    sock.settimeout(30)
    while True:
        try:
            c, _ = sock.accept()
        except OSError:
            return
        c.sendall(answer)
        c.close()


@pytest.fixture
def decode_process():
    if not same_host.copy_permitted(into_child=True):
        pytest.skip("this kernel does not let a process copy into its child (Yama ptrace_scope >= 2)")
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_decode_main, args=(child,), daemon=True)
    proc.start()
    assert parent.poll(60)
    frame, base, private = parent.recv()
    yield ctx, parent, frame, base, private
    parent.send("stop")
    proc.join(10)


def _dump(conn):
    conn.send("dump")
    return conn.recv()


@pytest.mark.parametrize("other_uid", [False, True], ids=["same_user", "other_user"])
def test_the_same_host_copy_refuses_a_peer_whose_identity_does_not_check_out(decode_process, other_uid):
    if other_uid and os.geteuid() != 0:
        pytest.skip("needs root to start a process of another user")
    ctx, conn, frame, base, private = decode_process
    real, why = same_host.verify_peer(same_host.parse_frame(frame))
    assert real is not None, why
    answer = same_host.identity_answer(real.token_addr, real.token, real.regions)  # what the decode says
    parent, child = ctx.Pipe()
    impostor = ctx.Process(target=_impostor_main, args=(child, answer, other_uid), daemon=True)
    impostor.start()
    try:
        assert parent.poll(60)
        name = parent.recv()
        src = np.full(64, 7, dtype=np.uint8)
        writer = same_host.SameHostWriter()
        # a registration naming the impostor's socket, aimed at the decode's own buffer
        assert not writer.write("forged", name, [src.ctypes.data], [base], [64])
        (why,) = writer.refused.values()
        assert ("uid" in why) if other_uid else (f"pid {impostor.pid}" in why), why
        buf, _ = _dump(conn)
        assert not buf.any() and writer.copied_bytes == 0
    finally:
        impostor.kill()
        impostor.join(10)


def test_the_same_host_copy_writes_only_inside_what_the_verified_process_declared(decode_process):
    ctx, conn, frame, base, private = decode_process
    src = np.full(64, 7, dtype=np.uint8)
    writer = same_host.SameHostWriter()
    # a forged registration naming the real decode's socket but aiming at its private memory
    assert not writer.write("forged", same_host.parse_frame(frame), [src.ctypes.data], [private], [64])
    assert not writer.write("forged", same_host.parse_frame(frame), [src.ctypes.data], [base + 4090], [64])
    buf, priv = _dump(conn)
    assert not buf.any() and not priv.any()
    assert writer.write("forged", same_host.parse_frame(frame), [src.ctypes.data], [base], [64])  # its buffer: yes
    buf, priv = _dump(conn)
    assert (buf[:64] == 7).all() and not buf[64:].any() and not priv.any()
