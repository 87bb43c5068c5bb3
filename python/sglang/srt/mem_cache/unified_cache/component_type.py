"""The kinds of device data a `UnifiedRadixCache` node can hold (upstream's numbering)."""

from __future__ import annotations

from enum import Enum


class ComponentType(int, Enum):
    # Full-attention KV: the base component; every non-root node holds it (node length == len(value)).
    FULL = 0
    # Sliding-window-attention KV in the separate SWA pool; internal nodes may hold a tombstone.
    SWA = 1
    # Recurrent (SSM/conv) state slot, one per node (hybrid Mamba models, copy-on-write).
    MAMBA = 2
    # NPU DeepSeek-V4 compression sidecar and draft SWA: upstream numbers, unused here.
    C128 = 3
    AUXILIARY_SWA = 4

    def __str__(self) -> str:
        return self.name.lower()

    @property
    def is_full(self) -> bool:
        return self is ComponentType.FULL

    @property
    def is_swa(self) -> bool:
        return self is ComponentType.SWA

    @property
    def is_mamba(self) -> bool:
        return self is ComponentType.MAMBA


BASE_COMPONENT_TYPE = ComponentType.FULL
