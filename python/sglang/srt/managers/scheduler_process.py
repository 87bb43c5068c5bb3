"""(Scheduler process.) ZMQ in, `Scheduler.step()`, ZMQ out -- and what happens when something fails.

Containment: an exception caused by one message (a request the scheduler cannot add, a control
message it cannot answer) fails that request or that reply, not the loop; an exception inside a
step aborts the requests of the batch that was running (HTTP 500 with the reason) and frees
their memory (`Scheduler.recover_from_step_error`), and the loop goes on. A fault that keeps
coming back (`SGLANG_SCHEDULER_MAX_CONSECUTIVE_ERRORS` failed steps in a row, default 8) or that
recovery itself cannot handle is fatal: the traceback is logged, the parent process is told with
SIGQUIT (as upstream), and the process exits non-zero, so the whole server goes down instead of
staying half alive.

Liveness: every turn of the loop ticks a heartbeat in shared memory (`utils/heartbeat.py`) that
`/health` reads without going through this process (503 when it is older than
`SGLANG_HEALTH_CHECK_TIMEOUT`), and that the watchdog reads (`--watchdog-timeout`: one turn, i.e.
one whole step, running longer takes the server down). Idle, the loop turns at least once a
second. Test hook: with `SGLANG_TEST_SCHEDULER_STALL_FILE=path` set, the loop sleeps at the start
of a turn for as long as that file exists (a stuck step, made from outside).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
import traceback
from typing import List, Optional

from sglang.srt.managers.replica_load import ReplicaLoad
from sglang.srt.distributed.parallel_state import TpPeerError
from sglang.srt.utils.heartbeat import Heartbeat
from sglang.srt.utils.process import notify_parent_and_exit
from sglang.srt.managers.internal_channel import bind_private, recv_msg, send_msg
from sglang.srt.managers.io_struct import (
    AbortReq,
    FlushCacheReqInput,
    FlushCacheReqOutput,
    GetInternalStateReq,
    GetInternalStateReqOutput,
    RejectedRequest,
    SchedulerReady,
    TokenizedGenerateReqInput,
)

logger = logging.getLogger(__name__)


def _max_consecutive_errors() -> int:
    return max(int(os.environ.get("SGLANG_SCHEDULER_MAX_CONSECUTIVE_ERRORS", "8")), 1)


class SchedulerLoop:
    IDLE_STEP_WAIT_MS = 1

    STALL_POLL_S = 0.05

    def __init__(self, scheduler, port_args, heartbeat: Heartbeat = None, replica: "ReplicaSlot" = None):
        import zmq

        self.scheduler = scheduler
        self.heartbeat = heartbeat if heartbeat is not None else Heartbeat()
        self.heartbeat.tick()
        self.replica = replica if replica is not None else ReplicaSlot()
        self.count_load_tokens = self.replica.load is not None and self.replica.count_tokens
        self.received_reqs = 0  # requests taken in so far (reported to the data-parallel controller)
        self.received_tokens = 0
        self.stall_file = os.environ.get("SGLANG_TEST_SCHEDULER_STALL_FILE") or None
        self.ctx = zmq.Context(2)
        self.recv_from_tokenizer = self.ctx.socket(zmq.PULL)
        bind_private(self.recv_from_tokenizer, self.replica.input_ipc_name or port_args.scheduler_input_ipc_name)
        # Outputs and control replies both go through the detokenizer, which keeps them in order.
        self.send_to_detokenizer = self.ctx.socket(zmq.PUSH)
        self.send_to_detokenizer.connect(port_args.detokenizer_ipc_name)
        self.poller = zmq.Poller()
        self.poller.register(self.recv_from_tokenizer, zmq.POLLIN)
        self.consecutive_errors = 0
        self.forward_ct_seen = -1  # the scheduler's forward count before the last step
        scheduler.send_outputs = self.send_outputs
        scheduler.take_messages = self.take_messages

    def recv_requests(self, wait_ms: int = 0) -> list:
        """Messages from the tokenizer, waiting up to `wait_ms` for the first (0: none)."""
        import zmq

        msgs = []
        if wait_ms > 0:
            self.poller.poll(timeout=wait_ms)
        while True:
            try:
                msg = recv_msg(self.recv_from_tokenizer, "scheduler input", zmq.NOBLOCK)
            except zmq.Again:
                return msgs
            if msg is not None:  # None: a frame that is not one of our messages, dropped
                msgs.append(msg)

    def take_messages(self) -> None:
        """Handles every message waiting now (the scheduler calls it mid-step, after waiting for its turn)."""
        for msg in self.recv_requests():
            self.handle(msg)

    def handle(self, msg) -> None:
        if isinstance(msg, list):
            for m in msg:
                self.handle(m)
            return
        try:
            self._dispatch(msg)
        except Exception as e:  # noqa: BLE001 - one message must not stop the loop
            logger.exception("Scheduler failed to handle a %s", type(msg).__name__)
            self._fail_message(msg, e)

    def _dispatch(self, msg) -> None:
        s = self.scheduler
        if isinstance(msg, TokenizedGenerateReqInput):
            self.received_reqs += 1
            self.received_tokens += len(msg.input_ids)
            s.add_request(msg)
        elif isinstance(msg, AbortReq):
            s.abort_request(msg.rid, msg.abort_all)
        elif isinstance(msg, RejectedRequest):
            s.reject_rooms(msg.bootstrap_host, msg.bootstrap_port, msg.bootstrap_rooms, msg.message, msg.status_code)
        elif isinstance(msg, FlushCacheReqInput):
            send_msg(self.send_to_detokenizer, FlushCacheReqOutput(success=s.flush_cache(), dp_rank=self.replica.dp_rank))
        elif isinstance(msg, GetInternalStateReq):
            state = {**s.internal_state(), "dp_rank": self.replica.dp_rank, "pid": os.getpid(),
                     "num_requests_received": self.received_reqs}
            send_msg(self.send_to_detokenizer, GetInternalStateReqOutput(internal_state=state, dp_rank=self.replica.dp_rank))
        else:
            logger.warning("Scheduler got an unknown message: %r", type(msg))

    def _fail_message(self, msg, exc: Exception) -> None:
        s = self.scheduler
        if isinstance(msg, TokenizedGenerateReqInput):
            s.reject_request(msg, f"Internal server error while adding the request: {type(exc).__name__}: {exc}")
        elif isinstance(msg, FlushCacheReqInput):
            send_msg(self.send_to_detokenizer, FlushCacheReqOutput(success=False, dp_rank=self.replica.dp_rank))
        elif isinstance(msg, GetInternalStateReq):
            send_msg(self.send_to_detokenizer, GetInternalStateReqOutput(internal_state={"error": repr(exc)},
                                                                         dp_rank=self.replica.dp_rank))

    def _wait_ms(self) -> int:
        """How long to wait for a message before the next step: up to a second with nothing to do;
        a moment (`IDLE_STEP_WAIT_MS`) when the last step ran no forward, i.e. the work there is
        waits on something outside (a KV transfer, a bootstrap, a grammar): spinning on it would
        take a core from whoever computes (the other PD server on shared cores, the transfer
        threads; on shared cores it first waits for the other's batch to end, `run_once`); none
        right after a forward."""
        s = self.scheduler
        if not s.has_work():
            return 1000
        return self.IDLE_STEP_WAIT_MS if s.forward_ct == self.forward_ct_seen else 0

    def _stall_for_tests(self) -> None:
        if self.stall_file is None:
            return
        while os.path.exists(self.stall_file):
            time.sleep(self.STALL_POLL_S)

    def run_once(self) -> None:
        self.heartbeat.tick()
        self._stall_for_tests()
        s = self.scheduler
        wait_ms = self._wait_ms()
        if wait_ms == self.IDLE_STEP_WAIT_MS and s.turns.wait_while_busy():
            wait_ms = 0  # the other scheduler's batch ended: what this one waits on may be here
        self.forward_ct_seen = s.forward_ct
        for msg in self.recv_requests(wait_ms):
            self.handle(msg)
        try:
            outs = s.step() if s.has_work() else s.take_outputs()
            self.consecutive_errors = 0
        except TpPeerError:  # the TP ranks are out of step: nothing to contain
            raise
        except Exception as e:  # noqa: BLE001 - contained below, or fatal after too many
            self.consecutive_errors += 1
            logger.error("Scheduler step failed (%d in a row); aborting the batch's requests:\n%s",
                         self.consecutive_errors, traceback.format_exc())
            if self.consecutive_errors >= _max_consecutive_errors():
                raise
            s.recover_from_step_error(e)
            outs = s.take_outputs()
        self.send_outputs(outs)
        self.publish_load()
        s.worker.keep_alive()  # TP: the other ranks hear from rank 0 at least once a second

    def publish_load(self) -> None:
        """What the data-parallel controller's shortest-queue dispatch reads (`replica_load.py`)."""
        load = self.replica.load
        if load is None:
            return
        reqs, tokens = self.scheduler.load(count_tokens=self.count_load_tokens)
        load.publish(reqs, tokens, self.received_reqs, self.received_tokens)

    def send_outputs(self, outs) -> None:
        for out in outs:
            if out.rids:
                send_msg(self.send_to_detokenizer, out)

    def run_forever(self) -> None:
        while True:
            self.run_once()


@dataclasses.dataclass
class ReplicaSlot:
    """Which data-parallel replica a scheduler process is (`--dp-size`; one replica: the defaults)."""

    dp_rank: int = 0
    input_ipc_name: Optional[str] = None  # its own input socket (None: the server's)
    cores: Optional[List[int]] = None  # the cores its forwards own (None: SGLANG_CPU_OMP_THREADS_BIND, else all)
    load: Optional[ReplicaLoad] = None  # where it reports its queue (None: one replica, nobody reads it)
    count_tokens: bool = False  # whether the dispatch reads the queue's tokens (total_tokens)

    def log_prefix(self, dp_size: int) -> str:
        return "scheduler" if dp_size <= 1 else f"scheduler DP{self.dp_rank}"


def run_scheduler_process(server_args, port_args, ready_pipe, notify_parent: bool = False,
                          heartbeat: Heartbeat = None, replica: ReplicaSlot = None, placement=None) -> None:
    """`notify_parent`: the parent is a server that handles SIGQUIT (an `Engine` host process is not).
    `heartbeat`: the shared value the launcher reads (a private one when None). `replica`: which
    data-parallel replica this is (None: the only one). `placement` (managers/tp_worker.py
    TpPlacement): under tensor parallelism this is rank 0 of its group, bound to its cores."""
    from sglang.srt.utils.process import configure_subprocess

    replica = replica if replica is not None else ReplicaSlot()
    configure_subprocess(replica.log_prefix(server_args.dp_size), server_args, torch_threads=0)
    try:
        from sglang.srt.managers.scheduler import Scheduler

        if server_args.device == "cpu":  # the cores this scheduler's forwards own
            from sglang.srt.utils.cpu_binding import bind_scheduler, bind_to_cores

            tp = placement is not None and placement.size > 1
            logger.info(bind_to_cores(placement.cores) if tp else bind_scheduler(rank=replica.dp_rank, cores=replica.cores))

        scheduler = Scheduler(server_args, dp_rank=replica.dp_rank, placement=placement)
        if server_args.device == "cpu":  # after loading and pool sizing: what loading freed goes back
            from sglang.srt.utils.host_memory import keep_freed_memory

            logger.info(keep_freed_memory())
            if scheduler.turns.enabled:
                logger.info(scheduler.turns.describe())
        loop = SchedulerLoop(scheduler, port_args, heartbeat, replica)
        ready_pipe.send(SchedulerReady(info=scheduler.ready_info()))
    except Exception:
        msg = traceback.format_exc()
        logger.error("Scheduler failed to start:\n%s", msg)
        ready_pipe.send({"error": msg})
        return
    from sglang.srt.managers.watchdog import SchedulerWatchdog

    SchedulerWatchdog.start_for(loop.heartbeat, server_args, notify_parent)
    try:
        loop.run_forever()
    except SystemExit:  # SIGTERM from the parent: a normal shutdown
        from sglang.srt.utils.process import exit_after_cleanup

        getattr(scheduler.worker, "stop_followers", lambda: None)()  # TP: the other ranks exit too
        loop.ctx.destroy(linger=0)
        exit_after_cleanup(0)
    except BaseException:  # noqa: BLE001 - fatal: say so, tell the parent, exit non-zero
        logger.error("Scheduler hit an exception: %s", traceback.format_exc())
        notify_parent_and_exit(1, notify_parent)
