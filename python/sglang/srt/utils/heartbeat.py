"""The scheduler loop's heartbeat: one double in shared memory that the loop sets to
`time.monotonic()` on every turn, and that other processes read without asking the scheduler.

Why shared memory and not a message: a scheduler stuck in one step (a pathological pattern, a
hung kernel, a deadlock) cannot answer any message, so `/health` must not depend on one. The
launcher creates the value and hands it to the scheduler process at spawn; `time.monotonic()` is
CLOCK_MONOTONIC, the same clock in every process of the machine. An aligned 8-byte store is atomic
on the platforms we run on, so no lock is needed (a reader sees the old or the new time).

The loop turns at least once a second while idle (its poll has a timeout), so an age above a few
seconds means one step (intake, scheduling, forward, outputs, grammar) has run that long.
"""

from __future__ import annotations

import math
import time


class Heartbeat:
    def __init__(self, mp_context=None):
        """`mp_context`: the multiprocessing context the scheduler is spawned with (shared
        memory then); None: a plain attribute, for a loop that runs in this process."""
        self._shared = mp_context.RawValue("d", 0.0) if mp_context is not None else None
        self._local = 0.0

    def tick(self) -> None:
        now = time.monotonic()
        if self._shared is not None:
            self._shared.value = now
        else:
            self._local = now

    def last(self) -> float:
        """monotonic() of the last tick; 0.0 before the first."""
        return self._shared.value if self._shared is not None else self._local

    def age(self) -> float:
        """Seconds since the last tick (inf before the first)."""
        last = self.last()
        return math.inf if last == 0.0 else time.monotonic() - last


class Heartbeats:
    """The heartbeats of several scheduler loops (data-parallel replicas, `--dp-size`), read as
    one: the server is as alive as its most stuck replica."""

    def __init__(self, beats):
        self.beats = list(beats)

    def age(self) -> float:
        return max(b.age() for b in self.beats)

    def last(self) -> float:
        return min(b.last() for b in self.beats)
