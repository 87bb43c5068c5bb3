"""The decode side of PD disaggregation, inside the scheduler (reference 5.6 and 4.6).

A request on a decode server goes through:
  prealloc queue  -- receiver bootstrapped, waiting for KV memory to be reserved for its prompt
  transfer queue  -- slots sent to the prefill server, KV (and first token) in flight
  running         -- KV and first token arrived: decoding like any other request
  retracted queue -- under memory pressure the KV is backed up (cpu_tensor / host_pool) and the
                     slots freed; resumed before any new request is admitted, without prefill.

With `--disaggregation-transfer-backend fake` (or a request whose bootstrap_host is
FAKE_BOOTSTRAP_HOST) nothing is received: the decode server computes the prompt's KV itself with a
local prefill (upstream leaves the KV unfilled; computing it makes a decode server testable alone
with real outputs), then the request decodes and retracts like a transferred one.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, List, Optional

import torch

from sglang.srt.disaggregation.mooncake.messages import decode_failure
from sglang.srt.disaggregation.utils import FAKE_BOOTSTRAP_HOST, KVPoll, kv_to_page_indices
from sglang.srt.managers.schedule_batch import FINISH_ABORT, Req, _evict_params
from sglang.srt.managers.scheduler_intake import ABORT_IN_QUEUE_MESSAGE

if TYPE_CHECKING:
    from sglang.srt.managers.scheduler import Scheduler

logger = logging.getLogger(__name__)


class DecodeQueues:
    def __init__(self, scheduler: "Scheduler"):
        self.s = scheduler
        sa = scheduler.server_args
        self.backend = sa.disaggregation_transfer_backend
        self.num_reserved_decode_tokens = sa.num_reserved_decode_tokens
        self.prealloc_queue: List[Req] = []
        self.transfer_queue: List[Req] = []
        self.retracted_queue: List[Req] = []
        self.kv_manager = None
        self.metadata_buffers = None
        self.metadata_allocator = None
        if self.backend != "fake":
            self._init_transfer()

    def _init_transfer(self) -> None:
        from sglang.srt.disaggregation.base import kv_args_from_pools
        from sglang.srt.disaggregation.utils import (
            DisaggregationMode,
            KVClassType,
            MetadataBuffers,
            ReqToMetadataIdxAllocator,
            get_kv_class,
        )

        s = self.s
        size = s.max_running_requests * 2
        self.metadata_buffers = MetadataBuffers(size)
        self.metadata_allocator = ReqToMetadataIdxAllocator(size)
        kv_args = kv_args_from_pools(
            s.model_runner.token_to_kv_pool, self.metadata_buffers, s.page_size,
            mamba_pool=getattr(s.model_runner, "mamba_pool", None),
            ib_device=s.server_args.disaggregation_ib_device,
        )
        manager_cls = get_kv_class(self.backend, KVClassType.MANAGER)
        self.kv_manager = manager_cls(kv_args, DisaggregationMode.DECODE, s.server_args)
        self.receiver_cls = get_kv_class(self.backend, KVClassType.RECEIVER)

    # --- queues -----------------------------------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self.prealloc_queue or self.transfer_queue or self.retracted_queue)

    def is_fake(self, recv) -> bool:
        return self.backend == "fake" or recv.bootstrap_host == FAKE_BOOTSTRAP_HOST

    def add(self, req: Req, recv) -> None:
        if self.is_fake(recv):
            self.s.waiting_queue.append(req)  # local prefill stands in for the transfer
            return
        port = recv.bootstrap_port or self.s.server_args.disaggregation_bootstrap_port
        host = recv.bootstrap_host
        if host is None or recv.bootstrap_room is None:  # the tokenizer refuses these; never trust one process
            req.to_abort = FINISH_ABORT("A PD decode request needs bootstrap_host and bootstrap_room.", 400,
                                        "BadRequestError")
            self.s._finish_unscheduled(req)
            return
        addr = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            req.kv_receiver = self.receiver_cls(self.kv_manager, addr, recv.bootstrap_room)
            req.kv_receiver.init(0)
        except Exception as e:  # bad address etc.: fail this request, not the server
            if getattr(req, "kv_receiver", None) is not None:
                req.kv_receiver.clear()
            req.to_abort = FINISH_ABORT(f"Failed to bootstrap with the prefill server {addr}: {e}", 500)
            self.s._finish_unscheduled(req)
            return
        req.bootstrap_room = recv.bootstrap_room
        self.prealloc_queue.append(req)

    def stats(self) -> dict:
        out = {
            "num_prealloc_queue_reqs": len(self.prealloc_queue),
            "num_transfer_queue_reqs": len(self.transfer_queue),
            "num_retracted_queue_reqs": len(self.retracted_queue),
            "pre_allocated_tokens": sum(r.kv_len for r in self.transfer_queue),
        }
        if self.metadata_allocator is not None:
            out["available_metadata_rows"] = self.metadata_allocator.available_size()
            out["metadata_rows"] = self.metadata_allocator.size
        return out

    def reject(self, host, port, room, message: str, status_code: Optional[int]) -> None:
        """This server refused a request before it reached these queues (tokenizer or scheduler):
        tell its prefill server, which would otherwise wait for our metadata until its bootstrap timeout."""
        if self.backend == "fake" or host in (None, FAKE_BOOTSTRAP_HOST) or room is None:
            return
        port = port or self.s.server_args.disaggregation_bootstrap_port
        addr = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            receiver = self.receiver_cls(self.kv_manager, addr, room)
            receiver.abort()  # delivered once the prefill's rank is resolved
            receiver.clear()
        except Exception:  # noqa: BLE001 - best effort: the prefill's bootstrap timeout still ends it
            logger.exception("Could not tell prefill %s that room %s was refused", addr, room)

    def all_reqs(self) -> List[Req]:
        return self.prealloc_queue + self.transfer_queue + self.retracted_queue

    def remove(self, req: Req) -> None:
        for queue in (self.prealloc_queue, self.transfer_queue, self.retracted_queue):
            if req in queue:
                queue.remove(req)

    def release_after_error(self, req: Req) -> None:
        """What a failed request holds on the decode side beyond its KV: metadata row, receiver, backup."""
        if getattr(req, "metadata_idx", None) is not None:
            self.metadata_allocator.free(req.metadata_idx)
            req.metadata_idx = None
        if getattr(req, "kv_receiver", None) is not None:
            req.kv_receiver.abort()
            req.kv_receiver.clear()
            req.kv_receiver = None
        if getattr(req, "retraction_backup", None) is not None:
            self.s.retraction_store.discard(req.retraction_backup)
            req.retraction_backup = None

    def process(self) -> None:
        """One pass of the decode-side queues; called at the top of every scheduler step. A
        request whose step raises fails alone (500), the others go on."""
        self.resume_retracted()
        if self.retracted_queue:
            return  # retracted requests come back before anything new is admitted
        self._pop_transferred()
        self._pre_alloc()

    def _contain(self, req: Req, fn) -> bool:
        """Runs `fn()` for one request; on an exception the request alone is aborted. False: it failed."""
        try:
            fn()
            return True
        except Exception as e:  # noqa: BLE001
            logger.exception("Decode queue step failed for request %s", req.rid)
            self.remove(req)
            self.s._unqueue(req)
            req.to_abort = FINISH_ABORT(f"Internal server error on the decode server: {type(e).__name__}: {e}", 500,
                                        "InternalServerError")
            self.s._release_after_error(req)
            self.s.emit([req])
            return False

    # --- prealloc / transfer --------------------------------------------------------------------------
    def _allocatable_tokens(self) -> int:
        s = self.s
        running = len(s.running_reqs) + len(self.transfer_queue)
        reserve = self.num_reserved_decode_tokens * running
        return s.allocator.available_size() + s.tree_cache.evictable_size() - reserve

    def _pre_alloc(self) -> None:
        for req in list(self.prealloc_queue):
            outcome = []
            if not self._contain(req, lambda: outcome.append(self._pre_alloc_one(req))):
                continue
            if outcome[0] == "stop":
                break

    def _pre_alloc_one(self, req: Req) -> str:
        """Reserves KV (and a Mamba slot) for one bootstrapped request. "stop": no room, try later."""
        s = self.s
        state = req.kv_receiver.poll()
        if state == KVPoll.Failed:
            self._fail(req, self.prealloc_queue)
            return "next"
        if state == KVPoll.Bootstrapping:
            return "next"
        n = len(req.origin_input_ids)
        if s.req_to_token_pool.available_size() <= 0 or self._allocatable_tokens() < n + s.page_size:
            return "stop"
        if len(s.running_reqs) + len(self.transfer_queue) >= s.max_running_requests:
            return "stop"
        aux = self.metadata_allocator.alloc()
        if aux is None:
            return "stop"
        row = s.req_to_token_pool.alloc(1)[0]
        slots = s.allocator.alloc_extend([0], [n], [0])
        if slots is None:
            s.req_to_token_pool.free(row)
            self.metadata_allocator.free(aux)
            return "stop"
        state_indices = None
        if s.mamba_pool is not None:  # hybrid SSM: the prefill's state lands in this slot
            mamba_slot = s.tree_cache.alloc_mamba_slot()
            if mamba_slot is None:
                s.allocator.free(slots)
                s.req_to_token_pool.free(row)
                self.metadata_allocator.free(aux)
                return "stop"
            req.mamba_pool_idx = mamba_slot
            state_indices = [[mamba_slot]]
        req.req_pool_idx = row
        s.req_to_token_pool.write(row, 0, slots)
        req.kv_len = n
        req.metadata_idx = aux
        self.prealloc_queue.remove(req)
        self.transfer_queue.append(req)
        req.kv_receiver.send_metadata(kv_to_page_indices(slots, s.page_size), aux, state_indices=state_indices)
        return "next"

    def _pop_transferred(self) -> None:
        for req in list(self.transfer_queue):
            self._contain(req, lambda: self._pop_transferred_one(req))

    def _pop_transferred_one(self, req: Req) -> None:
        s = self.s
        state = req.kv_receiver.poll()
        if state == KVPoll.Failed:
            self._fail(req, self.transfer_queue)
            return
        if state != KVPoll.Success:
            return
        row = self.metadata_buffers.get_buf(req.metadata_idx)
        self.metadata_allocator.free(req.metadata_idx)
        req.metadata_idx = None
        self.transfer_queue.remove(req)
        if req.bootstrap_room is not None and row.bootstrap_room != req.bootstrap_room % (1 << 63):
            req.to_abort = FINISH_ABORT(
                f"Context corruption detected: Request {req.rid} bootstrap_room mismatch "
                f"(expected {req.bootstrap_room}, got {row.bootstrap_room})", 500)
            req.kv_receiver.clear()
            req.kv_receiver = None
            self._drop(req)
            return
        if req.sampling_params.max_new_tokens > 0:
            req.output_ids.append(row.output_id)
        req.cached_tokens = row.cached_tokens
        if req.return_logprob and row.output_token_logprob_val is not None and req.output_ids:
            req.output_token_logprobs.append((row.output_token_logprob_val, row.output_id))
            if req.top_logprobs_num:
                req.output_top_logprobs.append(list(zip(row.top_logprobs_val, row.top_logprobs_idx)))
        req.fill_ids = req.all_ids()
        req.kv_receiver.clear()
        req.kv_receiver = None
        req.forward_entry_time = time.monotonic()
        req.check_finished()
        if req.finished():
            s.release_kv(req)
            s.emit([req])
        else:
            s.running_reqs.append(req)

    def _fail(self, req: Req, queue: List[Req]) -> None:
        try:
            req.kv_receiver.failure_exception()
            message = "KV transfer failed"
        except Exception as e:
            message = str(getattr(e, "failure_reason", None) or e)
        queue.remove(req)
        req.kv_receiver.clear()
        req.kv_receiver = None
        status, text = decode_failure(message)
        if status is not None and status < 500:  # the prefill refused the request itself (a client error)
            req.to_abort = FINISH_ABORT(f"The prefill server refused the request: {text}", status, "BadRequestError")
        else:
            req.to_abort = FINISH_ABORT(f"Failed to receive the KV cache of request {req.rid}: {message}", 500)
        self._drop(req)

    def _drop(self, req: Req) -> None:
        if getattr(req, "metadata_idx", None) is not None:
            self.metadata_allocator.free(req.metadata_idx)
            req.metadata_idx = None
        if req.req_pool_idx is not None:
            self.s.release_kv(req)
        req.finished_reason = req.to_abort
        self.s.emit([req])

    def abort(self, hit) -> None:
        for queue in (self.prealloc_queue, self.transfer_queue):
            for req in [r for r in queue if hit(r)]:
                if getattr(req, "kv_receiver", None) is not None:
                    req.kv_receiver.abort()  # the prefill drops the room too
                    req.kv_receiver.clear()
                    req.kv_receiver = None
                queue.remove(req)
                req.to_abort = FINISH_ABORT(ABORT_IN_QUEUE_MESSAGE)
                self._drop(req)
        for req in [r for r in self.retracted_queue if hit(r)]:
            self.retracted_queue.remove(req)
            self.s.retraction_store.discard(req.retraction_backup)  # free the backup at once (upstream #18701)
            req.retraction_backup = None
            req.to_abort = FINISH_ABORT(ABORT_IN_QUEUE_MESSAGE)
            req.finished_reason = req.to_abort
            self.s.emit([req])

    # --- retraction ---------------------------------------------------------------------------------
    def resume_retracted(self) -> None:
        for req in list(self.retracted_queue):
            outcome = []
            if not self._contain(req, lambda: outcome.append(self._resume_one(req))):
                continue
            if outcome[0] == "stop":
                break

    def _resume_one(self, req: Req) -> str:
        s = self.s
        backup = req.retraction_backup
        n = backup.kv_len
        if s.req_to_token_pool.available_size() <= 0:
            return "stop"
        if s.running_reqs and self._allocatable_tokens() < n + s.page_size:
            return "stop"
        row = s.req_to_token_pool.alloc(1)[0]
        slots = s.allocator.alloc_extend([0], [n], [0])
        if slots is None:
            s.tree_cache.evict(_evict_params(n))
            slots = s.allocator.alloc_extend([0], [n], [0])
        if slots is None:
            s.req_to_token_pool.free(row)
            return "stop"
        if s.mamba_pool is not None:  # hybrid SSM: the backed-up state goes into a new slot
            mamba_slot = s.tree_cache.alloc_mamba_slot()
            if mamba_slot is None:
                s.allocator.free(slots)
                s.req_to_token_pool.free(row)
                return "stop"
            req.mamba_pool_idx = mamba_slot
        req.req_pool_idx = row
        s.req_to_token_pool.write(row, 0, slots)
        req.kv_len = n
        s.retraction_store.restore(backup, slots, getattr(req, "mamba_pool_idx", None))
        req.retraction_backup = None
        req.fill_ids = req.all_ids()
        self.retracted_queue.remove(req)
        s.running_reqs.append(req)
        return "next"
