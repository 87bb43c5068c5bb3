"""Fake transfer backend (reference 5.9): moves no bytes, only walks the poll state machine.

Used for PD health checks / warmups (`bootstrap_host == FAKE_BOOTSTRAP_HOST`) and for a decode
server benchmarked alone (`--disaggregation-transfer-backend fake`: prompt KV allocated but never
filled). Same API as the real backends (see base.py); there is no fake bootstrap server.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Optional

import numpy as np

from sglang.srt.disaggregation.base import BaseKVManager, BaseKVReceiver, BaseKVSender, KVArgs
from sglang.srt.disaggregation.utils import DisaggregationMode, KVPoll

logger = logging.getLogger(__name__)

_WAITING_TIMEOUT_WARNING = (
    "Some FakeKVSender requests fail to receive a KV chunk after bootstrapping. If a greater mean TTFT is "
    "acceptable, you can 'export SGLANG_DISAGGREGATION_WAITING_TIMEOUT=600' (10 minutes) to relax the timeout "
    "condition. "
)
_warned_waiting_timeout = False


class FakeKVManager(BaseKVManager):
    def __init__(self, args: KVArgs, disaggregation_mode: DisaggregationMode, server_args=None, is_mla_backend: bool = False):
        self.kv_args = args
        self.disaggregation_mode = disaggregation_mode
        self.server_args = server_args
        self.is_mla_backend = is_mla_backend
        self.waiting_timeout = float(os.environ.get("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "300"))

    def register_to_bootstrap(self) -> None:
        pass


class FakeKVSender(BaseKVSender):
    def __init__(self, mgr: BaseKVManager, bootstrap_addr: str, bootstrap_room: int, req_has_disagg_prefill_dp_rank: bool = False):
        self.kv_mgr = mgr
        self.bootstrap_addr = bootstrap_addr
        self.bootstrap_room = bootstrap_room
        self.has_sent = False
        self.inited = False
        self.conclude_state: Optional[int] = None
        self.init_time: Optional[float] = None
        self.waiting_timeout = getattr(mgr, "waiting_timeout", float(os.environ.get("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "300")))

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None) -> None:
        self.inited = True
        self.num_kv_indices = num_kv_indices
        self.aux_index = aux_index

    def poll(self) -> int:
        global _warned_waiting_timeout
        if self.conclude_state is not None:
            return self.conclude_state
        if self.has_sent:
            self.conclude_state = KVPoll.Success
            return KVPoll.Success
        if self.inited:
            now = time.monotonic()
            if self.init_time is None:
                self.init_time = now
            elif now - self.init_time >= self.waiting_timeout:
                if not _warned_waiting_timeout:
                    _warned_waiting_timeout = True
                    logger.warning(_WAITING_TIMEOUT_WARNING)
                self.conclude_state = KVPoll.Failed
                return KVPoll.Failed
        return KVPoll.WaitingForInput

    def send(self, kv_indices: np.ndarray, state_indices=None, is_last: Optional[bool] = None) -> None:
        self.has_sent = True
        logger.debug("FakeKVSender send: room=%s, %d pages", self.bootstrap_room, len(kv_indices))

    def should_send_kv_chunk(self, num_pages: int, last_chunk: bool) -> bool:
        return num_pages > 0 or last_chunk

    def failure_exception(self):
        raise Exception("Fake KVSender Exception")

    def abort(self) -> None:
        self.conclude_state = KVPoll.Failed


class FakeKVReceiver(BaseKVReceiver):
    def __init__(self, mgr: BaseKVManager, bootstrap_addr: str, bootstrap_room: Optional[int] = None, prefill_dp_rank: Optional[int] = None):
        self.kv_mgr = mgr
        self.bootstrap_addr = bootstrap_addr
        self.bootstrap_room = bootstrap_room
        self.has_init = False
        self.has_sent_metadata = False
        self.conclude_state: Optional[int] = None

    def init(self, prefill_dp_rank: int = 0) -> None:
        self.has_init = True

    def poll(self) -> int:
        if self.conclude_state is not None:
            return self.conclude_state
        if not self.has_init:
            return KVPoll.Bootstrapping
        if not self.has_sent_metadata:
            return KVPoll.WaitingForInput
        self.conclude_state = KVPoll.Success
        return KVPoll.Success

    def send_metadata(self, kv_indices: np.ndarray, aux_index: Optional[int] = None, state_indices=None, decode_prefix_len=None) -> None:
        self.has_sent_metadata = True
        logger.debug("FakeKVReceiver send_metadata: room=%s, %d pages", self.bootstrap_room, len(kv_indices))

    def failure_exception(self):
        raise Exception("Fake KVReceiver Exception")

    def abort(self) -> None:
        self.conclude_state = KVPoll.Failed
