"""Nodes of the unified radix tree: a key segment plus one `ComponentData` per component."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

import torch

from sglang.srt.mem_cache.radix_key import RadixKey
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

_node_ids = itertools.count()


@dataclass
class ComponentData:
    """One component's data at one node.

    value: device indices into that component's pool, aligned with the node's key
    (FULL: full KV slots, SWA: SWA-pool slots); None is a tombstone: the data was evicted
    while the node (and its other components) stayed.
    lock_ref: how many live locks (requests using this node) protect the value from eviction.
    """

    value: Optional[torch.Tensor] = None
    lock_ref: int = 0
    metadata: Dict[str, Any] = field(default_factory=dict)


class UnifiedTreeNode:
    __slots__ = ("id", "key", "parent", "children", "component_data", "last_access_time", "hit_count", "deleted")

    def __init__(self, key: RadixKey, parent: Optional["UnifiedTreeNode"], components):
        self.id = next(_node_ids)
        self.key = key
        self.parent = parent
        self.children: Dict[Any, UnifiedTreeNode] = {}
        self.component_data: Dict[ComponentType, ComponentData] = {ct: ComponentData() for ct in components}
        self.last_access_time = 0
        self.hit_count = 0
        self.deleted = False

    def data(self, ct: ComponentType) -> ComponentData:
        return self.component_data[ct]

    @property
    def full_value(self) -> Optional[torch.Tensor]:
        return self.component_data[ComponentType.FULL].value

    @property
    def is_leaf(self) -> bool:
        return not self.children

    @property
    def is_root(self) -> bool:
        return self.parent is None

    def __len__(self) -> int:
        return len(self.key)

    def __repr__(self) -> str:
        parts = []
        for ct, d in self.component_data.items():
            state = "tomb" if d.value is None else str(len(d.value))
            parts.append(f"{ct}={state}/lock{d.lock_ref}")
        return f"Node#{self.id}(len={len(self.key)}, {', '.join(parts)})"
