"""Which cores a process's torch work runs on (CPU serving).

`SGLANG_CPU_OMP_THREADS_BIND` is upstream SGLang's variable: cores per tensor-parallel rank,
ranks separated by "|", each a list such as "0-3,8" ("0-1", "0|1"). A scheduler given cores is
pinned to them (CPU affinity) with one intra-op thread per core. Unset or "all": the process
keeps the cores it was started with and torch's thread count (OMP_NUM_THREADS, else one per
core). Processes that do no forwards (the HTTP/tokenizer process, the detokenizer) run one
thread: a full-width OpenMP pool in an idle process spins against the scheduler's.

`launch_pd` gives its prefill and decode servers their cores through this variable; servers
whose cores overlap take turns (`sglang.srt.utils.compute_turns`). With `--dp-size N` each
replica is one rank: group i of the variable, or, unset, an even share of the cores
(`replica_cores`).

Tensor parallelism (`tp_core_groups`): rank i on a node takes the i-th "|"-separated list; with
the variable unset the node's available cores are split evenly between its ranks (2 cores, 2
ranks: "0|1"), and each rank runs one torch thread per core it has.
"""

from __future__ import annotations

import logging
import os
from typing import List, Optional, Sequence

logger = logging.getLogger(__name__)

ENV = "SGLANG_CPU_OMP_THREADS_BIND"


def parse_core_list(text: str) -> List[int]:
    """'0-3,8' -> [0, 1, 2, 3, 8]."""
    cores: List[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()) or (hi and int(hi) < int(lo)):
            raise ValueError(f"{ENV}: {part!r} is not a core number or range (e.g. 0-3,8)")
        cores.extend(range(int(lo), int(hi or lo) + 1))
    if not cores:
        raise ValueError(f"{ENV}: an empty core list")
    return sorted(set(cores))


def available_cores() -> List[int]:
    return sorted(os.sched_getaffinity(0))


def cores_for_rank(spec: Optional[str], rank: int = 0) -> Optional[List[int]]:
    """The cores rank `rank` is given by `spec` (None: no binding asked for)."""
    if spec is None or spec.strip() in ("", "all"):
        return None
    groups = spec.split("|")
    if rank >= len(groups):
        raise ValueError(f"{ENV}={spec!r} names {len(groups)} rank(s); rank {rank} has none")
    cores = parse_core_list(groups[rank])
    missing = sorted(set(cores) - set(available_cores()))
    if missing:
        raise ValueError(f"{ENV}={spec!r}: cores {missing} are not available to this process "
                         f"(available: {available_cores()})")
    return cores


def replica_cores(dp_size: int) -> List[Optional[List[int]]]:
    """The cores of each data-parallel replica (`--dp-size`): rank i's group of
    `SGLANG_CPU_OMP_THREADS_BIND` when it names one group per replica ("|" between them);
    otherwise the cores of its one group (e.g. what `launch_pd` gives a server), or unset the
    cores this process may use, split evenly into contiguous blocks (the first replicas get one
    more when they do not divide). One replica and no variable: None (it keeps every core, as
    before). Raises ValueError when the replicas cannot each get a core."""
    spec = os.environ.get(ENV)
    named = spec is not None and spec.strip() not in ("", "all")
    groups = spec.split("|") if named else []
    if len(groups) > 1 or (named and dp_size == 1):
        if len(groups) < dp_size:
            raise ValueError(f"{ENV}={spec!r} names {len(groups)} core groups; --dp-size {dp_size} needs one "
                             f"per replica, separated by '|' (e.g. '0-3|4-7'), or a single list to split")
        return [cores_for_rank(spec, i) for i in range(dp_size)]
    if dp_size <= 1:
        return [None]
    cores = cores_for_rank(spec, 0) if named else available_cores()
    if len(cores) < dp_size:
        raise ValueError(f"--dp-size {dp_size} needs at least one CPU core per replica; this server may use "
                         f"{len(cores)} ({format_cores(cores)}). Lower --dp-size, or share cores on purpose with "
                         f"{ENV} (one group per replica, '|' between them).")
    base, extra = divmod(len(cores), dp_size)
    out, start = [], 0
    for i in range(dp_size):
        n = base + (1 if i < extra else 0)
        out.append(cores[start:start + n])
        start += n
    return out


def bind_scheduler(rank: int = 0, cores: Optional[List[int]] = None) -> str:
    """Pins this (scheduler) process to `cores`, or as `SGLANG_CPU_OMP_THREADS_BIND` says for
    `rank`; returns a log line."""
    import torch

    source = "given" if cores is not None else ENV
    if cores is None:
        cores = cores_for_rank(os.environ.get(ENV), rank)
    if cores is None:
        return f"CPU threads: {torch.get_num_threads()} (no {ENV}; cores {format_cores(available_cores())})"
    os.sched_setaffinity(0, cores)
    torch.set_num_threads(len(cores))
    return f"CPU threads: {len(cores)}, bound to cores {format_cores(cores)} ({source})"


def tp_core_groups(num_local_ranks: int, spec: Optional[str] = None) -> List[Optional[List[int]]]:
    """The cores of each of this node's TP ranks: from `SGLANG_CPU_OMP_THREADS_BIND` (one list per
    rank, "|" between them), else the available cores split evenly (None for a single rank that
    was given nothing: it keeps the process's cores)."""
    spec = os.environ.get(ENV) if spec is None else spec
    if spec is not None and spec.strip() not in ("", "all"):
        return [cores_for_rank(spec, i) for i in range(num_local_ranks)]
    if num_local_ranks <= 1:
        return [None]
    cores = available_cores()
    if len(cores) < num_local_ranks:  # fewer cores than ranks: they share, round robin
        return [[cores[i % len(cores)]] for i in range(num_local_ranks)]
    per = len(cores) // num_local_ranks
    return [cores[i * per:(i + 1) * per] for i in range(num_local_ranks)]


def bind_to_cores(cores: Optional[Sequence[int]]) -> str:
    """Pins this process to `cores` with one torch thread per core (None: unchanged); a log line."""
    import torch

    if cores is None:
        return f"CPU threads: {torch.get_num_threads()} (cores {format_cores(available_cores())})"
    os.sched_setaffinity(0, list(cores))
    torch.set_num_threads(len(cores))
    return f"CPU threads: {len(cores)}, bound to cores {format_cores(cores)}"


def one_thread() -> None:
    """For processes that do no forwards."""
    import torch

    torch.set_num_threads(1)


_OMP_PAUSES = None  # omp_pause_resource_all of every OpenMP runtime loaded (torch's, and any other)


def release_openmp_workers() -> bool:
    """Ends this process's idle OpenMP worker threads now (OpenMP 5.0's `omp_pause_resource_all`,
    soft); the next parallel region starts new ones. libgomp's workers spin ~4 ms after each region
    before they sleep (its GOMP_SPINCOUNT default), which a forward needs between its ops; after a
    forward on cores shared by turns that spin takes a core from the other scheduler's batch and
    from the HTTP, detokenizer and router processes (`compute_turns`). Every loaded runtime is
    asked (a runtime without a pool does nothing). False where none has that call or took it (one
    called inside a parallel region refuses)."""
    global _OMP_PAUSES
    if _OMP_PAUSES is None:
        _OMP_PAUSES = _find_omp_pauses()
    return any([pause(1) == 0 for pause in _OMP_PAUSES])  # 1: omp_pause_soft; a list: every one is called


def _find_omp_pauses() -> list:
    import ctypes

    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "/lib" in line and ("gomp" in line or "iomp" in line or "libomp" in line)}
    except OSError:
        return []
    found = []
    for path in sorted(paths):
        try:
            fn = ctypes.CDLL(path).omp_pause_resource_all  # the already loaded copy: same handle
        except (OSError, AttributeError):
            continue
        fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
        found.append(fn)
    return found


def cores_overlap(spec_a: str, spec_b: str) -> bool:
    """Whether two processes bound by these specs (one rank's list each, or "all") share a core."""
    def cores(spec: str) -> set:
        return set(available_cores()) if spec.strip() in ("", "all") else set(parse_core_list(spec))

    return bool(cores(spec_a) & cores(spec_b))


def format_cores(cores: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5' (the variable's syntax)."""
    cores = sorted(cores)
    parts, i = [], 0
    while i < len(cores):
        j = i
        while j + 1 < len(cores) and cores[j + 1] == cores[j] + 1:
            j += 1
        parts.append(str(cores[i]) if i == j else f"{cores[i]}-{cores[j]}")
        i = j + 1
    return ",".join(parts)
