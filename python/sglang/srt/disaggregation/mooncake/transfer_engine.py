"""Thin wrapper over `mooncake.engine.TransferEngine` (reference 5.8).

Why a wrapper: one place for the P2PHANDSHAKE initialisation with a deadline, the protocol choice
(`MOONCAKE_PROTOCOL`, default "rdma", which Mooncake itself falls back to TCP on a machine without
RDMA devices; `force_tcp=True` / `MC_FORCE_TCP=1` picks "tcp" with no device), the session id peers
use to address us (`f"{hostname}:{rpc_port}"`), and upstream's error messages.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import List, Optional

logger = logging.getLogger(__name__)

_INSTALL_HINT = (
    "Please install mooncake by following the instructions at "
    "https://kvcache-ai.github.io/Mooncake/getting_started/build.html to run SGLang with MooncakeTransferEngine."
)


def resolve_ib_device(ib_device: Optional[str], gpu_id: Optional[int]) -> str:
    """`--disaggregation-ib-device` forms: "mlx5_0", "mlx5_0,mlx5_1", a JSON object mapping GPU ids
    to devices ('{"0": "mlx5_0", "1": "mlx5_1"}'), or the path of a file holding that JSON."""
    if not ib_device:
        return ""
    text = ib_device.strip()
    if not text.startswith("{") and os.path.isfile(text):
        with open(text) as f:
            text = f.read().strip()
    if text.startswith("{"):
        mapping = json.loads(text)
        key = str(gpu_id if gpu_id is not None else 0)
        if key not in mapping:
            raise ValueError(f"No InfiniBand device configured for GPU {key} in --disaggregation-ib-device {ib_device!r}")
        value = mapping[key]
        return ",".join(value) if isinstance(value, list) else str(value)
    return text


def _wrap_ipv6(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


class MooncakeTransferEngine:
    def __init__(self, hostname: str, gpu_id: Optional[int] = None, ib_device: Optional[str] = None, force_tcp: bool = False):
        try:
            from mooncake.engine import TransferEngine
        except ImportError as e:
            raise ImportError(_INSTALL_HINT) from e
        self.engine = TransferEngine()
        self.hostname = hostname
        self.gpu_id = gpu_id
        self.ib_device = ib_device
        force_tcp = force_tcp or os.environ.get("MC_FORCE_TCP", "") in ("1", "true", "True")
        self.protocol = "tcp" if force_tcp else os.environ.get("MOONCAKE_PROTOCOL", "rdma")
        device_name = "" if force_tcp else resolve_ib_device(ib_device, gpu_id)
        self.initialize(hostname, device_name)
        self.session_id = f"{_wrap_ipv6(hostname)}:{self.engine.get_rpc_port()}"

    def initialize(self, hostname: str, device_name: str) -> None:
        timeout = float(os.environ.get("SGLANG_DISAGGREGATION_ENGINE_INIT_TIMEOUT", "60"))
        result: List[int] = []

        def _init():
            result.append(self.engine.initialize(hostname, "P2PHANDSHAKE", self.protocol, device_name))

        # The binding may hold the GIL for the whole call, so also judge the elapsed time after the
        # join: an initialisation that overran its deadline counts as failed either way.
        start = time.monotonic()
        t = threading.Thread(target=_init, name="mooncake-init", daemon=True)
        t.start()
        t.join(timeout)
        if t.is_alive() or time.monotonic() - start > timeout:
            logger.error("Mooncake Transfer Engine initialization timed out after %ss.", timeout)
            raise RuntimeError("Mooncake Transfer Engine initialization failed.")
        if not result or result[0] != 0:
            logger.error("Mooncake Transfer Engine initialization failed (ret=%s).", result[0] if result else None)
            raise RuntimeError("Mooncake Transfer Engine initialization failed.")

    def register(self, ptr: int, length: int) -> None:
        ret = self.engine.register_memory(ptr, length)
        if ret != 0:
            raise RuntimeError(f"Mooncake memory registration failed (ret={ret})")

    def deregister(self, ptr: int) -> None:
        ret = self.engine.unregister_memory(ptr)
        if ret != 0:
            logger.debug("Mooncake memory deregistration %#x failed (ret=%s).", ptr, ret)

    def batch_register(self, ptrs: List[int], lengths: List[int]) -> None:
        for ptr, length in zip(ptrs, lengths):
            self.register(ptr, length)

    def batch_deregister(self, ptrs: List[int]) -> None:
        for ptr in ptrs:
            self.deregister(ptr)

    def transfer_sync(self, session_id: str, buffer: int, peer_buffer_address: int, length: int) -> int:
        """Write `length` bytes local -> peer; < 0 means failure."""
        ret = self.engine.transfer_sync_write(session_id, buffer, peer_buffer_address, length)
        if ret < 0:
            logger.debug("Failed to transfer data from %#x to %s %#x (ret=%s).", buffer, session_id, peer_buffer_address, ret)
        return ret

    def batch_transfer_sync(self, session_id: str, buffers: List[int], peer_buffer_addresses: List[int], lengths: List[int]) -> int:
        """All blocks in one engine batch; < 0 means failure."""
        ret = self.engine.batch_transfer_sync_write(session_id, buffers, peer_buffer_addresses, lengths)
        if ret < 0:
            logger.debug("Failed to batch transfer %d blocks to %s (ret=%s).", len(buffers), session_id, ret)
        return ret

    def close(self) -> None:
        """Destroy the engine now. Its destructor can take ~1 s holding the GIL; doing it here keeps
        that cost at shutdown instead of wherever the garbage collector happens to free it."""
        self.engine = None

    def get_session_id(self) -> str:
        return self.session_id

    def get_localhost(self) -> str:
        return self.hostname
