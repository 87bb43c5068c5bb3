"""Shared pieces of the benchmarks: tables, progress bars, timing, peak RSS, machine facts, the
benchmark models and prompts, and the client side of the peer worker protocol (peers/worker.py).

Why shared: every benchmark prints the same table format (Markdown, so that a run's output pastes
into RESULTS.md as is) and runs peers the same way (one subprocess per engine in its own venv).
"""

from __future__ import annotations

import json
import os
import platform
import random
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from typing import Dict, List, Optional, Sequence

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(BENCH_DIR)
PEERS_DIR = os.path.join(BENCH_DIR, "peers")
VENVS_DIR = os.path.join(PEERS_DIR, ".venvs")
WORKER = os.path.join(PEERS_DIR, "worker.py")
TAG = "@@BENCH "

# The tiny Llama: 4 layers, hidden 256, vocab 32000 (random weights, built once).
TINY_LLAMA = dict(num_hidden_layers=4, hidden_size=256, intermediate_size=1024, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64, vocab_size=32000)
PEER_NAMES = {"ours": "ours", "ours_torch": "ours, torch ops", "ours_int8": "ours, w8a16_int8",
              "hf": "HF transformers", "vllm": "vLLM-CPU", "sglang_upstream": "upstream SGLang", "llamacpp": "llama.cpp",
              "llamacpp_q8_0": "llama.cpp q8_0"}
# Variants of our own engine: (worker backend, environment, Engine kwargs). "ours_torch" runs the
# torch fallbacks instead of sgl-kernel's compiled ops; "ours_int8" quantizes the linear weights.
OUR_VARIANTS = {"ours": ("ours", {}, {}), "ours_torch": ("ours", {"SGLANG_DISABLE_SGL_KERNEL": "1"}, {}),
                "ours_int8": ("ours", {}, {"quantization": "w8a16_int8"})}


# ---- output ----------------------------------------------------------------------------------
def print_table(title: str, headers: Sequence[str], rows: List[Sequence], file=None) -> str:
    """Prints (and returns) a Markdown table; floats get 3 significant-ish digits."""
    def fmt(v):
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        return str(v)

    cells = [[fmt(v) for v in r] for r in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in cells)) if cells else len(str(h)) for i, h in enumerate(headers)]
    lines = [f"\n### {title}\n" if title else "",
             "| " + " | ".join(str(h).ljust(w) for h, w in zip(headers, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in cells]
    text = "\n".join(lines)
    print(text, file=file or sys.stdout, flush=True)
    return text


def progress(total: int, desc: str):
    """A tqdm bar on stderr (a no-op stand-in when tqdm is missing)."""
    try:
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, file=sys.stderr, dynamic_ncols=True)
    except ImportError:  # pragma: no cover
        class _Bar:
            def update(self, n=1):
                pass

            def set_postfix_str(self, s):
                pass

            def close(self):
                pass

        return _Bar()


@contextmanager
def timer(out: Dict[str, float], key: str):
    t = time.perf_counter()
    try:
        yield
    finally:
        out[key] = time.perf_counter() - t


def machine_line() -> str:
    """One line for RESULTS.md: date, CPU, cores, memory, load average."""
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            mem_gib = int(f.readline().split()[1]) / 2**20
    except OSError:
        mem_gib = 0.0
    load = os.getloadavg()
    return (f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {cpu}; {os.cpu_count()} cores; "
            f"{mem_gib:.0f} GiB; load avg {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


# ---- memory ----------------------------------------------------------------------------------
def _children(pid: int) -> List[int]:
    kids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                kids.append(int(name))
        except (OSError, IndexError, ValueError):
            continue
    return kids


def tree_peak_rss_mib(pid: int) -> float:
    """Sum of peak RSS (VmHWM) over a process and all its descendants: an upper bound of the tree's
    peak, which is what a user must provision for (the model lives in a scheduler/engine child)."""
    total_kib, stack, seen = 0, [pid], set()
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        total_kib += int(line.split()[1])
        except OSError:
            continue
        stack.extend(_children(p))
    return total_kib / 1024


# ---- models and prompts ----------------------------------------------------------------------
def cache_dir() -> str:
    d = os.environ.get("SGLANG_BENCH_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "sglang-bench")
    os.makedirs(d, exist_ok=True)
    return d


def resolve_model(name: str) -> str:
    """"default" -> what the server serves for it: SmolLM2-135M-Instruct's dense copy (its
    dequantized fp32 HF folder); "default-gguf" -> the shipped Q4_1 GGUF file itself; "tiny" -> the
    tiny random Llama; anything else is a path to an HF model folder or a GGUF file."""
    if name == "default":
        from sglang.srt.model_loader.default_model import default_model_path

        return default_model_path()
    if name == "default-gguf":
        from sglang.srt.model_loader.default_model import default_gguf_path

        return default_gguf_path()
    if name.startswith("tiny-") and name[5:] in ("nemotron_h", "falcon_h1"):  # tiny hybrid SSM models
        path = os.path.join(cache_dir(), name)
        if not os.path.exists(os.path.join(path, "config.json")):
            from sglang.test.tiny_models import make_tiny_model

            make_tiny_model(path, name[5:], seed=5)
        return path
    if name == "tiny":
        path = os.path.join(cache_dir(), "tiny-llama-4l-256h-32k")
        if not os.path.exists(os.path.join(path, "model.safetensors")):
            from sglang.test.tiny_models import make_tiny_model

            make_tiny_model(path, "llama", seed=0, initializer_range=0.02, **TINY_LLAMA)
        return path
    return name


def model_config(path: str) -> dict:
    """The HF config of a model folder, or the one a GGUF file's metadata gives."""
    if os.path.isfile(path):
        from sglang.srt.configs.gguf_file import gguf_config_dict

        return gguf_config_dict(path)
    with open(os.path.join(path, "config.json")) as f:
        return json.load(f)


def synthetic_prompts(n: int, length: int, vocab: int, seed: int) -> List[List[int]]:
    """Fixed-seed random token ids (away from the low special-token ids)."""
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab - 1) for _ in range(length)] for _ in range(n)]


# ---- peers -----------------------------------------------------------------------------------
def our_python() -> str:
    venv = os.path.join(REPO_ROOT, ".venv", "bin", "python")
    return venv if os.path.exists(venv) else sys.executable


def peer_python(peer: str) -> Optional[str]:
    """Interpreter for a peer: its venv under peers/.venvs; HF falls back to our venv (it has
    transformers); None when the peer is not installed."""
    if peer in OUR_VARIANTS:
        return our_python()
    p = os.path.join(VENVS_DIR, peer, "bin", "python")
    if os.path.exists(p) and not os.path.exists(os.path.join(VENVS_DIR, peer, ".broken")):
        return p
    if peer == "hf":
        return our_python()
    return None


def signal_tree(pid: int, sig) -> None:
    """Sends `sig` to a process and all its descendants. Engines waiting their turn are frozen
    with SIGSTOP (and thawed with SIGCONT): some spin while idle (upstream SGLang's CPU scheduler
    loop takes a full core), which would slow whichever engine is being measured."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


class Worker:
    """A loaded engine in a subprocess (peers/worker.py); `run()` sends one workload."""

    def __init__(self, backend: str, model: str, dtype: str, max_total_tokens: int = 32768,
                 extra: Optional[dict] = None, log_path: Optional[str] = None, load_timeout: float = 400,
                 env_overrides: Optional[Dict[str, str]] = None):
        self.backend = backend
        self.name = PEER_NAMES.get(backend, backend)
        py = peer_python(backend)
        if py is None:
            raise RuntimeError(f"not installed (run: bash benchmark/peers/setup_peers.sh {backend})")
        self.log_path = log_path or os.path.join(cache_dir(), f"worker-{backend}.log")
        self.log = open(self.log_path, "w")
        env = dict(os.environ)
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        env.update(env_overrides or {})
        worker_backend = backend
        if backend in OUR_VARIANTS:
            worker_backend, variant_env, variant_kwargs = OUR_VARIANTS[backend]
            env.update(variant_env)
            extra = {**variant_kwargs, **(extra or {})}
            env["PYTHONPATH"] = os.path.join(REPO_ROOT, "python") + os.pathsep + env.get("PYTHONPATH", "")
        else:  # a peer must never see this repo's `sglang` package
            env.pop("PYTHONPATH", None)
        cmd = [py, WORKER, "--backend", worker_backend, "--model", model, "--dtype", dtype,
               "--max-total-tokens", str(max_total_tokens), "--extra", json.dumps(extra or {})]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     text=True, bufsize=1, env=env, cwd=cache_dir())
        ready = self._read(load_timeout)
        if not ready.get("ready"):
            self.close()
            raise RuntimeError(ready.get("error", "failed to start") + f" (log: {self.log_path})")
        self.load_s = ready["load_s"]
        self.version = ready.get("version", "?")

    def _read(self, timeout: float) -> dict:
        result: Dict = {}

        def pump():
            for line in self.proc.stdout:
                if line.startswith(TAG):
                    result.update(json.loads(line[len(TAG):]))
                    return
                self.log.write(line)
            result.setdefault("error", f"worker exited (rc={self.proc.poll()})")

        t = threading.Thread(target=pump, daemon=True)
        t.start()
        t.join(timeout)
        if t.is_alive():
            self.close()
            return {"error": f"timed out after {timeout:.0f} s"}
        return result

    def run(self, prompts: List[List[int]], max_new_tokens: int, timeout: float = 600) -> dict:
        self.proc.stdin.write(json.dumps({"prompts": prompts, "max_new_tokens": max_new_tokens}) + "\n")
        self.proc.stdin.flush()
        out = self._read(timeout)
        if "error" in out:
            raise RuntimeError(out["error"] + f" (log: {self.log_path})")
        return out

    def peak_rss_mib(self) -> float:
        return tree_peak_rss_mib(self.proc.pid)

    def pause(self) -> None:
        signal_tree(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        signal_tree(self.proc.pid, signal.SIGCONT)

    def close(self) -> None:
        self.resume()
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(30)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                self.proc.kill()
                self.proc.wait()
        self.log.close()
