"""For `test/security/`: find every socket a server's processes listen on, from the outside (as an
attacker on the same host would), and send each of them bytes that must never run.

    pids = process_tree(proc.pid)
    paths = unix_listeners(pids)             # ipc sockets: /proc/net/unix x /proc/<pid>/fd
    ports = tcp_listeners(pids)              # [(ip, port)], psutil
    probe = MarkerPickle(tmp_path / "pwned")  # unpickling it creates the marker file
    for p in paths: zmq_push(f"ipc://{p}", hostile_frames(probe))
    for ip, port in ports: zmq_push(f"tcp://{ip}:{port}", ...); raw_tcp_write(ip, port, ...)
    assert not probe.fired()
"""

from __future__ import annotations

import os
import pickle
import socket
from typing import Iterable, List, Sequence, Set, Tuple

import psutil

_SO_ACCEPTCON = 0x00010000  # /proc/net/unix "Flags" of a listening socket


def process_tree(pid: int) -> List[int]:
    root = psutil.Process(pid)
    return [root.pid] + [c.pid for c in root.children(recursive=True)]


def _socket_inodes(pid: int) -> Set[int]:
    inodes = set()
    fd_dir = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[len("socket:[") : -1]))
    return inodes


def unix_listeners(pids: Iterable[int]) -> List[str]:
    """Paths of the listening Unix sockets the processes hold ("@name" for an abstract one)."""
    out = []
    for pid in pids:
        inodes = _socket_inodes(pid)
        try:
            with open(f"/proc/{pid}/net/unix") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) < 8:
                continue  # unnamed
            flags, inode, path = int(parts[3], 16), int(parts[6]), parts[7]
            if inode in inodes and flags & _SO_ACCEPTCON and path not in out:
                out.append(path)
    return out


def tcp_listeners(pids: Iterable[int]) -> List[Tuple[str, int]]:
    """(ip, port) of every listening TCP socket the processes hold (IPv4 and IPv6)."""
    out = []
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        for c in conns:
            if c.status == psutil.CONN_LISTEN and (c.laddr.ip, c.laddr.port) not in out:
                out.append((c.laddr.ip, c.laddr.port))
    return out


class MarkerPickle:
    """A pickle whose loading creates `path` (`open(path, "w")`): proof that someone unpickled it."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))

    def payload(self) -> bytes:
        return pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL)

    def fired(self) -> bool:
        return os.path.exists(self.path)


def hostile_frames(probe: MarkerPickle) -> List[bytes]:
    """The pickle alone, the pickle behind our codec's header, an unregistered type in our format,
    and a valid frame cut short."""
    import msgpack

    from sglang.srt.managers.internal_channel import internal_codec
    from sglang.srt.managers.io_struct import AbortReq
    from sglang.srt.utils.msg_codec import MAGIC_PLAIN

    evil = probe.payload()
    unregistered = MAGIC_PLAIN + msgpack.packb([msgpack.ExtType(1, b""), "system", "touch " + probe.path])
    valid = internal_codec().encode(AbortReq(rid="probe-never-exists"))
    return [evil, MAGIC_PLAIN + evil, unregistered, valid[: len(valid) // 2]]


def zmq_push(endpoint: str, frames: Sequence[bytes], timeout_ms: int = 2000) -> int:
    """Sends each frame from a ZMQ PUSH socket connected to `endpoint`; how many were sent
    (a peer that is no ZMQ PULL socket takes none)."""
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.SNDTIMEO, timeout_ms)
    sock.setsockopt(zmq.LINGER, timeout_ms)
    sent = 0
    try:
        sock.connect(endpoint)
        for frame in frames:
            try:
                sock.send(frame)
                sent += 1
            except zmq.Again:
                break
    finally:
        sock.close()
        ctx.term()
    return sent


def raw_tcp_write(ip: str, port: int, frames: Sequence[bytes], timeout: float = 2.0) -> None:
    """Writes the frames as they are on one TCP connection (no ZMQ handshake), then closes it."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    host = "::1" if ip == "::" else ("127.0.0.1" if ip == "0.0.0.0" else ip)
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect((host, port))
            for frame in frames:
                s.sendall(frame)
        except OSError:
            pass


def raw_unix_write(path: str, frames: Sequence[bytes], timeout: float = 2.0) -> None:
    """Writes the frames as they are on one Unix stream connection (an abstract socket when
    `path` starts with "@", as /proc/net/unix shows them), then closes it."""
    address = "\0" + path[1:] if path.startswith("@") else path
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect(address)
            for frame in frames:
                s.sendall(frame)
        except OSError:
            pass
