"""`UnifiedRadixCache`: the prefix (radix-tree) cache the scheduler talks to.

The tree (`unified_cache/unified_tree_core.py`) decides; this class executes and holds the
request lifecycle, so the scheduler never touches tree nodes except as opaque handles.

Contract for the scheduler
==========================

Req attributes this cache reads/writes (the scheduler provides them; the KV ones live in the
request's KV record `req.kv`, `core/req.py::KVState`):
  kv.req_pool_idx: int          row of `req_to_token_pool.req_to_token`
  origin_input_ids, output_ids  token lists
  fill_ids: list[int]           tokens whose KV is written once the current forward ran
  extra_key: None | str         namespace: requests with different extra_keys never share KV
  kv.prefix_indices: Tensor     int64 FULL slots the request does not have to compute
  kv.last_node, kv.lock_receipt the node its cached prefix ends at and the lock taken on it
                                (None / None when it holds no lock)
  kv.cache_protected_len: int   the row's first cache_protected_len slots belong to the tree
                                (locked); the rest of the row belongs to the request. The cache
                                re-derives it from last_node (the locked prefix's token depth)
                                and writes it back, so it cannot go stale inside the cache.
  optional kv_committed_len     KV length to release; default
                                len(origin_input_ids) + len(output_ids) - 1 (the last sampled
                                token has no KV yet)

1. Admission (same scheduling step, before allocating, since allocation may evict):
     m = cache.match_prefix(MatchPrefixParams(key=RadixKey(ids, req.extra_key)))
   with ids = origin_input_ids (+ output_ids for a retracted request) minus at least the
   last token (a forward needs one token to produce logits), then
     cache.assign_prefix(req, m)
   which locks m.last_device_node and sets prefix_indices, last_node, lock_receipt and
   cache_protected_len = len(prefix_indices). The scheduler writes prefix_indices into
   req_to_token[req_pool_idx, :len] and allocates the rest (alloc_extend with
   last_loc = prefix_indices[-1]).
2. After each prefill chunk whose request continues (chunked prefill):
     cache.cache_unfinished_req(req, chunked=True)
   inserts the page-aligned part of fill_ids, frees the request's duplicate slots (another
   request cached the same tokens meanwhile), rewrites the row with the tree's slots, moves the
   lock to the new last node, and sets prefix_indices = all len(fill_ids) computed slots (tree
   part + the request's unaligned tail, upstream RadixCache semantics), cache_protected_len =
   the page-aligned length. The request keeps owning its tail page.
3. Finish (or abort with is_insert=False):
     cache.cache_finished_req(req, is_insert=True)
   inserts the page-aligned committed KV, frees duplicates and the unaligned tail (or, when not
   inserting or disabled, frees every slot the request owns), releases the lock, frees the row
   (`req_to_token_pool.free(req_pool_idx)`), and sets last_node/lock_receipt to None.
4. Memory pressure: `cache.evict(EvictParams(num_tokens=..., swa_num_tokens=...))` frees
   unlocked cached KV through the allocators; `evictable_size()`, `protected_size()`.

Hybrid SWA (allocator is a `SWATokenToKVPoolAllocator`): the scheduler may release the SWA
slots of tokens that slid out of the window with `allocator.free_swa(...)`, only for slots the
request owns (positions >= cache_protected_len) and whole pages. The tree notices missing SWA
slots on insert (tombstones) and takes over a request's SWA slots to revive tombstones.

Hybrid SSM models (`mamba_pool` given): every request also owns one MambaPool slot
(`req.kv.mamba_pool_idx`, allocated by the memory manager when the request gets its row). Right after
allocating it the scheduler calls `cache.init_req_mamba_state(req)`: copy-on-write of the matched
node's state into the slot (prefix hit) or zeros (no prefix); this also releases the single-node
Mamba lock taken by `assign_prefix`. `cache_unfinished_req` / `cache_finished_req` store a copy
of the request's state in a fresh tree slot on the final node when the inserted key covers
exactly the tokens the state summarises, in a slot taken from the memory manager's `StateSlots`
(or, for a finished request, its own slot, donated); the manager frees the request's slot.
Eviction of tree states: `cache.evict(EvictParams(mamba_num=...))`.

A disabled cache (`--disable-radix-cache`) is this class with `disable=True`: match returns
nothing, insert does nothing, cache_unfinished_req only sets prefix_indices to the computed
slots (the request keeps owning all of them), a finished request frees all its KV.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, List, Optional, Tuple

import torch

from sglang.srt.mem_cache.radix_key import RadixKey
from sglang.srt.mem_cache.unified_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_cache.components.full import FullComponent
from sglang.srt.mem_cache.unified_cache.types import (
    EvictParams,
    EvictResult,
    InsertParams,
    InsertResult,
    LockReceipt,
    MatchPrefixParams,
    MatchResult,
)
from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore

logger = logging.getLogger(__name__)

FULL, SWA, MAMBA = ComponentType.FULL, ComponentType.SWA, ComponentType.MAMBA


def _build_components(params: CacheInitParams) -> list:
    comps = [FullComponent(params.token_to_kv_pool_allocator)]
    if params.disable:
        return comps  # nothing is ever inserted; auxiliary components would be idle
    for ct in params.tree_components:
        if ct is FULL:
            continue
        if ct is SWA:
            from sglang.srt.mem_cache.unified_cache.components.swa import SWAComponent

            comps.append(SWAComponent(params.token_to_kv_pool_allocator, params.sliding_window_size, params.page_size))
        elif ct is MAMBA:
            from sglang.srt.mem_cache.unified_cache.components.mamba import MambaComponent

            comps.append(MambaComponent(params))
        else:
            raise NotImplementedError(f"UnifiedRadixCache: component {ct} is not supported")
    return comps


class UnifiedRadixCache:
    def __init__(self, params: CacheInitParams):
        self.params = params
        self.disable = params.disable
        self.req_to_token_pool = params.req_to_token_pool
        self.token_to_kv_pool_allocator = params.token_to_kv_pool_allocator
        self.page_size = params.page_size
        self.sliding_window_size = params.sliding_window_size
        self.tree_components: Tuple[ComponentType, ...] = tuple(params.tree_components)
        assert self.tree_components[0] is FULL, "FULL is the base component"
        if SWA in self.tree_components:
            assert params.sliding_window_size, "an SWA component needs sliding_window_size"
        self.mamba_pool = getattr(params, "mamba_pool", None)
        self.state_slots = params.state_slots
        if self.mamba_pool is not None and self.state_slots is None:
            raise ValueError("A tree over a MambaPool needs the memory manager's StateSlots (CacheInitParams.state_slots).")
        self.core = UnifiedTreeCore(_build_components(params), params.page_size, params.eviction_policy)
        self.has_mamba_component = MAMBA in self.core.components
        # HiCache host stack, attached by `init_hicache` (see `registry.py`).
        self.hicache_attached = False
        self.host_stack: Any = None

    # ---- basic API --------------------------------------------------------------------------
    @property
    def root_node(self):
        return self.core.root

    def reset(self) -> None:
        """Drop every cached prefix; the caller clears the allocators (e.g. flush_cache)."""
        self.core.reset()

    def supports_mamba(self) -> bool:
        return True  # the Mamba state lives in this class's MAMBA component

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        if self.disable or len(params.key) == 0:
            root = self.core.root
            return MatchResult(torch.empty(0, dtype=torch.int64), root, root, root)
        values, node = self.core.match(params.key, skip=() if params.with_state else (MAMBA,))
        indices = torch.cat(values) if values else torch.empty(0, dtype=torch.int64)
        return MatchResult(indices.to(torch.int64), node, node, node)

    def insert(self, params: InsertParams) -> InsertResult:
        if self.disable:
            return InsertResult(prefix_len=0, last_device_node=self.core.root)
        return self.core.insert(params.key, params.value)

    def evict(self, params: EvictParams) -> EvictResult:
        if self.disable:
            return EvictResult()
        return self.core.evict(params)

    def inc_lock_ref(self, node) -> LockReceipt:
        if self.disable or node is None:
            return LockReceipt(node=self.core.root if node is None else node)
        return self.core.inc_lock_ref(node)

    def dec_lock_ref(self, node, receipt: Optional[LockReceipt] = None) -> None:
        if self.disable or node is None:
            return
        self.core.dec_lock_ref(node, receipt)

    def evictable_size(self) -> int:
        return self.core.evictable[FULL]

    def protected_size(self) -> int:
        return self.core.protected[FULL]

    def total_size(self) -> int:
        return self.evictable_size() + self.protected_size()

    def component_evictable_size(self, ct: ComponentType) -> int:
        return self.core.evictable.get(ct, 0)

    def component_protected_size(self, ct: ComponentType) -> int:
        return self.core.protected.get(ct, 0)

    def swa_evictable_size(self) -> int:
        return self.component_evictable_size(SWA)

    def swa_protected_size(self) -> int:
        return self.component_protected_size(SWA)

    def sanity_check(self) -> None:
        self.core.sanity_check()

    # ---- request lifecycle ------------------------------------------------------------------
    def assign_prefix(self, req, match: MatchResult) -> None:
        """Lock a fresh match for `req` and record it on the request (step 1 of the contract)."""
        req.kv.lock_receipt = self.inc_lock_ref(match.last_device_node)
        req.kv.last_node = match.last_device_node
        req.kv.prefix_indices = match.device_indices
        req.kv.cache_protected_len = int(match.device_indices.numel())

    # ---- Mamba state (hybrid SSM models) ------------------------------------------------------
    def _drop_mamba_lock(self, receipt: Optional[LockReceipt]) -> None:
        """Release the single-node Mamba lock of a receipt early (once the state was copied)."""
        if receipt is None or not receipt.component_parts.get(MAMBA):
            return
        self.core.dec_component_lock(receipt.node, MAMBA)
        receipt.component_parts[MAMBA] = False

    def init_req_mamba_state(self, req) -> None:
        """The request just got its own slot: copy the matched prefix's state into it
        (copy-on-write; the tree slot is never written by a request), or zero it when the
        request starts from no cached prefix."""
        slot = req.kv.mamba_pool_idx
        node = req.kv.last_node
        src = None
        if self.has_mamba_component and node is not None and not node.is_root and len(req.kv.prefix_indices) > 0:
            from sglang.srt.mem_cache.unified_cache.components.mamba import MambaComponent

            src = MambaComponent.slot_of(node)
            assert src is not None, "a prefix match ended at a node without Mamba state"
        if src is None:
            self.mamba_pool.clear_slot(slot)
        else:
            self.mamba_pool.copy_from(src, slot)
        self._drop_mamba_lock(req.kv.lock_receipt)

    def release_prefix_state_lock(self, req) -> None:
        """The request never reads its matched prefix's state (a PD decode request gets its state
        from the prefill): the prefix node's state need not stay locked for it."""
        self._drop_mamba_lock(req.kv.lock_receipt)

    def _store_mamba_state(self, req, node, num_tokens: int, state_tokens: int, donate: bool = False) -> None:
        """Give `node` (the end of a freshly inserted key of `num_tokens` tokens) a copy of the
        request's state, which summarises `state_tokens` tokens; only when the two agree.
        `donate` (the request is done with its slot): the tree takes the slot itself, no copy."""
        slot = req.kv.mamba_pool_idx
        if not self.has_mamba_component or slot is None or node.is_root or num_tokens != state_tokens:
            return
        if node.data(MAMBA).value is not None:
            return  # same prefix, same state: keep the tree's copy
        if donate:
            self.core.set_component_value(node, MAMBA, torch.tensor([slot], dtype=torch.int64))
            req.kv.mamba_pool_idx = None  # now the tree's; the manager has nothing to free
            return
        self.core.inc_component_lock(node, FULL)  # keep `node` alive while evicting for a slot
        try:
            tree_slot = self.state_slots.alloc()  # the memory manager's slots
        finally:
            self.core.dec_component_lock(node, FULL)
        if tree_slot is None:
            return  # no room: this prefix end simply has no state (no hit there)
        self.mamba_pool.copy_from(slot, tree_slot)
        self.core.set_component_value(node, MAMBA, torch.tensor([tree_slot], dtype=torch.int64))

    def _release_lock(self, req) -> None:
        if req.kv.last_node is not None:
            self.dec_lock_ref(req.kv.last_node, req.kv.lock_receipt)
        req.kv.last_node = None
        req.kv.lock_receipt = None

    def _tree_owned_len(self, req) -> int:
        """How many leading slots of the request's row the tree owns: the token depth of the
        locked `last_node` (invariant under splits, since a split keeps the node's end). It is
        what `cache_protected_len` must say; computed here so a stale field cannot make the cache
        free slots the tree owns."""
        node, depth = req.kv.last_node, 0
        if node is None or self.disable:
            return 0
        while not node.is_root:
            depth += len(node)
            node = node.parent
        claimed = req.kv.cache_protected_len
        if claimed and claimed != depth:
            logger.warning("req.kv.cache_protected_len=%s but its locked prefix has %s tokens; using %s", claimed, depth, depth)
        req.kv.cache_protected_len = depth
        return depth

    @staticmethod
    def _kv_committed_len(req) -> int:
        return int(req.kv_committed_len)

    def cache_finished_req(self, req, is_insert: bool = True) -> None:
        free = self.token_to_kv_pool_allocator.free
        n = max(self._kv_committed_len(req), 0)
        row = self.req_to_token_pool.req_to_token[req.kv.req_pool_idx, :n].clone()
        protected = self._tree_owned_len(req)
        if self.disable or not is_insert:
            free(row[protected:])
        else:
            aligned = n // self.page_size * self.page_size
            token_ids = (list(req.origin_input_ids) + list(req.output_ids))[:aligned]
            res = self.insert(InsertParams(RadixKey(token_ids, req.extra_key), row[:aligned]))
            assert res.prefix_len >= protected, "the request's locked prefix vanished from the tree"
            free(row[protected : res.prefix_len])  # duplicates: the tree already has those tokens
            free(row[aligned:])  # the unaligned tail page is not cached
            self._store_mamba_state(req, res.last_device_node, aligned, n, donate=True)
        self._release_lock(req)
        self.req_to_token_pool.free(req.kv.req_pool_idx)

    def cache_unfinished_req(self, req, chunked: bool = False) -> None:
        n = len(req.fill_ids)
        row = self.req_to_token_pool.req_to_token[req.kv.req_pool_idx, :n].clone()
        if self.disable:
            req.kv.prefix_indices = row
            return
        protected = self._tree_owned_len(req)
        aligned = n // self.page_size * self.page_size
        res = self.insert(InsertParams(RadixKey(list(req.fill_ids[:aligned]), req.extra_key), row[:aligned]))
        assert res.prefix_len >= protected, "the request's locked prefix vanished from the tree"
        self.token_to_kv_pool_allocator.free(row[protected : res.prefix_len])
        new_node = res.last_device_node
        self._store_mamba_state(req, new_node, aligned, n)
        tree_indices = self.core.path_values(new_node)
        assert len(tree_indices) == aligned, (len(tree_indices), aligned)
        self.req_to_token_pool.write(req.kv.req_pool_idx, protected, tree_indices[protected:])
        receipt = self.inc_lock_ref(new_node)  # lock the new node before releasing the old one
        self._drop_mamba_lock(receipt)  # the request has its own state: no need to pin the tree's
        self._release_lock(req)
        req.kv.last_node, req.kv.lock_receipt = new_node, receipt
        req.kv.prefix_indices = torch.cat([tree_indices, row[aligned:]])
        req.kv.cache_protected_len = aligned

    # ---- HiCache seam ---------------------------------------------------------------------
    def init_hicache(self, attach: Callable[["UnifiedRadixCache"], Any]) -> None:
        """Attach a host stack: `attach(cache)` builds it (the registry's `attach_hicache` hook,
        for upstream-style HiCache backends). Retraction backups do not go through the tree: the
        `MemoryManager`'s `RetractionBackupStore` copies a retracted request's KV itself."""
        self.host_stack = attach(self)
        self.hicache_attached = True

    # ---- debugging --------------------------------------------------------------------------
    def pretty_print(self) -> str:
        lines: List[str] = []

        def visit(node, depth):
            for child in sorted(node.children.values(), key=lambda c: c.id):
                toks = child.key.token_ids[:6]
                more = "..." if len(child.key) > 6 else ""
                ns = f" ns={child.key.extra_key!r}" if child.key.extra_key is not None else ""
                comps = " ".join(
                    f"{ct}:{'tomb' if d.value is None else len(d.value)}/L{d.lock_ref}" for ct, d in child.component_data.items()
                )
                lines.append(f"{'  ' * depth}#{child.id} {toks}{more} len={len(child)}{ns} {comps} t={child.last_access_time}")
                visit(child, depth + 1)

        visit(self.core.root, 0)
        lines.append(f"#tokens: {self.total_size()} evictable: {self.evictable_size()} protected: {self.protected_size()}")
        text = "\n".join(lines)
        print(text)
        return text

