"""(Scheduler process.) The scheduler's request queues, one record shared by its parts.

  waiting   admitted, not prefilled yet (or retracted for recompute)
  running   decoding
  chunked   the request whose prompt is being prefilled chunk by chunk (at most one)

The intake adds and removes, the planner moves waiting -> chunked/running, output processing
moves running -> finished. A PD role keeps its own queues (`ServerRole.all_reqs`).
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional

from sglang.srt.core.req import Req


@dataclasses.dataclass
class RequestQueues:
    waiting: List[Req] = dataclasses.field(default_factory=list)
    running: List[Req] = dataclasses.field(default_factory=list)
    chunked: Optional[Req] = None

    def has_batch_work(self) -> bool:
        """Whether a batch could be formed from these queues."""
        return bool(self.waiting or self.running or self.chunked)

    def in_batches(self) -> List[Req]:
        """The requests that run (decoding, or a prompt being chunked)."""
        return self.running + ([self.chunked] if self.chunked is not None else [])

    def all(self) -> List[Req]:
        return list(self.waiting) + self.in_batches()

    def remove(self, req: Req) -> None:
        for queue in (self.waiting, self.running):
            if req in queue:
                queue.remove(req)
        if req is self.chunked:
            self.chunked = None
