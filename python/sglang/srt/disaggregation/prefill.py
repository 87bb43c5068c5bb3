"""(Scheduler process.) The prefill role of PD disaggregation (reference 5.5).

A request on a prefill server goes through:
  bootstrap queue -- its KV sender waits for the decode server's slots (KVPoll.WaitingForInput)
  waiting/running -- normal (chunked) prefill with max_new_tokens = 1; after every chunk the
                     finished whole pages are sent, the last chunk sends the rest plus the
                     metadata row (first output token, cached tokens, logprobs)
  inflight queue  -- KV on the wire; on Success the request finishes (its prefix stays in the
                     radix cache) and the prefill's HTTP response carries the one token.

With `--optimistic-prefill-attempts N` (N > 0; `launch_pd` sets 1) a prompt does not wait in the
bootstrap queue for the decode server's slots: it is prefilled at once, its chunks' KV stays in
this server's pool, and everything computed goes out when the slots arrive (a prefilled prompt
whose slots are still unknown waits in the inflight queue). The decode server's intake and
pre-allocation then overlap the prefill instead of preceding it. The KV is kept, never recomputed,
so one attempt always suffices: any N > 0 turns it on. A decode-side failure or abort meanwhile
fails the request when it is polled, as without it.
"""

from __future__ import annotations

import logging
import time
from typing import List, Optional

from sglang.srt.core.finish_reason import ABORT_IN_QUEUE_MESSAGE, FINISH_ABORT, FINISH_LENGTH
from sglang.srt.core.req import Req
from sglang.srt.disaggregation.utils import FAKE_BOOTSTRAP_HOST, KVPoll, kv_to_page_indices
from sglang.srt.managers.server_role import SchedulerFacade, ServerRole

logger = logging.getLogger(__name__)

# The longest a prefill server keeps the shared cores for its KV copies to land (end_of_turn); a
# same-host copy of a few hundred tokens takes a few ms.
END_OF_TURN_WAIT_S = 0.05
ABORTED_BY_DECODE = "Aborted by the decode server (its client went away or aborted the request)."


class PrefillRole(ServerRole):
    mode = "prefill"
    applies_queue_limit = False

    def __init__(self, facade: SchedulerFacade):
        super().__init__(facade)
        from sglang.srt.disaggregation.base import kv_args_from_pools
        from sglang.srt.disaggregation.transfer_backends import KVClassType, get_kv_class
        from sglang.srt.disaggregation.utils import DisaggregationMode, MetadataBuffers, ReqToMetadataIdxAllocator

        config = facade.disagg
        memory = facade.memory
        size = facade.max_running_requests * 2
        self.metadata_buffers = MetadataBuffers(size)
        self.metadata_allocator = ReqToMetadataIdxAllocator(size)
        pools = memory.device_pools()
        kv_args = kv_args_from_pools(pools.token_to_kv_pool, self.metadata_buffers, memory.page_size,
                                     mamba_pool=pools.mamba_pool, ib_device=config.disaggregation_ib_device)
        # With --dp-size the bootstrap server keeps one rank per replica; the decode side finds a
        # room's replica as `bootstrap_room % dp_size` (the tokenizer dispatches by that rule).
        kv_args.system_dp_rank = config.dp_rank
        backend = config.disaggregation_transfer_backend
        self.kv_manager = get_kv_class(backend, KVClassType.MANAGER)(kv_args, DisaggregationMode.PREFILL, config)
        self.sender_cls = get_kv_class(backend, KVClassType.SENDER)
        self.fake_manager = get_kv_class("fake", KVClassType.MANAGER)(kv_args, DisaggregationMode.PREFILL, config)
        self.fake_sender_cls = get_kv_class("fake", KVClassType.SENDER)
        self.optimistic = config.optimistic_prefill_attempts > 0
        self.bootstrap_queue: List[Req] = []
        self.inflight_queue: List[Req] = []  # KV on the wire, or prefilled and waiting for the decode's slots
        # KV transfers (for /metrics): counts, bytes, and the last one's latency and speed.
        self.transfer_stats = {"num_kv_transfers": 0, "num_kv_transfer_failures": 0, "kv_transfer_bytes": 0,
                               "kv_transfer_latency_ms": 0.0, "kv_transfer_speed_gb_s": 0.0}

    def has_work(self) -> bool:
        return bool(self.bootstrap_queue or self.inflight_queue)

    def stats(self) -> dict:
        return {
            "num_bootstrap_queue_reqs": len(self.bootstrap_queue),
            "num_inflight_queue_reqs": len(self.inflight_queue),
            "available_metadata_rows": self.metadata_allocator.available_size(),
            "metadata_rows": self.metadata_allocator.size,
            **self.transfer_stats,
        }

    def add(self, req: Req, recv) -> None:
        req.sampling_params.max_new_tokens = 1
        req.pd.sent_kv_len = 0
        req.pd.metadata_idx = None
        req.pd.kv_destination_known = False
        local = recv.bootstrap_host in (None, FAKE_BOOTSTRAP_HOST)
        if not local and recv.bootstrap_room is None:  # the tokenizer refuses this; never trust one process
            req.abort(FINISH_ABORT("bootstrap_room is required when bootstrap_host is set.", 400, "BadRequestError"))
            self.s.finish_unscheduled(req)
            return
        room = recv.bootstrap_room if recv.bootstrap_room is not None else 0
        req.pd.bootstrap_room = room
        if local:
            req.pd.kv_sender = self.fake_sender_cls(self.fake_manager, f"{FAKE_BOOTSTRAP_HOST}:0", room)
        else:
            port = recv.bootstrap_port or self.s.disagg.disaggregation_bootstrap_port
            req.pd.kv_sender = self.sender_cls(self.kv_manager, f"{recv.bootstrap_host}:{port}", room)
        self.bootstrap_queue.append(req)

    def all_reqs(self) -> List[Req]:
        return self.bootstrap_queue + self.inflight_queue

    def remove(self, req: Req) -> None:
        for queue in (self.bootstrap_queue, self.inflight_queue):
            if req in queue:
                queue.remove(req)

    def release(self, req: Req) -> None:
        """An aborted or failed request gives up its sender (the room stays recorded as aborted,
        so a decode peer that asks later learns why) and its metadata row."""
        if req.pd.kv_sender is not None:
            req.pd.kv_sender.abort()
            req.pd.kv_sender = None
        if req.pd.metadata_idx is not None:
            self.metadata_allocator.free(req.pd.metadata_idx)
            req.pd.metadata_idx = None

    def log_fields(self, decode: bool) -> str:
        if decode:
            return ""
        return f"#prealloc-req: {len(self.bootstrap_queue)}, #inflight-req: {len(self.inflight_queue)}, "

    def close(self) -> None:
        self.kv_manager.close()

    def process(self) -> None:
        self._pop_bootstrapped()
        self._process_inflight()

    def _pop_bootstrapped(self) -> None:
        for req in list(self.bootstrap_queue):
            if self.contain(req, lambda: self._pop_bootstrapped_one(req), "prefill") == "stop":
                break

    def _pop_bootstrapped_one(self, req: Req) -> str:
        state = req.pd.kv_sender.poll()
        if state == KVPoll.Failed:
            self.bootstrap_queue.remove(req)
            self._abort_failed(req)
        elif state == KVPoll.WaitingForInput or (state == KVPoll.Bootstrapping and self.optimistic):
            idx = self.metadata_allocator.alloc()
            if idx is None:
                return "stop"
            req.pd.metadata_idx = idx
            req.pd.kv_destination_known = state == KVPoll.WaitingForInput
            num_pages = -(-len(req.origin_input_ids) // self.s.page_size)
            req.pd.kv_sender.init(num_pages, idx)
            self.bootstrap_queue.remove(req)
            self.s.waiting_queue.append(req)
        return "next"

    def _destination_known(self, req: Req) -> bool:
        """Whether the decode server's slots for `req` arrived (asked again until they have)."""
        if not req.pd.kv_destination_known:
            req.pd.kv_destination_known = req.pd.kv_sender.poll() == KVPoll.WaitingForInput
        return req.pd.kv_destination_known

    # --- called by the scheduler after each extend forward ----------------------------------------
    def after_chunk(self, req: Req) -> None:
        """A non-last chunk is done: send its whole pages (the partial last page waits)."""
        ps = self.s.page_size
        end = req.kv.kv_len // ps * ps
        if end > req.pd.sent_kv_len and self._destination_known(req):  # else they go with the last chunk
            self._send(req, req.pd.sent_kv_len, end, is_last=False)

    def after_prefill(self, req: Req) -> bool:
        """The last chunk ran and the first token is sampled: send the rest and the metadata row
        (an aborted request is finished by the scheduler as usual)."""
        if req.to_abort is not None:
            return False
        lp = req.logprobs.output_token_logprobs[-1][0] if req.logprobs.output_token_logprobs else None
        tops = req.logprobs.output_top_logprobs[-1] if req.logprobs.output_top_logprobs else None
        self.metadata_buffers.set_buf(
            req.pd.metadata_idx,
            output_id=req.output_ids[-1],
            cached_tokens=req.cached_tokens,
            output_token_logprob_val=lp,
            top_logprobs_val=[v for v, _ in tops] if tops else None,
            top_logprobs_idx=[i for _, i in tops] if tops else None,
            bootstrap_room=req.pd.bootstrap_room % (1 << 63),
        )
        if self._destination_known(req):
            self._send(req, req.pd.sent_kv_len, req.kv.kv_len, is_last=True)
        self.inflight_queue.append(req)  # else sent from there when the decode's slots arrive
        return True

    def end_of_turn(self) -> None:
        """On cores shared with the decode server: the KV copies in flight (every prompt whose last
        pages went out) land before the decode server's turn, so that its next batch decodes them
        (they would otherwise wait a whole decode step, and the copies would run beside its forward)."""
        sent = [r for r in self.inflight_queue if r.pd.kv_destination_known and r.pd.kv_sender is not None]
        deadline = time.monotonic() + END_OF_TURN_WAIT_S
        while time.monotonic() < deadline and any(r.pd.kv_sender.poll() not in (KVPoll.Success, KVPoll.Failed)
                                                  for r in sent):
            time.sleep(0.0002)
        self._process_inflight()

    def _send(self, req: Req, start: int, end: int, is_last: bool) -> None:
        slots = self.s.memory.kv_slots(req, start, end)
        state_indices = None
        if req.kv.mamba_pool_idx is not None and is_last:
            state_indices = [[req.kv.mamba_pool_idx]]
        req.pd.kv_sender.send(kv_to_page_indices(slots, self.s.page_size), state_indices=state_indices, is_last=is_last)
        req.pd.sent_kv_len = end

    # --- completion -----------------------------------------------------------------------------------
    def _process_inflight(self) -> None:
        for req in list(self.inflight_queue):
            self.contain(req, lambda: self._process_inflight_one(req), "prefill")

    def _process_inflight_one(self, req: Req) -> None:
        state = req.pd.kv_sender.poll()
        if state == KVPoll.WaitingForInput and not req.pd.kv_destination_known:  # optimistic prefill: send it now
            req.pd.kv_destination_known = True
            self._send(req, req.pd.sent_kv_len, req.kv.kv_len, is_last=True)
        elif state == KVPoll.Success:
            self.inflight_queue.remove(req)
            self._record_transfer(req)
            req.finished_reason = req.to_abort or FINISH_LENGTH(length=0)
            self._release(req, insert=True)
            self.s.emit([req])
        elif state == KVPoll.Failed:
            self.inflight_queue.remove(req)
            self._abort_failed(req)

    def _record_transfer(self, req: Req) -> None:
        m = req.pd.kv_sender.get_transfer_metric()
        st = self.transfer_stats
        st["num_kv_transfers"] += 1
        seconds, nbytes = m.transfer_latency_s or 0.0, m.transfer_total_bytes or 0
        st["kv_transfer_bytes"] += nbytes
        if seconds > 0:
            st["kv_transfer_latency_ms"] = seconds * 1e3
            st["kv_transfer_speed_gb_s"] = nbytes / seconds / 1e9

    def _abort_failed(self, req: Req) -> None:
        if req.pd.kv_sender.aborted_by_peer():  # the client went away on the decode side: no error here
            self._abort(req, ABORTED_BY_DECODE, None)
        else:
            self.transfer_stats["num_kv_transfer_failures"] += 1
            self._abort(req, self._failure_message(req))

    def reject(self, host, port, room, message: str, status_code: Optional[int]) -> None:
        """This server refused a request before it reached these queues (tokenizer or scheduler): a
        decode peer that asks for its room learns why (and answers its client with the same status)."""
        if host in (None, FAKE_BOOTSTRAP_HOST) or room is None:
            return
        self.kv_manager.reject_room(room, message, status_code or 500)

    def _failure_message(self, req: Req) -> str:
        try:
            req.pd.kv_sender.failure_exception()
        except Exception as e:
            return f"KV transfer of request {req.rid} failed: {e}"
        return f"KV transfer of request {req.rid} failed"

    def _release(self, req: Req, insert: bool) -> None:
        if req.pd.metadata_idx is not None:
            self.metadata_allocator.free(req.pd.metadata_idx)
            req.pd.metadata_idx = None
        self.s.memory.release(req, insert=insert and req.kv.kv_len == req.seqlen - 1)
        if req.pd.kv_sender is not None:
            req.pd.kv_sender.clear()
        req.pd.kv_sender = None

    def _abort(self, req: Req, message: str, status_code: Optional[int] = 500) -> None:
        req.abort(FINISH_ABORT(message, status_code))
        req.finished_reason = req.to_abort
        self._release(req, insert=False)
        self.s.emit([req])

    def abort(self, hit) -> None:
        for queue in (self.bootstrap_queue, self.inflight_queue):
            for req in [r for r in queue if hit(r)]:
                queue.remove(req)
                req.pd.kv_sender.abort()
                self._abort(req, ABORT_IN_QUEUE_MESSAGE, None)
