"""The transfer backend lookup: `get_kv_class(backend, KVClassType.X)` -> the class for a role.

The only module that knows every backend; backends are imported on first use, so a deployment that
never asks for Mooncake never loads it. The interfaces themselves live in `base.py`.
"""

from __future__ import annotations

from sglang.srt.disaggregation.base import KVArgs
from sglang.srt.disaggregation.utils import KVClassType, TransferBackend

__all__ = ["KVClassType", "TransferBackend", "get_kv_class"]


def get_kv_class(transfer_backend, class_type: KVClassType):
    """Backend class for a role; `KVClassType.KVARGS` is `KVArgs` for every backend.

    The fake backend has no bootstrap server (returns None for BOOTSTRAP_SERVER).
    """
    try:
        backend = TransferBackend(transfer_backend) if not isinstance(transfer_backend, TransferBackend) else transfer_backend
    except ValueError:
        backend = None
    if backend is not None and class_type == KVClassType.KVARGS:
        return KVArgs
    if backend in (TransferBackend.MOONCAKE, TransferBackend.MOONCAKE_TCP):
        from sglang.srt.disaggregation.mooncake.conn import (
            MooncakeKVBootstrapServer,
            MooncakeKVManager,
            MooncakeKVReceiver,
            MooncakeKVSender,
        )

        return {
            KVClassType.MANAGER: MooncakeKVManager,
            KVClassType.SENDER: MooncakeKVSender,
            KVClassType.RECEIVER: MooncakeKVReceiver,
            KVClassType.BOOTSTRAP_SERVER: MooncakeKVBootstrapServer,
        }[class_type]
    if backend == TransferBackend.FAKE:
        from sglang.srt.disaggregation.fake import FakeKVManager, FakeKVReceiver, FakeKVSender

        return {
            KVClassType.MANAGER: FakeKVManager,
            KVClassType.SENDER: FakeKVSender,
            KVClassType.RECEIVER: FakeKVReceiver,
            KVClassType.BOOTSTRAP_SERVER: None,
        }[class_type]
    if backend in (TransferBackend.NIXL, TransferBackend.ASCEND, TransferBackend.MORI):
        raise ValueError(f"Transfer backend {backend.value} is not available in this build; use mooncake or fake.")
    raise ValueError(f"Unsupported transfer backend: {transfer_backend}")
