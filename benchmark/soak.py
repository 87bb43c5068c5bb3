"""Soak: N minutes of the request fuzzer's mix at a target rate against any URL (not in CI).

    python benchmark/soak.py --url http://127.0.0.1:30000 --minutes 10 --rate 4 --behind-router \
        --servers http://127.0.0.1:30100 http://127.0.0.1:30200

Requests are the fuzzer's cases (`sglang.test.fuzz`: valid and invalid ones over every route,
n > 1, batches, streams cut mid-way, aborts), sent at `--rate` per second (Poisson arrivals, at
most `--concurrency` in flight). Every 30 s and at the end it prints requests by status, p50/p99
latency of the answered valid ones, violations (a valid request that did not get a right-shaped
200, an invalid one that did not get a 4xx), and the RSS of the server processes (found by the
ports of `--servers`). At the end it waits for the servers to go idle and checks every pool
against its free size. Exit code 1 on a violation or a pool that did not come back.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import random
import statistics
import sys
import threading
import time
import urllib.parse
from collections import Counter
from typing import Dict, List

import psutil
import requests

from sglang.test.fuzz import runner
from sglang.test.fuzz.cases import CaseGenerator, FuzzTarget
from sglang.test.fuzz.runner import pool_violations, send_case, wait_idle


def server_pids(urls: List[str]) -> Dict[str, int]:
    """The process listening on each server URL's port (needs permission to see its sockets)."""
    out = {}
    ports = {urllib.parse.urlparse(u).port: u for u in urls}
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port in ports and conn.pid:
            out[ports[conn.laddr.port]] = conn.pid
    return out


def tree_rss_mb(pid: int) -> float:
    try:
        root = psutil.Process(pid)
        return sum(p.memory_info().rss for p in [root] + root.children(recursive=True)) / 2**20
    except psutil.NoSuchProcess:
        return float("nan")


def percentile(values: List[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(int(q * len(values)), len(values) - 1)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="where requests go (a server, the router, a load balancer)")
    p.add_argument("--servers", nargs="*", default=None, help="server URLs for /server_info, pools and RSS (default: --url)")
    p.add_argument("--minutes", type=float, default=10)
    p.add_argument("--rate", type=float, default=4.0, help="requests per second")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--behind-router", action="store_true", help="sglang-router in front (its request rules)")
    p.add_argument("--report-every", type=float, default=30)
    p.add_argument("--max-prompt-tokens", type=int, default=None,
                   help="cap the fuzzer's near-context prompts (default: up to the context limit)")
    p.add_argument("--timeout", type=float, default=runner.REQUEST_TIMEOUT_S,
                   help="seconds a client waits for an answer before it counts as none")
    args = p.parse_args()
    runner.REQUEST_TIMEOUT_S = args.timeout
    servers = args.servers or [args.url]
    info = requests.get(servers[-1] + "/server_info", timeout=30).json()
    target = FuzzTarget(url=args.url, vocab_size=info["vocab_size"], context_len=info["context_len"],
                        behind_sglang_router=args.behind_router, tokenize_routes=not args.behind_router,
                        abort_urls=[servers[-1]], pd=len(servers) > 1, max_prompt_tokens=args.max_prompt_tokens)
    gen = CaseGenerator(target, args.seed)
    pids = server_pids(servers)
    rss0 = {u: tree_rss_mb(pid) for u, pid in pids.items()}
    print(f"[soak] {args.minutes} min at {args.rate}/s against {args.url}; servers {servers}; "
          f"RSS at start (MB): { {u: round(v) for u, v in rss0.items()} }", flush=True)

    lock = threading.Lock()
    statuses: Counter = Counter()
    latencies: List[float] = []
    violations: List[str] = []
    rng = random.Random(args.seed + 1)
    slots = threading.Semaphore(args.concurrency)

    def run(case):
        try:
            res = send_case(case, target)
        finally:
            slots.release()
        with lock:
            statuses[f"{'valid' if case.valid else 'invalid'} {res.status}"] += 1
            if case.valid and res.status == 200 and case.cut_after is None:
                latencies.append(res.latency_s)
            violations.extend(f"#{case.index} {case.what}: {v}" for v in res.violations)

    def report(final: bool = False):
        with lock:
            lat = list(latencies)
            line = (f"[soak] {'final' if final else 'after %.0f s' % (time.time() - t0)}: {sum(statuses.values())} "
                    f"requests {dict(statuses)}; p50 {percentile(lat, 0.5):.2f} s, p99 {percentile(lat, 0.99):.2f} s; "
                    f"violations {len(violations)}; RSS (MB) "
                    f"{ {u: round(tree_rss_mb(pid)) for u, pid in pids.items()} }")
        print(line, flush=True)

    t0 = time.time()
    deadline = t0 + args.minutes * 60
    next_report = t0 + args.report_every
    index = 0
    with cf.ThreadPoolExecutor(args.concurrency) as ex:
        while time.time() < deadline:
            time.sleep(rng.expovariate(args.rate))
            slots.acquire()
            ex.submit(run, gen.make(index))
            index += 1
            if time.time() >= next_report:
                report()
                next_report += args.report_every
    report(final=True)
    problems = []
    for u in servers:
        try:
            problems += [f"{u}: {p}" for p in pool_violations(wait_idle(u, timeout=120))]
        except AssertionError as e:
            problems.append(str(e))
    rss1 = {u: tree_rss_mb(pid) for u, pid in pids.items()}
    print(f"[soak] RSS growth (MB): { {u: round(rss1[u] - rss0[u], 1) for u in rss1} }", flush=True)
    print(f"[soak] latency of answered valid requests: mean {statistics.mean(latencies) if latencies else 0:.2f} s, "
          f"p50 {percentile(latencies, 0.5):.2f} s, p99 {percentile(latencies, 0.99):.2f} s", flush=True)
    print(f"[soak] pools after the run: {'all back to their free sizes' if not problems else problems}", flush=True)
    for v in violations[:50]:
        print(f"[soak] violation: {v}", flush=True)
    return 1 if violations or problems else 0


if __name__ == "__main__":
    sys.exit(main())
