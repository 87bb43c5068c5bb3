"""Small helpers shared by the Mooncake manager halves: env parsing, host naming, warn-once."""

from __future__ import annotations

import logging
import os
from typing import Optional, Set

logger = logging.getLogger("sglang.srt.disaggregation.mooncake.conn")

ABORT_REASON = "Aborted by AbortReq."
# Prefill's reason text when a decode session's buffers are unknown to it; decode re-registers on seeing it.
UNREGISTERED_MARKER = "has not registered its KV buffers"


def zmq_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def connect_host(host: Optional[str]) -> str:
    if os.environ.get("SGLANG_HOST_IP"):
        return os.environ["SGLANG_HOST_IP"]
    if host in (None, "", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def warn_once(key: str, msg: str, _seen: Set[str] = set()) -> None:  # noqa: B006 - process-wide memo
    if key not in _seen:
        _seen.add(key)
        logger.warning(msg)


