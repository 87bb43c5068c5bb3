"""Up to how many rows `sgl_kernel.linear` takes a CPU linear (decode) before oneDNN does: measured
once per machine, model shapes and thread count, then kept.

The crossover differs between machines by up to 8x (benchmark/RESULTS.md), so it is timed on the
model's own weights with the scheduler's threads. The two paths round the last bits of a sum
differently, so the choice is also part of what a seeded request samples: measuring it afresh at
every start made `--random-seed` runs differ between processes on a busy machine. Hence the
measurement is kept in a per-user cache file, keyed by everything it depends on (CPU model, kernel
set and library build, torch version, threads, the weights' shapes and dtype); later processes
with the same key read it, and concurrent ones wait for the first (a file lock), so every server
on the machine makes the same choice until the library, torch or the cores change.

`SGLANG_CPU_TUNING_CACHE=<file>` moves the cache; `SGLANG_CPU_TUNING_CACHE=0` measures at every
start (in one process a model's shapes are still measured once). `SGLANG_CPU_SMALL_M_LINEAR=N`
fixes the rows and skips all of this.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import platform
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from sglang.srt.layers import cpu_ops
from sglang.srt.layers.linear import (_SILU_AND_MUL, MergedColumnParallelLinear, _large_m_linear, cpu_linear_modules,
                                      is_panel_weight, linear)

logger = logging.getLogger(__name__)

SMALL_M_CANDIDATE_ROWS = (1, 2, 4, 8, 16, 32, 64)
PANEL_CANDIDATE_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # prefill chunks too: the panels take any rows
_measured_here: Dict[str, Dict[str, int]] = {}  # key digest -> rows per dtype name, this process
# A measurement is kept only if its threads ran for at least this share of its wall time on every
# core it has: one taken while another process computed (a build, a benchmark) picks the wrong path
# (measured: bf16 panels at 1 row instead of 16+ during a compile, 0.5x the batch-16 decode rate).
MIN_CORE_SHARE = 0.8
# oneDNN takes rows from the weight panels only when it is at least this much faster over the pass:
# the panels also let a decode step run fused (layers/fused_decode.py: the whole decoder layer in
# C++), which is worth far more than a few percent of the linears (measured on the Intel AMX kind,
# default model, batch 64 bf16: panels 19.4 against oneDNN 21.3 ms a pass, but 33-36 against
# 47-51 ms a decode step once a noisy measurement had given oneDNN the 64 rows).
PANEL_MARGIN = 0.10
# In the cache key: a new rule measures anew. "gate_up as run": a gate_up projection is timed as the
# model runs it on each path (the panels' fused linear_silu_mul against oneDNN's GEMM and then
# silu_and_mul), not as a plain GEMM: the fused pass stores half the outputs and overlaps its SiLU
# with the tiles (at 512 rows 28 ms against 33 for the default model's 30 plain gate_up GEMMs).
PANEL_RULE = f"panels vs oneDNN, margin {PANEL_MARGIN}, outright at the last, gate_up as run"


def measure_small_m_rows(model: nn.Module, candidates: Sequence[int] = SMALL_M_CANDIDATE_ROWS
                         ) -> Tuple[Dict[torch.dtype, int], str]:
    """Up to how many rows `sgl_kernel.linear` beats the path beyond it (oneDNN on the packed
    copy, else F.linear) on this model's linear weights, per weight dtype (torch.int8 for
    `--quantization w8a16_int8`, compared with what `linear` does without the int8 kernel);
    recorded with `cpu_ops.set_linear_max_rows`. Returns the rows and where they came from
    ("measured in 0.5 s", "cached in <file>"); ({}, "") when sgl-kernel is not in use or
    SGLANG_CPU_SMALL_M_LINEAR fixes the rows.

    Each timing is one pass over every linear weight in layer order, so that the weights stream
    from memory as in a decode step; the search stops at the first candidate where the other
    path wins. Weights packed in panels (`linear.pack_linear_weights`) have one kernel for any
    rows and are not timed. The result is at least 1 row: at one row the kernel also lets the decoder layer
    run fused (layers/fused_decode.py), which saves more of a step than a linear timing sees.
    """
    if cpu_ops.fixed_linear_max_rows() is not None:
        return {}, ""
    mods = [m for m in cpu_linear_modules(model) if cpu_ops.enabled(m.weight)]
    if not mods:
        return {}, ""
    dtype = mods[0].weight.dtype
    mods = [m for m in mods if m.weight.dtype == dtype]
    quantized = [m for m in mods if m.int8_weight is not None]
    plain = [m for m in mods if not is_panel_weight(m.packed_weight)]  # panel weights: one kernel at any rows
    if not plain and not quantized:
        return {}, ""
    rows, source = _kept(_cache_key(mods, bool(quantized), candidates),
                         lambda: _measure(plain, quantized, dtype, candidates))
    found = {_DTYPE_BY_NAME[name]: n for name, n in rows.items()}
    for kind, n in found.items():
        cpu_ops.set_linear_max_rows(kind, n)
    return found, source


def measure_panel_rows(model: nn.Module, candidates: Sequence[int] = PANEL_CANDIDATE_ROWS
                       ) -> Tuple[Optional[int], str]:
    """Up to how many rows the panels beat oneDNN on the weights that have both
    (`linear.pack_linear_weights`), recorded with `cpu_ops.set_panel_max_rows`; where the panels
    win at every candidate the oneDNN copies are dropped (their memory freed) and the panels take
    every row. At least 1 row: at one row the panels also let the decoder layer run fused
    (layers/fused_decode.py). Returns (rows, source) with rows None for every row; (None, "")
    without such weights. Kept in the same cache as `measure_small_m_rows`; SGLANG_CPU_PANEL_ROWS=N fixes it.

    On the Intel AVX-512 + AMX kind oneDNN's bf16 tiles beat the vdpbf16ps panels from 8 rows (2.2x
    at 32 rows, 6.6x at 512 over a pass of the default model's layers; benchmark/RESULTS.md); the
    panels' own AMX tiles (the `amx` kernel set) move the crossover to 128-256 rows.
    """
    mods = [m for m in cpu_linear_modules(model) if getattr(m, "onednn_weight", None) is not None]
    if not mods:
        return None, ""
    dtype = mods[0].packed_weight.dtype
    fixed = cpu_ops.fixed_panel_max_rows()
    if fixed is not None:
        rows, source = fixed, "SGLANG_CPU_PANEL_ROWS"
    else:
        found, source = _kept(_cache_key(mods, False, candidates, what=PANEL_RULE), lambda: {
            str(dtype): max(1, _crossover(mods, dtype, candidates,
                                   small=_panel_pass, other=_onednn_pass,
                                   margin=PANEL_MARGIN))})
        rows = found[str(dtype)]
    if rows >= candidates[-1]:
        for m in mods:
            m.onednn_weight = None
        rows = None
    cpu_ops.set_panel_max_rows(dtype, rows)
    return rows, source


def _panel_pass(x: torch.Tensor, m: nn.Module) -> torch.Tensor:
    if isinstance(m, MergedColumnParallelLinear):  # as its silu_mul runs on the panels
        return torch.ops.sgl_kernel.linear_silu_mul(x, m.packed_weight, None, m.bias)
    return torch.ops.sgl_kernel.linear(x, m.packed_weight, None, m.bias)


def _onednn_pass(x: torch.Tensor, m: nn.Module) -> torch.Tensor:
    y = _large_m_linear(x, m.weight, m.bias, m.onednn_weight)
    return _SILU_AND_MUL(y) if isinstance(m, MergedColumnParallelLinear) else y


def _kept(digest_and_key: Tuple[str, dict], measure: Callable[[], Dict[str, int]]) -> Tuple[Dict[str, int], str]:
    """`measure()` (rows per dtype name) once per cache key: from this process, else the cache
    file (under its lock, so concurrent starts wait for the first), else measured and written."""
    digest, key = digest_and_key
    rows = _measured_here.get(digest)
    source = "measured earlier in this process"
    if rows is None:
        with _locked_cache() as (path, entries):
            rows = entries.get(digest, {}).get("rows")
            source = f"cached in {path}"
            if rows is None:
                start, cpu_start = time.perf_counter(), time.process_time()
                rows = measure()
                wall = time.perf_counter() - start
                share = (time.process_time() - cpu_start) / max(wall * torch.get_num_threads(), 1e-9)
                source = f"measured on these weights in {wall:.1f} s"
                if share < MIN_CORE_SHARE:
                    source += (f", while other work held the cores ({share:.0%} of their time was this process's): "
                               "used here, not kept; measured again at the next start")
                    logger.warning("CPU linear crossover %s", source)
                elif path is not None:
                    entries[digest] = {"rows": rows, "key": key, "when": time.strftime("%Y-%m-%d %H:%M:%S"),
                                       "core_share": round(share, 2)}
                    _write(path, entries)
        _measured_here[digest] = rows
    return rows, source


def _measure(plain: List[nn.Module], quantized: List[nn.Module], dtype: torch.dtype,
             candidates: Sequence[int]) -> Dict[str, int]:
    rows = {}
    if plain:
        rows[str(dtype)] = max(1, _crossover(
            plain, dtype, candidates,
            small=lambda x, m: torch.ops.sgl_kernel.linear(x, m.weight, None, m.bias),
            other=lambda x, m: _large_m_linear(x, m.weight, m.bias, m.packed_weight)))
        cpu_ops.set_linear_max_rows(dtype, rows[str(dtype)])  # what `linear` does without int8
    if quantized:
        rows[str(torch.int8)] = max(1, _crossover(
            quantized, dtype, candidates,
            small=lambda x, m: torch.ops.sgl_kernel.linear(x, m.int8_weight[0], m.int8_weight[1], m.bias),
            other=lambda x, m: linear(x, m.weight, m.bias, m.packed_weight, None, m.onednn_weight)))
    return rows


_DTYPE_BY_NAME = {str(d): d for d in (torch.float32, torch.bfloat16, torch.int8)}


def _crossover(mods: List[nn.Module], dtype: torch.dtype, candidates: Sequence[int],
               small: Callable, other: Callable, margin: float = 0.0) -> int:
    """The largest of `candidates` (ascending) up to which `other` is not more than `margin` faster
    than `small` over one pass of `mods`; 0 when it is from the first. At the last candidate `small`
    must be at least as fast (no margin): reaching it lets the caller drop `other` for every larger
    row count too. A loss ends the search, so it is timed a second time before it counts (the least
    time of both): one noisy round on a shared machine must not hand every larger row count to the
    other path."""
    widths = {m.weight.shape[1] for m in mods}
    best = 0
    with torch.inference_mode():
        for rows in candidates:
            xs = {k: torch.randn(rows, k).to(dtype) for k in widths}
            passes = [lambda fn=fn: [fn(xs[m.weight.shape[1]], m) for m in mods] for fn in (small, other)]
            slack = 1.0 + (margin if rows != candidates[-1] else 0.0)
            t_small, t_other = _least_seconds(passes)
            if t_small > t_other * slack:
                again = _least_seconds(passes)
                t_small, t_other = min(t_small, again[0]), min(t_other, again[1])
            if t_small > t_other * slack:
                break
            best = rows
    return best


def _least_seconds(passes: List[Callable], min_total: float = 0.02, max_rounds: int = 50) -> List[float]:
    """Each pass's least time over at least 3 rounds (more for short passes), the passes
    alternating so that a change in the machine's load hits both alike."""
    for run in passes:  # warm-up: first-touch of outputs, oneDNN primitive creation
        run()
    least = [float("inf")] * len(passes)
    total, rounds = 0.0, 0
    while rounds < 3 or (total < min_total and rounds < max_rounds):
        for i, run in enumerate(passes):
            start = time.perf_counter()
            run()
            took = time.perf_counter() - start
            least[i], total = min(least[i], took), total + took
        rounds += 1
    return least


def _cache_key(mods: List[nn.Module], quantized: bool, candidates: Sequence[int],
               what: str = "small-M kernel vs the rest") -> Tuple[str, dict]:
    """Everything the measurement depends on, and its digest."""
    key = {
        "what": what,
        "cpu": _cpu_model(), "isa": cpu_ops.isa_name(), "library": _library_digest(),
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "dtype": str(mods[0].weight.dtype), "int8": quantized, "candidates": list(candidates),
        "weights": _weight_shapes(mods),
    }
    return hashlib.sha1(json.dumps(key).encode()).hexdigest(), key


def _weight_shapes(mods: List[nn.Module]) -> List[str]:
    """Each timed weight shape with its count, in order of first use: "576x1536 packed x30"."""
    counts: Dict[str, int] = {}
    for m in mods:
        packed = "" if m.packed_weight is None else " panels" if is_panel_weight(m.packed_weight) else " packed"
        packed += " +oneDNN" if getattr(m, "onednn_weight", None) is not None else ""
        shape = "x".join(map(str, m.weight.shape)) + packed + (" bias" if m.bias is not None else "")
        counts[shape] = counts.get(shape, 0) + 1
    return [f"{shape} x{n}" for shape, n in counts.items()]


def _cpu_model() -> str:
    """The CPU's name with its family, model and stepping: cloud VMs name different generations
    alike ("AMD EPYC" for Zen 4 and Zen 5, whose crossovers differ)."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                name, _, value = line.partition(":")
                name = name.strip()
                if name in ("model name", "cpu family", "model", "stepping") and name not in fields:
                    fields[name] = value.strip()
                if not line.strip() and fields:
                    break  # the first processor's block
    except OSError:
        pass
    if "model name" not in fields:
        return platform.processor() or platform.machine()
    ids = "/".join(fields.get(k, "?") for k in ("cpu family", "model", "stepping"))
    return f"{fields['model name']} ({ids})"


def _library_digest() -> str:
    path = cpu_ops.library_path()
    if path is None:
        return "none"
    try:
        return hashlib.sha1(path.read_bytes()).hexdigest()
    except OSError:
        return "unknown"


def cache_path() -> Optional[Path]:
    """The cache file (SGLANG_CPU_TUNING_CACHE, default ~/.cache/sglang/cpu_linear_rows.json), or
    None when caching is off."""
    env = os.environ.get("SGLANG_CPU_TUNING_CACHE")
    if env is not None:
        return None if env.strip() in ("", "0") else Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sglang" / "cpu_linear_rows.json"


@contextlib.contextmanager
def _locked_cache():
    """(path, entries) under an exclusive lock of the cache; (None, {}) without a usable cache."""
    path = cache_path()
    lock = None
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            lock = open(str(path) + ".lock", "a")
            fcntl.flock(lock, fcntl.LOCK_EX)
        except OSError as e:
            logger.warning(f"CPU tuning cache {path} unusable ({e}): measuring without it")
            path = None
    try:
        yield path, (_read(path) if path is not None else {})
    finally:
        if lock is not None:
            lock.close()  # releases the lock


def _read(path: Path) -> dict:
    try:
        entries = json.loads(path.read_text())
        return entries if isinstance(entries, dict) else {}
    except (OSError, ValueError):
        return {}  # absent or damaged: measured again and rewritten


def _write(path: Path, entries: dict) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(entries, indent=1))
        os.replace(tmp, path)
    except OSError as e:
        logger.warning(f"CPU tuning cache {path} not written ({e})")
