"""Decode half of `MooncakeKVManager`: resolves prefill ranks through the bootstrap server on a
background thread (retrying until SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT), registers this rank's
buffers once per prefill peer, receives status frames, and polls each prefill's `/health`
(SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL x ..._MAX_FAILURE) to fail rooms of a dead prefill."""

from __future__ import annotations

import queue
import time
from typing import TYPE_CHECKING, Dict, List, Optional, Set

import requests
import zmq

from sglang.srt.disaggregation import pd_auth
from sglang.srt.disaggregation.mooncake.common import UNREGISTERED_MARKER, logger
from sglang.srt.disaggregation.mooncake import same_host
from sglang.srt.disaggregation.mooncake.messages import KVArgsRegisterInfo, parse_kv_status_message
from sglang.srt.disaggregation.utils import KVPoll

if TYPE_CHECKING:
    from sglang.srt.disaggregation.base import BaseKVReceiver as MooncakeKVReceiver  # the mixin never names conn.py


class _BootstrapHTTPError(Exception):
    def __init__(self, status: int, text: str):
        super().__init__(f"HTTP {status}: {text}")
        self.status = status


class _FatalBootstrapError(Exception):
    pass



class DecodeManagerMixin:
    def _init_decode(self) -> None:
        self.prefill_info_cache: Dict[str, dict] = {}
        self.connection_pool: Dict[tuple, List[dict]] = {}
        self.connection_queries: Dict[tuple, str] = {}  # /route query of each pooled connection (heartbeat re-checks it)
        self.room_peers: Dict[int, List[str]] = {}
        self.registered_peers: Set[str] = set()
        self.addr_to_rooms: Dict[str, Set[int]] = {}
        self.heartbeat_failures: Dict[str, int] = {}
        self.required_prefill_responses: Dict[int, int] = {}
        self.prefill_responses: Dict[int, Set[int]] = {}
        self.bootstrap_requests: queue.Queue = queue.Queue()
        self.host_identity = same_host.HostIdentity(self.registered_regions) if same_host.enabled() else None
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
            dst_attn_tp_size=max(int(self.server_args.tp_size), 1),
            dst_kv_item_len=a.kv_item_lens[0] if a.kv_item_lens else 0,
            dst_state_item_lens=[list(x) for x in a.state_item_lens],
            dst_state_dim_per_tensor=[list(x) for x in a.state_dim_per_tensor],
            dst_kv_layer_ids=list(a.kv_layer_ids),
            dst_state_layer_ids=[list(x) for x in a.state_layer_ids],
            dst_kv_item_lens=list(a.kv_item_lens),
            same_host=self.host_identity.frame() if self.host_identity is not None else b"",
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
            msg = self._open_frames(msg)
            if msg is None:
                continue
            parsed = parse_kv_status_message(msg)
            if parsed is None:
                self.refusals.warning("malformed", "Dropping malformed KV status message (%d frames)", len(msg))
                continue
            room, status, rank, reason = parsed
            if room not in self.request_status:
                continue
            if status == KVPoll.Failed:
                if reason and UNREGISTERED_MARKER in reason:
                    # the prefill lost our registration (it restarted): register again next time
                    for peer in self.room_peers.get(room, ()):
                        self.registered_peers.discard(peer)
                self.fail(room, reason or f"Failed to get KV cache of request {room} from prefill rank {rank}")
            elif status == KVPoll.Success:
                got = self.prefill_responses.setdefault(room, set())
                got.add(rank)
                if len(got) >= self.required_prefill_responses.get(room, 1):
                    self.update_status(room, KVPoll.Success)
            else:
                self.update_status(room, status)

    def _fetch_json(self, url: str, timeout: float) -> dict:
        r = requests.get(url, timeout=timeout, allow_redirects=False)
        if r.status_code != 200:
            raise _BootstrapHTTPError(r.status_code, r.text)
        if self.secret is not None:
            # Only a bootstrap server holding the deployment secret may tell us where to send our
            # registration (buffer addresses) and metadata.
            what = "GET /" + url.split("/", 3)[3]  # http://host:port/route?... -> GET /route?...
            if not pd_auth.verify_http(self.secret, what, r.content, r.headers.get(pd_auth.SIGNATURE_HEADER)):
                raise _FatalBootstrapError(f"the bootstrap server at {url.split('/')[2]} did not sign its answer "
                                           f"with the deployment secret ({pd_auth.SECRET_ENV})")
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
            layout = info.get("kv_layout")
            if layout is not None and self.kv_args.kv_layout is not None and layout != self.kv_args.kv_layout:
                # pages of one layout copied into the other would be garbage, not an error
                raise _FatalBootstrapError(f"Prefill KV layout {layout} does not match decode KV layout "
                                           f"{self.kv_args.kv_layout}; serve the same model and --kv-cache-dtype on both")
            decode_tp = max(int(self.server_args.tp_size), 1)
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
            self.connection_queries[key] = q
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
            pass_errors: Dict[str, Exception] = {}  # one failed try per address per pass, not per request
            for rcv in pending:
                concluded = rcv.conclude_state is not None or self.check_status(rcv.bootstrap_room) == KVPoll.Failed
                if concluded and rcv.abort_pending is None:
                    continue
                now = time.monotonic()
                if now < rcv.next_bootstrap_try:
                    still.append(rcv)
                    continue
                remaining = rcv.bootstrap_deadline - now
                try:
                    if rcv.bootstrap_addr in pass_errors:
                        raise pass_errors[rcv.bootstrap_addr]
                    ranks = self._resolve(rcv, timeout=max(0.1, min(2.0, remaining)))
                except _FatalBootstrapError as e:
                    self.fail(rcv.bootstrap_room, f"Bootstrap with prefill {rcv.bootstrap_addr} failed: {e}")
                    continue
                except Exception as e:
                    pass_errors[rcv.bootstrap_addr] = e
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
                try:
                    rcv._on_bootstrapped(ranks)
                except Exception as e:
                    self.fail(rcv.bootstrap_room, f"Sending metadata of request {rcv.bootstrap_room} to prefill failed: {e}")
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
                    self._check_rank_endpoints(addr)
                    continue
                self.heartbeat_failures[addr] = self.heartbeat_failures.get(addr, 0) + 1
                if self.heartbeat_failures[addr] >= self.heartbeat_max_failure:
                    try:
                        self._handle_node_failure(addr)
                    except Exception:  # the heartbeat must outlive any one failure
                        logger.exception("Handling the loss of prefill %s failed", addr)

    def _check_rank_endpoints(self, addr: str) -> None:
        """A prefill that restarted behind a live bootstrap server registers a new rank endpoint;
        requests sent to the old one would wait for the full waiting timeout, so fail them now."""
        for key in [k for k in list(self.connection_pool) if k[0] == addr]:
            q = self.connection_queries.get(key)
            old = self.connection_pool.get(key)
            if q is None or not old:
                continue
            try:
                fresh = self._fetch_json(f"http://{addr}/route?{q}", timeout=max(0.2, min(2.0, self.heartbeat_interval)))
            except Exception:
                continue  # not (yet) re-registered: /health failures handle a dead server
            if (str(fresh.get("rank_ip")), int(fresh.get("rank_port", -1))) != (str(old[0]["rank_ip"]), int(old[0]["rank_port"])):
                self._handle_node_failure(
                    addr,
                    f"Prefill instance behind bootstrap_addr {addr} restarted (rank endpoint "
                    f"{old[0]['rank_ip']}:{old[0]['rank_port']} -> {fresh.get('rank_ip')}:{fresh.get('rank_port')})",
                )
                return

    def _handle_node_failure(self, addr: str, reason: Optional[str] = None) -> None:
        self.prefill_info_cache.pop(addr, None)
        self.heartbeat_failures.pop(addr, None)
        # list(...) snapshots in C: other threads add rooms / connections while we walk them
        for key in [k for k in list(self.connection_pool) if k[0] == addr]:
            self.connection_queries.pop(key, None)
            for r in self.connection_pool.pop(key, []):
                self.registered_peers.discard(f"{r['rank_ip']}:{r['rank_port']}")
        rooms = list(self.addr_to_rooms.get(addr, ()))
        affected = [r for r in rooms if self.check_status(r) not in (KVPoll.Success, KVPoll.Failed, None)]
        for room in affected:
            self.fail(room, reason or f"Losing connection with prefill instance (bootstrap_addr: {addr}), affected {len(affected)} requests")
        logger.error("Lost connection with prefill instance (bootstrap_addr: %s), affected %d requests", addr, len(affected))


