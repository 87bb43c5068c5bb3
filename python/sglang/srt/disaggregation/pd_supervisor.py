"""(launch_pd process.) Keeps a PD deployment whole: prefill server, decode server and router.

Policy (documented in docs/pd.md): a member that exits is restarted with a bounded exponential
backoff (1 s, 2 s, 4 s ... at most 30 s); a member that needs more than `max_restarts` restarts
within `RESTART_WINDOW_S` makes launch_pd shut the whole deployment down and exit with code 1
and a message that says which member and why, so that an outer supervisor can take over. There
is never a deployment with a dead member left running. `max_restarts=0` shuts down at the first
death. On SIGTERM/SIGINT the members are stopped router first, each with SIGTERM and a bounded
wait, then SIGKILL, and launch_pd exits only after all of them have.
"""

from __future__ import annotations

import subprocess
import time
from collections import deque
from typing import Callable, Deque, Dict, List, Optional

RESTART_WINDOW_S = 600.0
MAX_BACKOFF_S = 30.0
STOP_TIMEOUT_S = 30.0


def log(msg: str) -> None:
    print(f"[launch_pd] {msg}", flush=True)


class Member:
    """One process of the deployment: how to start it and how to know it is up."""

    def __init__(self, name: str, cmd: List[str], url: str, startup_timeout: float,
                 wait_healthy: Callable[[str, subprocess.Popen, float], None],
                 env: Optional[Dict[str, str]] = None):
        self.name = name
        self.cmd = cmd
        self.env = env  # None: this process's environment
        self.url = url
        self.startup_timeout = startup_timeout
        self.wait_healthy = wait_healthy
        self.proc: Optional[subprocess.Popen] = None
        self.restarts: Deque[float] = deque()

    def start(self) -> None:
        self.proc = subprocess.Popen(self.cmd, env=self.env)

    def wait_up(self) -> None:
        self.wait_healthy(self.url, self.proc, self.startup_timeout)

    def exited(self) -> Optional[int]:
        return None if self.proc is None else self.proc.poll()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()

    def wait_stopped(self, timeout: float) -> None:
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log(f"{self.name} did not stop within {timeout:.0f} s; killing it")
            self.proc.kill()
            self.proc.wait(timeout=10)


class Deployment:
    def __init__(self, members: List[Member], max_restarts: int = 3, sleep=time.sleep):
        self.members = members  # start order: prefill, decode, router
        self.max_restarts = max_restarts
        self.sleep = sleep
        self.stopping = False

    def start(self) -> None:
        """The servers start side by side; the router once both are healthy (it probes them)."""
        *servers, router = self.members
        for m in servers:
            m.start()
        for m in servers:
            m.wait_up()
        router.start()
        router.wait_up()

    def supervise(self, poll_s: float = 1.0) -> int:
        """Runs until a member cannot be kept alive (returns 1) or `stop()` is called (returns 0)."""
        while not self.stopping:
            for m in self.members:
                code = m.exited()
                if code is None or self.stopping:
                    continue
                if not self._restart(m, code):
                    return 1
            self.sleep(poll_s)
        return 0

    def _restart(self, m: Member, code: int) -> bool:
        now = time.monotonic()
        while m.restarts and now - m.restarts[0] > RESTART_WINDOW_S:
            m.restarts.popleft()
        if len(m.restarts) >= self.max_restarts:
            log(f"the {m.name} server exited with code {code} and has been restarted {len(m.restarts)} time(s) in "
                f"{RESTART_WINDOW_S:.0f} s (--max-restarts {self.max_restarts}); shutting the deployment down. "
                f"See its log above for the cause.")
            return False
        backoff = min(2.0 ** len(m.restarts), MAX_BACKOFF_S)
        log(f"the {m.name} server exited with code {code}; restarting it in {backoff:.0f} s "
            f"(restart {len(m.restarts) + 1} of at most {self.max_restarts} in {RESTART_WINDOW_S:.0f} s)")
        m.restarts.append(now)
        self.sleep(backoff)
        if self.stopping:
            return True
        m.start()
        try:
            m.wait_up()
        except Exception as e:  # noqa: BLE001 - the next poll sees it dead (or hung: stop it)
            log(f"the restarted {m.name} server did not come up: {e}")
            m.stop()
            m.wait_stopped(STOP_TIMEOUT_S)
            return self._restart(m, m.exited() if m.exited() is not None else -1)
        log(f"the {m.name} server is back: {m.url}")
        return True

    def stop(self) -> None:
        """Router first (no new requests), then decode, then prefill; each waited for."""
        self.stopping = True
        for m in reversed(self.members):
            m.stop()
            m.wait_stopped(STOP_TIMEOUT_S)

    def status(self) -> Dict[str, Optional[int]]:
        return {m.name: m.exited() for m in self.members}
