"""The scheduler subprocess: ZMQ in, `Scheduler.step()`, ZMQ out."""

from __future__ import annotations

import logging
import traceback

from sglang.srt.managers.io_struct import (
    AbortReq,
    FlushCacheReqInput,
    FlushCacheReqOutput,
    GetInternalStateReq,
    GetInternalStateReqOutput,
    SchedulerReady,
    TokenizedGenerateReqInput,
)

logger = logging.getLogger(__name__)


class SchedulerLoop:
    def __init__(self, scheduler, port_args):
        import zmq

        self.scheduler = scheduler
        self.ctx = zmq.Context(2)
        self.recv_from_tokenizer = self.ctx.socket(zmq.PULL)
        self.recv_from_tokenizer.bind(port_args.scheduler_input_ipc_name)
        # Outputs and control replies both go through the detokenizer, which keeps them in order.
        self.send_to_detokenizer = self.ctx.socket(zmq.PUSH)
        self.send_to_detokenizer.connect(port_args.detokenizer_ipc_name)
        self.poller = zmq.Poller()
        self.poller.register(self.recv_from_tokenizer, zmq.POLLIN)

    def recv_requests(self, block: bool) -> list:
        import zmq

        msgs = []
        if block:
            self.poller.poll(timeout=1000)
        while True:
            try:
                msgs.append(self.recv_from_tokenizer.recv_pyobj(zmq.NOBLOCK))
            except zmq.Again:
                return msgs

    def handle(self, msg) -> None:
        s = self.scheduler
        if isinstance(msg, list):
            for m in msg:
                self.handle(m)
        elif isinstance(msg, TokenizedGenerateReqInput):
            s.add_request(msg)
        elif isinstance(msg, AbortReq):
            s.abort_request(msg.rid, msg.abort_all)
        elif isinstance(msg, FlushCacheReqInput):
            self.send_to_detokenizer.send_pyobj(FlushCacheReqOutput(success=s.flush_cache()))
        elif isinstance(msg, GetInternalStateReq):
            self.send_to_detokenizer.send_pyobj(GetInternalStateReqOutput(internal_state=s.internal_state()))
        else:
            logger.warning("Scheduler got an unknown message: %r", type(msg))

    def run_forever(self) -> None:
        s = self.scheduler
        while True:
            for msg in self.recv_requests(block=not s.has_work()):
                self.handle(msg)
            outs = s.step() if s.has_work() else s.step_idle()
            for out in outs:
                if out.rids:
                    self.send_to_detokenizer.send_pyobj(out)


def run_scheduler_process(server_args, port_args, ready_pipe) -> None:
    from sglang.srt.utils.process import configure_subprocess

    configure_subprocess("scheduler", server_args, torch_threads=0)
    try:
        from sglang.srt.managers.scheduler import Scheduler

        scheduler = Scheduler(server_args)
        loop = SchedulerLoop(scheduler, port_args)
        ready_pipe.send(SchedulerReady(info=scheduler.ready_info()))
    except Exception:
        msg = traceback.format_exc()
        logger.error("Scheduler failed to start:\n%s", msg)
        ready_pipe.send({"error": msg})
        return
    try:
        loop.run_forever()
    except Exception:
        logger.error("Scheduler hit an exception:\n%s", traceback.format_exc())
        raise
