"""`TreeComponent`: what one kind of device data does at each step of the tree's algorithms.

The tree core (`unified_tree_core.py`) owns structure (walks, splits, node creation and
deletion, size counters); a component decides what its data means:
- which matched prefixes it can serve (`new_match_validator`),
- how its value is carved when a node is split (`redistribute_on_split`),
- what a new node stores (`value_for_new_node`) and what happens when an insert runs over
  a node that already exists (`on_insert_overlap`),
- how its data is freed (`free_device`) and where it sits in the eviction cascade
  (`internal_priority`: evicting a component on an internal node also evicts every component
  with lower or equal priority there; a leaf always loses everything),
- what a lock on a matched node protects (`lock`/`unlock`, replayed from a receipt).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Optional

import torch

from sglang.srt.mem_cache.unified_cache.component_type import ComponentType


class MatchValidator:
    """Stateful check run while a match walks down: `advance` per node, then `ok()`."""

    def advance(self, node, num_tokens: int) -> None:
        pass

    def ok(self) -> bool:
        return True


class TreeComponent(ABC):
    component_type: ComponentType
    internal_priority: int = 0

    def __init__(self):
        self.core = None

    def attach(self, core) -> None:
        self.core = core

    def eviction_priority(self, is_leaf: bool) -> int:
        return 0 if is_leaf else self.internal_priority

    def new_match_validator(self) -> MatchValidator:
        return MatchValidator()

    def value_for_new_node(self, full_value: torch.Tensor, tombstone: bool) -> Optional[torch.Tensor]:
        return None if tombstone else full_value.clone()

    def tombstone_prefix_len(self, full_value: torch.Tensor) -> int:
        """How many leading tokens of a new segment arrive without this component's data."""
        return 0

    def redistribute_on_split(self, new_parent, child, split_len: int) -> None:
        """Default: the value is per-token, so slice it; the parent inherits the child's locks
        (every lock on the child covers the child's whole range, hence the parent too)."""
        pd, cd = new_parent.data(self.component_type), child.data(self.component_type)
        if cd.value is not None:
            pd.value = cd.value[:split_len]
            cd.value = cd.value[split_len:]
        pd.lock_ref = cd.lock_ref
        pd.metadata = dict(cd.metadata)

    def on_insert_overlap(self, node, new_full_value: torch.Tensor):
        """An insert covers all of `node` with `new_full_value`; returns the node to continue from."""
        return node

    @abstractmethod
    def free_device(self, node) -> None:
        """Free this component's device data at `node` (the core then marks it a tombstone)."""

    @abstractmethod
    def lock(self, node) -> Any:
        """Protect what a request that matched up to `node` needs; return the receipt part."""

    @abstractmethod
    def unlock(self, node, part: Any) -> None:
        """Undo exactly what `lock(node)` did, given its receipt part."""
