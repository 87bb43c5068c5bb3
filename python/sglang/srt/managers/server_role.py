"""(Scheduler process.) What a server's PD role adds to the scheduler, as a strategy.

The scheduler core (queues, admission, batching, retraction, outputs) is the same on every
server; what differs by `--disaggregation-mode` is behind `ServerRole`:

  add(req, recv)        where a new request goes (plain: the waiting queue; prefill: the
                        bootstrap queue; decode: the pre-allocation queue)
  reject(...)           a request this server refused: its PD peer is told
  process()             the role's queues, before each step (bootstrap, transfers, resumes)
  may_prefill()         whether new prompts may be admitted now (decode: not while retracted
                        requests wait to resume)
  after_prefill(req)    a prompt is fully prefilled (prefill: hand its KV to the transfer)
  after_chunk(req)      a prompt chunk is prefilled (prefill: send its whole pages)
  retract(req)          free a retracted request's memory (decode: back its KV up first);
                        False: it cannot be kept and is aborted
  requeue_retracted     where retracted requests wait (plain: re-prefill; decode: resume)
  release(req)          what a finished/aborted request holds beyond its KV (sender, rows)
  abort(hit) / all_reqs() / remove(req) / release_after_error(req) / stats() / log_fields()

`ServerRole` itself is the plain (null) role. The PD roles (`disaggregation/prefill.py`, `decode.py`) see the
scheduler only through `SchedulerFacade`, never the scheduler module itself.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional

from sglang.srt.configs.runtime_config import DisaggConfig
from sglang.srt.core.finish_reason import FINISH_ABORT
from sglang.srt.core.req import Req

logger = logging.getLogger(__name__)


class SchedulerFacade:
    """The narrow view of the scheduler a role works with: memory, queues, outputs, and the PD
    settings (`disagg`, the `DisaggConfig` slice) rather than the whole `ServerArgs`, so a role's
    inputs are the few fields it names and the transfer backends get the same slice."""

    def __init__(self, scheduler):
        self._s = scheduler
        self.disagg = DisaggConfig.from_server_args(scheduler.server_args, dp_rank=scheduler.dp_rank)
        self.memory = scheduler.memory
        self.page_size = scheduler.memory.page_size

    @property
    def max_running_requests(self) -> int:
        return self._s.max_running_requests

    @property
    def waiting_queue(self) -> List[Req]:
        return self._s.waiting_queue

    @property
    def running_reqs(self) -> List[Req]:
        return self._s.running_reqs

    def emit(self, reqs: List[Req]) -> None:
        self._s.emit(reqs)

    def finish_unscheduled(self, req: Req) -> None:
        """Ends a request that never ran (its `to_abort` is the reason) and reports it."""
        self._s.finish_unscheduled(req)

    def release_after_error(self, req: Req) -> None:
        self._s.release_after_error(req)

    def unqueue(self, req: Req) -> None:
        self._s.unqueue(req)


class ServerRole:
    """The plain (non-PD) server: every hook is the null behaviour."""

    mode = "null"
    applies_queue_limit = True  # --max-queued-requests (upstream: ignored with disaggregation)
    allows_mixed_chunk = True

    def __init__(self, facade: SchedulerFacade):
        self.s = facade

    def contain(self, req: Req, fn: Callable[[], Any], where: str) -> Any:
        """Runs one request's step of the role's queues; an exception fails that request alone
        (500 with the reason) and everything it holds is freed. Returns fn's result (None on failure)."""
        try:
            return fn()
        except Exception as e:  # noqa: BLE001
            logger.exception("%s queue step failed for request %s", where, req.rid)
            self.remove(req)
            self.s.unqueue(req)
            req.abort(FINISH_ABORT(f"Internal server error on the {where} server: {type(e).__name__}: {e}",
                                        500, "InternalServerError"))
            self.s.release_after_error(req)
            self.s.emit([req])
            return None

    # --- requests in ---------------------------------------------------------------------------
    def add(self, req: Req, recv) -> None:
        self.s.waiting_queue.append(req)

    def reject(self, host, port, room, message: str, status_code: Optional[int]) -> None:
        """No PD peer to tell."""

    # --- each step -------------------------------------------------------------------------------
    def has_work(self) -> bool:
        return False

    def process(self) -> None:
        """Nothing beyond the scheduler's own queues."""

    def may_prefill(self) -> bool:
        return True

    def end_of_turn(self) -> None:
        """Called after the step's batch while this scheduler still holds the cores it shares with
        another (`sglang.srt.utils.compute_turns`): what the other one's next batch needs from this
        step finishes here. Nothing here."""

    def after_prefill(self, req: Req) -> bool:
        """True: the role took the request over (it does not join the running batch)."""
        return False

    def after_chunk(self, req: Req) -> None:
        """A non-last prompt chunk of `req` is prefilled."""

    # --- retraction --------------------------------------------------------------------------------
    def retract(self, req: Req) -> bool:
        """Frees a retracted request's memory; it is prefilled again later (recomputed)."""
        self.s.memory.release(req)
        req.reset_for_retract()
        return True

    def requeue_retracted(self, reqs: List[Req]) -> None:
        # At the front: they arrived before anything still waiting.
        self.s.waiting_queue[0:0] = reqs

    # --- requests out ------------------------------------------------------------------------------
    def release(self, req: Req) -> None:
        """A finished or aborted request gives back what the role gave it (nothing here)."""

    def abort(self, hit: Callable[[Req], bool]) -> None:
        """Aborts the role's queued requests matching `hit` (none here)."""

    def all_reqs(self) -> List[Req]:
        return []

    def remove(self, req: Req) -> None:
        """Drops `req` from the role's queues (none here)."""

    def release_after_error(self, req: Req) -> None:
        """What a failed request holds in the role beyond its KV (what `release` frees, by default)."""
        self.release(req)

    def stats(self) -> Dict[str, Any]:
        return {}

    def log_fields(self, decode: bool) -> str:
        """The role's part of upstream's "Prefill batch." / "Decode batch." log lines."""
        return ""

    def close(self) -> None:
        """Stops the role's threads and sockets (transfer engines)."""
