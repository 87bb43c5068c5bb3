"""Same-host KV writes: one kernel copy (`process_vm_writev`) instead of Mooncake's loopback TCP.

When the prefill and decode servers run on one machine (`launch_pd`, or two `launch_server`s side by
side), Mooncake's TCP transport still moves every byte through two socket copies and two threads:
a 256-token prompt's KV of the default model (5.9 MB) takes 3-4 ms of two cores when they are idle
and 7-11 ms beside a busy one, and a decode forward running beside it stalls on its OpenMP barriers.
`process_vm_writev(2)` copies the same blocks straight from the prefill's pages into the decode's
in ~0.6 ms of one core. Mooncake still owns the engine, the registration of the buffers and every
transfer between hosts; this only replaces the data copy of a batch whose peer proved to be a
process on this machine.

Proof, not guesswork: the decode rank puts a random 16-byte token in its own memory and advertises
`(pid, token address, token)` in its registration. The prefill reads that address of that pid with
`process_vm_readv` before every batch and writes only if the token is there: a decode in another
pid namespace or on another host, or a pid reused after the decode died, reads back something else
(or nothing) and the batch goes through Mooncake as before. A refused or partial copy also falls
back to Mooncake (the writes are idempotent), and a peer whose copies are refused is not tried
again. The kernel allows the copy where the prefill may ptrace the decode: same user, and Yama's
`ptrace_scope` 0 where Yama is on (its common default 1 refuses siblings; this code does not widen
the decode's ptrace permissions to get around that).

`SGLANG_DISAGGREGATION_SAME_HOST_COPY=0` on the decode server keeps every byte on Mooncake
(its registration then carries no token).
"""

from __future__ import annotations

import ctypes
import os
import secrets
import threading
from typing import Dict, List, Optional, Tuple

import numpy as np

from sglang.srt.disaggregation.mooncake.common import logger

_IOV_MAX = 1024
COPY_MESSAGE = "is copied with process_vm_writev"  # logged once per decode peer that takes the copy
_TOKEN_LEN = 16


def enabled() -> bool:
    return os.environ.get("SGLANG_DISAGGREGATION_SAME_HOST_COPY", "1").lower() not in ("0", "false", "no", "off")


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


class HostIdentity:
    """The decode side: the token this process advertises (kept alive as long as the manager)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.token = np.frombuffer(secrets.token_bytes(_TOKEN_LEN), dtype=np.uint8).copy()

    def frame(self) -> bytes:
        return f"{self.pid}:{self.token.ctypes.data}:{self.token.tobytes().hex()}".encode("ascii")


def parse_frame(frame: bytes) -> Optional[Tuple[int, int, bytes]]:
    """-> (pid, token address, token) or None (an empty or unknown frame: Mooncake only)."""
    try:
        pid, addr, token = frame.decode("ascii").split(":")
        return int(pid), int(addr), bytes.fromhex(token)
    except (ValueError, UnicodeDecodeError):
        return None


def _iovecs(addrs: List[int], lens: List[int]) -> np.ndarray:
    iov = np.empty((len(addrs), 2), dtype=np.uint64)
    iov[:, 0] = addrs
    iov[:, 1] = lens
    return iov


class SameHostWriter:
    """The prefill side: copies a batch into a proven same-host peer, else says it did not."""

    def __init__(self) -> None:
        self.refused: Dict[str, str] = {}  # "session (pid N)" -> why its batches go through Mooncake
        self.copied_bytes = 0
        self._copying: Dict[str, None] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _token_problem(pid: int, addr: int, token: bytes) -> Optional[str]:
        """None when `pid` holds `token` at `addr` here, else why not."""
        buf = np.zeros(len(token), dtype=np.uint8)
        local = _iovecs([buf.ctypes.data], [len(token)])
        remote = _iovecs([addr], [len(token)])
        n = _LIBC.process_vm_readv(pid, local.ctypes.data, 1, remote.ctypes.data, 1, 0)
        if n == len(token) and buf.tobytes() == token:
            return None
        if n < 0:
            err = ctypes.get_errno()
            return (f"cannot read pid {pid}'s token here ({os.strerror(err)}): another host or pid namespace, or no "
                    "ptrace access to it (Yama's kernel.yama.ptrace_scope must be 0)")
        return f"pid {pid} here does not hold the decode's token (another host or pid namespace, or a reused pid)"

    def _refuse(self, key: str, why: str) -> None:
        with self._lock:
            if key not in self.refused:
                self.refused[key] = why
                logger.info("KV to %s goes through Mooncake: %s", key, why)

    def write(self, session_id: str, peer: Optional[Tuple[int, int, bytes]], srcs: List[int], dsts: List[int], lens: List[int]) -> bool:
        """True when every block was copied; False: send the batch through Mooncake."""
        if peer is None or _LIBC is None:
            return False
        pid, addr, token = peer
        key = f"{session_id} (pid {pid})"  # a restarted decode may reuse the session id, not the pid
        if key in self.refused:
            return False
        problem = self._token_problem(pid, addr, token)  # before every batch: the pid may have died
        if problem is not None:
            self._refuse(key, problem)
            return False
        total = 0
        for i in range(0, len(srcs), _IOV_MAX):
            n = lens[i:i + _IOV_MAX]
            local, remote = _iovecs(srcs[i:i + _IOV_MAX], n), _iovecs(dsts[i:i + _IOV_MAX], n)
            done = _LIBC.process_vm_writev(pid, local.ctypes.data, len(n), remote.ctypes.data, len(n), 0)
            if done != int(sum(n)):
                err = ctypes.get_errno() if done < 0 else 0
                self._refuse(key, f"process_vm_writev copied {max(done, 0)} of {int(sum(n))} bytes"
                                         f"{' (' + os.strerror(err) + ')' if err else ''}")
                return False
            total += done
        with self._lock:
            self.copied_bytes += total
            if key not in self._copying:
                self._copying[key] = None
                logger.info("KV to %s on this host %s", key, COPY_MESSAGE)
        return True
