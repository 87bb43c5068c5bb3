"""Starts the engine's processes: scheduler and detokenizer subprocesses, and the
TokenizerManager in this process. Shared by `Engine` and `launch_server`."""

from __future__ import annotations

import logging
import multiprocessing as mp
from dataclasses import dataclass
from typing import List

logger = logging.getLogger(__name__)


@dataclass
class EngineProcesses:
    tokenizer_manager: object
    scheduler_info: dict
    processes: List[mp.Process]
    port_args: object

    def alive(self) -> bool:
        return all(p.is_alive() for p in self.processes)

    def shutdown(self, timeout: float = 5.0) -> None:
        from sglang.srt.utils.process import kill_process_tree

        for p in self.processes:
            if p.is_alive():
                kill_process_tree(p.pid, include_parent=True, timeout=timeout)
        for p in self.processes:
            p.join(timeout=timeout)
        self.processes = []
        _remove_ipc_files(self.port_args)


def _remove_ipc_files(port_args) -> None:
    import os

    for name in ("tokenizer_ipc_name", "scheduler_input_ipc_name", "detokenizer_ipc_name", "rpc_ipc_name", "metrics_ipc_name"):
        val = getattr(port_args, name, None)
        if isinstance(val, str) and val.startswith("ipc://"):
            try:
                os.unlink(val[len("ipc://") :])
            except OSError:
                pass


def launch_engine_processes(server_args) -> EngineProcesses:
    from sglang.srt.managers.detokenizer_manager import run_detokenizer_process
    from sglang.srt.managers.scheduler_process import run_scheduler_process
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.server_args import PortArgs

    port_args = PortArgs.init_new(server_args)
    ctx = mp.get_context("spawn")
    sched_r, sched_w = ctx.Pipe(duplex=False)
    detok_r, detok_w = ctx.Pipe(duplex=False)
    scheduler = ctx.Process(target=run_scheduler_process, args=(server_args, port_args, sched_w), name="sglang::scheduler", daemon=True)
    detok = ctx.Process(target=run_detokenizer_process, args=(server_args, port_args, detok_w), name="sglang::detokenizer", daemon=True)
    scheduler.start()
    detok.start()
    procs = EngineProcesses(None, {}, [scheduler, detok], port_args)
    try:
        info = _wait_ready(sched_r, scheduler, "scheduler")
        _wait_ready(detok_r, detok, "detokenizer")
    except Exception:
        procs.shutdown()
        raise
    procs.scheduler_info = info.info
    procs.tokenizer_manager = TokenizerManager(server_args, port_args, info.info, is_scheduler_alive=scheduler.is_alive)
    return procs


def _wait_ready(pipe, proc, name: str):
    while not pipe.poll(timeout=1.0):
        if not proc.is_alive():
            raise RuntimeError(f"The {name} process exited during start-up (exit code {proc.exitcode}). Check the log above.")
    msg = pipe.recv()
    if isinstance(msg, dict) and "error" in msg:
        raise RuntimeError(f"The {name} process failed to start:\n{msg['error']}")
    return msg
