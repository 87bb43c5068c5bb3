"""Same-host KV writes: one kernel copy (`process_vm_writev`) instead of Mooncake's loopback TCP.

When the prefill and decode servers run on one machine (`launch_pd`, or two `launch_server`s side by
side), Mooncake's TCP transport still moves every byte through two socket copies and two threads,
and a decode forward running beside a transfer stalls on its OpenMP barriers. `process_vm_writev(2)`
copies the same blocks straight from the prefill's pages into the decode's (docs/pd.md has the
measurements). Mooncake still owns the engine, the registration of the buffers and every transfer
between hosts; this only replaces the data copy of a batch whose peer proved to be a process on
this machine.

Proof, not guesswork: the decode rank puts a random 16-byte token in its own memory and advertises
`(pid, token address, token, its registered buffers)` in its registration. The prefill reads that
address of that pid with `process_vm_readv` before every batch and writes only if the token is
there: a decode in another pid namespace or on another host, or a pid reused after the decode
died, reads back something else (or nothing) and the batch goes through Mooncake as before. Every
block must also lie inside one of the advertised buffers (what Mooncake has registered), so a
wrong address fails the batch (Mooncake then refuses it) instead of writing elsewhere. A refused or
partial copy falls back to Mooncake (the writes are idempotent), and a decode process whose copies
are refused is not tried again. The kernel allows the copy where the prefill may ptrace the decode:
same user, and Yama's `ptrace_scope` 0 where Yama is on, or CAP_SYS_PTRACE (`copy_permitted()`;
this code does not widen the decode's ptrace permissions).

`SGLANG_DISAGGREGATION_SAME_HOST_COPY=0` on the decode server keeps every byte on Mooncake
(its registration then carries no token).
"""

from __future__ import annotations

import ctypes
import os
import secrets
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


class HostIdentity:
    """The decode side: the token this process advertises (kept alive as long as the manager)
    and the buffers (pointer, length) a same-host prefill may write."""

    def __init__(self, regions: Sequence[Tuple[int, int]]) -> None:
        self.pid = os.getpid()
        self.token = np.frombuffer(secrets.token_bytes(_TOKEN_LEN), dtype=np.uint8).copy()
        self.regions = np.asarray(list(regions), dtype=np.uint64).reshape(-1, 2)

    def frame(self) -> bytes:
        return (f"{self.pid}:{self.token.ctypes.data}:{self.token.tobytes().hex()}:"
                f"{self.regions.astype('<u8').tobytes().hex()}").encode("ascii")


def parse_frame(frame: bytes) -> Optional[Peer]:
    """-> the peer, or None for an empty, malformed or implausible frame (Mooncake only)."""
    try:
        pid, addr, token, regions = frame.decode("ascii").split(":")
        pid, addr, token = int(pid), int(addr), bytes.fromhex(token)
        raw = bytes.fromhex(regions)
    except (ValueError, UnicodeDecodeError):
        return None
    if len(token) != _TOKEN_LEN or not 0 < pid < _PID_MAX or not 0 < addr < 1 << 64 or not raw or len(raw) % 16:
        return None
    regions = np.frombuffer(raw, dtype="<u8").reshape(-1, 2).astype(np.uint64)
    return Peer(pid, addr, token, regions[np.argsort(regions[:, 0], kind="stable")])


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
    """The prefill side: copies a batch into a proven same-host peer, else says it did not."""

    def __init__(self) -> None:
        self.refused: Dict[str, str] = {}  # "session (pid N, token T)" -> why its batches go through Mooncake
        self.copied_bytes = 0
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
            return (f"cannot read pid {peer.pid}'s token here ({os.strerror(err)}): another host or pid namespace, "
                    "or no ptrace access to it (Yama's kernel.yama.ptrace_scope must be 0)")
        return f"pid {peer.pid} here does not hold the decode's token (another host or pid namespace, or a reused pid)"

    def _refuse(self, key: str, why: str) -> None:
        with self._lock:
            if key not in self.refused:
                self.refused[key] = why
                logger.info("KV to %s goes through Mooncake: %s", key, why)

    def write(self, session_id: str, peer: Optional[Peer], srcs: List[int], dsts: List[int], lens: List[int]) -> bool:
        """True when every block was copied; False: send the batch through Mooncake. `peer` must
        come from the same registration as `dsts`."""
        if peer is None or _LIBC is None:
            return False
        key = f"{session_id} (pid {peer.pid}, token {peer.token.hex()[:8]})"  # one decode process
        if key in self.refused:
            return False
        s, d, n = (np.asarray(v, dtype=np.uint64) for v in (srcs, dsts, lens))
        if not _inside(peer.regions, d, n):
            logger.warning("KV batch to %s has blocks outside the decode's registered buffers: sent through "
                           "Mooncake, which refuses them", key)
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
                logger.info("KV to %s on this host %s", key, COPY_MESSAGE)
        return True
