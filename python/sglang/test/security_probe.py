"""Helpers for `test/security/`: send a hostile request while a bystander measures that the server
still serves everyone else, then check that the server is whole.

    with Bystander(url) as b:                 # a 1-token chat every 0.25 s on its own connection
        r = requests.post(url + "/generate", json=attack, timeout=60)
    assert r.status_code == 400 and "..." in error_message(r)
    b.assert_responsive()                     # every bystander chat answered, each within 2 s
    assert_server_whole(url)                  # /health 200, nothing running, pools at their free sizes
"""

from __future__ import annotations

import threading
import time
from typing import Dict, List, Optional, Sequence

import requests

from sglang.test.fuzz.runner import pool_violations

BYSTANDER_BOUND_S = 2.0


def auth(key: Optional[str]) -> Dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def error_message(r: requests.Response) -> str:
    """The error text of a 4xx/5xx answer in any of the server's shapes (OpenAI, native, plain)."""
    try:
        body = r.json()
    except ValueError:
        return r.text
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            return str(err.get("message", ""))
        return str(body.get("message") or body.get("detail") or err or body)
    return str(body)


class Bystander:
    """A second client that sends a 1-token chat (on /v1/chat/completions) every `interval` s
    while the block runs, and records how long each took (None: it failed)."""

    def __init__(self, url: str, api_key: Optional[str] = None, interval: float = 0.25, timeout: float = 30.0):
        self.url, self.headers, self.interval, self.timeout = url, auth(api_key), interval, timeout
        self.latencies: List[Optional[float]] = []
        self.errors: List[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _one(self, session: requests.Session) -> None:
        t0 = time.perf_counter()
        try:
            r = session.post(self.url + "/v1/chat/completions", headers=self.headers, timeout=self.timeout,
                             json={"model": "default", "messages": [{"role": "user", "content": "hi"}],
                                   "max_tokens": 1, "temperature": 0})
            if r.status_code != 200:
                self.errors.append(f"status {r.status_code}: {r.text[:200]}")
                self.latencies.append(None)
                return
        except requests.RequestException as e:
            self.errors.append(repr(e))
            self.latencies.append(None)
            return
        self.latencies.append(time.perf_counter() - t0)

    def _run(self) -> None:
        with requests.Session() as s:
            while not self._stop.is_set():
                self._one(s)
                self._stop.wait(self.interval)
            self._one(s)  # one more after the attack's answer came back

    def __enter__(self) -> "Bystander":
        self._thread.start()
        time.sleep(self.interval)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(self.timeout + 5)

    def assert_responsive(self, bound: float = BYSTANDER_BOUND_S) -> None:
        assert self.latencies, "the bystander sent nothing"
        assert not self.errors, f"bystander requests failed: {self.errors[:3]}"
        worst = max(self.latencies)
        assert worst <= bound, f"a bystander's 1-token chat took {worst:.2f} s (bound {bound} s): {self.latencies}"


def assert_server_whole(url: str, api_key: Optional[str] = None, timeout: float = 60.0) -> None:
    """/health answers 200, nothing runs or waits, and every pool is back at its free size."""
    r = requests.get(url + "/health", headers=auth(api_key), timeout=10)
    assert r.status_code == 200, f"/health answered {r.status_code}: {r.text[:200]}"
    deadline = time.time() + timeout
    while True:
        info = requests.get(url + "/server_info", headers=auth(api_key), timeout=30).json()
        st = info["internal_states"][0]
        busy = st["num_running_reqs"] + st["num_waiting_reqs"]
        if busy == 0:
            break
        assert time.time() < deadline, f"{url} still busy after {timeout:.0f} s: {st}"
        time.sleep(0.2)
    problems = pool_violations(st)
    assert not problems, "\n".join(problems)


def assert_all_whole(urls: Sequence[str], api_key: Optional[str] = None) -> None:
    for u in urls:
        assert_server_whole(u, api_key)
