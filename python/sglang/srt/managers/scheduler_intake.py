"""(Scheduler process.) Requests in and out of the scheduler's queues without running a batch:
admission (limits, truncation, queue capacity), rejection of a request the scheduler could not
add, aborts (exact rid), and upstream's waiting/running time limits.

`SchedulerIntake` works on the shared `RequestQueues`, the grammar queue, the role and the
memory it is given; what it ends goes out through the `OutputProcessor`'s outbox. It is also
the one place that ends an aborted request (`finish_unscheduled`, `drop_aborted_running`,
`release_after_error`).
"""

from __future__ import annotations

import logging
import os
import time
import dataclasses
from typing import List, Optional, Set

from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.core.finish_reason import (
    ABORT_IN_QUEUE_MESSAGE,
    ABORT_RUNNING_MESSAGE,
    FINISH_ABORT,
    QUEUE_FULL_MESSAGE,
    QUEUED_TIMEOUT_MESSAGE,
    RUNNING_TIMEOUT_MESSAGE,
)
from sglang.srt.core.req import Req
from sglang.srt.constrained.base_grammar_backend import grammar_key
from sglang.srt.constrained.grammar_manager import GRAMMAR_BACKEND_NONE_MESSAGE

logger = logging.getLogger(__name__)



def _env_seconds(name: str, legacy_ms_name: Optional[str] = None) -> Optional[float]:
    """A positive time limit in seconds from `name`, else from the deprecated `legacy_ms_name` (ms)."""
    raw = os.environ.get(name)
    if raw is None and legacy_ms_name and os.environ.get(legacy_ms_name) is not None:
        logger.warning("Environment variable %s (in ms) is deprecated, please use %s (in seconds) instead",
                       legacy_ms_name, name)
        raw = str(float(os.environ[legacy_ms_name]) / 1000.0)
    if raw is None:
        return None
    value = float(raw)
    return value if value > 0 else None


def waiting_timeout_s() -> Optional[float]:
    return _env_seconds("SGLANG_REQ_WAITING_TIMEOUT", "SGLANG_QUEUED_TIMEOUT_MS")


def running_timeout_s() -> Optional[float]:
    return _env_seconds("SGLANG_REQ_RUNNING_TIMEOUT", "SGLANG_FORWARD_TIMEOUT_MS")


@dataclasses.dataclass(frozen=True)
class IntakeLimits:
    """What admission checks a new request against."""

    max_req_len: int  # a sequence never outgrows the context or the whole KV pool
    max_req_input_len: int
    vocab_size: int
    eos_token_ids: Set[int]
    allow_auto_truncate: bool = False
    max_queued_requests: Optional[int] = None
    pool_all_tokens: bool = False  # embedding servers pooling every prompt token (no prefix reuse)


class SchedulerIntake:
    def __init__(self, *, queues, memory, role, grammar_manager, output, limits: IntakeLimits, tokenizer=None):
        self.queues = queues
        self.memory = memory
        self.role = role
        self.grammar_manager = grammar_manager
        self.output = output
        self.limits = limits
        self.tokenizer = tokenizer
        self.waiting_timeout_s = waiting_timeout_s()
        self.running_timeout_s = running_timeout_s()

    # --- requests in -------------------------------------------------------------------------
    def _new_req(self, recv: TokenizedGenerateReqInput) -> Req:
        req = Req(
            rid=recv.rid,
            origin_input_text=recv.input_text,
            origin_input_ids=recv.input_ids,
            sampling_params=recv.sampling_params,
            eos_token_ids=self.limits.eos_token_ids,
            return_logprob=recv.return_logprob,
            logprob_start_len=recv.logprob_start_len,
            top_logprobs_num=recv.top_logprobs_num,
            stream=recv.stream,
            extra_key=recv.extra_key,
            priority=recv.priority,
            vocab_size=self.limits.vocab_size,
            token_ids_logprob=recv.token_ids_logprob,
            custom_logit_processor=recv.custom_logit_processor,
        )
        req.tokenizer = self.tokenizer
        req.pool_all_tokens = self.limits.pool_all_tokens
        return req

    def add_request(self, recv: TokenizedGenerateReqInput) -> Req:
        req = self._new_req(recv)
        try:
            self._admit(req, recv)
        except Exception:
            self.unqueue(req)
            raise
        return req

    def _admit(self, req: Req, recv: TokenizedGenerateReqInput) -> None:
        n, limit = len(req.origin_input_ids), self.limits.max_req_input_len
        if n == 0:
            req.abort(FINISH_ABORT("The input is empty: at least one token is required.", 400, "BadRequestError"))
        elif n >= limit:
            if self.limits.allow_auto_truncate:
                logger.warning("Request length is longer than the KV cache pool size or the max context length. "
                               "Truncated. len(req.origin_input_ids)=%d, max_req_input_len=%d", n, limit)
                req.origin_input_ids = req.origin_input_ids[:limit]
            else:
                req.abort(FINISH_ABORT(
                    f"Input length ({n} tokens) exceeds the maximum allowed length "
                    f"({limit} tokens). Use a shorter input or enable --allow-auto-truncate.",
                    400,
                    "BadRequestError",
                ))
        sp = req.sampling_params
        sp.max_new_tokens = min(sp.max_new_tokens if sp.max_new_tokens is not None else 1 << 30,
                                self.limits.max_req_len - len(req.origin_input_ids) - 1)
        if req.to_abort is None and self.queue_is_full():
            req.abort(FINISH_ABORT(QUEUE_FULL_MESSAGE, 503, "ServiceUnavailable"))
        constrained = req.to_abort is None and grammar_key(sp) is not None
        if constrained and self.grammar_manager is None:
            req.abort(FINISH_ABORT(GRAMMAR_BACKEND_NONE_MESSAGE, 400, "BadRequestError"))
        if req.to_abort is not None:
            self._refuse(req, recv)
        elif constrained:
            self.grammar_manager.submit(req, recv)  # joins the role's queue once its grammar is ready
        else:
            self.role.add(req, recv)  # plain: the waiting queue; PD: the role's first queue

    def _refuse(self, req: Req, recv: TokenizedGenerateReqInput) -> None:
        self.reject_rooms(recv.bootstrap_host, recv.bootstrap_port, [recv.bootstrap_room],
                          req.to_abort.message, req.to_abort.status_code)  # the PD peer must not wait
        self.finish_unscheduled(req)

    def move_ready_grammar_requests(self) -> None:
        """Constrained requests whose grammar is compiled go on; a bad spec or a timeout is a 400."""
        if self.grammar_manager is None or not self.grammar_manager.queue:
            return
        idle = not (self.queues.has_batch_work() or self.role.has_work())
        ready, failed = self.grammar_manager.poll(wait_s=0.02 if idle else 0.0)
        for req, recv, message in failed:
            req.abort(FINISH_ABORT(message, 400, "BadRequestError"))
            self._refuse(req, recv)
        for req, recv in ready:
            self.role.add(req, recv)

    def reject_rooms(self, host, port, rooms, message: str, status_code) -> None:
        """Requests this server refused (here or in its tokenizer): their PD peer is told."""
        for room in rooms:
            self.role.reject(host, port, room, message, status_code)

    def queue_is_full(self) -> bool:
        """--max-queued-requests (plain servers only, as upstream: PD roles have their own queues)."""
        limit = self.limits.max_queued_requests
        return limit is not None and self.role.applies_queue_limit and len(self.queues.waiting) >= limit

    def reject_request(self, recv: TokenizedGenerateReqInput, message: str) -> None:
        """A request that could not be added (a bug on our side): abort it with a 500."""
        for req in self.all_reqs():
            if req.rid == recv.rid:
                self.unqueue(req)
                req.abort(FINISH_ABORT(message, 500, "InternalServerError"))
                self.release_after_error(req)
                self.output.emit([req])
                return
        req = self._new_req(recv)
        req.finished_reason = FINISH_ABORT(message, 500, "InternalServerError")
        self.output.emit([req])

    def all_reqs(self) -> List[Req]:
        grammar = self.grammar_manager.reqs() if self.grammar_manager else []
        return self.queues.all() + self.role.all_reqs() + grammar

    def unqueue(self, req: Req) -> None:
        """Takes `req` out of every queue it is in (its memory is the caller's to release)."""
        self.queues.remove(req)
        if self.grammar_manager is not None:
            self.grammar_manager.remove(req)
        self.role.remove(req)

    # --- aborts -------------------------------------------------------------------------------
    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        """Aborts the request `rid` (exact match; the tokenizer expands a client rid to its sequences)."""

        def hit(r):
            return abort_all or r.rid == rid

        for req in [r for r in self.queues.waiting if hit(r)]:
            self.queues.waiting.remove(req)
            req.abort(FINISH_ABORT(ABORT_IN_QUEUE_MESSAGE))
            self.memory.release(req)  # a retracted request re-queued on a plain server holds nothing; this is safe
            self.finish_unscheduled(req)
        for req in [r for r in (self.grammar_manager.reqs() if self.grammar_manager else []) if hit(r)]:
            self.grammar_manager.remove(req)  # holds nothing yet
            req.abort(FINISH_ABORT(ABORT_IN_QUEUE_MESSAGE))
            self.finish_unscheduled(req)
        for req in self.queues.in_batches():
            if hit(req) and req.to_abort is None:
                req.abort(FINISH_ABORT(ABORT_RUNNING_MESSAGE))
        self.role.abort(hit)

    def abort_timed_out(self) -> None:
        """SGLANG_QUEUED_TIMEOUT_MS (waiting) and SGLANG_REQ_RUNNING_TIMEOUT (running), as upstream."""
        now = time.monotonic()
        if self.waiting_timeout_s is not None:
            for req in [r for r in self.queues.waiting if now - r.queue_time_start > self.waiting_timeout_s]:
                self.queues.waiting.remove(req)
                req.abort(FINISH_ABORT(QUEUED_TIMEOUT_MESSAGE, 503, "ServiceUnavailable"))
                self.memory.release(req)
                self.finish_unscheduled(req)
        if self.running_timeout_s is not None:
            for req in self.queues.in_batches():
                started = req.forward_entry_time
                if req.to_abort is None and started is not None and now - started > self.running_timeout_s:
                    req.abort(FINISH_ABORT(RUNNING_TIMEOUT_MESSAGE, 503, "ServiceUnavailable"))

    def drop_aborted_running(self) -> None:
        """Running (or chunked) requests marked `to_abort` end now, before the next batch is formed."""
        q = self.queues
        aborted = [r for r in q.running if r.to_abort is not None]
        if q.chunked is not None and q.chunked.to_abort is not None:
            aborted.append(q.chunked)
            q.chunked = None
        for req in aborted:
            if req in q.running:
                q.running.remove(req)
            req.finished_reason = req.to_abort
            self.memory.release(req)
            self.role.release(req)
        if aborted:
            self.output.emit(aborted)

    def finish_unscheduled(self, req: Req) -> None:
        """Ends a request that is not running (its `to_abort` is the reason) and reports it."""
        req.finished_reason = req.to_abort
        self.role.release(req)
        self.output.emit([req])

    def release_after_error(self, req: Req) -> None:
        """A failed request gives back everything it holds, even if part of that fails."""
        req.finished_reason = req.to_abort
        try:
            self.memory.release(req)
        except Exception:  # noqa: BLE001 - say so loudly; the pool check in the tests catches a leak
            logger.exception("Could not release the memory of request %s", req.rid)
        try:
            self.role.release_after_error(req)
        except Exception:  # noqa: BLE001
            logger.exception("Could not release the transfer state of request %s", req.rid)
