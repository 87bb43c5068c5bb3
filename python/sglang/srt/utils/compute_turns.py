"""Turns on shared cores: schedulers that share CPU cores run their batches one at a time.

Two schedulers whose OpenMP pools span the same cores and compute at once slow each other far
more than twice: every parallel region waits at its barrier for the thread the other process
preempted (measured with `launch_pd` on 2 cores, both servers on both: 0.39x one plain server's
serving throughput). Taking turns gives each batch every core, as one plain server's mix of
prefills and decodes has them, while what runs between batches (transfers, polling, output)
overlaps the other's batch.

`SGLANG_CPU_TURNS_FILE=<path>`: every scheduler started with the same path takes an exclusive
`flock` on it for each batch it runs (forward, sampling and output of one step) and gives it
back when the step ends. `launch_pd` sets it for its two servers when their cores overlap (see
`sglang.srt.disaggregation.launch_pd`); unset or empty: no turns.
"""

from __future__ import annotations

import fcntl
import os
from typing import Optional

ENV = "SGLANG_CPU_TURNS_FILE"


class ComputeTurns:
    """`take()` before a batch's first forward (a no-op while held), `give_back()` when the step ends."""

    def __init__(self, path: Optional[str]):
        self.path = path or None
        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600) if self.path else None
        self.held = False
        self.turns_taken = 0

    @classmethod
    def from_env(cls) -> "ComputeTurns":
        return cls(os.environ.get(ENV))

    @property
    def enabled(self) -> bool:
        return self.fd is not None

    def take(self) -> None:
        if self.fd is None or self.held:
            return
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        self.held = True
        self.turns_taken += 1

    def give_back(self) -> None:
        if self.held:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            self.held = False

    def close(self) -> None:
        self.give_back()
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def describe(self) -> str:
        return f"compute turns: shared with every scheduler on {self.path} ({ENV})" if self.path else "compute turns: none"
