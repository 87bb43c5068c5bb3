"""Mooncake KV transfer: manager, sender (prefill) and receiver (decode); reference 5.6-5.8.

API for the scheduler (see also `disaggregation/base.py`):

    mgr = MooncakeKVManager(kv_args, DisaggregationMode.PREFILL | DECODE, server_args)
    # prefill: registers with the bootstrap server at
    #          f"{server_args.host}:{server_args.disaggregation_bootstrap_port}" (PUT /route)
    sender = MooncakeKVSender(mgr, bootstrap_addr, room); sender.poll(); sender.init(num_pages, aux_index)
    sender.send(np.int32 pages, state_indices=None, is_last=None)   # per chunk; worker thread transfers
    receiver = MooncakeKVReceiver(mgr, bootstrap_addr, room); receiver.init(prefill_dp_rank=0)
    receiver.send_metadata(np.int32 pages, aux_index, state_indices=None); receiver.poll()
    mgr.close()

Data path: for each chunk the prefill worker groups (src page, dst page) pairs into contiguous runs
and writes every layer's K and V run (plus, for the last chunk, the metadata row and the state
slots) with ONE `batch_transfer_sync_write`. Control path: ZMQ PUSH -> PULL frames of messages.py.

Timeouts (read from the environment when the manager is built, so tests can shrink them):
`SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT` (prefill: decode metadata never came; decode: bootstrap
server unreachable / not registered), `SGLANG_DISAGGREGATION_WAITING_TIMEOUT` (decode: no done signal
after send_metadata), `SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL` / `..._HEARTBEAT_MAX_FAILURE` (decode:
prefill bootstrap `/health` unreachable -> its in-flight rooms fail).
"""

from __future__ import annotations

import logging
import os
import queue
import random
import threading
import time
from typing import Dict, List, Optional, Set

import numpy as np
import requests
import zmq

from sglang.srt.disaggregation.base import (
    BaseKVManager,
    BaseKVReceiver,
    BaseKVSender,
    KVArgs,
    KVTransferError,
    KVTransferMetric,
)
from sglang.srt.disaggregation.bootstrap_server import KVBootstrapServer
from sglang.srt.disaggregation.mooncake.blocks import build_chunk_blocks
from sglang.srt.disaggregation.mooncake.messages import (
    ABORT_TAG,
    REGISTRATION_ROOM,
    KVArgsRegisterInfo,
    TransferInfo,
    build_abort_message,
    build_status_message,
    parse_abort_message,
    parse_kv_status_message,
)
from sglang.srt.disaggregation.mooncake.transfer_engine import MooncakeTransferEngine
from sglang.srt.disaggregation.utils import DisaggregationMode, KVPoll

logger = logging.getLogger(__name__)

ABORT_REASON = "Aborted by AbortReq."
_MAX_CLOSED_ROOMS = 65536


def _env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def _connect_host(host: Optional[str]) -> str:
    if os.environ.get("SGLANG_HOST_IP"):
        return os.environ["SGLANG_HOST_IP"]
    if host in (None, "", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def _warn_once(key: str, msg: str, _seen: Set[str] = set()) -> None:  # noqa: B006 - process-wide memo
    if key not in _seen:
        _seen.add(key)
        logger.warning(msg)


class TransferKVChunk:
    __slots__ = ("room", "prefill_kv_indices", "index_slice", "is_last", "prefill_aux_index", "state_indices")

    def __init__(self, room, prefill_kv_indices, index_slice, is_last, prefill_aux_index, state_indices):
        self.room = room
        self.prefill_kv_indices = prefill_kv_indices
        self.index_slice = index_slice
        self.is_last = is_last
        self.prefill_aux_index = prefill_aux_index
        self.state_indices = state_indices


class MooncakeKVManager(BaseKVManager):
    def __init__(self, args: KVArgs, disaggregation_mode: DisaggregationMode, server_args=None, is_mla_backend: bool = False):
        self.kv_args = args
        self.disaggregation_mode = disaggregation_mode
        self.server_args = server_args
        self.is_mla_backend = is_mla_backend
        self.local_ip = _connect_host(getattr(server_args, "host", None))
        force_tcp = getattr(server_args, "disaggregation_transfer_backend", None) == "mooncake_tcp"
        self.engine = MooncakeTransferEngine(self.local_ip, args.gpu_id, args.ib_device, force_tcp=force_tcp)
        self.session_id = self.engine.get_session_id()
        self._registered_ptrs: List[int] = []
        self._register_buffers()

        self.bootstrap_timeout = _env_float("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", 300)
        self.waiting_timeout = _env_float("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", 300)
        self.heartbeat_interval = max(_env_float("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", 5.0), 0.05)
        self.heartbeat_max_failure = max(int(_env_float("SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", 2)), 1)

        self.request_status: Dict[int, int] = {}
        self.failure_records: Dict[int, str] = {}
        self.status_lock = threading.Lock()
        self.transfer_metrics: Dict[int, KVTransferMetric] = {}

        self.context = zmq.Context()
        self.server_socket = self.context.socket(zmq.PULL)
        self.server_socket.setsockopt(zmq.LINGER, 0)
        self.rank_port = self.server_socket.bind_to_random_port(f"tcp://{self._zmq_host(self.local_ip)}")
        self._push_sockets: Dict[str, zmq.Socket] = {}
        self._push_lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: List[threading.Thread] = []

        if disaggregation_mode == DisaggregationMode.PREFILL:
            self._init_prefill()
        elif disaggregation_mode == DisaggregationMode.DECODE:
            self._init_decode()
        else:
            raise ValueError(f"Unsupported DisaggregationMode: {disaggregation_mode}")

    # ------------------------------------------------------------------ common
    @staticmethod
    def _zmq_host(host: str) -> str:
        return f"[{host}]" if ":" in host and not host.startswith("[") else host

    def _register_buffers(self) -> None:
        a = self.kv_args
        regions = list(zip(a.kv_data_ptrs, a.kv_data_lens)) + list(zip(a.aux_data_ptrs, a.aux_data_lens))
        for ptrs, lens in zip(a.state_data_ptrs, a.state_data_lens):
            regions += list(zip(ptrs, lens))
        for ptr, length in regions:
            self.engine.register(ptr, length)
            self._registered_ptrs.append(ptr)

    def _start_thread(self, target, name: str) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _push(self, ip: str, port: int, frames: List[bytes]) -> bool:
        endpoint = f"tcp://{self._zmq_host(ip)}:{port}"
        with self._push_lock:
            sock = self._push_sockets.get(endpoint)
            if sock is None:
                sock = self.context.socket(zmq.PUSH)
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.SNDTIMEO, 1000)
                sock.connect(endpoint)
                self._push_sockets[endpoint] = sock
            try:
                sock.send_multipart(frames)
                return True
            except zmq.ZMQError as e:
                logger.warning("Failed to send control message to %s: %s", endpoint, e)
                return False

    def update_status(self, room: int, status: int) -> None:
        with self.status_lock:
            cur = self.request_status.get(room)
            if cur is None:
                self.request_status[room] = status
            elif cur == KVPoll.Failed:
                pass  # Failed is final
            elif status == KVPoll.Failed:
                self.request_status[room] = KVPoll.Failed
            else:
                self.request_status[room] = max(cur, status)

    def check_status(self, room: int) -> Optional[int]:
        return self.request_status.get(room)

    def record_failure(self, room: int, reason: str) -> None:
        with self.status_lock:
            self.failure_records.setdefault(room, reason)

    def fail(self, room: int, reason: str) -> None:
        self.record_failure(room, reason)
        self.update_status(room, KVPoll.Failed)

    def get_failure_reason(self, room: int) -> str:
        return self.failure_records.get(room, "Failed due to an unknown reason from another rank")

    def clear_room(self, room: int) -> None:
        with self.status_lock:
            self.request_status.pop(room, None)
            self.failure_records.pop(room, None)
            self.transfer_metrics.pop(room, None)

    def close(self) -> None:
        """Stop threads, close sockets, deregister memory. Safe to call twice."""
        if self._stop.is_set():
            return
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        with self._push_lock:
            for sock in self._push_sockets.values():
                sock.close(linger=0)
            self._push_sockets.clear()
        self.server_socket.close(linger=0)
        self.context.term()
        self.engine.batch_deregister(self._registered_ptrs)
        self._registered_ptrs = []
        self.engine.close()

    # ------------------------------------------------------------------ prefill side
    def _init_prefill(self) -> None:
        self.transfer_infos: Dict[int, Dict[str, TransferInfo]] = {}
        self.decode_kv_args_table: Dict[str, KVArgsRegisterInfo] = {}
        self.closed_rooms: Dict[int, str] = {}  # aborted / failed rooms: late metadata is answered with Failed
        n = max(int(_env_float("SGLANG_DISAGGREGATION_QUEUE_SIZE", 4)), 1)
        self.transfer_queues: List[queue.Queue] = [queue.Queue() for _ in range(n)]
        self._start_thread(self._prefill_bootstrap_thread, "kv-prefill-bootstrap")
        for i, q in enumerate(self.transfer_queues):
            self._start_thread(lambda q=q: self._transfer_worker(q), f"kv-transfer-worker-{i}")
        self.register_to_bootstrap()

    def _bootstrap_endpoint(self) -> str:
        sa = self.server_args
        host = getattr(sa, "host", None)
        dist_init_addr = getattr(sa, "dist_init_addr", None)
        if dist_init_addr and getattr(sa, "nnodes", 1) > 1:
            host = dist_init_addr.rsplit(":", 1)[0]
        host = _connect_host(host) if not os.environ.get("SGLANG_HOST_IP") else os.environ["SGLANG_HOST_IP"]
        port = getattr(sa, "disaggregation_bootstrap_port", 8998)
        return f"{self._zmq_host(host)}:{port}"

    def register_to_bootstrap(self) -> None:
        sa = self.server_args
        tp_size = int(getattr(sa, "tp_size", 1) or 1)
        dp_size = int(getattr(sa, "dp_size", 1) or 1)
        payload = {
            "attn_tp_size": tp_size,
            "attn_tp_rank": self.kv_args.engine_rank % tp_size,
            "attn_cp_size": 1,
            "attn_cp_rank": 0,
            "attn_dp_size": 1,
            "attn_dp_rank": 0,
            "pp_size": int(getattr(sa, "pp_size", 1) or 1),
            "pp_rank": self.kv_args.pp_rank,
            "system_dp_size": dp_size,
            "system_dp_rank": self.kv_args.system_dp_rank,
            "rank_ip": self.local_ip,
            "rank_port": self.rank_port,
            "page_size": self.kv_args.page_size,
            "kv_cache_dtype": self.kv_args.kv_cache_dtype_str,
            "kv_layout": self.kv_args.kv_layout,
            "load_balance_method": getattr(sa, "load_balance_method", "follow_bootstrap_room"),
            "decode_allocation_policy": getattr(sa, "disaggregation_decode_allocation_policy", None),
            "prefill_http_port": getattr(sa, "port", None),
        }
        url = f"http://{self._bootstrap_endpoint()}/route"
        attempts = 5
        for attempt in range(attempts):
            try:
                r = requests.put(url, json=payload, timeout=5)
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
                msg = self.server_socket.recv_multipart(zmq.NOBLOCK)
                if msg[0] == REGISTRATION_ROOM:
                    info = KVArgsRegisterInfo.from_zmq(msg)
                    self.decode_kv_args_table[info.mooncake_session_id] = info
                elif msg[0] == ABORT_TAG:
                    room, session_id, reason = parse_abort_message(msg)
                    self._close_room(room, f"Request {room} was aborted by the decode instance ({reason})", notify=False)
                else:
                    self._on_transfer_info(TransferInfo.from_zmq(msg))
            except zmq.Again:
                continue
            except zmq.ZMQError:
                if self._stop.is_set():
                    return
                raise
            except Exception:  # a malformed peer message must not kill the control thread
                logger.exception("Dropping malformed KV control message")

    def _on_transfer_info(self, info: TransferInfo) -> None:
        room = info.room
        if room in self.closed_rooms:
            self._push(info.endpoint, info.dst_port, build_status_message(room, KVPoll.Failed, self.kv_args.engine_rank, self.closed_rooms[room]))
            return
        infos = self.transfer_infos.setdefault(room, {})
        infos[info.mooncake_session_id] = info
        if len(infos) >= info.required_dst_info_num:
            self.update_status(room, KVPoll.WaitingForInput)

    def _close_room(self, room: int, reason: str, notify: bool) -> None:
        """Fail a room on prefill; tell its decode destinations when `notify`."""
        self.closed_rooms[room] = reason
        while len(self.closed_rooms) > _MAX_CLOSED_ROOMS:  # insertion ordered: forget the oldest
            self.closed_rooms.pop(next(iter(self.closed_rooms)))
        self.fail(room, reason)
        infos = self.transfer_infos.pop(room, {})
        if notify:
            for info in infos.values():
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
                raise RuntimeError(f"Decode instance {info.mooncake_session_id} has not registered its KV buffers")
            srcs, dsts, lens = build_chunk_blocks(self.kv_args, reg, info, chunk)
            if not srcs:
                continue
            ret = self.engine.batch_transfer_sync(info.mooncake_session_id, srcs, dsts, lens)
            if ret < 0:
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
            for info in infos.values():
                self._push(info.endpoint, info.dst_port, build_status_message(room, KVPoll.Success, self.kv_args.engine_rank))
            self.update_status(room, KVPoll.Success)
            self.transfer_infos.pop(room, None)

    # ------------------------------------------------------------------ decode side
    def _init_decode(self) -> None:
        self.prefill_info_cache: Dict[str, dict] = {}
        self.connection_pool: Dict[tuple, List[dict]] = {}
        self.registered_peers: Set[str] = set()
        self.addr_to_rooms: Dict[str, Set[int]] = {}
        self.heartbeat_failures: Dict[str, int] = {}
        self.required_prefill_responses: Dict[int, int] = {}
        self.prefill_responses: Dict[int, Set[int]] = {}
        self.bootstrap_requests: queue.Queue = queue.Queue()
        self._start_thread(self._decode_status_thread, "kv-decode-status")
        self._start_thread(self._decode_bootstrap_thread, "kv-decode-bootstrap")
        self._start_thread(self._heartbeat_thread, "kv-decode-heartbeat")

    def registration_message(self) -> List[bytes]:
        a = self.kv_args
        return KVArgsRegisterInfo(
            endpoint=self.local_ip,
            dst_port=self.rank_port,
            mooncake_session_id=self.session_id,
            dst_kv_ptrs=list(a.kv_data_ptrs),
            dst_aux_ptrs=list(a.aux_data_ptrs),
            dst_state_data_ptrs=[list(p) for p in a.state_data_ptrs],
            dst_tp_rank=a.engine_rank,
            dst_attn_tp_size=int(getattr(self.server_args, "tp_size", 1) or 1),
            dst_kv_item_len=a.kv_item_lens[0] if a.kv_item_lens else 0,
            dst_state_item_lens=[list(x) for x in a.state_item_lens],
            dst_state_dim_per_tensor=[list(x) for x in a.state_dim_per_tensor],
            dst_kv_layer_ids=list(a.kv_layer_ids),
            dst_state_layer_ids=[list(x) for x in a.state_layer_ids],
            dst_kv_item_lens=list(a.kv_item_lens),
        ).to_zmq()

    def _decode_status_thread(self) -> None:
        poller = zmq.Poller()
        poller.register(self.server_socket, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            try:
                msg = self.server_socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                continue
            except zmq.ZMQError:
                if self._stop.is_set():
                    return
                raise
            parsed = parse_kv_status_message(msg)
            if parsed is None:
                logger.warning("Dropping malformed KV status message (%d frames)", len(msg))
                continue
            room, status, rank, reason = parsed
            if room not in self.request_status:
                continue
            if status == KVPoll.Failed:
                self.fail(room, reason or f"Failed to get KV cache of request {room} from prefill rank {rank}")
            elif status == KVPoll.Success:
                got = self.prefill_responses.setdefault(room, set())
                got.add(rank)
                if len(got) >= self.required_prefill_responses.get(room, 1):
                    self.update_status(room, KVPoll.Success)
            else:
                self.update_status(room, status)

    def _fetch_json(self, url: str, timeout: float) -> dict:
        r = requests.get(url, timeout=timeout)
        if r.status_code != 200:
            raise _BootstrapHTTPError(r.status_code, r.text)
        return r.json()

    def _resolve(self, receiver: "MooncakeKVReceiver", timeout: float) -> List[dict]:
        """Prefill rank endpoints for the receiver; registers our buffers with new peers."""
        addr = receiver.bootstrap_addr
        info = self.prefill_info_cache.get(addr)
        if info is None:
            info = self._fetch_json(f"http://{addr}/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1", timeout)
            page_size = info.get("page_size")
            if page_size is not None and int(page_size) != self.kv_args.page_size:
                raise _FatalBootstrapError(f"Prefill page_size {page_size} does not match decode page_size {self.kv_args.page_size}")
            decode_tp = int(getattr(self.server_args, "tp_size", 1) or 1)
            if int(info.get("attn_tp_size", 1)) != decode_tp or int(info.get("pp_size", 1)) != 1 or int(info.get("attn_cp_size", 1)) != 1:
                raise _FatalBootstrapError(
                    f"Unsupported prefill layout (attn_tp_size={info.get('attn_tp_size')}, pp_size={info.get('pp_size')}, "
                    f"attn_cp_size={info.get('attn_cp_size')}) for decode tp_size={decode_tp}"
                )
            self.prefill_info_cache[addr] = info
        dp_rank = receiver.prefill_dp_rank
        if dp_rank is None:
            dp_rank = receiver.bootstrap_room % max(int(info.get("dp_size", 1)), 1) if info.get("follow_bootstrap_room", True) else 0
        key = (addr, dp_rank)
        ranks = self.connection_pool.get(key)
        if ranks is None:
            tp_rank = self.kv_args.engine_rank % int(info.get("attn_tp_size", 1))
            q = f"prefill_dp_rank={dp_rank}&prefill_cp_rank=0&target_tp_rank={tp_rank}&target_pp_rank=0"
            ranks = [self._fetch_json(f"http://{addr}/route?{q}", timeout)]
            self.connection_pool[key] = ranks
        for r in ranks:
            peer = f"{r['rank_ip']}:{r['rank_port']}"
            if peer not in self.registered_peers:
                self._push(r["rank_ip"], int(r["rank_port"]), self.registration_message())
                self.registered_peers.add(peer)
        return ranks

    def _decode_bootstrap_thread(self) -> None:
        pending: List["MooncakeKVReceiver"] = []
        while not self._stop.is_set():
            try:
                pending.append(self.bootstrap_requests.get(timeout=0.05 if pending else 0.2))
                while True:
                    pending.append(self.bootstrap_requests.get_nowait())
            except queue.Empty:
                pass
            still: List["MooncakeKVReceiver"] = []
            for rcv in pending:
                if rcv.conclude_state is not None or self.check_status(rcv.bootstrap_room) == KVPoll.Failed:
                    continue
                now = time.monotonic()
                if now < rcv.next_bootstrap_try:
                    still.append(rcv)
                    continue
                remaining = rcv.bootstrap_deadline - now
                try:
                    ranks = self._resolve(rcv, timeout=max(0.1, min(2.0, remaining)))
                except _FatalBootstrapError as e:
                    self.fail(rcv.bootstrap_room, f"Bootstrap with prefill {rcv.bootstrap_addr} failed: {e}")
                    continue
                except Exception as e:
                    if time.monotonic() >= rcv.bootstrap_deadline:
                        self.fail(
                            rcv.bootstrap_room,
                            f"Request {rcv.bootstrap_room} could not bootstrap with prefill {rcv.bootstrap_addr} "
                            f"within {self.bootstrap_timeout:.1f}s (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT): {e}",
                        )
                    else:
                        rcv.next_bootstrap_try = now + min(0.5, max(0.05, self.bootstrap_timeout / 20))
                        still.append(rcv)
                    continue
                rcv._on_bootstrapped(ranks)
            pending = still

    def _heartbeat_thread(self) -> None:
        while not self._stop.wait(self.heartbeat_interval):
            for addr in list(self.prefill_info_cache.keys()):
                try:
                    ok = requests.get(f"http://{addr}/health", timeout=max(0.2, min(2.0, self.heartbeat_interval))).status_code == 200
                except requests.RequestException:
                    ok = False
                if ok:
                    self.heartbeat_failures[addr] = 0
                    continue
                self.heartbeat_failures[addr] = self.heartbeat_failures.get(addr, 0) + 1
                if self.heartbeat_failures[addr] >= self.heartbeat_max_failure:
                    self._handle_node_failure(addr)

    def _handle_node_failure(self, addr: str) -> None:
        self.prefill_info_cache.pop(addr, None)
        self.heartbeat_failures.pop(addr, None)
        for key in [k for k in self.connection_pool if k[0] == addr]:
            for r in self.connection_pool.pop(key):
                self.registered_peers.discard(f"{r['rank_ip']}:{r['rank_port']}")
        affected = [r for r in self.addr_to_rooms.get(addr, set()) if self.check_status(r) not in (KVPoll.Success, KVPoll.Failed, None)]
        for room in affected:
            self.fail(room, f"Losing connection with prefill instance (bootstrap_addr: {addr}), affected {len(affected)} requests")
        logger.error("Lost connection with prefill instance (bootstrap_addr: %s), affected %d requests", addr, len(affected))


class _BootstrapHTTPError(Exception):
    def __init__(self, status: int, text: str):
        super().__init__(f"HTTP {status}: {text}")
        self.status = status


class _FatalBootstrapError(Exception):
    pass


class MooncakeKVSender(BaseKVSender):
    def __init__(self, mgr: MooncakeKVManager, bootstrap_addr: str, bootstrap_room: int, req_has_disagg_prefill_dp_rank: bool = False):
        self.kv_mgr = mgr
        self.bootstrap_addr = bootstrap_addr
        self.bootstrap_room = bootstrap_room
        self.kv_mgr.update_status(bootstrap_room, KVPoll.Bootstrapping)
        self.init_time = time.monotonic()
        self.num_kv_indices: Optional[int] = None
        self.aux_index: Optional[int] = None
        self.curr_idx = 0
        self.conclude_state: Optional[int] = None
        self._failure: Optional[KVTransferError] = None

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None) -> None:
        self.num_kv_indices = num_kv_indices
        self.aux_index = aux_index

    def send(self, kv_indices: np.ndarray, state_indices=None, is_last: Optional[bool] = None) -> None:
        n = len(kv_indices)
        index_slice = slice(self.curr_idx, self.curr_idx + n)
        self.curr_idx += n
        if is_last is None:
            is_last = self.num_kv_indices is not None and self.curr_idx >= self.num_kv_indices
        if state_indices is not None and len(state_indices) and not isinstance(state_indices[0], (list, tuple, np.ndarray)):
            state_indices = [list(state_indices)]  # one state type given as a flat list
        self.kv_mgr.add_transfer_request(
            self.bootstrap_room,
            kv_indices,
            index_slice,
            is_last,
            aux_index=self.aux_index if is_last else None,
            state_indices=state_indices if is_last else None,
        )

    def poll(self) -> int:
        if self.conclude_state is not None:
            return self.conclude_state
        status = self.kv_mgr.check_status(self.bootstrap_room)
        if status in (KVPoll.Success, KVPoll.Failed):
            self.conclude_state = status
        elif status == KVPoll.Bootstrapping and time.monotonic() - self.init_time >= self.kv_mgr.bootstrap_timeout:
            elapsed = time.monotonic() - self.init_time
            _warn_once(
                "sender-bootstrap",
                "Some requests timed out when bootstrapping, which means prefill instances fail to receive the KV indices "
                "from the decode instance of this request. If a greater mean TTFT is acceptable, you can "
                "'export SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=600' (10 minutes) to relax the timeout condition. ",
            )
            self.kv_mgr.fail(self.bootstrap_room, f"Request {self.bootstrap_room} timed out after {elapsed:.1f}s in KVPoll.Bootstrapping")
            self.conclude_state = KVPoll.Failed
            return KVPoll.Failed
        return status if status is not None else KVPoll.Failed

    def failure_exception(self):
        if self._failure is None:
            self.conclude_state = KVPoll.Failed
            self._failure = KVTransferError(self.bootstrap_room, self.kv_mgr.get_failure_reason(self.bootstrap_room))
            self.clear()
        raise self._failure

    def get_transfer_metric(self) -> KVTransferMetric:
        return self.kv_mgr.transfer_metrics.get(self.bootstrap_room, KVTransferMetric())

    def clear(self) -> None:
        self.kv_mgr.clear_room(self.bootstrap_room)
        self.kv_mgr.transfer_infos.pop(self.bootstrap_room, None)

    def abort(self) -> None:
        self.kv_mgr.record_failure(self.bootstrap_room, ABORT_REASON)
        self.kv_mgr._close_room(self.bootstrap_room, f"Request {self.bootstrap_room} was aborted on the prefill instance", notify=True)
        self.conclude_state = KVPoll.Failed


class MooncakeKVReceiver(BaseKVReceiver):
    def __init__(self, mgr: MooncakeKVManager, bootstrap_addr: str, bootstrap_room: Optional[int] = None, prefill_dp_rank: Optional[int] = None):
        self.kv_mgr = mgr
        self.bootstrap_addr = bootstrap_addr
        self.bootstrap_room = bootstrap_room
        self.prefill_dp_rank = prefill_dp_rank
        self.conclude_state: Optional[int] = None
        self._failure: Optional[KVTransferError] = None
        self._lock = threading.Lock()
        self.bootstrap_infos: Optional[List[dict]] = None
        self._pending_metadata: Optional[List[bytes]] = None
        self.metadata_time: Optional[float] = None
        self.bootstrap_deadline = float("inf")
        self.next_bootstrap_try = 0.0
        mgr.update_status(bootstrap_room, KVPoll.Bootstrapping)
        mgr.addr_to_rooms.setdefault(bootstrap_addr, set()).add(bootstrap_room)

    def init(self, prefill_dp_rank: Optional[int] = 0) -> None:
        """Queue bootstrap resolution (GET /route, registration) on the manager's thread; never blocks."""
        if prefill_dp_rank is not None:
            self.prefill_dp_rank = prefill_dp_rank
        self.bootstrap_deadline = time.monotonic() + self.kv_mgr.bootstrap_timeout
        self.kv_mgr.bootstrap_requests.put(self)

    def _on_bootstrapped(self, ranks: List[dict]) -> None:
        with self._lock:
            self.bootstrap_infos = ranks
            self.kv_mgr.required_prefill_responses[self.bootstrap_room] = len(ranks)
            self.kv_mgr.update_status(self.bootstrap_room, KVPoll.WaitingForInput)
            if self._pending_metadata is not None:
                self._send_to_prefill(self._pending_metadata)
                self._pending_metadata = None

    def _send_to_prefill(self, frames: List[bytes]) -> None:
        for r in self.bootstrap_infos or []:
            self.kv_mgr._push(r["rank_ip"], int(r["rank_port"]), frames)

    def send_metadata(self, kv_indices: np.ndarray, aux_index: Optional[int] = None, state_indices=None, decode_prefix_len=None) -> None:
        if state_indices is not None and len(state_indices) and not isinstance(state_indices[0], (list, tuple, np.ndarray)):
            state_indices = [list(state_indices)]
        frames = TransferInfo(
            room=self.bootstrap_room,
            endpoint=self.kv_mgr.local_ip,
            dst_port=self.kv_mgr.rank_port,
            mooncake_session_id=self.kv_mgr.session_id,
            dst_kv_indices=np.asarray(kv_indices, dtype=np.int32),
            dst_aux_index=aux_index,
            dst_state_indices=[[int(i) for i in s] for s in (state_indices or [])],
            required_dst_info_num=1,
            decode_prefix_len=decode_prefix_len or 0,
        ).to_zmq()
        with self._lock:
            self.metadata_time = time.monotonic()
            self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Transferring)
            if self.bootstrap_infos is None:
                self._pending_metadata = frames
            else:
                self._send_to_prefill(frames)

    def poll(self) -> int:
        if self.conclude_state is not None:
            return self.conclude_state
        status = self.kv_mgr.check_status(self.bootstrap_room)
        if status in (KVPoll.Success, KVPoll.Failed):
            self.conclude_state = status
        elif status == KVPoll.Transferring and self.metadata_time is not None:
            elapsed = time.monotonic() - self.metadata_time
            if elapsed >= self.kv_mgr.waiting_timeout:
                _warn_once(
                    "receiver-waiting",
                    "Some requests fail to receive KV Cache transfer done signal after bootstrapping. If a greater mean TTFT "
                    "is acceptable, you can 'export SGLANG_DISAGGREGATION_WAITING_TIMEOUT=600' (10 minutes) to relax the "
                    "timeout condition. ",
                )
                self.kv_mgr.fail(self.bootstrap_room, f"Request {self.bootstrap_room} timed out after {elapsed:.1f}s in KVPoll.WaitingForInput")
                self.conclude_state = KVPoll.Failed
                return KVPoll.Failed
        return status if status is not None else KVPoll.Failed

    def failure_exception(self):
        if self._failure is None:
            self.conclude_state = KVPoll.Failed
            self._failure = KVTransferError(self.bootstrap_room, self.kv_mgr.get_failure_reason(self.bootstrap_room))
            self.clear()
        raise self._failure

    def clear(self) -> None:
        self.kv_mgr.clear_room(self.bootstrap_room)
        self.kv_mgr.required_prefill_responses.pop(self.bootstrap_room, None)
        self.kv_mgr.prefill_responses.pop(self.bootstrap_room, None)
        rooms = self.kv_mgr.addr_to_rooms.get(self.bootstrap_addr)
        if rooms is not None:
            rooms.discard(self.bootstrap_room)

    def abort(self) -> None:
        self.kv_mgr.fail(self.bootstrap_room, ABORT_REASON)
        self.conclude_state = KVPoll.Failed
        with self._lock:
            self._pending_metadata = None
            self._send_to_prefill(build_abort_message(self.bootstrap_room, self.kv_mgr.session_id, ABORT_REASON))


class MooncakeKVBootstrapServer(KVBootstrapServer):
    pass
