"""`UnifiedTreeCore`: the radix tree shared by all components (structure, sizes, eviction, locks).

Every non-root node holds FULL data (its key length == len(FULL value)); auxiliary
components (SWA, MAMBA) may hold a tombstone. Keys and node lengths are page-aligned.

Size counters, per component: tokens with data on nodes whose component lock_ref is 0
(evictable) or > 0 (protected). They are kept in step by `set_component_value` and
`inc/dec_component_lock`; `sanity_check()` recomputes them from scratch.

Eviction: FULL deletes least-recently-used unlocked leaves. An auxiliary component walks its
nodes oldest first: a leaf is deleted (all components freed), an internal node is tombstoned
for that component and, by the cascade, for every component of lower or equal internal
priority (FULL 2 > SWA 1 > MAMBA 0). After any deletion, ancestors that became unlocked
leaves missing some component's data are deleted too (they can never be matched).
"""

from __future__ import annotations

import heapq
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from sglang.srt.mem_cache.radix_key import RadixKey
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_cache.components.base import TreeComponent
from sglang.srt.mem_cache.unified_cache.tree_node import UnifiedTreeNode
from sglang.srt.mem_cache.unified_cache.types import EvictParams, EvictResult, InsertResult, LockReceipt

FULL = ComponentType.FULL
_EMPTY = torch.empty(0, dtype=torch.int64)

# lru: least recently used; lfu: least hit, then LRU; slru: nodes hit fewer than twice first,
# then LRU; priority: per-request priorities are not tracked in the tree, so every node has
# priority 0 and the order is LRU.
EVICTION_POLICIES = ("lru", "lfu", "slru", "priority")
SLRU_PROTECTED_THRESHOLD = 2


class UnifiedTreeCore:
    def __init__(self, components: Sequence[TreeComponent], page_size: int, eviction_policy: str = "lru"):
        assert components and components[0].component_type is FULL, "FULL must be the first component"
        if eviction_policy not in EVICTION_POLICIES:
            raise NotImplementedError(f"--radix-eviction-policy {eviction_policy} is not supported here; use one of {list(EVICTION_POLICIES)}.")
        self.components: Dict[ComponentType, TreeComponent] = {c.component_type: c for c in components}
        self.aux_components = [c for c in components if c.component_type is not FULL]
        for c in components:
            c.attach(self)
        self.page_size = page_size
        self.eviction_policy = eviction_policy
        self.reset()

    # ---- state -------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget every node (does not free device memory: callers clear the allocators)."""
        self.root = UnifiedTreeNode(RadixKey([]), None, self.components)
        for d in self.root.component_data.values():
            d.value = _EMPTY
            d.lock_ref = 1
        self.clock = 0
        self.evictable: Dict[ComponentType, int] = {ct: 0 for ct in self.components}
        self.protected: Dict[ComponentType, int] = {ct: 0 for ct in self.components}

    def set_component_value(self, node: UnifiedTreeNode, ct: ComponentType, value: Optional[torch.Tensor]) -> None:
        d = node.data(ct)
        bucket = self.protected if d.lock_ref > 0 else self.evictable
        if d.value is not None:
            bucket[ct] -= len(d.value)
        d.value = value
        if value is not None:
            bucket[ct] += len(value)

    def inc_component_lock(self, node: UnifiedTreeNode, ct: ComponentType) -> None:
        d = node.data(ct)
        if d.lock_ref == 0 and d.value is not None:
            self.evictable[ct] -= len(d.value)
            self.protected[ct] += len(d.value)
        d.lock_ref += 1

    def dec_component_lock(self, node: UnifiedTreeNode, ct: ComponentType) -> None:
        d = node.data(ct)
        assert d.lock_ref > 0, f"lock_ref underflow on {node} for {ct}"
        if d.lock_ref == 1 and d.value is not None:
            self.protected[ct] -= len(d.value)
            self.evictable[ct] += len(d.value)
        d.lock_ref -= 1

    def _touch_path(self, node: UnifiedTreeNode) -> None:
        """Most recent at `node`, strictly older going up: parents are evicted before children."""
        path = []
        while not node.is_root:
            path.append(node)
            node = node.parent
        self.clock += len(path)
        for i, n in enumerate(path):
            n.last_access_time = self.clock - i

    # ---- structure ----------------------------------------------------------------------
    def split_node(self, child: UnifiedTreeNode, split_len: int) -> UnifiedTreeNode:
        """Cut `child` at split_len; returns the new parent holding key[:split_len].

        The `child` object keeps the suffix, so references to it (request last_node, lock
        receipts) keep meaning "the end of that prefix".
        """
        assert 0 < split_len < len(child) and split_len % self.page_size == 0
        parent = child.parent
        new_node = UnifiedTreeNode(child.key[:split_len], parent, self.components)
        new_node.last_access_time = child.last_access_time
        new_node.hit_count = child.hit_count
        for comp in self.components.values():
            comp.redistribute_on_split(new_node, child, split_len)
        parent.children[child.key.child_key(self.page_size)] = new_node
        child.key = child.key[split_len:]
        child.parent = new_node
        new_node.children[child.key.child_key(self.page_size)] = child
        return new_node

    def _new_node(self, parent: UnifiedTreeNode, key: RadixKey, value: torch.Tensor, tombstone: set) -> UnifiedTreeNode:
        node = UnifiedTreeNode(key, parent, self.components)
        parent.children[key.child_key(self.page_size)] = node
        for ct, comp in self.components.items():
            self.set_component_value(node, ct, comp.value_for_new_node(value, ct in tombstone))
        return node

    def _add_segment(self, parent: UnifiedTreeNode, key: RadixKey, value: torch.Tensor) -> UnifiedTreeNode:
        cuts = {c.component_type: c.tombstone_prefix_len(value) for c in self.aux_components}
        points = sorted({t for t in cuts.values() if 0 < t < len(key)} | {0, len(key)})
        node = parent
        for a, b in zip(points, points[1:]):
            tomb = {ct for ct, t in cuts.items() if t >= b}
            node = self._new_node(node, key[a:b], value[a:b], tomb)
        return node

    # ---- match / insert -----------------------------------------------------------------
    def match(self, key: RadixKey, skip: Tuple[ComponentType, ...] = ()) -> Tuple[List[torch.Tensor], UnifiedTreeNode]:
        """FULL values along the longest prefix every component (but those in `skip`) can serve,
        and its last node."""
        key = key.page_aligned(self.page_size)
        validators = [c.new_match_validator() for c in self.aux_components if c.component_type not in skip]
        node, pos = self.root, 0
        path: List[Tuple[UnifiedTreeNode, int]] = []
        best = 0  # number of path entries in the best usable prefix
        while pos < len(key):
            child = node.children.get(key[pos:].child_key(self.page_size))
            if child is None:
                break
            n = child.key.match(key[pos:], self.page_size)
            if n == 0:
                break
            for v in validators:
                v.advance(child, n)
            path.append((child, n))
            if all(v.ok() for v in validators):
                best = len(path)
            if n < len(child):
                break
            node, pos = child, pos + n
        if best == 0:
            return [], self.root
        last, n = path[best - 1]
        if n < len(last):
            last = self.split_node(last, n)
        values = [nd.full_value for nd, _ in path[: best - 1]] + [last.full_value]
        self._touch_path(last)
        walker = last
        while not walker.is_root:
            walker.hit_count += 1
            walker = walker.parent
        return values, last

    def insert(self, key: RadixKey, value: torch.Tensor) -> InsertResult:
        n = len(key) // self.page_size * self.page_size
        key, value = key[:n], value[:n]
        node, pos = self.root, 0
        while pos < n:
            child = node.children.get(key[pos:].child_key(self.page_size))
            if child is None:
                break
            m = child.key.match(key[pos:], self.page_size)
            if m < len(child):
                child = self.split_node(child, m)
            for comp in self.aux_components:
                child = comp.on_insert_overlap(child, value[pos : pos + m])
            node, pos = child, pos + m
        prefix_len = pos
        if pos < n:
            node = self._add_segment(node, key[pos:], value[pos:])
        self._touch_path(node)
        return InsertResult(prefix_len=prefix_len, last_device_node=node)

    def path_values(self, node: UnifiedTreeNode) -> torch.Tensor:
        vals = []
        while not node.is_root:
            vals.append(node.full_value)
            node = node.parent
        return torch.cat(vals[::-1]) if vals else _EMPTY.clone()

    # ---- locks ----------------------------------------------------------------------------
    def inc_lock_ref(self, node: UnifiedTreeNode) -> LockReceipt:
        parts = {}
        if not node.is_root:
            for ct, comp in self.components.items():
                parts[ct] = comp.lock(node)
        return LockReceipt(node=node, component_parts=parts)

    def dec_lock_ref(self, node: UnifiedTreeNode, receipt: Optional[LockReceipt]) -> None:
        if node.is_root:
            return
        assert receipt is not None and receipt.node is node, "dec_lock_ref: receipt was taken on another node"
        for ct, comp in reversed(list(self.components.items())):
            comp.unlock(node, receipt.component_parts[ct])

    # ---- eviction ---------------------------------------------------------------------------
    def _priority_key(self, node: UnifiedTreeNode):
        if self.eviction_policy == "lfu":
            return (node.hit_count, node.last_access_time, node.id)
        if self.eviction_policy == "slru":
            return (node.hit_count >= SLRU_PROTECTED_THRESHOLD, node.last_access_time, node.id)
        return (node.last_access_time, node.id)

    def _unlocked(self, node: UnifiedTreeNode) -> bool:
        return all(d.lock_ref == 0 for d in node.component_data.values())

    def _all_nodes(self) -> List[UnifiedTreeNode]:
        out, stack = [], [self.root]
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(n.children.values())
        return out

    def _free_component(self, node: UnifiedTreeNode, ct: ComponentType, res: EvictResult) -> None:
        d = node.data(ct)
        if d.value is None:
            return
        n = len(d.value)
        self.components[ct].free_device(node)
        self.set_component_value(node, ct, None)
        if ct is FULL:
            res.num_tokens_evicted += n
        elif ct is ComponentType.SWA:
            res.swa_num_tokens_evicted += n
        elif ct is ComponentType.MAMBA:
            res.mamba_num_evicted += 1

    def _delete_leaf(self, node: UnifiedTreeNode, res: EvictResult) -> None:
        assert node.is_leaf and not node.is_root and self._unlocked(node)
        # Auxiliary data first: the SWA allocator finds SWA slots through the FULL slots.
        for ct in sorted(self.components, key=lambda c: self.components[c].internal_priority):
            self._free_component(node, ct, res)
        del node.parent.children[node.key.child_key(self.page_size)]
        node.deleted = True
        parent = node.parent
        # Iteratively delete ancestors that became data-less unlocked leaves.
        while (
            not parent.is_root
            and parent.is_leaf
            and self._unlocked(parent)
            and any(d.value is None for d in parent.component_data.values())
        ):
            for ct in self.components:
                self._free_component(parent, ct, res)
            del parent.parent.children[parent.key.child_key(self.page_size)]
            parent.deleted = True
            parent = parent.parent

    def _evictable_leaf(self, node: UnifiedTreeNode) -> bool:
        return not node.is_root and not node.deleted and node.is_leaf and self._unlocked(node)

    def _evict_full(self, num_tokens: int, res: EvictResult) -> None:
        heap = [(self._priority_key(n), n) for n in self._all_nodes() if self._evictable_leaf(n)]
        heapq.heapify(heap)
        while res.num_tokens_evicted < num_tokens and heap:
            _, node = heapq.heappop(heap)
            if not self._evictable_leaf(node):
                continue
            ancestor = node.parent
            self._delete_leaf(node, res)  # may also delete data-less ancestors
            while ancestor.deleted:
                ancestor = ancestor.parent
            if self._evictable_leaf(ancestor):
                heapq.heappush(heap, (self._priority_key(ancestor), ancestor))

    def _evict_aux(self, ct: ComponentType, num_tokens: int, res: EvictResult) -> None:
        prio = self.components[ct].internal_priority
        cascade = [c for c, comp in self.components.items() if comp.internal_priority <= prio]
        candidates = [n for n in self._all_nodes() if not n.is_root and n.data(ct).value is not None]
        candidates.sort(key=self._priority_key)
        for node in candidates:
            if self._evicted_count(res, ct) >= num_tokens:
                break
            if node.deleted or node.data(ct).value is None:
                continue
            if node.is_leaf and self._unlocked(node):
                self._delete_leaf(node, res)
            elif all(node.data(c).lock_ref == 0 for c in cascade):
                # Internal node, or a leaf some request is anchored on (its FULL KV is in use)
                # whose data of this component is not locked (MAMBA: the request already copied
                # the state): tombstone.
                for c in sorted(cascade, key=lambda c: self.components[c].internal_priority):
                    self._free_component(node, c, res)

    @staticmethod
    def _evicted_count(res: EvictResult, ct: ComponentType) -> int:
        if ct is ComponentType.SWA:
            return res.swa_num_tokens_evicted
        if ct is ComponentType.MAMBA:
            return res.mamba_num_evicted
        return res.num_tokens_evicted

    def evict(self, params: EvictParams) -> EvictResult:
        res = EvictResult()
        if params.num_tokens > 0:
            self._evict_full(params.num_tokens, res)
        if params.swa_num_tokens > 0 and ComponentType.SWA in self.components:
            self._evict_aux(ComponentType.SWA, params.swa_num_tokens, res)
        if params.mamba_num > 0 and ComponentType.MAMBA in self.components:
            self._evict_aux(ComponentType.MAMBA, params.mamba_num, res)
        return res

    # ---- checks -------------------------------------------------------------------------
    def sanity_check(self) -> None:
        """Recompute every invariant; raises AssertionError on the first violation."""
        evictable = {ct: 0 for ct in self.components}
        protected = {ct: 0 for ct in self.components}
        for node in self._all_nodes():
            if node.is_root:
                continue
            assert not node.deleted and len(node) > 0 and len(node) % self.page_size == 0, node
            assert node.parent.children.get(node.key.child_key(self.page_size)) is node, node
            assert node.full_value is not None and len(node.full_value) == len(node), node
            for ct, d in node.component_data.items():
                assert d.lock_ref >= 0, node
                if d.value is not None:
                    (protected if d.lock_ref > 0 else evictable)[ct] += len(d.value)
            if ComponentType.FULL in node.component_data and node.data(FULL).lock_ref > 0:
                assert node.parent.is_root or node.parent.data(FULL).lock_ref > 0, f"path lock broken at {node}"
        assert evictable == self.evictable, (evictable, self.evictable)
        assert protected == self.protected, (protected, self.protected)
