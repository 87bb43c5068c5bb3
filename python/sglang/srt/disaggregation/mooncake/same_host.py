"""Same-host KV writes: one kernel copy (`process_vm_writev`) instead of Mooncake's loopback TCP.

When the prefill and decode servers run on one machine (`launch_pd`, or two `launch_server`s side by
side), Mooncake's TCP transport still moves every byte through two socket copies and two threads,
and a decode forward running beside a transfer stalls on its OpenMP barriers. `process_vm_writev(2)`
copies the same blocks straight from the prefill's pages into the decode's (docs/pd.md has the
measurements). Mooncake still owns the engine, the registration of the buffers and every transfer
between hosts; this only replaces the data copy of a batch whose peer proved to be a process on
this machine.

Proof, not guesswork, and never the peer's word for it: the decode rank listens on an abstract
Unix socket (its name, random, is all its registration carries) and answers each connection from a
process of its own user with a random 16-byte token in its memory, the token's address and its
registered buffers (pointer, length). The prefill connects once per decode process and takes the
pid from the kernel (SO_PEERCRED: the process that listens there), not from any frame, and requires
the same uid. Before every batch it reads the token's address of that pid with `process_vm_readv`
and writes only if the token is there: a decode in another network or pid namespace or on another
host cannot be reached or read, a pid reused after the decode died reads back something else, and
the batch goes through Mooncake as before. Every block must also lie inside one of the buffers the
verified process itself declared (what Mooncake has registered there), whatever a registration frame
says, so a forged registration can at most aim at that decode's KV buffers, never at its other
memory or at another process. A refused or partial copy falls back to Mooncake (the writes are
idempotent), and a decode process whose copies are refused is not tried again. The kernel allows the
copy where the prefill may ptrace the decode: same user, and Yama's `ptrace_scope` 0 where Yama is
on, or CAP_SYS_PTRACE (`copy_permitted()`; this code does not widen the decode's ptrace permissions).

`SGLANG_DISAGGREGATION_SAME_HOST_COPY=0` on the decode server keeps every byte on Mooncake
(its registration then carries no token).
"""

from __future__ import annotations

import ctypes
import os
import re
import secrets
import socket
import struct
import threading
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from sglang.srt.disaggregation.mooncake.common import logger

COPY_MESSAGE = "is copied with process_vm_writev"  # logged once per decode process that takes the copy
_IOV_MAX = 1024
_CALL_BYTES = 1 << 30  # one call moves at most ~2 GiB (MAX_RW_COUNT): stay well below
_TOKEN_LEN = 16
_PID_MAX = 1 << 22  # the kernel's limit for pid_max
_CAP_SYS_PTRACE = 19


def enabled() -> bool:
    return os.environ.get("SGLANG_DISAGGREGATION_SAME_HOST_COPY", "1").lower() not in ("0", "false", "no", "off")


def copy_permitted(into_child: bool = False) -> bool:
    """Whether this kernel lets a process copy into another process of the same user: into its
    own child (`into_child`), or into any other (launch_pd's servers are siblings). Yama's
    `ptrace_scope` 1 allows the child only, 2 neither, without CAP_SYS_PTRACE; 3 never."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = int(f.read().strip())
    except (OSError, ValueError):
        return True  # no Yama: the classic same-user rule
    if scope == 0 or (scope == 1 and into_child):
        return True
    if scope >= 3:
        return False
    try:
        with open("/proc/self/status") as f:
            caps = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    except (OSError, StopIteration, ValueError):
        return False
    return bool(caps >> _CAP_SYS_PTRACE & 1)


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    for name in ("process_vm_writev", "process_vm_readv"):
        fn = getattr(libc, name, None)
        if fn is None:
            return None
        fn.restype = ctypes.c_ssize_t
        fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    return libc


_LIBC = _libc()


class Peer(NamedTuple):
    pid: int
    token_addr: int
    token: bytes
    regions: np.ndarray  # [n, 2] uint64 (start, length) of its registered buffers, sorted by start


_NAME_PREFIX = "sglang-pd-identity-"
_NAME_RE = re.compile(r"uds:(sglang-pd-identity-[0-9a-f]{32})")
_ANSWER_MAGIC = b"SGLPDID1"
_ANSWER_HEAD = struct.Struct("<8sQI")  # magic, token address, number of regions
_MAX_REGIONS = 1 << 16
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def _peer_cred(sock: socket.socket) -> Tuple[int, int, int]:
    return _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))


def identity_answer(token_addr: int, token: bytes, regions: np.ndarray) -> bytes:
    """What a decode's identity socket says: where its token is, the token, its buffers."""
    regions = np.asarray(regions, dtype=np.uint64).reshape(-1, 2)
    return _ANSWER_HEAD.pack(_ANSWER_MAGIC, token_addr, len(regions)) + token + regions.astype("<u8").tobytes()


class HostIdentity:
    """The decode side: the token this process keeps (alive as long as the manager), the buffers
    (pointer, length) a same-host prefill may write, and the socket that tells a prefill of the
    same user both, the kernel vouching for which process answers."""

    def __init__(self, regions: Sequence[Tuple[int, int]]) -> None:
        self.pid = os.getpid()
        self.token = np.frombuffer(secrets.token_bytes(_TOKEN_LEN), dtype=np.uint8).copy()
        self.regions = np.asarray(list(regions), dtype=np.uint64).reshape(-1, 2)
        self.name = _NAME_PREFIX + secrets.token_hex(16)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(b"\0" + self.name.encode("ascii"))
        self._sock.listen(16)
        self._sock.settimeout(0.5)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="kv-same-host-identity", daemon=True)
        self._thread.start()

    def frame(self) -> bytes:
        return f"uds:{self.name}".encode("ascii")

    def answer(self) -> bytes:
        return identity_answer(self.token.ctypes.data, self.token.tobytes(), self.regions)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return  # closed
            with conn:
                try:
                    if _peer_cred(conn)[1] == os.geteuid():  # another user gets nothing (not even addresses)
                        conn.settimeout(2.0)
                        conn.sendall(self.answer())
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._sock.close()
        self._thread.join(timeout=2)


def parse_frame(frame: bytes) -> Optional[str]:
    """-> the name of the decode's identity socket, or None for an empty or malformed frame (an
    upstream decode, or the older frame that declared its pid: Mooncake only)."""
    try:
        m = _NAME_RE.fullmatch(frame.decode("ascii"))
    except UnicodeDecodeError:
        return None
    return m.group(1) if m else None


def verify_peer(name: str, timeout: float = 2.0) -> Tuple[Optional[Peer], str]:
    """Connects to the identity socket `name`: -> (the peer, "") with the pid the kernel reports for
    the listening process, or (None, why not)."""
    if not name.startswith(_NAME_PREFIX):
        return None, "not an identity socket name"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(b"\0" + name.encode("ascii"))
            pid, uid, _ = _peer_cred(sock)
            if uid != os.geteuid():
                return None, f"its identity socket belongs to uid {uid}, not this server's user"
            if pid <= 0:
                return None, "its process is not visible in this pid namespace"
            data = b""
            limit = _ANSWER_HEAD.size + _TOKEN_LEN + 16 * _MAX_REGIONS
            while len(data) <= limit:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
    except OSError as e:
        return None, f"cannot reach its identity socket ({e}): another host or network namespace"
    if len(data) < _ANSWER_HEAD.size + _TOKEN_LEN:
        return None, f"pid {pid} did not answer as a decode identity"
    magic, token_addr, n = _ANSWER_HEAD.unpack_from(data)
    raw = data[_ANSWER_HEAD.size + _TOKEN_LEN:]
    if magic != _ANSWER_MAGIC or not 0 < n <= _MAX_REGIONS or len(raw) != 16 * n or not 0 < token_addr:
        return None, f"pid {pid} did not answer as a decode identity"
    token = data[_ANSWER_HEAD.size:_ANSWER_HEAD.size + _TOKEN_LEN]
    regions = np.frombuffer(raw, dtype="<u8").reshape(-1, 2).astype(np.uint64)
    return Peer(pid, token_addr, token, regions[np.argsort(regions[:, 0], kind="stable")]), ""


def _iovecs(addrs, lens) -> np.ndarray:
    iov = np.empty((len(addrs), 2), dtype=np.uint64)
    iov[:, 0] = addrs
    iov[:, 1] = lens
    return iov


def _inside(regions: np.ndarray, dsts: np.ndarray, lens: np.ndarray) -> bool:
    """Every block [dst, dst + len) inside one region."""
    i = np.searchsorted(regions[:, 0], dsts, side="right") - 1
    if (i < 0).any():
        return False
    return bool((dsts + lens <= regions[i, 0] + regions[i, 1]).all())


def _calls(srcs: np.ndarray, dsts: np.ndarray, lens: np.ndarray):
    """The blocks as (srcs, dsts, lens) per call: at most IOV_MAX blocks and ~1 GiB each (a longer
    block is cut into pieces)."""
    if (lens > _CALL_BYTES).any():
        pieces = ((lens + (_CALL_BYTES - 1)) // _CALL_BYTES).astype(np.int64)
        idx = np.repeat(np.arange(len(lens)), pieces)
        nth = np.arange(len(idx)) - np.repeat(np.cumsum(pieces) - pieces, pieces)  # piece number in its block
        off = nth.astype(np.uint64) * np.uint64(_CALL_BYTES)
        srcs, dsts = srcs[idx] + off, dsts[idx] + off
        lens = np.minimum(lens[idx] - off, np.uint64(_CALL_BYTES))
    start, total = 0, 0
    for i, n in enumerate(lens.tolist()):
        if i > start and (i - start == _IOV_MAX or total + n > _CALL_BYTES):
            yield srcs[start:i], dsts[start:i], lens[start:i]
            start, total = i, 0
        total += n
    if start < len(lens):
        yield srcs[start:], dsts[start:], lens[start:]


class SameHostWriter:
    """The prefill side: copies a batch into a verified same-host peer, else says it did not."""

    def __init__(self) -> None:
        self.refused: Dict[str, str] = {}  # "session (identity socket)" -> why its batches go through Mooncake
        self.copied_bytes = 0
        self._peers: Dict[str, Peer] = {}  # "session (identity socket)" -> the verified process
        self._copying: Dict[str, None] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _token_problem(peer: Peer) -> Optional[str]:
        """None when the peer's pid holds its token here, else why not."""
        buf = np.zeros(_TOKEN_LEN, dtype=np.uint8)
        local, remote = _iovecs([buf.ctypes.data], [_TOKEN_LEN]), _iovecs([peer.token_addr], [_TOKEN_LEN])
        n = _LIBC.process_vm_readv(peer.pid, local.ctypes.data, 1, remote.ctypes.data, 1, 0)
        if n == _TOKEN_LEN and buf.tobytes() == peer.token:
            return None
        if n < 0:
            err = ctypes.get_errno()
            return (f"cannot read pid {peer.pid}'s token here ({os.strerror(err)}): it died, or no ptrace access "
                    "to it (Yama's kernel.yama.ptrace_scope must be 0)")
        return f"pid {peer.pid} does not hold the token it announced (a reused pid, or not a decode)"

    def _refuse(self, key: str, why: str) -> None:
        with self._lock:
            if key not in self.refused:
                self.refused[key] = why
                logger.info("KV to %s goes through Mooncake: %s", key, why)

    def _peer(self, key: str, claim: str) -> Optional[Peer]:
        peer = self._peers.get(key)
        if peer is None:
            peer, why = verify_peer(claim)
            if peer is None:
                self._refuse(key, why)
                return None
            with self._lock:
                self._peers[key] = peer
        return peer

    def write(self, session_id: str, claim: Optional[str], srcs: List[int], dsts: List[int], lens: List[int]) -> bool:
        """True when every block was copied; False: send the batch through Mooncake. `claim` is the
        identity socket named by the registration of `session_id` (`parse_frame`)."""
        if claim is None or _LIBC is None:
            return False
        key = f"{session_id} ({claim})"  # one decode process
        if key in self.refused:
            return False
        peer = self._peer(key, claim)
        if peer is None:
            return False
        s, d, n = (np.asarray(v, dtype=np.uint64) for v in (srcs, dsts, lens))
        if not _inside(peer.regions, d, n):
            logger.warning("KV batch to %s (pid %s) has blocks outside the buffers that process declared: sent "
                           "through Mooncake, which refuses them", key, peer.pid)
            return False
        problem = self._token_problem(peer)  # before every batch: the pid may have died
        if problem is not None:
            self._refuse(key, problem)
            return False
        total = 0
        for cs, cd, cn in _calls(s, d, n):
            local, remote = _iovecs(cs, cn), _iovecs(cd, cn)
            want = int(cn.sum())
            done = _LIBC.process_vm_writev(peer.pid, local.ctypes.data, len(cn), remote.ctypes.data, len(cn), 0)
            if done != want:
                err = ctypes.get_errno() if done < 0 else 0
                self._refuse(key, f"process_vm_writev copied {max(done, 0)} of {want} bytes"
                                  f"{' (' + os.strerror(err) + ')' if err else ''}")
                return False
            total += done
        with self._lock:
            self.copied_bytes += total
            if key not in self._copying:
                self._copying[key] = None
                logger.info("KV to %s (pid %s) on this host %s", key, peer.pid, COPY_MESSAGE)
        return True
