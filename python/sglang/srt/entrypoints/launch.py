"""Starts the engine's processes: scheduler and detokenizer subprocesses, and the
TokenizerManager in this process. Shared by `Engine` and `launch_server`.

With `--dp-size N` it starts N scheduler replicas through the same `_start_scheduler`, each
with its index, its own input socket, cores (`utils/cpu_binding.replica_cores`) and load
report; the TokenizerManager's data-parallel controller dispatches to them
(`managers/data_parallel_controller.py`), and every replica pushes its outputs to the one
detokenizer. A replica that dies takes the server down as the one scheduler does."""

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
    # utils/heartbeat.py: the scheduler loop's, in shared memory (read by /health); with --dp-size,
    # every replica's (`Heartbeats`: the oldest counts)
    heartbeat: object = None

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
    from sglang.srt.managers.tokenizer_loading import load_tokenizer
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.managers.internal_channel import internal_codec
    from sglang.srt.model_loader.loader import check_model_servable
    from sglang.srt.server_args import PortArgs
    from sglang.srt.utils.heartbeat import Heartbeats

    internal_codec()  # a bad SGLANG_INTERNAL_SECRET fails here, before any process starts
    check_model_servable(server_args.model_path)  # a config we cannot serve: one line, nothing spawned
    replicas = plan_replicas(server_args)  # bad core groups for --dp-size: one line, nothing spawned
    port_args = PortArgs.init_new(server_args)
    bootstrap_server = _start_bootstrap_server(server_args)
    ctx = mp.get_context("spawn")
    procs = EngineProcesses(None, {}, [], port_args, bootstrap_server)
    try:
        schedulers = [_start_scheduler(ctx, server_args, port_args, notify_parent, replica) for replica in replicas]
        procs.processes += [s.process for s in schedulers]
        heartbeats = [s.heartbeat for s in schedulers]
        procs.heartbeat = heartbeats[0] if len(heartbeats) == 1 else Heartbeats(heartbeats)
        # Loaded once here, while the schedulers load the model; the detokenizer gets a copy.
        tokenizer = None if server_args.skip_tokenizer_init else load_tokenizer(server_args)
        detok_r, detok_w = ctx.Pipe(duplex=False)
        detok = ctx.Process(target=run_detokenizer_process, args=(server_args, port_args, detok_w, notify_parent,
                                                                  tokenizer),
                            name="sglang::detokenizer", daemon=True)
        detok.start()
        procs.processes.append(detok)
        infos = [_wait_ready(s.ready, s.process, s.process.name.replace("sglang::", "")).info for s in schedulers]
        _wait_ready(detok_r, detok, "detokenizer")
    except Exception:
        procs.shutdown()
        raise
    procs.scheduler_info = dict(infos[0])
    if len(infos) > 1:  # each replica's pools: /server_info reports them one by one and summed
        procs.scheduler_info["dp_size"] = len(infos)
        procs.scheduler_info["replica_max_total_num_tokens"] = [i["max_total_num_tokens"] for i in infos]
    if notify_parent:  # a server's own process does no forwards (an Engine host keeps its settings)
        from sglang.srt.utils.cpu_binding import one_thread

        one_thread()
    sched_procs = [s.process for s in schedulers]
    procs.tokenizer_manager = TokenizerManager(
        server_args, port_args, procs.scheduler_info, is_scheduler_alive=lambda: all(p.is_alive() for p in sched_procs),
        tokenizer=tokenizer, replica_loads=[s.replica.load for s in schedulers] if len(schedulers) > 1 else None)
    return procs


@dataclass
class StartedScheduler:
    process: mp.Process
    ready: object  # the pipe it reports SchedulerReady (or its start-up error) on
    heartbeat: object
    replica: object  # its ReplicaSlot


def plan_replicas(server_args) -> list:
    """One `ReplicaSlot` per data-parallel replica (`--dp-size`): its input socket and, on CPU, its cores."""
    from sglang.srt.managers.scheduler_process import ReplicaSlot

    dp_size = max(int(server_args.dp_size or 1), 1)
    cores = [None] * dp_size
    if server_args.device == "cpu" and dp_size > 1:
        from sglang.srt.utils.cpu_binding import replica_cores

        cores = replica_cores(dp_size)
    return [ReplicaSlot(dp_rank=i, cores=cores[i]) for i in range(dp_size)]


def _start_scheduler(ctx, server_args, port_args, notify_parent: bool, replica) -> StartedScheduler:
    """Starts one scheduler process: the only one, or data-parallel replica `replica.dp_rank`
    with its own input socket, cores and load report."""
    from sglang.srt.managers.data_parallel_controller import replica_input_names
    from sglang.srt.managers.replica_load import ReplicaLoad
    from sglang.srt.managers.scheduler_process import run_scheduler_process
    from sglang.srt.utils.heartbeat import Heartbeat

    dp_size = max(int(server_args.dp_size or 1), 1)
    heartbeat = Heartbeat(ctx)
    name = "sglang::scheduler"
    if dp_size > 1:
        replica.input_ipc_name = replica_input_names(port_args.scheduler_input_ipc_name, dp_size)[replica.dp_rank]
        replica.load = ReplicaLoad(ctx)
        replica.count_tokens = server_args.load_balance_method == "total_tokens"
        name = f"sglang::scheduler_DP{replica.dp_rank}"  # upstream's process name
    ready_r, ready_w = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=run_scheduler_process,
                       args=(server_args, port_args, ready_w, notify_parent, heartbeat, replica),
                       name=name, daemon=True)
    proc.start()
    return StartedScheduler(proc, ready_r, heartbeat, replica)


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
