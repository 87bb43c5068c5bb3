"""Online serving benchmark (bench_serving style) against OpenAI-compatible servers.

Sends streaming `/v1/completions` requests with random token-id prompts (exact input lengths on
every server) and `max_tokens` + `ignore_eos` (exact output lengths), at a request rate (Poisson
arrivals) or a fixed concurrency, and reports request throughput, output tokens/s, TTFT, ITL
(inter-token latency between streamed chunks) and end-to-end latency percentiles.

Two ways to run:
  --url http://127.0.0.1:30000            one server that is already running (any OpenAI API)
  --launch ours vllm                      starts each server as a subprocess (ours from this repo's
                                          venv, vLLM-CPU's api_server from peers/.venvs/vllm), waits
                                          until healthy, then runs the same workload against each
                                          in turn, --rounds times, alternating; missing peers skipped

    python benchmark/serving.py --launch ours vllm                   # default model, < 10 min
    python benchmark/serving.py --url http://127.0.0.1:30000 --num-prompts 32 --request-rate 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from typing import List, Optional, Union

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (PEER_NAMES, cache_dir, machine_line, model_config, our_python, peer_python,  # noqa: E402
                    print_table, progress, resolve_model, signal_tree, synthetic_prompts, tree_peak_rss_mib)


# ---- client ----------------------------------------------------------------------------------
async def one_request(session, url: str, model: str, prompt: Union[str, List[int]], out_len: int) -> dict:
    payload = {"model": model, "prompt": prompt, "max_tokens": out_len, "temperature": 0.0, "ignore_eos": True,
               "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft, last, itls, chunks, usage_tokens = None, t0, [], 0, None
    try:
        async with session.post(url + "/v1/completions", json=payload) as resp:
            if resp.status != 200:
                return {"ok": False, "error": f"HTTP {resp.status}: {(await resp.text())[:200]}"}
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                obj = json.loads(data)
                if obj.get("usage"):
                    usage_tokens = obj["usage"].get("completion_tokens")
                if not obj.get("choices") or not obj["choices"][0].get("text"):
                    continue
                now = time.perf_counter()
                if ttft is None:
                    ttft = now - t0
                else:
                    itls.append(now - last)
                last = now
                chunks += 1
    except Exception as e:  # a failed request is counted, not fatal
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    return {"ok": True, "ttft": ttft or (time.perf_counter() - t0), "itls": itls, "latency": time.perf_counter() - t0,
            "output_tokens": usage_tokens if usage_tokens is not None else chunks}


async def run_workload(url: str, model: str, prompts, out_lens, rate: float, concurrency: Optional[int], seed: int,
                       bar=None) -> dict:
    import aiohttp

    rng = random.Random(seed)
    sem = asyncio.Semaphore(concurrency or len(prompts))
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async def task(p, n):
            async with sem:
                r = await one_request(session, url, model, p, n)
            if bar:
                bar.update(1)
            return r

        t0 = time.perf_counter()
        tasks = []
        for p, n in zip(prompts, out_lens):
            tasks.append(asyncio.create_task(task(p, n)))
            if rate != float("inf"):
                await asyncio.sleep(rng.expovariate(rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - t0
    ok = [r for r in results if r["ok"]]
    errors = [r["error"] for r in results if not r["ok"]]
    return {"duration": duration, "ok": ok, "errors": errors}


def pct(values, q):
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def summarize(name: str, r: dict) -> list:
    ok = r["ok"]
    ttfts = [x["ttft"] * 1000 for x in ok]
    itls = [v * 1000 for x in ok for v in x["itls"]]
    lat = [x["latency"] for x in ok]
    out_tok = sum(x["output_tokens"] for x in ok)
    return [name, f"{len(ok)}/{len(ok) + len(r['errors'])}", len(ok) / r["duration"], out_tok / r["duration"],
            statistics.mean(ttfts) if ttfts else None, pct(ttfts, 50), pct(ttfts, 99),
            statistics.mean(itls) if itls else None, pct(itls, 50), pct(itls, 99), pct(lat, 50)]


HEADERS = ["server", "ok", "req/s", "out tok/s", "TTFT mean ms", "TTFT p50", "TTFT p99", "ITL mean ms",
           "ITL p50", "ITL p99", "E2E p50 s"]


# ---- servers ---------------------------------------------------------------------------------
class Server:
    """A server subprocess (ours or vLLM-CPU) on a local port."""

    def __init__(self, kind: str, model_path: str, dtype: str, port: int, max_total_tokens: int):
        self.kind, self.name, self.port = kind, PEER_NAMES[kind], port
        self.url = f"http://127.0.0.1:{port}"
        py = peer_python(kind)
        if py is None:
            raise RuntimeError(f"not installed (run: bash benchmark/peers/setup_peers.sh {kind})")
        env = dict(os.environ)
        if kind == "ours":
            env["PYTHONPATH"] = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python")
            cmd = [our_python(), "-m", "sglang.launch_server", "--model-path", model_path, "--dtype", dtype,
                   "--host", "127.0.0.1", "--port", str(port), "--max-total-tokens", str(max_total_tokens)]
        elif kind == "vllm":
            env.pop("PYTHONPATH", None)
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
            cmd = [py, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path, "--dtype", dtype,
                   "--max-model-len", "1024", "--host", "127.0.0.1", "--port", str(port)]
        else:
            raise RuntimeError(f"--launch supports ours and vllm, not {kind}")
        self.log_path = os.path.join(cache_dir(), f"server-{kind}.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=cache_dir())
        self.model_name = model_path

    def wait_ready(self, timeout: float) -> None:
        import urllib.request

        t = time.time()
        while time.time() - t < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"exited with {self.proc.returncode} (log: {self.log_path})")
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=2) as r:
                    self.model_name = json.loads(r.read())["data"][0]["id"]
                    return
            except Exception:
                time.sleep(1)
        raise RuntimeError(f"not ready after {timeout:.0f} s (log: {self.log_path})")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=None, help="an already running OpenAI-compatible server")
    ap.add_argument("--launch", nargs="*", default=None, help="servers to start: ours, vllm")
    ap.add_argument("--model", default="default", help='"default", "tiny" or an HF folder (for --launch and vocab)')
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=64, help="mean; lengths drawn from [ratio*len, len]")
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--range-ratio", type=float, default=0.5)
    ap.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s (Poisson); inf = all at once")
    ap.add_argument("--max-concurrency", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds per server (median of rounds)")
    ap.add_argument("--port", type=int, default=31000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--text-prompts", action="store_true",
                    help="send the random token ids decoded to text (the sglang-router refuses token-id prompts on "
                         "/v1/completions); lengths are then approximate, the same text goes to every server")
    ap.add_argument("--plot", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "plots", "serving_latest.png"),
                    help="PNG drawn from the final table (matplotlib: pip install -e '.[bench]'); '' for none")
    args = ap.parse_args()
    if args.url is None and args.launch is None:
        args.launch = ["ours", "vllm"]

    print(f"machine: {machine_line()}", flush=True)
    path = resolve_model(args.model)
    vocab = model_config(path)["vocab_size"]
    rng = random.Random(args.seed)
    in_lens = [rng.randint(int(args.input_len * args.range_ratio), args.input_len) for _ in range(args.num_prompts)]
    out_lens = [rng.randint(int(args.output_len * args.range_ratio), args.output_len) for _ in range(args.num_prompts)]

    servers = []
    if args.url:
        servers.append(("given", args.url, None, None))
    for i, kind in enumerate(args.launch or []):
        try:
            s = Server(kind, path, args.dtype, args.port + i, max(8192, 2 * sum(in_lens) + sum(out_lens)))
        except RuntimeError as e:
            print(f"SKIP {PEER_NAMES.get(kind, kind)}: {e}", flush=True)
            continue
        servers.append((s.name, s.url, s, kind))
    live = []
    for name, url, s, kind in servers:
        if s is None:
            live.append((name, url, args.model, None))
            continue
        try:
            s.wait_ready(300)
            print(f"{name} ready at {url}", flush=True)
            live.append((name, url, s.model_name, s))
        except RuntimeError as e:
            print(f"SKIP {name}: {e}", flush=True)
            s.close()
    if args.url:  # model name from the given server
        import urllib.request

        try:
            with urllib.request.urlopen(args.url + "/v1/models", timeout=5) as r:
                live[0] = (live[0][0], live[0][1], json.loads(r.read())["data"][0]["id"], None)
        except Exception as e:
            print(f"note: /v1/models failed ({e}); using model name {args.model!r}")

    as_text = (lambda ps: ps)
    if args.text_prompts:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path)
        as_text = (lambda ps: [tok.decode(p) for p in ps])
    results = {name: [] for name, *_ in live}
    try:
        for name, url, model, s in live:  # warm-up; then each launched server waits its turn frozen
            asyncio.run(run_workload(url, model, as_text(synthetic_prompts(2, 8, vocab, 3)), [4, 4], float("inf"), None, 0))
            if s is not None:
                signal_tree(s.proc.pid, signal.SIGSTOP)
        bar = progress(args.rounds * len(live) * args.num_prompts, "serving")
        for rnd in range(args.rounds):
            prompts = as_text([synthetic_prompts(1, n, vocab, seed=args.seed * 1000 + rnd * 100 + i)[0]
                               for i, n in enumerate(in_lens)])
            order = live if rnd % 2 == 0 else live[::-1]
            for name, url, model, s in order:
                if s is not None:
                    signal_tree(s.proc.pid, signal.SIGCONT)
                r = asyncio.run(run_workload(url, model, prompts, out_lens, args.request_rate, args.max_concurrency,
                                             args.seed + rnd, bar))
                if s is not None:
                    signal_tree(s.proc.pid, signal.SIGSTOP)
                for e in r["errors"][:3]:
                    print(f"{name}: request failed: {e}", flush=True)
                results[name].append(r)
        bar.close()
        rss = {name: tree_peak_rss_mib(s.proc.pid) for name, _, _, s in live if s is not None}
    finally:
        for *_, s in live:
            if s is not None:
                signal_tree(s.proc.pid, signal.SIGCONT)
                s.close()

    rows = []
    for name, rs in results.items():
        per_round = [summarize(name, r) for r in rs]
        best = sorted(per_round, key=lambda row: row[3])[len(per_round) // 2]  # median round by out tok/s
        rows.append(best + [rss.get(name)])
    if len(rows) > 1:
        ours = next((r for r in rows if r[0] == "ours"), None)
        for r in rows:
            r.append("" if ours is None or r is ours else f"{ours[3] / r[3]:.2f}x")
    print(f"\nmachine at end: {machine_line()}")
    rate = "inf" if args.request_rate == float("inf") else f"{args.request_rate:g}"
    title = (f"Serving ({args.model}:{args.dtype}; {args.num_prompts} prompts, input <= {args.input_len}, output "
             f"<= {args.output_len}, rate {rate}, concurrency {args.max_concurrency}; median of {args.rounds})")
    headers = HEADERS + ["peak RSS MiB"] + (["ours out tok/s / server"] if len(rows) > 1 else [])
    print_table(title, headers, rows)
    if args.plot:
        from plots import save_plot

        save_plot("latency", headers, rows, args.plot, title)


if __name__ == "__main__":
    main()
