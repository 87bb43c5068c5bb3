"""FULL: full-attention KV slots. The base component: a node's key length is its FULL length."""

from __future__ import annotations

from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_cache.components.base import TreeComponent


class FullComponent(TreeComponent):
    component_type = ComponentType.FULL
    internal_priority = 2

    def __init__(self, token_to_kv_pool_allocator):
        super().__init__()
        self.allocator = token_to_kv_pool_allocator

    def free_device(self, node) -> None:
        self.allocator.free(node.data(ComponentType.FULL).value)

    def lock(self, node):
        """Path lock: the whole prefix anchor..root is needed by the request."""
        while not node.is_root:
            self.core.inc_component_lock(node, ComponentType.FULL)
            node = node.parent
        return None

    def unlock(self, node, part) -> None:
        while not node.is_root:
            self.core.dec_component_lock(node, ComponentType.FULL)
            node = node.parent
