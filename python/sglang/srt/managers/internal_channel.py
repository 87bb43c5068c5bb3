"""(Shared by all three processes.) The internal ZMQ channels: tokenizer manager -> scheduler ->
detokenizer -> tokenizer manager. What may travel on them, how it is encoded, and what happens to
a frame that is not one of ours.

No pickle: every frame is a `MessageCodec` frame (`utils/msg_codec.py`, msgpack) of the classes
in `INTERNAL_MESSAGE_TYPES`, or a list of them. A receiver drops anything else (a pickle, an
unknown type, a truncated frame, a bad tag), says so in the log (the first time, then at most
every `DROP_LOG_INTERVAL_S` with a count), and goes on.

The secret: `SGLANG_INTERNAL_SECRET` (at least 16 bytes; upstream has no such option). When set,
every frame carries an HMAC-SHA256 tag and frames without a valid tag are dropped. On one host
the channels are `ipc://` sockets in a private 0700 directory (`server_args.PortArgs`), so it is
off by default; channels between hosts must set it (in every process of the deployment).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Optional

from sglang.srt.managers.io_struct import (
    AbortReq,
    BatchStrOutput,
    BatchTokenIDOutput,
    FlushCacheReqInput,
    FlushCacheReqOutput,
    GetInternalStateReq,
    GetInternalStateReqOutput,
    RejectedRequest,
    TokenizedGenerateReqInput,
)
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.utils.msg_codec import MessageCodec, MessageRegistry, WireError, secret_from_text

logger = logging.getLogger(__name__)

SECRET_ENV = "SGLANG_INTERNAL_SECRET"
DROP_LOG_INTERVAL_S = 10.0

# Top-level messages, and the classes that travel inside them (SamplingParams in a request).
INTERNAL_MESSAGE_TYPES = (
    TokenizedGenerateReqInput,
    BatchTokenIDOutput,
    BatchStrOutput,
    AbortReq,
    RejectedRequest,
    FlushCacheReqInput,
    FlushCacheReqOutput,
    GetInternalStateReq,
    GetInternalStateReqOutput,
)
INTERNAL_REGISTRY = MessageRegistry(INTERNAL_MESSAGE_TYPES + (SamplingParams,))

_codec: Optional[MessageCodec] = None


def internal_codec() -> MessageCodec:
    """This process's codec for the internal channels (the secret read from the environment once;
    a secret that is too short raises ValueError)."""
    global _codec
    if _codec is None:
        _codec = MessageCodec(INTERNAL_REGISTRY, secret_from_text(os.environ.get(SECRET_ENV)))
    return _codec


class _DropLog:
    """Logs dropped frames without letting a flood of them flood the log."""

    def __init__(self):
        self.last = 0.0
        self.suppressed = 0

    def dropped(self, where: str, why: str) -> None:
        now = time.monotonic()
        if now - self.last < DROP_LOG_INTERVAL_S:
            self.suppressed += 1
            return
        more = f" ({self.suppressed} more dropped since the last report)" if self.suppressed else ""
        logger.warning("Dropped a frame on the %s channel: %s%s. Only this server's processes should write "
                       "to it.", where, why, more)
        self.last, self.suppressed = now, 0


_drop_log = _DropLog()


def decode_frame(frame: bytes, where: str) -> Optional[Any]:
    """The message in `frame` (a registered message or a list of them), or None when dropped."""
    try:
        msg = internal_codec().decode(frame)
    except WireError as e:
        _drop_log.dropped(where, str(e))
        return None
    if type(msg) in _TOP_LEVEL or (isinstance(msg, list) and msg and all(type(m) in _TOP_LEVEL for m in msg)):
        return msg
    _drop_log.dropped(where, f"a {type(msg).__name__} is not a message")
    return None


_TOP_LEVEL = frozenset(INTERNAL_MESSAGE_TYPES)


def send_msg(sock, msg: Any, flags: int = 0):
    """Sends `msg` (a registered message or a list of them) as one frame; returns what
    `sock.send` returns (an awaitable on a zmq.asyncio socket)."""
    return sock.send(internal_codec().encode(msg), flags)


def recv_msg(sock, where: str, flags: int = 0) -> Optional[Any]:
    """One frame from a blocking socket, decoded; None when it was dropped (zmq.Again passes)."""
    return decode_frame(sock.recv(flags, copy=True), where)


async def recv_msg_async(sock, where: str) -> Optional[Any]:
    return decode_frame(await sock.recv(copy=True), where)


def bind_private(sock, endpoint: str) -> None:
    """Binds `endpoint`; an ipc socket file is made owner-only right away (its directory is
    already 0700: this keeps the file private too if someone moves it elsewhere)."""
    sock.bind(endpoint)
    if endpoint.startswith("ipc://"):
        try:
            os.chmod(endpoint[len("ipc://") :], 0o600)
        except OSError:
            pass
