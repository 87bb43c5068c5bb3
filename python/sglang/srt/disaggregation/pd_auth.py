"""The PD deployment's shared secret: who may register a prefill rank, send KV control frames,
and register servers with the in-tree load balancer; and which prefill hosts a decode server
may be sent to by a client.

Upstream SGLang authenticates none of this traffic. Here a deployment can share a secret:

* `SGLANG_DISAGGREGATION_SECRET` (environment only: a flag would show in `ps`). `launch_pd`
  generates one per deployment and hands it to both servers and the in-tree mini_lb; by hand, set
  the same value on every prefill, decode and mini_lb process.
* With it: every ZMQ control frame between the KV managers carries an HMAC-SHA256 tag (one extra
  trailing frame) over all its frames and its direction; the bootstrap server's `PUT /route` and
  `POST /register_dp_rank` need an `X-SGLang-PD-Signature` over the body; its `GET /route`
  answers are signed and the decode side checks them before it registers its buffers with the
  endpoint they name; mini_lb's `/register` needs the signature. Anything without a valid tag is
  dropped and logged (at most once per 10 s per kind).
* Without it: everything works as upstream (the real sglang-router by-hand deployments), each
  process warns once at start that PD control traffic is unauthenticated, the bootstrap server
  lets only the address that registered a rank replace it, and mini_lb refuses `/register`.

Frames are authenticated, not encrypted, and not protected against replay (a replayed frame is
one the deployment itself sent: a registration or a status for a room that is already done).

`bootstrap_host` (where a decode server connects for a request's KV) is checked against
`SGLANG_DISAGGREGATION_BOOTSTRAP_HOSTS` before any connection: a comma list of `host` or
`host:port` (`[v6]:port`), `*` for any; unset: loopback (127.0.0.1, localhost, ::1) and the
server's own `--host`, any port. No name is resolved: the router passes the prefill URL's host as
written, and that is what is compared.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import threading
import time
from typing import Dict, List, Mapping, Optional, Sequence

logger = logging.getLogger(__name__)

SECRET_ENV = "SGLANG_DISAGGREGATION_SECRET"
BOOTSTRAP_HOSTS_ENV = "SGLANG_DISAGGREGATION_BOOTSTRAP_HOSTS"
SIGNATURE_HEADER = "X-SGLang-PD-Signature"

# Directions of a ZMQ control frame: a tag made for one is refused in the other.
TO_PREFILL = b"to-prefill"
TO_DECODE = b"to-decode"

_TAG_MAGIC = b"SGLPDMAC1"  # the tag frame: magic + 32-byte HMAC
_TAG_LEN = len(_TAG_MAGIC) + 32
_LOOPBACK = ("127.0.0.1", "localhost", "::1")
_WILDCARD_BINDS = ("", "0.0.0.0", "::")


def generate_secret() -> str:
    return secrets.token_hex(32)


def secret_from_env(environ: Mapping[str, str] = os.environ) -> Optional[bytes]:
    value = environ.get(SECRET_ENV, "")
    return value.encode("utf-8") if value else None


_warned = set()
_warn_lock = threading.Lock()


def warn_if_unauthenticated(secret: Optional[bytes], who: str) -> None:
    """Once per process and component: say that PD control traffic is open to anyone who can reach it."""
    if secret is not None:
        return
    with _warn_lock:
        if who in _warned:
            return
        _warned.add(who)
    logger.warning("%s: %s is not set, so PD control traffic (bootstrap registration, KV control frames) is "
                   "unauthenticated: anyone who can reach these ports can register or send frames. "
                   "Set the same secret on every PD server (launch_pd does this itself).", who, SECRET_ENV)


class RateLimitedLog:
    """A warning per key at most every `interval` s, with how many were suppressed meanwhile: a
    flood of forged frames must not flood the log (or cost the thread more than a dict lookup)."""

    def __init__(self, interval: float = 10.0):
        self.interval = interval
        self._last: Dict[str, float] = {}
        self._suppressed: Dict[str, int] = {}
        self._lock = threading.Lock()

    def warning(self, key: str, msg: str, *args) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(key, -1e18) < self.interval:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return
            self._last[key] = now
            n = self._suppressed.pop(key, 0)
        logger.warning(msg + (f" ({n} more since the last such message)" if n else ""), *args)


def _mac(secret: bytes, label: bytes, parts: Sequence[bytes]) -> bytes:
    h = hmac.new(secret, digestmod=hashlib.sha256)
    h.update(label + b"\0")
    for p in parts:  # length-prefixed: no two frame lists share an encoding
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return h.digest()


class FrameAuth:
    """Signs outgoing ZMQ control frames and opens incoming ones (`secret=None`: no tags)."""

    def __init__(self, secret: Optional[bytes], send_label: bytes, recv_label: bytes):
        self.secret, self.send_label, self.recv_label = secret, send_label, recv_label

    @property
    def enabled(self) -> bool:
        return self.secret is not None

    def sign(self, frames: List[bytes]) -> List[bytes]:
        if self.secret is None:
            return frames
        return list(frames) + [_TAG_MAGIC + _mac(self.secret, self.send_label, frames)]

    def open(self, frames: List[bytes]) -> Optional[List[bytes]]:
        """The frames without their tag; None when a secret is set and the tag is missing or wrong."""
        tagged = bool(frames) and len(frames[-1]) == _TAG_LEN and frames[-1].startswith(_TAG_MAGIC)
        body = frames[:-1] if tagged else frames
        if self.secret is None:
            return body  # a signing peer and an unsigning one still talk (the warning says why)
        if not tagged:
            return None
        want = _mac(self.secret, self.recv_label, body)
        return body if hmac.compare_digest(frames[-1][len(_TAG_MAGIC):], want) else None

    def why_refused(self, frames: List[bytes]) -> str:
        tagged = bool(frames) and frames[-1].startswith(_TAG_MAGIC)
        return ("a wrong tag (another secret?)" if tagged else
                f"no tag (is {SECRET_ENV} set to the same value on both servers?)")


def sign_http(secret: bytes, what: str, body: bytes) -> str:
    """`what` names the request or answer ("PUT /route", "GET /route?..."): a signature made for one
    route is no good on another."""
    return _mac(secret, what.encode("utf-8"), [body]).hex()


def verify_http(secret: bytes, what: str, body: bytes, signature: Optional[str]) -> bool:
    if not signature:
        return False
    return hmac.compare_digest(signature.strip().lower().encode("ascii", "replace"),
                               sign_http(secret, what, body).encode("ascii"))


def signed_headers(secret: Optional[bytes], what: str, body: bytes) -> Dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if secret is not None:
        headers[SIGNATURE_HEADER] = sign_http(secret, what, body)
    return headers


# --- bootstrap_host ------------------------------------------------------------------------------
def _norm_host(host: str) -> str:
    host = host.strip().lower()
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def _split_entry(entry: str):
    """'host' -> (host, None); 'host:port' / '[v6]:port' -> (host, port); a bare IPv6 -> (host, None)."""
    entry = entry.strip()
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        return _norm_host(host), int(rest[1:]) if rest.startswith(":") and rest[1:] else None
    if entry.count(":") == 1:
        host, port = entry.split(":")
        return _norm_host(host), int(port)
    return _norm_host(entry), None


class BootstrapHostPolicy:
    """Which (bootstrap_host, bootstrap_port) a decode server may connect to for a request."""

    def __init__(self, own_host: Optional[str], environ: Mapping[str, str] = os.environ):
        raw = environ.get(BOOTSTRAP_HOSTS_ENV)
        self.any = False
        self.entries = []
        if raw is not None and raw.strip():
            for item in raw.split(","):
                if not item.strip():
                    continue
                if item.strip() == "*":
                    self.any = True
                    continue
                try:
                    self.entries.append(_split_entry(item))
                except ValueError:
                    raise ValueError(f"{BOOTSTRAP_HOSTS_ENV}: {item.strip()!r} is not 'host' or 'host:port'")
            self.source = f"{BOOTSTRAP_HOSTS_ENV}={raw}"
        else:
            hosts = list(_LOOPBACK)
            if own_host and own_host not in _WILDCARD_BINDS:
                hosts.append(own_host)
            self.entries = [(_norm_host(h), None) for h in hosts]
            self.source = f"the default (loopback and this server's --host; set {BOOTSTRAP_HOSTS_ENV} for others)"

    def problem(self, host: str, port: int) -> Optional[str]:
        """None when allowed, else the client-facing reason (`port`: the one the decode would use)."""
        if self.any:
            return None
        h = _norm_host(host)
        for eh, ep in self.entries:
            if eh == h and (ep is None or ep == port):
                return None
        where = f"{host}:{port}" if port is not None else host
        return (f"bootstrap_host {where} is not a prefill server this decode server may connect to; "
                f"allowed: {self.source}.")
