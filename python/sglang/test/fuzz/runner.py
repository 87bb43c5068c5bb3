"""Runs fuzz cases against a URL and checks what came back; checks the servers' pools afterwards.

    target = FuzzTarget(url=..., vocab_size=..., context_len=..., abort_urls=[...])
    report = run_fuzz(target, num_cases=200, concurrency=16, seed=0)
    assert not report.violations, report.summary()
    assert_pools_restored(server_urls)   # every pool back to its free size, nothing running

Streams are read event by event (and dropped mid-way when the case says so); a share of cases
carries a rid that is aborted with `/abort_request` while it runs. `benchmark/soak.py` drives
the same cases for minutes at a target rate.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import threading
import time
from collections import Counter
from typing import Dict, List, Optional, Sequence

import requests

from sglang.test.fuzz.cases import CaseGenerator, FuzzCase, FuzzTarget
from sglang.test.fuzz.checks import check_answer

REQUEST_TIMEOUT_S = 120


@dataclasses.dataclass
class CaseResult:
    case: FuzzCase
    status: int  # HTTP status; 0: no answer (connection error / timeout)
    latency_s: float
    violations: List[str]


@dataclasses.dataclass
class FuzzReport:
    results: List[CaseResult]

    @property
    def violations(self) -> List[str]:
        return [f"#{r.case.index} {r.case.what}: {v}" for r in self.results for v in r.violations]

    def by_status(self) -> Dict[str, int]:
        return dict(Counter(f"{'valid' if r.case.valid else 'invalid'} {r.status}" for r in self.results))

    def summary(self) -> str:
        lines = [f"{len(self.results)} cases, by status: {self.by_status()}"]
        lines += self.violations[:40]
        return "\n".join(lines)


def send_case(case: FuzzCase, target: FuzzTarget, session: Optional[requests.Session] = None) -> CaseResult:
    http = session or requests
    url = target.url + case.route
    kwargs = {"timeout": REQUEST_TIMEOUT_S}
    if isinstance(case.body, bytes):
        kwargs.update(data=case.body, headers={"Content-Type": "application/json"})
    else:
        kwargs["json"] = case.body
    if case.abort_after is not None:
        _schedule_abort(case, target)
    t0 = time.monotonic()
    try:
        if case.stream and case.valid:
            with http.post(url, stream=True, **kwargs) as r:
                status = r.status_code
                payload = _read_events(r, case.cut_after) if status == 200 else _json(r)
        else:
            r = http.post(url, **kwargs)
            status, payload = r.status_code, _json(r)
    except requests.RequestException as e:
        return CaseResult(case, 0, time.monotonic() - t0, [f"no answer: {type(e).__name__}: {e}"])
    return CaseResult(case, status, time.monotonic() - t0, check_answer(case, status, payload))


def _read_events(r: requests.Response, cut_after: Optional[int]) -> List[str]:
    events = []
    for line in r.iter_lines():
        if not line or not line.startswith(b"data: "):
            continue
        events.append(line[len(b"data: "):].decode("utf-8", "replace"))
        if cut_after is not None and len(events) >= cut_after:
            break  # the client hangs up mid-stream
    return events


def _json(r: requests.Response):
    try:
        return r.json()
    except ValueError:
        return r.text


def _schedule_abort(case: FuzzCase, target: FuzzTarget) -> None:
    def fire():
        for url in target.abort_urls:
            try:
                requests.post(url + "/abort_request", json={"rid": case.rid}, timeout=10)
            except requests.RequestException:
                pass

    timer = threading.Timer(case.abort_after, fire)
    timer.daemon = True
    timer.start()


def make_cases(target: FuzzTarget, num_cases: int, seed: int) -> List[FuzzCase]:
    gen = CaseGenerator(target, seed)
    return [gen.make(i) for i in range(num_cases)]


def run_fuzz(target: FuzzTarget, num_cases: int = 200, concurrency: int = 16, seed: int = 0,
             cases: Optional[Sequence[FuzzCase]] = None) -> FuzzReport:
    cases = list(cases) if cases is not None else make_cases(target, num_cases, seed)
    local = threading.local()

    def run(case: FuzzCase) -> CaseResult:
        if not hasattr(local, "session"):
            local.session = requests.Session()
        return send_case(case, target, local.session)

    with cf.ThreadPoolExecutor(concurrency) as ex:
        results = list(ex.map(run, cases))
    return FuzzReport(results)


# --------------------------------------------------------------------------------- server state
def internal_state(url: str) -> dict:
    return requests.get(url + "/server_info", timeout=30).json()["internal_states"][0]


def wait_idle(url: str, timeout: float = 60.0) -> dict:
    """Waits until the server runs and queues nothing (in every queue of its role)."""
    deadline = time.time() + timeout
    while True:
        st = internal_state(url)
        d = st.get("disaggregation") or {}
        busy = st["num_running_reqs"] + st["num_waiting_reqs"] + sum(
            d.get(k, 0) for k in ("num_prealloc_queue_reqs", "num_transfer_queue_reqs", "num_retracted_queue_reqs",
                                  "num_bootstrap_queue_reqs", "num_inflight_queue_reqs"))
        if busy == 0:
            return st
        if time.time() > deadline:
            raise AssertionError(f"{url} still busy after {timeout:.0f} s: {st}")
        time.sleep(0.2)


def pool_violations(st: dict) -> List[str]:
    """Every pool of an idle server back to its initial free size (the radix tree may keep cached
    tokens and states, but nothing may be locked)."""
    out = []
    if st["available_kv_tokens"] + st["evictable_kv_tokens"] != st["max_total_num_tokens"]:
        out.append(f"KV tokens: {st['available_kv_tokens']} free + {st['evictable_kv_tokens']} cached "
                   f"!= {st['max_total_num_tokens']}")
    if st["protected_kv_tokens"]:
        out.append(f"{st['protected_kv_tokens']} KV tokens still locked")
    if st["available_req_slots"] != st["req_pool_size"]:
        out.append(f"request slots: {st['available_req_slots']} free of {st['req_pool_size']}")
    if st.get("mamba_pool_size") is not None:
        free = st["available_mamba_slots"] + (st.get("evictable_mamba_slots") or 0)
        if free != st["mamba_pool_size"]:
            out.append(f"Mamba slots: {free} free or cached of {st['mamba_pool_size']}")
    d = st.get("disaggregation") or {}
    if "metadata_rows" in d and d["available_metadata_rows"] != d["metadata_rows"]:
        out.append(f"metadata rows: {d['available_metadata_rows']} free of {d['metadata_rows']}")
    backup = st.get("retraction_backup") or {}
    if backup.get("live_backups"):
        out.append(f"{backup['live_backups']} retraction backups still held")
    if backup.get("host_pool_size") is not None and backup.get("host_pool_available") != backup["host_pool_size"]:
        out.append(f"host pool: {backup.get('host_pool_available')} free of {backup['host_pool_size']}")
    return out


def assert_pools_restored(urls: Sequence[str], timeout: float = 60.0) -> None:
    problems = []
    for url in urls:
        problems += [f"{url}: {p}" for p in pool_violations(wait_idle(url, timeout))]
    assert not problems, "\n".join(problems)
