"""Prefill half of `MooncakeKVManager`: receives decode registrations / per-request metadata on the
PULL socket, registers this rank with the bootstrap server, and runs the transfer workers that turn
each queued chunk into one engine batch and report the outcome to decode (status frames)."""

from __future__ import annotations

import json
import os
import queue
import random
import time
from typing import Dict, List

import numpy as np
import requests
import zmq

from sglang.srt.disaggregation import pd_auth
from sglang.srt.disaggregation.base import KVTransferMetric
from sglang.srt.disaggregation.mooncake.blocks import build_chunk_blocks, mamba_state_layout_mismatch
from sglang.srt.disaggregation.mooncake.common import UNREGISTERED_MARKER, connect_host, env_float, logger
from sglang.srt.disaggregation.mooncake import same_host
from sglang.srt.disaggregation.mooncake.messages import (
    ABORT_TAG,
    REGISTRATION_ROOM,
    KVArgsRegisterInfo,
    TransferInfo,
    build_status_message,
    parse_abort_message,
)
from sglang.srt.disaggregation.utils import KVPoll, encode_failure

_MAX_CLOSED_ROOMS = 65536


class TransferKVChunk:
    __slots__ = ("room", "prefill_kv_indices", "index_slice", "is_last", "prefill_aux_index", "state_indices")

    def __init__(self, room, prefill_kv_indices, index_slice, is_last, prefill_aux_index, state_indices):
        self.room = room
        self.prefill_kv_indices = prefill_kv_indices
        self.index_slice = index_slice
        self.is_last = is_last
        self.prefill_aux_index = prefill_aux_index
        self.state_indices = state_indices


class PrefillManagerMixin:
    def _init_prefill(self) -> None:
        self.transfer_infos: Dict[int, Dict[str, TransferInfo]] = {}
        self.decode_kv_args_table: Dict[str, KVArgsRegisterInfo] = {}
        self.closed_rooms: Dict[int, str] = {}  # aborted / failed rooms: late metadata is answered with Failed
        self.peer_aborted_rooms: Dict[int, None] = {}  # rooms the decode side aborted (bounded like closed_rooms)
        self.rejected_sessions: Dict[str, str] = {}  # decode peers whose registration was refused: why
        self.max_transfer_blocks = max(int(env_float("SGLANG_DISAGGREGATION_MAX_TRANSFER_BLOCKS", 2048)), 1)
        self.transfer_retries = max(int(env_float("SGLANG_DISAGGREGATION_TRANSFER_RETRIES", 6)), 0)
        self.transfer_retry_budget_s = env_float("SGLANG_DISAGGREGATION_TRANSFER_RETRY_BUDGET_S", 2.0)
        n = max(int(env_float("SGLANG_DISAGGREGATION_QUEUE_SIZE", 4)), 1)
        self.same_host_writer = same_host.SameHostWriter()
        self.transfer_queues: List[queue.Queue] = [queue.Queue() for _ in range(n)]
        self._start_thread(self._prefill_bootstrap_thread, "kv-prefill-bootstrap")
        for i, q in enumerate(self.transfer_queues):
            self._start_thread(lambda q=q: self._transfer_worker(q), f"kv-transfer-worker-{i}")
        self.register_to_bootstrap()

    def _bootstrap_endpoint(self) -> str:
        sa = self.server_args
        host = sa.host
        dist_init_addr = sa.dist_init_addr
        if dist_init_addr and sa.nnodes > 1:
            host = dist_init_addr.rsplit(":", 1)[0]
        host = connect_host(host) if not os.environ.get("SGLANG_HOST_IP") else os.environ["SGLANG_HOST_IP"]
        port = sa.disaggregation_bootstrap_port
        return f"{self._zmq_host(host)}:{port}"

    def register_to_bootstrap(self) -> None:
        sa = self.server_args
        tp_size = max(int(sa.tp_size), 1)
        dp_size = max(int(sa.dp_size), 1)
        payload = {
            "attn_tp_size": tp_size,
            "attn_tp_rank": self.kv_args.engine_rank % tp_size,
            "attn_cp_size": 1,
            "attn_cp_rank": 0,
            "attn_dp_size": 1,
            "attn_dp_rank": 0,
            "pp_size": max(int(sa.pp_size), 1),
            "pp_rank": self.kv_args.pp_rank,
            "system_dp_size": dp_size,
            "system_dp_rank": self.kv_args.system_dp_rank,
            "rank_ip": self.local_ip,
            "rank_port": self.rank_port,
            "page_size": self.kv_args.page_size,
            "kv_cache_dtype": self.kv_args.kv_cache_dtype_str,
            "kv_layout": self.kv_args.kv_layout,
            # "auto" resolves to follow_bootstrap_room on a prefill server (server_args/resolution.py)
            "load_balance_method": "follow_bootstrap_room" if sa.load_balance_method == "auto" else sa.load_balance_method,
            "decode_allocation_policy": sa.disaggregation_decode_allocation_policy,
            "prefill_http_port": sa.port,
        }
        url = f"http://{self._bootstrap_endpoint()}/route"
        body = json.dumps(payload).encode("utf-8")
        attempts = 5
        for attempt in range(attempts):
            try:
                r = requests.put(url, data=body, headers=pd_auth.signed_headers(self.secret, "PUT /route", body), timeout=5)
                if r.status_code == 200:
                    logger.debug("Prefill rank registered to bootstrap server %s", url)
                    return
                err = f"{r.status_code} {r.text}"
            except requests.RequestException as e:
                err = str(e)
            if attempt + 1 < attempts:
                delay = min(30.0, 2.0**attempt) * (0.5 + random.random() / 2)
                logger.warning("Prefill failed to register to bootstrap server %s (%s); retry in %.1fs", url, err, delay)
                self._stop.wait(delay)
        logger.error("Prefill instance failed to register to bootstrap server %s after %d attempts: %s", url, attempts, err)

    def _prefill_bootstrap_thread(self) -> None:
        poller = zmq.Poller()
        poller.register(self.server_socket, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            try:
                msg = self._open_frames(self.server_socket.recv_multipart(zmq.NOBLOCK))
                if not msg:
                    continue
                if msg[0] == REGISTRATION_ROOM:
                    info = KVArgsRegisterInfo.from_zmq(msg)
                    self.decode_kv_args_table[info.mooncake_session_id] = info
                    err = mamba_state_layout_mismatch(self.kv_args, info)
                    if err is not None:
                        logger.error("Refusing decode registration of %s: %s", info.mooncake_session_id, err)
                        self.rejected_sessions[info.mooncake_session_id] = err
                    else:
                        self.rejected_sessions.pop(info.mooncake_session_id, None)
                elif msg[0] == ABORT_TAG:
                    room, session_id, reason = parse_abort_message(msg)
                    self.peer_aborted_rooms[room] = None
                    while len(self.peer_aborted_rooms) > _MAX_CLOSED_ROOMS:
                        self.peer_aborted_rooms.pop(next(iter(self.peer_aborted_rooms)))
                    self._close_room(room, f"Request {room} was aborted by the decode instance ({reason})", notify=False)
                else:
                    self._on_transfer_info(TransferInfo.from_zmq(msg))
            except zmq.Again:
                continue
            except zmq.ZMQError:
                if self._stop.is_set():
                    return
                raise
            except Exception as e:  # a malformed peer message must not kill the control thread
                self.refusals.warning("malformed", "Dropping malformed KV control message: %r", e)

    def _on_transfer_info(self, info: TransferInfo) -> None:
        room = info.room
        if room in self.closed_rooms:
            self._push(info.endpoint, info.dst_port, build_status_message(room, KVPoll.Failed, self.kv_args.engine_rank, self.closed_rooms[room]))
            return
        rejected = self.rejected_sessions.get(info.mooncake_session_id)
        if rejected is not None:  # refused at registration: fail the room before any prefill
            self._close_room(room, rejected, notify=False)
            self._push(info.endpoint, info.dst_port, build_status_message(room, KVPoll.Failed, self.kv_args.engine_rank, rejected))
            return
        infos = self.transfer_infos.setdefault(room, {})
        infos[info.mooncake_session_id] = info
        if len(infos) >= info.required_dst_info_num:
            self.update_status(room, KVPoll.WaitingForInput)

    def reject_room(self, room: int, message: str, status_code: int) -> None:
        """This server refused the request before it had a sender: the decode side, whose
        metadata may still come, gets Failed with the status to answer its client with."""
        self._close_room(room, encode_failure(message, status_code), notify=True)

    def _close_room(self, room: int, reason: str, notify: bool) -> None:
        """Fail a room on prefill; tell its decode destinations when `notify`."""
        self.closed_rooms[room] = reason
        while len(self.closed_rooms) > _MAX_CLOSED_ROOMS:  # insertion ordered: forget the oldest
            self.closed_rooms.pop(next(iter(self.closed_rooms)))
        self.fail(room, reason)
        infos = self.transfer_infos.pop(room, {})
        if notify:
            for info in list(infos.values()):
                self._push(info.endpoint, info.dst_port, build_status_message(room, KVPoll.Failed, self.kv_args.engine_rank, reason))

    def add_transfer_request(self, room: int, kv_indices: np.ndarray, index_slice: slice, is_last: bool, aux_index=None, state_indices=None) -> None:
        if self.check_status(room) == KVPoll.Failed:
            return
        self.update_status(room, KVPoll.Transferring)
        chunk = TransferKVChunk(room, np.asarray(kv_indices, dtype=np.int32), index_slice, is_last, aux_index, state_indices)
        self.transfer_queues[room % len(self.transfer_queues)].put(chunk)

    def _transfer_worker(self, q: queue.Queue) -> None:
        while not self._stop.is_set():
            try:
                chunk = q.get(timeout=0.1)
            except queue.Empty:
                continue
            try:
                self._process_chunk(chunk)
            except Exception as e:  # never let one request kill the worker
                logger.exception("KV transfer of room %s failed", chunk.room)
                self._close_room(chunk.room, f"KV transfer of request {chunk.room} failed: {e}", notify=True)

    def _transfer_data(self, reg: KVArgsRegisterInfo, srcs: List[int], dsts: List[int], lens: List[int]) -> int:
        """Writes the blocks into the decode rank `reg` registered (the addresses come from the same
        registration): by the same-host copy where that rank proved to be on this host, else Mooncake."""
        if self.same_host_writer.write(reg.mooncake_session_id, reg.same_host_peer, srcs, dsts, lens):
            return 0
        return self._mooncake_transfer(reg.mooncake_session_id, srcs, dsts, lens)

    def _mooncake_transfer(self, session_id: str, srcs: List[int], dsts: List[int], lens: List[int]) -> int:
        """One batch_transfer_sync_write per chunk, split only past the engine's batch limit
        (Mooncake refuses batches of a few thousand blocks: fragmented pages at page_size 1).

        A failed batch is retried in halves with a short backoff: Mooncake's TCP transport rejects
        work when its lane queues are full under concurrency ("TCP lane queue-full rejection"),
        which is backpressure, not a dead peer (the writes are idempotent). Retries are bounded in
        number (`SGLANG_DISAGGREGATION_TRANSFER_RETRIES`) and time (`..._TRANSFER_RETRY_BUDGET_S`):
        a peer that refuses the write itself fails within that budget. A refused call itself can
        take 1-2 s (Mooncake's own retries), so no attempt starts unless twice the slowest refusal
        so far still fits in the budget: the decode side, waiting
        `SGLANG_DISAGGREGATION_WAITING_TIMEOUT`, hears of the failure before it gives up on its own."""
        n = self.max_transfer_blocks
        work = [(srcs[i : i + n], dsts[i : i + n], lens[i : i + n]) for i in range(0, len(srcs), n)]
        failures, slowest, deadline = 0, 0.0, time.monotonic() + self.transfer_retry_budget_s
        while work:
            s, d, l = work.pop(0)
            started = time.monotonic()
            ret = self.engine.batch_transfer_sync(session_id, s, d, l)
            if ret >= 0:
                continue
            failures += 1
            now = time.monotonic()
            slowest = max(slowest, now - started)
            if failures > self.transfer_retries or now + 2 * slowest >= deadline:
                return ret
            time.sleep(min(0.005 * (2 ** failures), 0.25))
            h = len(s) // 2
            work[0:0] = [(s[:h], d[:h], l[:h]), (s[h:], d[h:], l[h:])] if h else [(s, d, l)]
        return 0

    def _process_chunk(self, chunk: TransferKVChunk) -> None:
        room = chunk.room
        if self.check_status(room) == KVPoll.Failed or room in self.closed_rooms:
            return
        infos = self.transfer_infos.get(room)
        if not infos:
            self._close_room(room, f"No decode destination is known for request {room}", notify=False)
            return
        t0 = time.perf_counter()
        total_bytes = 0
        for info in list(infos.values()):
            if info.is_dummy:
                continue
            reg = self.decode_kv_args_table.get(info.mooncake_session_id)
            if reg is None:
                raise RuntimeError(f"Decode instance {info.mooncake_session_id} {UNREGISTERED_MARKER}")
            srcs, dsts, lens = build_chunk_blocks(self.kv_args, reg, info, chunk)
            if not srcs:
                continue
            ret = self._transfer_data(reg, srcs, dsts, lens)
            if ret < 0:
                logger.error("KV transfer of request %s to %s:%s failed (ret=%s) after its retries", room,
                             info.endpoint, info.dst_port, ret)
                self._close_room(
                    room,
                    f"Failed to send KV chunk of request {room} to {info.endpoint}:{info.dst_port} "
                    f"(session {info.mooncake_session_id}): batch_transfer_sync_write returned {ret}",
                    notify=True,
                )
                return
            total_bytes += int(sum(lens))
        m = self.transfer_metrics.setdefault(room, KVTransferMetric(transfer_latency_s=0.0))
        m.transfer_latency_s = (m.transfer_latency_s or 0.0) + time.perf_counter() - t0
        m.transfer_total_bytes += total_bytes
        if chunk.is_last:
            for info in list(infos.values()):
                self._push(info.endpoint, info.dst_port, build_status_message(room, KVPoll.Success, self.kv_args.engine_rank))
            self.update_status(room, KVPoll.Success)
            self.transfer_infos.pop(room, None)

