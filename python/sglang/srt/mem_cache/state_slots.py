"""The Mamba state slots of one scheduler: the memory manager's, lent to the radix tree.

A hybrid SSM model keeps one recurrent state per running request (a `MambaPool` slot) and the radix
tree keeps copies of states at prefix ends (so a prefix hit resumes the recurrence). Both draw
from the same pool, so one object hands slots out: `MemoryManager` builds it, gives requests their
slots through it, and passes it to the tree for its copies. When the pool is empty it asks the
tree (through `evict_one`, wired by `build_memory`) to drop one unlocked cached state.
"""

from __future__ import annotations

from typing import Any, Callable, Optional


class StateSlots:
    def __init__(self, pool: Any):
        self.pool = pool
        self.evict_one: Optional[Callable[[], None]] = None

    def alloc(self) -> Optional[int]:
        """One slot, evicting one unlocked cached state when none is free; None when still none."""
        slots = self.pool.alloc(1)
        if slots is None and self.evict_one is not None:
            self.evict_one()
            slots = self.pool.alloc(1)
        return None if slots is None else slots[0]

    def free_request_slot(self, req) -> None:
        """Gives back the request's slot, if it still has one (the tree may have taken it over)."""
        if req.kv.mamba_pool_idx is not None:
            self.pool.free(req.kv.mamba_pool_idx)
        req.kv.mamba_pool_idx = None
