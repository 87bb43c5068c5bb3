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

Turns are handed on in order: a scheduler waiting for one gets the next. A bare `flock` does not
do that: the process that unlocks runs on and locks again before the woken waiter is scheduled,
so a decode server stepping back to back kept the turn for 100+ steps while the prefill server
waited with a new prompt. So a taker first passes a gate (`<path>.gate`), which it holds while it
waits for the turn: the scheduler that just gave the turn back then queues at the gate behind it.
A dead holder's locks go with its file descriptors, as before.

After each forward a scheduler on shared cores ends its idle OpenMP workers (`end_of_forward`):
libgomp's would spin ~4 ms on a core the other scheduler or the HTTP processes need.

A scheduler takes its turn before it forms the step's batch, and when it had to wait it looks at its
queues again (`Scheduler.step`): what arrived while the other one computed (a decode server's KV
transfers, a prefill server's bootstrapped prompts) joins this batch instead of waiting a whole
batch more. `ComputeTurns.gate` is that whole protocol around one batch; the batch itself (plan,
forward, outputs) knows nothing of turns.
"""

from __future__ import annotations

import fcntl
import os
from typing import Callable, Optional

from sglang.srt.utils.cpu_binding import release_openmp_workers

ENV = "SGLANG_CPU_TURNS_FILE"


def _lock(fd: int) -> bool:
    """An exclusive flock on `fd`; True when someone else held it and this call waited."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return True


class ComputeTurns:
    """`take()` before a step's batch is formed (a no-op while held), `give_back()` when the step ends."""

    def __init__(self, path: Optional[str]):
        self.path = path or None
        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600) if self.path else None
        self.gate_fd = os.open(self.path + ".gate", os.O_CREAT | os.O_RDWR, 0o600) if self.path else None
        self.held = False
        self.turns_taken = 0

    @classmethod
    def from_env(cls) -> "ComputeTurns":
        return cls(os.environ.get(ENV))

    @property
    def enabled(self) -> bool:
        return self.fd is not None

    def take(self) -> bool:
        """Takes the turn; True when it had to wait for it (the other scheduler was computing)."""
        if self.fd is None or self.held:
            return False
        waited = _lock(self.gate_fd)  # first in line: whoever comes later waits here
        try:
            waited = _lock(self.fd) or waited
        finally:
            fcntl.flock(self.gate_fd, fcntl.LOCK_UN)
        self.held = True
        self.turns_taken += 1
        return waited

    def wait_while_busy(self) -> bool:
        """Blocks while another scheduler holds the turn, without taking one; True if it waited.
        A scheduler whose work waits on the other one (a decode server on KV that the prefill's
        batch makes, a prefill server on the decode's slots) waits here instead of polling every
        millisecond: a poll that wakes during the other's batch takes a core from its OpenMP team,
        and each of the team's barriers then waits for it (measured: PD prefill forwards 15-20%
        slower than a plain server's, same prompts, while the decode polled)."""
        if self.fd is None or self.held:
            return False
        waited = _lock(self.fd)
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        return waited

    def end_of_forward(self) -> None:
        """After each forward on shared cores: the OpenMP workers, which would spin on for ~4 ms
        (libgomp), end now, so that the other scheduler's batch and the HTTP, detokenizer and router
        processes get their core; the next forward starts new ones (benchmark/RESULTS.md: launch_pd
        +2-3% serving throughput, alternating)."""
        if self.fd is not None:
            release_openmp_workers()

    def gate(self, batch: Callable[[bool], None], forward_count: Callable[[], int],
             end_of_turn: Callable[[], None]) -> None:
        """Runs one step's batch in this scheduler's turn: takes the turn, runs `batch(waited)`
        (`waited`: the other scheduler computed meanwhile, so look at the queues again), ends the
        OpenMP workers when the batch ran a forward (`forward_count` moved), lets `end_of_turn`
        finish what the other scheduler's next batch needs, and gives the turn back. Without
        shared cores it just runs `batch(False)`."""
        forwards = forward_count()
        waited = self.take()
        try:
            try:
                batch(waited)
            finally:
                if forward_count() != forwards:
                    self.end_of_forward()
            if self.held:
                end_of_turn()
        finally:
            self.give_back()

    def give_back(self) -> None:
        if self.held:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            self.held = False

    def close(self) -> None:
        self.give_back()
        if self.fd is not None:
            os.close(self.fd)
            os.close(self.gate_fd)
            self.fd = self.gate_fd = None

    def describe(self) -> str:
        return f"compute turns: shared with every scheduler on {self.path} ({ENV})" if self.path else "compute turns: none"
