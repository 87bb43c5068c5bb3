"""Starts the engine's processes: scheduler and detokenizer subprocesses, and the
TokenizerManager in this process. Shared by `Engine` and `launch_server`.

With `--dp-size N` it starts N scheduler replicas through the same `_start_scheduler`, each
with its index, its own input socket, cores (`utils/cpu_binding.replica_cores`) and load
report; the TokenizerManager's data-parallel controller dispatches to them
(`managers/data_parallel_controller.py`), and every replica pushes its outputs to the one
detokenizer. A replica that dies takes the server down as the one scheduler does.

Tensor parallelism (--tp-size N, docs/parallelism.md): N scheduler processes, one per rank
(`start_tp_ranks`, which takes one replica's placements: ranks, store address, cores). Rank 0 is
the scheduler the tokenizer talks to; the others run `managers/tp_group_worker.py` followers.
With --nnodes > 1 each node starts its own ranks (`tp_placements`); node 0 also runs the
tokenizer, detokenizer and HTTP server, the other nodes only their ranks (`run_nonzero_node`)."""

from __future__ import annotations

import logging
import multiprocessing as mp
import threading
from dataclasses import dataclass, field
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
    # `Process.is_alive` reaps with waitpid: when two threads ask at once (/health and
    # `watch_children`), the one that loses the race gets ECHILD, which multiprocessing reports
    # as "still alive". One lock makes the answer the same for every asker.
    _poll_lock: object = field(default_factory=threading.Lock, repr=False)

    def alive(self, among=None) -> bool:
        """Whether every child (or every one of `among`) is still running."""
        return self.dead_process(among) is None

    def dead_process(self, among=None):
        """(name, exit code) of a child (of `among`) that has exited, or None."""
        with self._poll_lock:
            for p in self.processes if among is None else among:
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
    from sglang.srt.model_loader.loader import check_model_servable, check_tp_servable
    from sglang.srt.server_args import PortArgs
    from sglang.srt.utils.heartbeat import Heartbeats

    internal_codec()  # a bad SGLANG_INTERNAL_SECRET fails here, before any process starts
    check_model_servable(server_args.model_path)  # a config we cannot serve: one line, nothing spawned
    check_tp_servable(server_args.model_path, server_args.tp_size)
    if server_args.node_rank != 0:
        raise ValueError("--node-rank > 0 runs only its TP ranks: start it with `python -m sglang.launch_server` "
                         "(an Engine serves from node 0)")
    replicas = plan_replicas(server_args)  # bad core groups for --dp-size: one line, nothing spawned
    port_args = PortArgs.init_new(server_args)
    bootstrap_server = _start_bootstrap_server(server_args)
    ctx = mp.get_context("spawn")
    procs = EngineProcesses(None, {}, [], port_args, bootstrap_server)
    try:
        tp = server_args.tp_size > 1
        placements = tp_placements(server_args, port_args) if tp else [None]  # TP (one replica): rank 0 here
        schedulers = [_start_scheduler(ctx, server_args, port_args, notify_parent, replica, placements[0])
                      for replica in replicas]
        followers = start_tp_ranks(server_args, port_args, placements[1:], ctx, notify_parent) if tp else []
        procs.processes += [s.process for s in schedulers] + [p for p, _ in followers]
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
        if tp:  # every rank at once: one that cannot join fails the start in bounded time
            ready = _wait_all_ready([(s.ready, s.process, s.process.name.replace("sglang::", "")) for s in schedulers]
                                    + [(r, p, p.name.replace("sglang::", "")) for p, r in followers])
            infos = [msg.info for msg in ready[:len(schedulers)]]
        else:
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
        server_args, port_args, procs.scheduler_info, is_scheduler_alive=lambda: procs.alive(sched_procs),
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


def _start_scheduler(ctx, server_args, port_args, notify_parent: bool, replica, placement=None) -> StartedScheduler:
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
                       args=(server_args, port_args, ready_w, notify_parent, heartbeat, replica, placement),
                       name=name, daemon=True)
    proc.start()
    return StartedScheduler(proc, ready_r, heartbeat, replica)


def tp_placements(server_args, port_args=None, node_rank=None, core_groups=None, init_addr=None):
    """This node's TP ranks (`TpPlacement`s): --tp-size / --nnodes of them, from rank
    node_rank * that; the group meets at `init_addr`, else --dist-init-addr, else on this host at
    the nccl port; cores from `core_groups` (one list per local rank), else
    SGLANG_CPU_OMP_THREADS_BIND ("|" between this node's ranks) or split evenly
    (utils/cpu_binding.py tp_core_groups). A single rank without `core_groups`: one placement
    with no cores (the scheduler binds itself as before). A data-parallel controller passes each
    replica its own cores and store address."""
    from sglang.srt.managers.tp_worker import TpPlacement
    from sglang.srt.utils.cpu_binding import tp_core_groups

    tp, nnodes = int(server_args.tp_size), int(server_args.nnodes)
    node = int(server_args.node_rank if node_rank is None else node_rank)
    if tp == 1:
        return [TpPlacement(cores=core_groups[0] if core_groups else None)]
    per_node = tp // nnodes
    addr = init_addr or server_args.dist_init_addr
    if not addr:
        port = port_args.nccl_port if port_args is not None else server_args.nccl_port
        addr = f"127.0.0.1:{port}"
    if core_groups is not None:
        cores = list(core_groups)
    else:
        cores = tp_core_groups(per_node) if (server_args.device or "cpu") == "cpu" else [None] * per_node
    return [TpPlacement(rank=node * per_node + i, size=tp, init_addr=addr, cores=cores[i], local_rank=i)
            for i in range(per_node)]


def start_tp_ranks(server_args, port_args, placements, ctx, notify_parent: bool = False, heartbeat=None) -> list:
    """Starts one process per placement: rank 0 is the scheduler (it serves `port_args`' sockets),
    any other rank a follower. Returns [(process, ready pipe)] in the placements' order; the
    processes have started (not yet joined their group: wait on the pipes)."""
    from sglang.srt.managers.scheduler_process import run_scheduler_process
    from sglang.srt.managers.tp_group_worker import run_tp_follower_process

    out = []
    for placement in placements:
        reader, writer = ctx.Pipe(duplex=False)
        if placement.rank == 0:
            proc = ctx.Process(target=run_scheduler_process,
                               args=(server_args, port_args, writer, notify_parent, heartbeat, None, placement),
                               name="sglang::scheduler", daemon=True)
        else:
            proc = ctx.Process(target=run_tp_follower_process, args=(server_args, placement, writer, notify_parent),
                               name=f"sglang::scheduler_TP{placement.rank}", daemon=True)
        proc.start()
        out.append((proc, reader))
    return out


def run_nonzero_node(server_args) -> int:
    """--node-rank > 0: starts this node's TP ranks and waits on them (no tokenizer, detokenizer
    or API: node 0 serves). As upstream, --host:--port answers only `GET /health` and
    `/health_generate` (200 while this node's ranks run, 503 otherwise) for orchestrators. Returns
    the exit code: 0 when the ranks were stopped cleanly, else non-zero, with the failing rank
    named in the log."""
    import time

    from sglang.srt.model_loader.loader import check_model_servable, check_tp_servable

    check_model_servable(server_args.model_path)
    check_tp_servable(server_args.model_path, server_args.tp_size)
    ctx = mp.get_context("spawn")
    ranks = start_tp_ranks(server_args, None, tp_placements(server_args), ctx, notify_parent=False)
    procs = [p for p, _ in ranks]
    health = None
    try:
        _wait_all_ready([(r, p, p.name) for p, r in ranks])
        lock = threading.Lock()  # is_alive reaps: one asker at a time (see EngineProcesses._poll_lock)

        def ranks_alive() -> bool:
            with lock:
                return all(p.is_alive() for p in procs)

        health = _node_health_server(server_args.host, server_args.port, ranks_alive)
        logger.info(f"Node {server_args.node_rank}: TP ranks {[p.name for p in procs]} joined the group at "
                    f"{server_args.dist_init_addr}; node 0 serves HTTP. Waiting on the ranks.")
        while ranks_alive():
            time.sleep(0.2)
        with lock:
            dead = next(p for p in procs if not p.is_alive())
        code = dead.exitcode
        if code:
            logger.error(f"Node {server_args.node_rank}: {dead.name} exited with code {code}; stopping this node.")
        return 1 if code else 0
    except Exception as e:  # noqa: BLE001 - one line, then the exit code
        logger.error(f"Node {server_args.node_rank} failed to start: {e}")
        return 1
    finally:
        if health is not None:
            health.shutdown()
            health.server_close()
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()


def _node_health_server(host: str, port: int, healthy):
    """A thread serving GET /health and /health_generate on a node other than 0 (nothing else)."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            if self.path.split("?")[0] not in ("/health", "/health_generate"):
                self.send_error(404, "node 0 serves the API")
                return
            ok = healthy()
            self.send_response(200 if ok else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):  # probes are not worth a log line
            pass

    server = http.server.ThreadingHTTPServer((host or "127.0.0.1", int(port)), Handler)
    threading.Thread(target=server.serve_forever, name="sglang-node-health", daemon=True).start()
    return server


def _wait_all_ready(waits) -> list:
    """[(pipe, process, name)] -> their ready messages; raises as soon as one fails or dies (a
    TP rank that cannot join its group fails in bounded time, and says so on its pipe)."""
    results = [None] * len(waits)
    pending = set(range(len(waits)))
    while pending:
        for i in sorted(pending):
            pipe, proc, name = waits[i]
            if pipe.poll(timeout=0.1):
                msg = pipe.recv()
                if isinstance(msg, dict) and "error" in msg:
                    raise RuntimeError(f"The {name} process failed to start:\n{msg['error']}")
                results[i] = msg
                pending.discard(i)
            elif not proc.is_alive():
                raise RuntimeError(f"The {name} process exited during start-up (exit code {proc.exitcode}). "
                                   "Check the log above.")
    return results


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
