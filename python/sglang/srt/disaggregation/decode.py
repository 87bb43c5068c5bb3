"""(Scheduler process.) The decode role of PD disaggregation (reference 5.6 and 4.6).

A request on a decode server goes through:
  prealloc queue  -- receiver bootstrapped, waiting for KV memory to be reserved for its prompt
                     (with --disaggregation-decode-enable-radix-cache: only for the part of the
                     prompt this server's radix tree does not already hold)
  transfer queue  -- slots sent to the prefill server, KV (and first token) in flight
  running         -- KV and first token arrived: decoding like any other request
  retracted queue -- under memory pressure the KV is backed up (cpu_tensor / host_pool) and the
                     slots freed; resumed before any new request is admitted, without prefill.

With `--disaggregation-transfer-backend fake` (or a request whose bootstrap_host is
FAKE_BOOTSTRAP_HOST) nothing is received: the decode server computes the prompt's KV itself with a
local prefill (upstream leaves the KV unfilled; computing it makes a decode server testable alone
with real outputs), then the request decodes and retracts like a transferred one.

Memory goes through the scheduler's `MemoryManager` (`admissible_tokens`, `match_and_lock`,
`reserve`, `release`, `backup_for_retraction`, `restore`); the role only decides when.
"""

from __future__ import annotations

import logging
import time
from typing import List, Optional

from sglang.srt.core.finish_reason import ABORT_IN_QUEUE_MESSAGE, FINISH_ABORT
from sglang.srt.core.req import Req
from sglang.srt.disaggregation.pd_auth import BootstrapHostPolicy
from sglang.srt.disaggregation.utils import FAKE_BOOTSTRAP_HOST, KVPoll, decode_failure, kv_to_page_indices
from sglang.srt.managers.server_role import SchedulerFacade, ServerRole

logger = logging.getLogger(__name__)


def _bootstrap_addr(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class DecodeRole(ServerRole):
    mode = "decode"
    applies_queue_limit = False
    allows_mixed_chunk = False

    def __init__(self, facade: SchedulerFacade):
        super().__init__(facade)
        config = facade.disagg
        self.backend = config.disaggregation_transfer_backend
        self.bootstrap_port = config.disaggregation_bootstrap_port
        self.num_reserved_decode_tokens = config.num_reserved_decode_tokens
        self.prealloc_queue: List[Req] = []
        self.transfer_queue: List[Req] = []
        self.retracted_queue: List[Req] = []
        self.radix_hit_tokens = 0  # prompt tokens reused from this server's radix tree, not received
        self.num_transfer_failures = 0
        self.bootstrap_hosts = BootstrapHostPolicy(config.host)  # the tokenizer checks too; never trust one process
        self.kv_manager = None
        self.metadata_buffers = None
        self.metadata_allocator = None
        if self.backend != "fake":
            self._init_transfer()

    def _init_transfer(self) -> None:
        from sglang.srt.disaggregation.base import kv_args_from_pools
        from sglang.srt.disaggregation.transfer_backends import KVClassType, get_kv_class
        from sglang.srt.disaggregation.utils import DisaggregationMode, MetadataBuffers, ReqToMetadataIdxAllocator

        memory, config = self.s.memory, self.s.disagg
        size = self.s.max_running_requests * 2
        self.metadata_buffers = MetadataBuffers(size)
        self.metadata_allocator = ReqToMetadataIdxAllocator(size)
        pools = memory.device_pools()
        kv_args = kv_args_from_pools(pools.token_to_kv_pool, self.metadata_buffers, memory.page_size,
                                     mamba_pool=pools.mamba_pool, ib_device=config.disaggregation_ib_device)
        self.kv_manager = get_kv_class(self.backend, KVClassType.MANAGER)(kv_args, DisaggregationMode.DECODE, config)
        self.receiver_cls = get_kv_class(self.backend, KVClassType.RECEIVER)

    def close(self) -> None:
        if self.kv_manager is not None:
            self.kv_manager.close()

    # --- requests in ----------------------------------------------------------------------------
    def _is_fake(self, host) -> bool:
        return self.backend == "fake" or host == FAKE_BOOTSTRAP_HOST

    def add(self, req: Req, recv) -> None:
        if self._is_fake(recv.bootstrap_host):
            self.s.waiting_queue.append(req)  # local prefill stands in for the transfer
            return
        host = recv.bootstrap_host
        if host is None or recv.bootstrap_room is None:  # the tokenizer refuses these; never trust one process
            req.abort(FINISH_ABORT("A PD decode request needs bootstrap_host and bootstrap_room.", 400,
                                   "BadRequestError"))
            self.s.finish_unscheduled(req)
            return
        port = recv.bootstrap_port or self.bootstrap_port
        problem = self.bootstrap_hosts.problem(host, port)
        if problem is not None:
            req.abort(FINISH_ABORT(problem, 400, "BadRequestError"))
            self.s.finish_unscheduled(req)
            return
        addr = _bootstrap_addr(host, port)
        try:
            req.pd.kv_receiver = self.receiver_cls(self.kv_manager, addr, recv.bootstrap_room)
            req.pd.kv_receiver.init(None)  # the prefill replica: bootstrap_room % its dp_size
        except Exception as e:  # bad address etc.: fail this request, not the server
            if req.pd.kv_receiver is not None:
                req.pd.kv_receiver.clear()
                req.pd.kv_receiver = None
            req.abort(FINISH_ABORT(f"Failed to bootstrap with the prefill server {addr}: {e}", 500))
            self.s.finish_unscheduled(req)
            return
        req.pd.bootstrap_room = recv.bootstrap_room
        self.prealloc_queue.append(req)

    def reject(self, host, port, room, message: str, status_code: Optional[int]) -> None:
        """This server refused a request before it reached these queues (tokenizer or scheduler):
        tell its prefill server, which would otherwise wait for our metadata until its bootstrap timeout."""
        if self._is_fake(host) or host is None or room is None:
            return
        port = port or self.bootstrap_port
        if self.bootstrap_hosts.problem(host, port) is not None:
            return  # never connect to a host a client named that is not an allowed prefill
        addr = _bootstrap_addr(host, port)
        try:
            receiver = self.receiver_cls(self.kv_manager, addr, room)
            receiver.abort()  # delivered once the prefill's rank is resolved
            receiver.clear()
        except Exception:  # noqa: BLE001 - best effort: the prefill's bootstrap timeout still ends it
            logger.exception("Could not tell prefill %s that room %s was refused", addr, room)

    # --- bookkeeping ------------------------------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self.prealloc_queue or self.transfer_queue or self.retracted_queue)

    def stats(self) -> dict:
        out = {
            "num_prealloc_queue_reqs": len(self.prealloc_queue),
            "num_transfer_queue_reqs": len(self.transfer_queue),
            "num_retracted_queue_reqs": len(self.retracted_queue),
            "pre_allocated_tokens": sum(r.kv.kv_len for r in self.transfer_queue),
            "decode_radix_hit_tokens": self.radix_hit_tokens,
            "num_kv_transfer_failures": self.num_transfer_failures,
        }
        if self.metadata_allocator is not None:
            out["available_metadata_rows"] = self.metadata_allocator.available_size()
            out["metadata_rows"] = self.metadata_allocator.size
        return out

    def log_fields(self, decode: bool) -> str:
        if not decode:
            return ""
        st, total = self.stats(), self.s.memory.max_total_num_tokens
        return (f"pre-allocated usage: {st['pre_allocated_tokens'] / total:.2f}, "
                f"#prealloc-req: {st['num_prealloc_queue_reqs']}, #transfer-req: {st['num_transfer_queue_reqs']}, "
                f"#retracted-req: {st['num_retracted_queue_reqs']}, ")

    def all_reqs(self) -> List[Req]:
        return self.prealloc_queue + self.transfer_queue + self.retracted_queue

    def remove(self, req: Req) -> None:
        for queue in (self.prealloc_queue, self.transfer_queue, self.retracted_queue):
            if req in queue:
                queue.remove(req)

    def release_after_error(self, req: Req) -> None:
        """What a failed request holds on the decode side beyond its KV: metadata row, receiver, backup."""
        self._free_metadata(req)
        if req.pd.kv_receiver is not None:
            req.pd.kv_receiver.abort()
            req.pd.kv_receiver.clear()
            req.pd.kv_receiver = None
        self.s.memory.discard_backup(req)

    def _free_metadata(self, req: Req) -> None:
        if req.pd.metadata_idx is not None:
            self.metadata_allocator.free(req.pd.metadata_idx)
            req.pd.metadata_idx = None

    # --- each step ----------------------------------------------------------------------------------
    def process(self) -> None:
        """One pass of the decode-side queues, at the top of every scheduler step. A request whose
        step raises fails alone (500), the others go on."""
        self._resume_retracted()
        if self.retracted_queue:
            return  # retracted requests come back before anything new is admitted
        arrived: List[Req] = []
        for req in list(self.transfer_queue):
            self.contain(req, lambda: self._pop_transferred(req, arrived), "decode")
        if arrived:
            self.s.emit(arrived)  # streams' first tokens go out now, before the next decode forward
        for req in list(self.prealloc_queue):
            if self.contain(req, lambda: self._pre_alloc(req), "decode") == "stop":
                break

    def may_prefill(self) -> bool:
        return not self.retracted_queue  # retracted requests resume first

    def _allocatable_tokens(self) -> int:
        """The admission budget less --num-reserved-decode-tokens per request that decodes here."""
        running = len(self.s.running_reqs) + len(self.transfer_queue)
        return self.s.memory.admissible_tokens(self.num_reserved_decode_tokens * running)

    def _pre_alloc(self, req: Req) -> str:
        """Reserves KV (and a Mamba slot) for one bootstrapped request. "stop": no room, try later."""
        state = req.pd.kv_receiver.poll()
        if state == KVPoll.Failed:
            self._fail(req, self.prealloc_queue)
            return "next"
        if state == KVPoll.Bootstrapping:
            return "next"
        n, memory = len(req.origin_input_ids), self.s.memory
        if len(self.s.running_reqs) + len(self.transfer_queue) >= self.s.max_running_requests:
            return "stop"
        prefix = self._lock_cached_prefix(req)
        if self._allocatable_tokens() < n - prefix + memory.page_size:
            self._unlock_prefix(req)
            return "stop"
        aux = self.metadata_allocator.alloc()
        if aux is None:
            self._unlock_prefix(req)
            return "stop"
        slots = memory.reserve([req], [prefix], [n], init_mamba_state=False)  # the prefill's state lands in its slot
        if slots is None:
            self.metadata_allocator.free(aux)
            self._unlock_prefix(req)
            return "stop"
        req.pd.metadata_idx = aux
        self.radix_hit_tokens += prefix
        self.prealloc_queue.remove(req)
        self.transfer_queue.append(req)
        state_indices = [[req.kv.mamba_pool_idx]] if req.kv.mamba_pool_idx is not None else None
        req.pd.kv_receiver.send_metadata(kv_to_page_indices(slots, memory.page_size), aux, state_indices=state_indices,
                                      decode_prefix_len=prefix)
        return "next"

    def _lock_cached_prefix(self, req: Req) -> int:
        """--disaggregation-decode-enable-radix-cache: the prompt's longest prefix this server
        already holds (earlier requests' prompts and outputs) is reused and locked; the prefill
        sends only the pages after it (`decode_prefix_len`). The recurrent state of a hybrid model
        always comes from the prefill (it summarises the whole prompt), so the prefix needs KV only
        (it may end where the tree keeps no state) and a state there is not kept locked. Returns
        the prefix length in tokens (whole pages)."""
        req.fill_ids = req.all_ids()
        return self.s.memory.match_and_lock(req, with_state=False)

    def _unlock_prefix(self, req: Req) -> None:
        """Undo `_lock_cached_prefix` for a request that waits for memory (matched again next time)."""
        self.s.memory.unlock(req)

    def _pop_transferred(self, req: Req, arrived: List[Req]) -> None:
        """A request whose KV arrived joins the running batch (or finishes) and `arrived`."""
        state = req.pd.kv_receiver.poll()
        if state == KVPoll.Failed:
            self._fail(req, self.transfer_queue)
            return
        if state != KVPoll.Success:
            return
        row = self.metadata_buffers.get_buf(req.pd.metadata_idx)
        self._free_metadata(req)
        self.transfer_queue.remove(req)
        req.pd.kv_receiver.clear()
        req.pd.kv_receiver = None
        if req.pd.bootstrap_room is not None and row.bootstrap_room != req.pd.bootstrap_room % (1 << 63):
            req.abort(FINISH_ABORT(
                f"Context corruption detected: Request {req.rid} bootstrap_room mismatch "
                f"(expected {req.pd.bootstrap_room}, got {row.bootstrap_room})", 500))
            self._drop(req)
            return
        if req.sampling_params.max_new_tokens > 0:
            req.output_ids.append(row.output_id)
        req.cached_tokens = row.cached_tokens
        if req.return_logprob and row.output_token_logprob_val is not None and req.output_ids:
            req.logprobs.output_token_logprobs.append((row.output_token_logprob_val, row.output_id))
            if req.top_logprobs_num:
                req.logprobs.output_top_logprobs.append(list(zip(row.top_logprobs_val, row.top_logprobs_idx)))
        req.fill_ids = req.all_ids()
        req.forward_entry_time = time.monotonic()
        req.check_finished()
        if req.finished():
            self.s.memory.release(req)
        else:
            self.s.running_reqs.append(req)
        arrived.append(req)

    def _fail(self, req: Req, queue: List[Req]) -> None:
        try:
            req.pd.kv_receiver.failure_exception()
            message = "KV transfer failed"
        except Exception as e:
            message = str(getattr(e, "failure_reason", None) or e)
        queue.remove(req)
        req.pd.kv_receiver.clear()
        req.pd.kv_receiver = None
        status, text = decode_failure(message)
        self.num_transfer_failures += status is None or status >= 500
        if status is not None and status < 500:  # the prefill refused the request itself (a client error)
            req.abort(FINISH_ABORT(f"The prefill server refused the request: {text}", status, "BadRequestError"))
        else:
            req.abort(FINISH_ABORT(f"Failed to receive the KV cache of request {req.rid}: {message}", 500))
        self._drop(req)

    def _drop(self, req: Req) -> None:
        self._free_metadata(req)
        self.s.memory.release(req)
        req.finished_reason = req.to_abort
        self.s.emit([req])

    def abort(self, hit) -> None:
        for queue in (self.prealloc_queue, self.transfer_queue):
            for req in [r for r in queue if hit(r)]:
                if req.pd.kv_receiver is not None:
                    req.pd.kv_receiver.abort()  # the prefill drops the room too
                    req.pd.kv_receiver.clear()
                    req.pd.kv_receiver = None
                queue.remove(req)
                req.abort(FINISH_ABORT(ABORT_IN_QUEUE_MESSAGE))
                self._drop(req)
        for req in [r for r in self.retracted_queue if hit(r)]:
            self.retracted_queue.remove(req)
            self.s.memory.discard_backup(req)  # free the backup at once (upstream #18701)
            req.abort(FINISH_ABORT(ABORT_IN_QUEUE_MESSAGE))
            req.finished_reason = req.to_abort
            self.s.emit([req])

    # --- retraction -----------------------------------------------------------------------------------
    def retract(self, req: Req) -> bool:
        """Backs the request's KV (and Mamba state) up, then frees it; False (abort) without a backup."""
        memory = self.s.memory
        saved = memory.backup_for_retraction(req)
        memory.release(req)
        if saved is None:
            if req.to_abort is None:
                req.abort(memory.retraction_abort_reason())
            logger.warning("retract_decode: aborted request %s: %s", req.rid, req.to_abort.message)
            return False
        req.kv.retraction_backup = saved
        req.reset_for_retract()
        return True

    def requeue_retracted(self, reqs: List[Req]) -> None:
        self.retracted_queue.extend(reqs)  # resumed from their backups

    def _resume_retracted(self) -> None:
        for req in list(self.retracted_queue):
            if self.contain(req, lambda: self._resume(req), "decode") == "stop":
                break

    def _resume(self, req: Req) -> str:
        n, memory = req.kv.retraction_backup.kv_len, self.s.memory
        if self.s.running_reqs and self._allocatable_tokens() < n + memory.page_size:
            return "stop"
        if not memory.restore(req):
            return "stop"
        req.fill_ids = req.all_ids()
        self.retracted_queue.remove(req)
        self.s.running_reqs.append(req)
        return "next"
