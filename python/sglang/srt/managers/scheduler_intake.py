"""(Scheduler process.) Requests in and out of the scheduler's queues without running a batch:
admission (limits, truncation, queue capacity), rejection of a request the scheduler could not
add, aborts (exact rid), and upstream's waiting/running time limits.

A mixin of `Scheduler` (it reads the scheduler's queues and pools); kept apart so that
`scheduler.py` is about batching.
"""

from __future__ import annotations

import logging
import os
import time
from typing import List, Optional

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


class SchedulerIntakeMixin:
    # --- requests in -------------------------------------------------------------------------
    def _new_req(self, recv: TokenizedGenerateReqInput) -> Req:
        req = Req(
            rid=recv.rid,
            origin_input_text=recv.input_text,
            origin_input_ids=recv.input_ids,
            sampling_params=recv.sampling_params,
            eos_token_ids=self.eos_token_ids,
            return_logprob=recv.return_logprob,
            logprob_start_len=recv.logprob_start_len,
            top_logprobs_num=recv.top_logprobs_num,
            stream=recv.stream,
            extra_key=recv.extra_key,
            priority=recv.priority,
            vocab_size=self.model_config.vocab_size,
            token_ids_logprob=recv.token_ids_logprob,
            custom_logit_processor=recv.custom_logit_processor,
        )
        req.tokenizer = self.tokenizer
        req.pool_all_tokens = self.pooling is not None and self.pooling.needs_all_tokens
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
        n = len(req.origin_input_ids)
        if n == 0:
            req.to_abort = FINISH_ABORT("The input is empty: at least one token is required.", 400, "BadRequestError")
        elif n >= self.max_req_input_len:
            if self.server_args.allow_auto_truncate:
                logger.warning("Request length is longer than the KV cache pool size or the max context length. "
                               "Truncated. len(req.origin_input_ids)=%d, max_req_input_len=%d",
                               n, self.max_req_input_len)
                req.origin_input_ids = req.origin_input_ids[: self.max_req_input_len]
            else:
                req.to_abort = FINISH_ABORT(
                    f"Input length ({n} tokens) exceeds the maximum allowed length "
                    f"({self.max_req_input_len} tokens). Use a shorter input or enable --allow-auto-truncate.",
                    400,
                    "BadRequestError",
                )
        sp = req.sampling_params
        sp.max_new_tokens = min(sp.max_new_tokens if sp.max_new_tokens is not None else 1 << 30,
                                self.max_req_len - len(req.origin_input_ids) - 1)
        if req.to_abort is None and self.queue_is_full():
            req.to_abort = FINISH_ABORT(QUEUE_FULL_MESSAGE, 503, "ServiceUnavailable")
        constrained = req.to_abort is None and grammar_key(sp) is not None
        if constrained and self.grammar_manager is None:
            req.to_abort = FINISH_ABORT(GRAMMAR_BACKEND_NONE_MESSAGE, 400, "BadRequestError")
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
        idle = not (self.waiting_queue or self.running_reqs or self.chunked_req or self.role.has_work())
        ready, failed = self.grammar_manager.poll(wait_s=0.02 if idle else 0.0)
        for req, recv, message in failed:
            req.to_abort = FINISH_ABORT(message, 400, "BadRequestError")
            self._refuse(req, recv)
        for req, recv in ready:
            self.role.add(req, recv)

    def reject_rooms(self, host, port, rooms, message: str, status_code) -> None:
        """Requests this server refused (here or in its tokenizer): their PD peer is told."""
        for room in rooms:
            self.role.reject(host, port, room, message, status_code)

    def queue_is_full(self) -> bool:
        """--max-queued-requests (plain servers only, as upstream: PD roles have their own queues)."""
        limit = self.server_args.max_queued_requests
        return limit is not None and self.role.applies_queue_limit and len(self.waiting_queue) >= limit

    def reject_request(self, recv: TokenizedGenerateReqInput, message: str) -> None:
        """A request that could not be added (a bug on our side): abort it with a 500."""
        for req in self.all_reqs():
            if req.rid == recv.rid:
                self.unqueue(req)
                req.to_abort = FINISH_ABORT(message, 500, "InternalServerError")
                self.release_after_error(req)
                self.emit([req])
                return
        req = self._new_req(recv)
        req.finished_reason = FINISH_ABORT(message, 500, "InternalServerError")
        self.emit([req])

    def all_reqs(self) -> List[Req]:
        chunked = [self.chunked_req] if self.chunked_req else []
        grammar = self.grammar_manager.reqs() if self.grammar_manager else []
        return list(self.waiting_queue) + list(self.running_reqs) + chunked + self.role.all_reqs() + grammar

    def unqueue(self, req: Req) -> None:
        """Takes `req` out of every queue it is in (its memory is the caller's to release)."""
        for queue in (self.waiting_queue, self.running_reqs):
            if req in queue:
                queue.remove(req)
        if req is self.chunked_req:
            self.chunked_req = None
        if self.grammar_manager is not None:
            self.grammar_manager.remove(req)
        self.role.remove(req)

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        """Aborts the request `rid` (exact match; the tokenizer expands a client rid to its sequences)."""

        def hit(r):
            return abort_all or r.rid == rid

        for req in [r for r in self.waiting_queue if hit(r)]:
            self.waiting_queue.remove(req)
            req.to_abort = FINISH_ABORT(ABORT_IN_QUEUE_MESSAGE)
            self.memory.release(req)  # a retracted request re-queued on a plain server holds nothing; this is safe
            self.finish_unscheduled(req)
        for req in [r for r in (self.grammar_manager.reqs() if self.grammar_manager else []) if hit(r)]:
            self.grammar_manager.remove(req)  # holds nothing yet
            req.to_abort = FINISH_ABORT(ABORT_IN_QUEUE_MESSAGE)
            self.finish_unscheduled(req)
        for req in self.running_reqs + ([self.chunked_req] if self.chunked_req else []):
            if hit(req) and req.to_abort is None:
                req.to_abort = FINISH_ABORT(ABORT_RUNNING_MESSAGE)
        self.role.abort(hit)

    def abort_timed_out(self) -> None:
        """SGLANG_QUEUED_TIMEOUT_MS (waiting) and SGLANG_REQ_RUNNING_TIMEOUT (running), as upstream."""
        now = time.monotonic()
        if self.waiting_timeout_s is not None:
            for req in [r for r in self.waiting_queue if now - r.queue_time_start > self.waiting_timeout_s]:
                self.waiting_queue.remove(req)
                req.to_abort = FINISH_ABORT(QUEUED_TIMEOUT_MESSAGE, 503, "ServiceUnavailable")
                self.memory.release(req)
                self.finish_unscheduled(req)
        if self.running_timeout_s is not None:
            for req in self.running_reqs + ([self.chunked_req] if self.chunked_req else []):
                started = req.forward_entry_time
                if req.to_abort is None and started is not None and now - started > self.running_timeout_s:
                    req.to_abort = FINISH_ABORT(RUNNING_TIMEOUT_MESSAGE, 503, "ServiceUnavailable")

    def finish_unscheduled(self, req: Req) -> None:
        """Ends a request that is not running (its `to_abort` is the reason) and reports it."""
        req.finished_reason = req.to_abort
        self.role.release(req)
        self.emit([req])
