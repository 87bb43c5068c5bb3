"""`CacheInitParams`: what a prefix cache is built from (the subset of upstream's that we use)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Tuple

from sglang.srt.mem_cache.unified_cache.component_type import ComponentType


@dataclass
class CacheInitParams:
    disable: bool
    req_to_token_pool: Any
    token_to_kv_pool_allocator: Any
    page_size: int
    eviction_policy: str = "lru"
    sliding_window_size: Optional[int] = None
    tree_components: Tuple[ComponentType, ...] = (ComponentType.FULL,)
    enable_kv_cache_events: bool = False
    # Hybrid SSM models: the MambaPool whose slots requests and the MAMBA component hold.
    mamba_pool: Any = None
    # ... and the memory manager's `StateSlots` over it, from which the tree takes the slots of the
    # states it keeps (mem_cache/state_slots.py); required with `mamba_pool`.
    state_slots: Any = None
