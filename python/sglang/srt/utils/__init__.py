"""Small helpers shared by the argument layer and the launchers.

Kept free of heavy imports (no torch) because `sglang.srt.server_args` and the
`python -m sglang.check_server_args` CLI import this module and must start fast.
"""

from __future__ import annotations

import argparse
import ipaddress
import re
import socket
from typing import Optional, Tuple

_LOGGED_ONCE = set()


def log_once(logger, message: str) -> None:
    """`logger.info(message)` the first time this process logs `message` this way (first uses of
    a fast path: the tests look for them in server logs)."""
    if message not in _LOGGED_ONCE:
        _LOGGED_ONCE.add(message)
        logger.info(message)


_DECIMAL_SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY_SUFFIXES = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_HUMAN_INT_RE = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")


def human_readable_int(value) -> int:
    """Parse an integer flag value that may carry a size suffix.

    Lower-case suffixes are decimal (`4k` = 4000, `1.5m` = 1500000), upper-case ones binary
    (`4K` = 4096); a binary suffix needs a whole number. Plain integers pass through, so
    `--max-total-tokens 4096` and `--max-total-tokens 4K` mean the same.
    """
    if isinstance(value, int):
        return value
    text = str(value).strip()
    match = _HUMAN_INT_RE.fullmatch(text)
    if match:
        number, suffix = match.groups()
        if suffix in _DECIMAL_SUFFIXES:
            return int(float(number) * _DECIMAL_SUFFIXES[suffix])
        if "." in number:
            raise argparse.ArgumentTypeError(
                f"Decimals are not allowed with binary suffixes like {suffix}. "
                f"Did you mean to use {number}{suffix.lower()} instead?"
            )
        return int(number) * _BINARY_SUFFIXES[suffix]
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer value: {value!r}") from None


def is_valid_ipv6_address(address: str) -> bool:
    try:
        ipaddress.IPv6Address(address)
        return True
    except ValueError:
        return False


def split_host_port(address: str) -> Tuple[str, int]:
    """Split `host:port` or `[ipv6]:port`; the port is mandatory.

    Used for `--dist-init-addr`; a missing or non-numeric port is an operator error that must
    surface before any process is spawned, not as a hang in a rendezvous later.
    """
    address = address.strip()
    if address.startswith("["):
        end = address.find("]")
        if end < 0:
            raise ValueError(f"Invalid address {address!r}: unbalanced '[' in IPv6 address.")
        host, rest = address[1:end], address[end + 1 :]
        if not rest.startswith(":") or len(rest) == 1:
            raise ValueError(f"Invalid address {address!r}: Missing port.")
        port_text = rest[1:]
    else:
        if ":" not in address:
            raise ValueError(f"Invalid address {address!r}: Missing port.")
        host, port_text = address.rsplit(":", 1)
        if not port_text:
            raise ValueError(f"Invalid address {address!r}: Missing port.")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"Invalid address {address!r}: port {port_text!r} is not an integer.") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"Invalid address {address!r}: port {port} out of range.")
    return host, port


def is_port_available(port: int, host: str = "127.0.0.1") -> bool:
    family = socket.AF_INET6 if is_valid_ipv6_address(host) else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def get_free_port(host: str = "127.0.0.1") -> int:
    """A port the OS reports free right now (bind to port 0)."""
    family = socket.AF_INET6 if is_valid_ipv6_address(host) else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def get_free_port_below_ephemeral(start: int = 20000, end: int = 32000, host: str = "127.0.0.1") -> Optional[int]:
    """A free port below Linux's ephemeral range, so that a later outgoing connection cannot grab it.

    Falls back to an OS-chosen port when the whole range is busy.
    """
    import random

    candidates = list(range(start, end))
    random.shuffle(candidates)
    for port in candidates[:200]:
        if is_port_available(port, host):
            return port
    return get_free_port(host)
