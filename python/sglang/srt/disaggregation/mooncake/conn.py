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
slots) with ONE `batch_transfer_sync_write` (split only past SGLANG_DISAGGREGATION_MAX_TRANSFER_BLOCKS,
default 2048: Mooncake refuses larger batches). Control path: ZMQ PUSH -> PULL frames of messages.py.
Mooncake over TCP costs ~0.1-0.2 ms per block, so fragmented page_size=1 layouts are slow
(benchmark/pd_transfer.py --layout random); contiguous pages run at engine bandwidth.
A decode rank on this host (a process the kernel names, holding the token it announced, `same_host.py`) gets the same blocks
by one `process_vm_writev` instead; anything that fails there goes through Mooncake.

Code layout: `prefill_manager.py` / `decode_manager.py` hold the two halves of the manager,
`blocks.py` the address arithmetic, `messages.py` the frames, `transfer_engine.py` the engine,
`same_host.py` the same-host copy.

Timeouts (read from the environment when the manager is built, so tests can shrink them):
`SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT` (prefill: decode metadata never came; decode: bootstrap
server unreachable / not registered), `SGLANG_DISAGGREGATION_WAITING_TIMEOUT` (decode: no done signal
after send_metadata), `SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL` / `..._HEARTBEAT_MAX_FAILURE` (decode:
prefill bootstrap `/health` unreachable -> its in-flight rooms fail).
"""

from __future__ import annotations

import threading
import time
from typing import Dict, List, Optional

import numpy as np
import zmq

from sglang.srt.configs.runtime_config import DisaggConfig
from sglang.srt.disaggregation.base import (
    BaseKVManager,
    BaseKVReceiver,
    BaseKVSender,
    KVArgs,
    KVTransferError,
    KVTransferMetric,
)
from sglang.srt.disaggregation import pd_auth
from sglang.srt.disaggregation.bootstrap_server import KVBootstrapServer
from sglang.srt.disaggregation.mooncake.common import ABORT_REASON, connect_host, env_float, logger, warn_once, zmq_host
from sglang.srt.disaggregation.mooncake.decode_manager import DecodeManagerMixin
from sglang.srt.disaggregation.mooncake.messages import TransferInfo, build_abort_message
from sglang.srt.disaggregation.mooncake.prefill_manager import PrefillManagerMixin, TransferKVChunk  # noqa: F401
from sglang.srt.disaggregation.mooncake.transfer_engine import MooncakeTransferEngine
from sglang.srt.disaggregation.utils import DisaggregationMode, KVPoll


class MooncakeKVManager(PrefillManagerMixin, DecodeManagerMixin, BaseKVManager):
    def __init__(self, args: KVArgs, disaggregation_mode: DisaggregationMode, server_args=None, is_mla_backend: bool = False):
        self.kv_args = args
        self.disaggregation_mode = disaggregation_mode
        self.server_args = DisaggConfig.of(server_args)  # the PD settings of the server (a record or the slice)
        self.is_mla_backend = is_mla_backend
        # Control frames carry an HMAC tag when the deployment has a secret (pd_auth.py).
        self.secret = pd_auth.secret_from_env()
        pd_auth.warn_if_unauthenticated(self.secret, "PD KV manager")
        to_peer, to_me = ((pd_auth.TO_DECODE, pd_auth.TO_PREFILL) if disaggregation_mode == DisaggregationMode.PREFILL
                          else (pd_auth.TO_PREFILL, pd_auth.TO_DECODE))
        self.frame_auth = pd_auth.FrameAuth(self.secret, to_peer, to_me)
        self.refusals = pd_auth.RateLimitedLog()
        self.local_ip = connect_host(self.server_args.host)
        force_tcp = self.server_args.disaggregation_transfer_backend == "mooncake_tcp"
        self.engine = MooncakeTransferEngine(self.local_ip, args.gpu_id, args.ib_device, force_tcp=force_tcp)
        self.session_id = self.engine.get_session_id()
        self._registered_ptrs: List[int] = []
        self._register_buffers()

        self.bootstrap_timeout = env_float("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", 300)
        self.waiting_timeout = env_float("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", 300)
        self.heartbeat_interval = max(env_float("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", 5.0), 0.05)
        self.heartbeat_max_failure = max(int(env_float("SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", 2)), 1)

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
        # The port a firewall must keep to the PD peers (it is random): say where it is.
        logger.info("PD KV control frames (%s side) on tcp://%s:%d, %s", disaggregation_mode.name.lower(),
                    self._zmq_host(self.local_ip), self.rank_port,
                    "authenticated" if self.secret is not None else "UNAUTHENTICATED")

        if disaggregation_mode == DisaggregationMode.PREFILL:
            self._init_prefill()
        elif disaggregation_mode == DisaggregationMode.DECODE:
            self._init_decode()
        else:
            raise ValueError(f"Unsupported DisaggregationMode: {disaggregation_mode}")

    # ------------------------------------------------------------------ common
    @staticmethod
    def _zmq_host(host: str) -> str:
        return zmq_host(host)

    def _register_buffers(self) -> None:
        a = self.kv_args
        regions = list(zip(a.kv_data_ptrs, a.kv_data_lens)) + list(zip(a.aux_data_ptrs, a.aux_data_lens))
        for ptrs, lens in zip(a.state_data_ptrs, a.state_data_lens):
            regions += list(zip(ptrs, lens))
        for ptr, length in regions:
            self.engine.register(ptr, length)
            self._registered_ptrs.append(ptr)
        self.registered_regions = regions  # what a same-host prefill may write (same_host.py)

    def _open_frames(self, msg: List[bytes]) -> Optional[List[bytes]]:
        """The control frames without their tag, or None (logged, at most every 10 s) for a frame
        that does not carry the deployment secret's tag: it is dropped, never parsed."""
        body = self.frame_auth.open(msg)
        if body is None:
            self.refusals.warning("frame", "Dropped a KV control message (%d frames) with %s", len(msg),
                                  self.frame_auth.why_refused(msg))
        return body

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
                sock.send_multipart(self.frame_auth.sign(frames))
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
        if getattr(self, "host_identity", None) is not None:
            self.host_identity.close()
        self.context.term()
        self.engine.batch_deregister(self._registered_ptrs)
        self._registered_ptrs = []
        self.engine.close()


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
            warn_once(
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

    def aborted_by_peer(self) -> bool:
        """The decode side aborted this room (its client hung up or asked for it): not an error here."""
        return self.bootstrap_room in self.kv_mgr.peer_aborted_rooms

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
        self.abort_pending: Optional[List[bytes]] = None  # an abort to deliver once bootstrapped
        mgr.update_status(bootstrap_room, KVPoll.Bootstrapping)
        mgr.addr_to_rooms.setdefault(bootstrap_addr, set()).add(bootstrap_room)

    def init(self, prefill_dp_rank: Optional[int] = 0) -> None:
        """Queue bootstrap resolution (GET /route, registration) on the manager's thread; never blocks.

        `prefill_dp_rank=None` derives it from the prefill's server info: `bootstrap_room % dp_size`
        when it follows the bootstrap room (upstream default), else 0."""
        if prefill_dp_rank is not None:
            self.prefill_dp_rank = prefill_dp_rank
        self.bootstrap_deadline = time.monotonic() + self.kv_mgr.bootstrap_timeout
        self.kv_mgr.bootstrap_requests.put(self)

    def _on_bootstrapped(self, ranks: List[dict]) -> None:
        with self._lock:
            self.bootstrap_infos = ranks
            if self.abort_pending is not None:  # aborted before the bootstrap resolved: only say so
                self._send_to_prefill(self.abort_pending)
                self.abort_pending = None
                return
            self.kv_mgr.required_prefill_responses[self.bootstrap_room] = len(ranks)
            self.kv_mgr.room_peers[self.bootstrap_room] = [f"{r['rank_ip']}:{r['rank_port']}" for r in ranks]
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
                warn_once(
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
        self.kv_mgr.room_peers.pop(self.bootstrap_room, None)
        rooms = self.kv_mgr.addr_to_rooms.get(self.bootstrap_addr)
        if rooms is not None:
            rooms.discard(self.bootstrap_room)

    def abort(self) -> None:
        """Tells the prefill to drop this room, also when the bootstrap is still resolving (the
        abort then goes out as soon as the prefill's rank is known), so that the prefill never
        waits for metadata that will not come."""
        self.kv_mgr.fail(self.bootstrap_room, ABORT_REASON)
        self.conclude_state = KVPoll.Failed
        frames = build_abort_message(self.bootstrap_room, self.kv_mgr.session_id, ABORT_REASON)
        with self._lock:
            self._pending_metadata = None
            if self.bootstrap_infos is None:
                self.abort_pending = frames
                if self.bootstrap_deadline == float("inf"):  # never queued: resolve just to deliver it
                    self.init(0)
            else:
                self._send_to_prefill(frames)


class MooncakeKVBootstrapServer(KVBootstrapServer):
    pass
