"""No code runs from a socket (issue 51, finding 1): every socket the server's processes listen on
is found from the outside (/proc/net/unix and the processes' descriptors for ipc sockets, psutil
for TCP) and sent a pickle whose loading would create a marker file, the same pickle behind our
frame header, an unregistered type in our format and a truncated frame -- over ZMQ, and to TCP
ports also as raw bytes. The marker never appears, each internal channel logs that it dropped
them, a bystander's 1-token chats keep answering, and the server is whole afterwards.

Also: `--attn-dp-size 2` (no effect here) with `--dist-init-addr 0.0.0.0:PORT` opens no TCP port
but HTTP; the ipc sockets live in a private 0700 directory that goes away with the server; with
`SGLANG_INTERNAL_SECRET` a frame without the right tag is ignored while a signed one is obeyed."""

import concurrent.futures as cf
import json
import os
import time

import pytest
import requests

from sglang.srt.managers.internal_channel import INTERNAL_REGISTRY, SECRET_ENV
from sglang.srt.managers.io_struct import AbortReq
from sglang.srt.utils.msg_codec import MessageCodec
from sglang.test.pd_utils import launch_decode, launch_prefill
from sglang.test.security_probe import Bystander, assert_server_whole
from sglang.test.server_utils import find_free_port, popen_launch_server, start_side_by_side, stop_server
from sglang.test.socket_probe import (
    MarkerPickle,
    hostile_frames,
    process_tree,
    raw_tcp_write,
    raw_unix_write,
    tcp_listeners,
    unix_listeners,
    zmq_push,
)

pytestmark = pytest.mark.server

COMMON = ["--dtype", "float32", "--max-total-tokens", "4096"]
CHANNELS = {"tokenizer": "tokenizer input", "scheduler_input": "scheduler input", "detokenizer": "detokenizer input"}
SECRET = "a-deployment-secret-of-32-bytes!"


def attack_every_socket(pid: int, http_ports, probe: MarkerPickle):
    """Sends the hostile frames to every listening socket of `pid`'s process tree except the HTTP
    ports; returns (ipc paths, [(ip, port)]) that were attacked."""
    pids = process_tree(pid)
    paths = unix_listeners(pids)
    ports = [(ip, port) for ip, port in tcp_listeners(pids) if port not in http_ports]
    frames = hostile_frames(probe)
    for path in paths:  # ZMQ ipc sockets, and the PD same-host identity socket (abstract, not ZMQ)
        if path.startswith("@"):
            raw_unix_write(path, frames)
        else:
            zmq_push(f"ipc://{path}", frames)
    for ip, port in ports:
        host = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(ip, f"[{ip}]" if ":" in ip else ip)
        zmq_push(f"tcp://{host}:{port}", frames)
        raw_tcp_write(ip, port, frames)
    return paths, ports


def assert_drops_logged(log_path: str, timeout: float = 10.0) -> None:
    """Each internal channel said it dropped a frame (the frames reached the receivers)."""
    deadline = time.time() + timeout
    while True:
        with open(log_path, errors="replace") as f:
            log = f.read()
        missing = [c for c in CHANNELS.values() if f"Dropped a frame on the {c} channel" not in log]
        if not missing:
            return
        assert time.time() < deadline, f"no dropped frame logged on {missing}: {log[-2000:]}"
        time.sleep(0.2)


def generate(url: str, max_new_tokens: int = 4) -> dict:
    r = requests.post(url + "/generate", timeout=60, json={
        "text": "hello", "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["meta_info"]["completion_tokens"] == max_new_tokens
    return out


def ipc_dir_of(paths):
    dirs = {os.path.dirname(p) for p in paths}
    assert len(dirs) == 1, paths
    return dirs.pop()


def assert_private_ipc(paths) -> str:
    paths = [p for p in paths if not p.startswith("@")]  # abstract sockets have no file (PD identity)
    assert sorted(os.path.basename(p) for p in paths) == sorted(CHANNELS), paths
    d = ipc_dir_of(paths)
    st = os.stat(d)
    assert st.st_mode & 0o777 == 0o700 and st.st_uid == os.getuid(), oct(st.st_mode)
    for p in paths:
        assert os.stat(p).st_mode & 0o777 == 0o600, (p, oct(os.stat(p).st_mode))
    return d


def test_plain_server_runs_nothing_from_any_socket(plain_server, tmp_path):
    url, proc = plain_server["url"], plain_server["proc"]
    http = int(url.rsplit(":", 1)[1])
    probe = MarkerPickle(tmp_path / "pwned")
    with Bystander(url) as b:
        paths, ports = attack_every_socket(proc.pid, {http}, probe)
        time.sleep(1.0)
    assert {os.path.basename(p) for p in paths} >= set(CHANNELS), paths
    assert ports == [], f"a plain server listens on TCP ports besides HTTP: {ports}"
    assert not probe.fired(), "a process of the server unpickled the probe"
    assert_drops_logged(plain_server["log"])
    b.assert_responsive()
    generate(url)
    assert_server_whole(url)
    assert_private_ipc(paths)


def test_attn_dp_size_without_effect_opens_no_tcp_port(tiny_llama, tmp_path):
    """`--attn-dp-size 2 --dist-init-addr 0.0.0.0:PORT` used to switch the channels to TCP on that
    address (a pickle there ran code); it has no effect here and the channels stay ipc."""
    port, dist_port = find_free_port(), find_free_port()
    log = str(tmp_path / "attn_dp.log")
    proc = popen_launch_server(tiny_llama, port, COMMON + ["--attn-dp-size", "2", "--dist-init-addr",
                                                         f"0.0.0.0:{dist_port}"], log_path=log)
    try:
        pids = process_tree(proc.pid)
        assert tcp_listeners(pids) == [("127.0.0.1", port)]
        paths = unix_listeners(pids)
        ipc_dir = assert_private_ipc(paths)
        probe = MarkerPickle(tmp_path / "pwned")
        attack_every_socket(proc.pid, {port}, probe)
        time.sleep(1.0)
        assert not probe.fired()
        assert_drops_logged(log)
        generate(f"http://127.0.0.1:{port}")
        assert_server_whole(f"http://127.0.0.1:{port}")
    finally:
        stop_server(proc)
    assert not os.path.exists(ipc_dir), "the private ipc directory outlived the server"


def _stream_until_finished(url: str, on_first_chunk) -> dict:
    """Streams a long generation; calls `on_first_chunk()` once it runs; returns the last chunk."""
    last, called = None, False
    with requests.post(url + "/generate", stream=True, timeout=120, json={
            "text": "count", "stream": True,
            "sampling_params": {"max_new_tokens": 600, "temperature": 0, "ignore_eos": True}}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                continue
            last = json.loads(line[len(b"data:"):])
            if not called:
                called = True
                on_first_chunk()
    return last


def test_with_a_secret_only_signed_frames_are_obeyed(tiny_llama, tmp_path):
    """A well-formed AbortReq(abort_all) without a tag, or signed with another key, is ignored (the
    stream runs to its length); the same message signed with the server's secret aborts it (the
    channel is real, and the secret is what decides)."""
    port = find_free_port()
    log = str(tmp_path / "secret.log")
    proc = popen_launch_server(tiny_llama, port, COMMON, log_path=log, env={SECRET_ENV: SECRET})
    url = f"http://127.0.0.1:{port}"
    try:
        scheduler_input = next(p for p in unix_listeners(process_tree(proc.pid)) if p.endswith("/scheduler_input"))
        abort_all = AbortReq(rid="", abort_all=True)
        probe = MarkerPickle(tmp_path / "pwned")
        forged = [MessageCodec(INTERNAL_REGISTRY).encode(abort_all),
                  MessageCodec(INTERNAL_REGISTRY, b"not-the-secret-but-long-enough").encode(abort_all),
                  *hostile_frames(probe)]
        last = _stream_until_finished(url, lambda: zmq_push(f"ipc://{scheduler_input}", forged))
        assert last["meta_info"]["finish_reason"]["type"] == "length", last["meta_info"]
        assert not probe.fired()
        signed = MessageCodec(INTERNAL_REGISTRY, SECRET.encode()).encode(abort_all)
        last = _stream_until_finished(url, lambda: zmq_push(f"ipc://{scheduler_input}", [signed]))
        assert last["meta_info"]["finish_reason"]["type"] == "abort", last["meta_info"]
        with open(log) as f:
            assert "Dropped a frame on the scheduler input channel" in f.read()
        generate(url)
        assert_server_whole(url)
    finally:
        stop_server(proc)


def test_pd_pair_runs_nothing_from_any_socket(tiny_llama, tmp_path):
    """A prefill and a decode server over Mooncake on loopback: their ipc channels, the Mooncake
    control sockets, the transfer engine's port and the bootstrap server all get the frames; the
    pair still serves a PD request and both servers are whole."""
    d, p, boot = find_free_port(), find_free_port(), find_free_port()
    pd_args = ["--dtype", "float32", "--max-total-tokens", "2048"]
    dproc, pproc = start_side_by_side(
        lambda: launch_decode(tiny_llama, d, pd_args, log_path=str(tmp_path / "decode.log")),
        lambda: launch_prefill(tiny_llama, p, boot, pd_args, log_path=str(tmp_path / "prefill.log")))
    try:
        probe = MarkerPickle(tmp_path / "pwned")
        attacked = {}
        for name, proc in (("decode", dproc), ("prefill", pproc)):
            attacked[name] = attack_every_socket(proc.pid, {d, p}, probe)
        time.sleep(2.0)
        assert not probe.fired()
        for name in ("decode", "prefill"):
            paths, ports = attacked[name]
            assert_private_ipc(paths)
            assert_drops_logged(str(tmp_path / f"{name}.log"))
        assert ("127.0.0.1", boot) in attacked["prefill"][1]  # the bootstrap server was in the list
        assert any(p.startswith("@sglang-pd-identity") for p in attacked["decode"][0])  # and the identity socket
        with cf.ThreadPoolExecutor(2) as ex:
            futs = [ex.submit(requests.post, f"http://127.0.0.1:{port}/generate", timeout=90, json={
                "text": "hello", "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True},
                "bootstrap_host": "127.0.0.1", "bootstrap_port": boot, "bootstrap_room": 4242}) for port in (d, p)]
            answers = [f.result() for f in futs]
        assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
        assert answers[0].json()["meta_info"]["completion_tokens"] == 4
        for port in (d, p):
            assert_server_whole(f"http://127.0.0.1:{port}")
    finally:
        stop_server(dproc)
        stop_server(pproc)
