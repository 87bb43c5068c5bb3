"""MAMBA: one recurrent-state slot per node (hybrid SSM models). The seam only, for now.

Upstream semantics to implement here: validator = the node holds a Mamba slot; split gives
the new parent no state (the state belongs to the end of the sequence, i.e. the child);
insert stores the request's slot on the final node (copy-on-write at match time);
internal priority 0 (evicted together with SWA/FULL on the same node); lock = single node.
"""

from __future__ import annotations

from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_cache.components.base import TreeComponent


class MambaComponent(TreeComponent):
    component_type = ComponentType.MAMBA
    internal_priority = 0

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(
            "MambaComponent: prefix caching of Mamba state is not implemented yet; "
            "run hybrid-SSM models with --disable-radix-cache."
        )

    def free_device(self, node) -> None:  # pragma: no cover - seam
        raise NotImplementedError

    def lock(self, node):  # pragma: no cover - seam
        raise NotImplementedError

    def unlock(self, node, part) -> None:  # pragma: no cover - seam
        raise NotImplementedError
