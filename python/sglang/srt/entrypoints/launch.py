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
    bootstrap_server: object = None  # PD prefill: where decode servers find this server's KV ranks
    heartbeat: object = None  # utils/heartbeat.py: the scheduler loop's, in shared memory (read by /health)

    def alive(self) -> bool:
        return all(p.is_alive() for p in self.processes)

    def dead_process(self):
        """(name, exit code) of a child that has exited, or None."""
        for p in self.processes:
            if not p.is_alive():
                return p.name, p.exitcode
        return None

    def shutdown(self, timeout: float = 5.0) -> None:
        """SIGTERM to every child (they exit cleanly), SIGKILL to what is left after `timeout`;
        when this returns no engine process is left."""
        import psutil

        procs = []
        for p in self.processes:
            try:
                root = psutil.Process(p.pid)
                procs += root.children(recursive=True) + [root]
            except psutil.NoSuchProcess:
                pass
        for proc in procs:
            try:
                proc.terminate()
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(procs, timeout=timeout)
        for proc in alive:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=timeout)
        for p in self.processes:
            p.join(timeout=timeout)
        self.processes = []
        if self.bootstrap_server is not None:
            self.bootstrap_server.close()
            self.bootstrap_server = None
        _remove_ipc_files(self.port_args)


def _remove_ipc_files(port_args) -> None:
    """The socket files and the server's private ipc directory (`PortArgs.ipc_dir`)."""
    import os
    import shutil

    for name in ("tokenizer_ipc_name", "scheduler_input_ipc_name", "detokenizer_ipc_name", "rpc_ipc_name",
                 "metrics_ipc_name", "tokenizer_worker_ipc_name", "load_collector_ipc_name"):
        val = getattr(port_args, name, None)
        if isinstance(val, str) and val.startswith("ipc://"):
            try:
                os.unlink(val[len("ipc://") :])
            except OSError:
                pass
    if getattr(port_args, "ipc_dir", ""):
        shutil.rmtree(port_args.ipc_dir, ignore_errors=True)


def launch_engine_processes(server_args, notify_parent: bool = False) -> EngineProcesses:
    """`notify_parent`: children send SIGQUIT to this process on a fatal error (a server, which
    handles it); an `Engine` host watches its children instead."""
    from sglang.srt.managers.detokenizer_manager import run_detokenizer_process
    from sglang.srt.managers.scheduler_process import run_scheduler_process
    from sglang.srt.managers.tokenizer_loading import load_tokenizer
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.managers.internal_channel import internal_codec
    from sglang.srt.model_loader.loader import check_model_servable
    from sglang.srt.server_args import PortArgs
    from sglang.srt.utils.heartbeat import Heartbeat

    internal_codec()  # a bad SGLANG_INTERNAL_SECRET fails here, before any process starts
    check_model_servable(server_args.model_path)  # a config we cannot serve: one line, nothing spawned
    port_args = PortArgs.init_new(server_args)
    bootstrap_server = _start_bootstrap_server(server_args)
    ctx = mp.get_context("spawn")
    heartbeat = Heartbeat(ctx)
    sched_r, sched_w = ctx.Pipe(duplex=False)
    detok_r, detok_w = ctx.Pipe(duplex=False)
    scheduler = ctx.Process(target=run_scheduler_process, args=(server_args, port_args, sched_w, notify_parent, heartbeat),
                            name="sglang::scheduler", daemon=True)
    scheduler.start()
    procs = EngineProcesses(None, {}, [scheduler], port_args, bootstrap_server, heartbeat)
    try:
        # Loaded once here, while the scheduler loads the model; the detokenizer gets a copy.
        tokenizer = None if server_args.skip_tokenizer_init else load_tokenizer(server_args)
        detok = ctx.Process(target=run_detokenizer_process, args=(server_args, port_args, detok_w, notify_parent,
                                                                  tokenizer),
                            name="sglang::detokenizer", daemon=True)
        detok.start()
        procs.processes.append(detok)
        info = _wait_ready(sched_r, scheduler, "scheduler")
        _wait_ready(detok_r, detok, "detokenizer")
    except Exception:
        procs.shutdown()
        raise
    procs.scheduler_info = info.info
    if notify_parent:  # a server's own process does no forwards (an Engine host keeps its settings)
        from sglang.srt.utils.cpu_binding import one_thread

        one_thread()
    procs.tokenizer_manager = TokenizerManager(server_args, port_args, info.info, is_scheduler_alive=scheduler.is_alive,
                                               tokenizer=tokenizer)
    return procs


def _start_bootstrap_server(server_args):
    """A PD prefill server runs the bootstrap HTTP server in this (main) process, as upstream;
    it must be up before the scheduler's KV manager registers with it."""
    if server_args.disaggregation_mode != "prefill":
        return None
    from sglang.srt.disaggregation.transfer_backends import KVClassType, get_kv_class

    server_cls = get_kv_class(server_args.disaggregation_transfer_backend, KVClassType.BOOTSTRAP_SERVER)
    if server_cls is None:  # the fake backend has none
        return None
    host = server_args.host if server_args.host not in ("", "0.0.0.0") else "0.0.0.0"
    return server_cls(host=host, port=server_args.disaggregation_bootstrap_port)


def _wait_ready(pipe, proc, name: str):
    while not pipe.poll(timeout=1.0):
        if not proc.is_alive():
            raise RuntimeError(f"The {name} process exited during start-up (exit code {proc.exitcode}). Check the log above.")
    msg = pipe.recv()
    if isinstance(msg, dict) and "error" in msg:
        raise RuntimeError(f"The {name} process failed to start:\n{msg['error']}")
    return msg
