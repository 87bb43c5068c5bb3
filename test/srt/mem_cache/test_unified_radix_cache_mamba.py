"""The MAMBA component of UnifiedRadixCache on a real MambaPool, allocator and request pool.

A request's Mamba state summarises its whole prefix, so each test writes, as the "state" after
t tokens, a fingerprint of those t tokens into every element of the request's slot; a state the
cache hands out must carry the fingerprint of exactly the matched prefix. Covered: a match ends
only at a node holding a state (never inside a node, no split for it), copy-on-write into the
request's own slot (the tree's slot never changes), the single-node lock until that copy, splits
keeping the state on the child, tombstones of internal nodes, leaf deletion, the eviction
cascade FULL > MAMBA, page-aligned inserts that get no state, and every slot back in the pool."""

from dataclasses import dataclass, field
from typing import Any, List, Optional

import pytest
import torch

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.mamba_pool import MambaPool
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.radix_key import RadixKey
from sglang.srt.mem_cache.state_slots import StateSlots
from sglang.srt.mem_cache.unified_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_cache.components.mamba import MambaComponent
from sglang.srt.mem_cache.unified_radix_cache import EvictParams, MatchPrefixParams, UnifiedRadixCache

FULL, MAMBA = ComponentType.FULL, ComponentType.MAMBA


@dataclass
class Req:
    origin_input_ids: List[int]
    output_ids: List[int] = field(default_factory=list)
    fill_ids: List[int] = field(default_factory=list)
    extra_key: Optional[str] = None
    req_pool_idx: Optional[int] = None
    mamba_pool_idx: Optional[int] = None
    prefix_indices: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))
    last_node: Any = None
    lock_receipt: Any = None
    cache_protected_len: int = 0
    kv_committed_len: int = 0

    @property
    def kv(self):
        """The request's KV record (`Req.kv`): this fake keeps its fields itself."""
        return self


def fp(tokens: List[int]) -> float:
    h = 1
    for t in tokens:
        h = (h * 1000003 + t + 11) % (1 << 23)
    return float(h)


class Harness:
    def __init__(self, page_size=1, kv_size=512, mamba_slots=16):
        self.ps = page_size
        self.req_pool = ReqToTokenPool(8, 256)
        kv = MHATokenToKVPool(kv_size, page_size, torch.float32, 1, 1, [0])
        self.alloc = TokenToKVPoolAllocator(kv_size, page_size, kv)
        self.mamba = MambaPool(mamba_slots, 2, (3, 2), (2, 2, 4), torch.float32)
        # The slots come from the memory manager's StateSlots, wired as build_memory wires it.
        self.slots = StateSlots(self.mamba)
        self.cache = UnifiedRadixCache(CacheInitParams(False, self.req_pool, self.alloc, page_size,
                                                       tree_components=(FULL, MAMBA), mamba_pool=self.mamba,
                                                       state_slots=self.slots))
        self.slots.evict_one = lambda: self.cache.evict(EvictParams(mamba_num=1))
        self.kv_free0 = self.alloc.available_size()

    def finish(self, req: Req, is_insert: bool = True) -> None:
        """What MemoryManager.release does: the tree caches (and may take the state slot over),
        then the request's slot goes back."""
        self.cache.cache_finished_req(req, is_insert=is_insert)
        self.slots.free_request_slot(req)

    def state(self, slot: int) -> float:
        conv, ssm = self.mamba.conv_state[:, slot], self.mamba.ssm_state[:, slot]
        assert bool((conv == conv.flatten()[0]).all()) and bool((ssm == conv.flatten()[0]).all())
        return float(conv.flatten()[0])

    def admit(self, req: Req) -> int:
        ids = req.origin_input_ids + req.output_ids
        m = self.cache.match_prefix(MatchPrefixParams(key=RadixKey(ids[:-1], req.extra_key)))
        self.cache.assign_prefix(req, m)
        req.req_pool_idx = self.req_pool.alloc(1)[0]
        self.req_pool.write(req.req_pool_idx, 0, m.device_indices)
        req.mamba_pool_idx = self.slots.alloc()
        self.cache.init_req_mamba_state(req)
        req.kv_committed_len = len(m.device_indices)
        return len(m.device_indices)

    def forward(self, req: Req, upto: int) -> None:
        """Computes tokens [kv_committed_len, upto): KV slots and the state after `upto` tokens."""
        p = req.kv_committed_len
        ids = req.origin_input_ids + req.output_ids
        # The state a real model would hold continues from the request's own slot.
        assert self.state(req.mamba_pool_idx) == (fp(ids[:p]) if p else 0.0)
        last = int(self.req_pool.req_to_token[req.req_pool_idx, p - 1]) if p else 0
        out = self.alloc.alloc_extend([p], [upto], [last])
        self.req_pool.write(req.req_pool_idx, p, out)
        self.mamba.conv_state[:, req.mamba_pool_idx] = fp(ids[:upto])
        self.mamba.ssm_state[:, req.mamba_pool_idx] = fp(ids[:upto])
        req.kv_committed_len = upto
        req.fill_ids = ids[:upto]

    def run(self, tokens: List[int], chunks=(), finish=True) -> Req:
        """A request over `tokens` (prompt), prefilled with chunk ends `chunks`, then finished."""
        req = Req(list(tokens))
        self.admit(req)
        for c in list(chunks) + [len(tokens)]:
            if c > req.kv_committed_len:
                self.forward(req, c)
                if c < len(tokens):
                    self.cache.cache_unfinished_req(req, chunked=True)
        if finish:
            self.finish(req)
        return req

    def match(self, tokens):
        return self.cache.match_prefix(MatchPrefixParams(key=RadixKey(list(tokens))))

    def tree_slots(self) -> int:
        c = self.cache
        return c.component_evictable_size(MAMBA) + c.component_protected_size(MAMBA)

    def assert_all_free_after_full_eviction(self):
        self.cache.sanity_check()
        assert self.cache.protected_size() == 0
        self.cache.evict(EvictParams(num_tokens=self.kv_free0))
        assert self.alloc.available_size() == self.kv_free0
        assert self.mamba.available_size() == self.mamba.size
        assert self.req_pool.available_size() == self.req_pool.size


def nodes(cache):
    return cache.core._all_nodes()[1:]


A = list(range(100, 110))


def test_match_ends_only_at_nodes_with_state_without_splitting():
    h = Harness()
    h.run(A, chunks=[4])  # states after 4 (chunk end) and after 10 (finished, committed 10)
    assert h.tree_slots() == 2
    n_nodes = len(nodes(h.cache))
    assert h.match(A).device_prefix_len == 10
    assert h.match(A + [1, 2]).device_prefix_len == 10
    m = h.match(A[:9])  # ends inside [4, 10): only the state at 4 is usable
    assert m.device_prefix_len == 4 and MambaComponent.slot_of(m.last_device_node) is not None
    assert h.match(A[:3]).device_prefix_len == 0
    assert len(nodes(h.cache)) == n_nodes  # no split for a prefix that cannot be served
    h.assert_all_free_after_full_eviction()


def test_copy_on_write_into_the_requests_slot():
    h = Harness()
    h.run(A, chunks=[4])
    req = Req(A + [7, 8, 9])
    assert h.admit(req) == 10
    tree_slot = MambaComponent.slot_of(req.last_node)
    assert req.mamba_pool_idx != tree_slot
    assert h.state(req.mamba_pool_idx) == fp(A) == h.state(tree_slot)
    # The single-node Mamba lock is released once the state is copied; FULL stays locked.
    assert h.cache.component_protected_size(MAMBA) == 0 and h.cache.protected_size() == 10
    h.forward(req, 13)  # the request advances its own state only
    assert h.state(tree_slot) == fp(A)
    h.finish(req)
    assert h.state(MambaComponent.slot_of(h.match(A + [7, 8, 9, 0]).last_device_node)) == fp(A + [7, 8, 9])
    h.assert_all_free_after_full_eviction()


def test_mamba_lock_pins_the_anchor_state_until_the_copy():
    h = Harness()
    h.run(A)
    req = Req(A + [5])
    m = h.match(A)
    h.cache.assign_prefix(req, m)
    assert h.cache.component_protected_size(MAMBA) == 1
    assert h.cache.evict(EvictParams(mamba_num=1)).mamba_num_evicted == 0  # locked
    req.req_pool_idx = h.req_pool.alloc(1)[0]
    h.req_pool.write(req.req_pool_idx, 0, m.device_indices)
    req.mamba_pool_idx = h.slots.alloc()
    h.cache.init_req_mamba_state(req)
    assert h.state(req.mamba_pool_idx) == fp(A)
    # The anchor is a leaf locked by FULL only now: evicting its state tombstones it in place.
    res = h.cache.evict(EvictParams(mamba_num=1))
    assert res.mamba_num_evicted == 1 and res.num_tokens_evicted == 0
    assert req.last_node.data(MAMBA).value is None and not req.last_node.deleted
    req.kv_committed_len = 10
    h.finish(req, is_insert=False)
    h.assert_all_free_after_full_eviction()


def test_split_keeps_the_state_on_the_child_and_new_branch_gets_its_own():
    h = Harness()
    h.run(A)
    B = A[:7] + [1, 2, 3]
    h.run(B)  # splits [0, 10) at 7: the new parent has no state
    parent = h.match(A).last_device_node.parent
    assert len(parent) == 7 and parent.data(MAMBA).value is None
    assert h.match(A[:7] + [0]).device_prefix_len == 0  # no state after 7 tokens
    for seq in (A, B):
        m = h.match(seq)
        assert m.device_prefix_len == 10 and h.state(MambaComponent.slot_of(m.last_device_node)) == fp(seq)
    assert h.tree_slots() == 2
    h.assert_all_free_after_full_eviction()


def test_eviction_tombstones_internal_nodes_deletes_leaves_and_cascades():
    h = Harness()
    h.run(A, chunks=[4])  # node [0,4) internal with a state, node [4,10) leaf with a state
    free_m, free_kv = h.mamba.available_size(), h.alloc.available_size()
    inner = next(iter(h.cache.root_node.children.values()))  # (a match would make it most recent)
    assert len(inner) == 4 and not inner.is_leaf
    # Oldest first: the internal node's state goes, the node and its KV stay (tombstone).
    res = h.cache.evict(EvictParams(mamba_num=1))
    assert (res.mamba_num_evicted, res.num_tokens_evicted) == (1, 0)
    assert inner.data(MAMBA).value is None and not inner.deleted and inner.full_value is not None
    assert h.mamba.available_size() == free_m + 1 and h.alloc.available_size() == free_kv
    assert h.match(A[:9]).device_prefix_len == 0 and h.match(A).device_prefix_len == 10
    # Evicting the leaf's state deletes the leaf, and the data-less parent with it.
    res = h.cache.evict(EvictParams(mamba_num=1))
    assert res.mamba_num_evicted == 1 and res.num_tokens_evicted == 10
    assert h.cache.total_size() == 0
    # FULL eviction (priority 2) also frees the state of every node it deletes.
    h.run(A, chunks=[4])
    assert h.tree_slots() == 2
    res = h.cache.evict(EvictParams(num_tokens=1))
    assert res.num_tokens_evicted >= 6 and res.mamba_num_evicted >= 1
    h.assert_all_free_after_full_eviction()


def test_pool_pressure_evicts_tree_states_for_requests():
    h = Harness(mamba_slots=3)
    # While the request runs it holds one slot, so the tree keeps two chunk-end states: storing
    # the one after 6 tokens evicts the oldest (after 2). At finish the request's own slot is
    # donated to the tree (no copy) for the state after 10 tokens.
    r0 = h.run(A, chunks=[2, 4, 6])
    assert r0.mamba_pool_idx is None
    assert h.tree_slots() == 3 and h.mamba.available_size() == 0
    assert h.match(A).device_prefix_len == 10 and h.match(A[:9]).device_prefix_len == 6
    assert h.match(A[:5]).device_prefix_len == 4 and h.match(A[:3]).device_prefix_len == 0
    r1, r2 = Req([1, 2, 3]), Req([4, 5, 6])
    h.admit(r1)  # each new request evicts the least recently used tree state
    h.admit(r2)
    assert None not in (r1.mamba_pool_idx, r2.mamba_pool_idx) and h.tree_slots() == 1
    for r in (r1, r2):
        h.finish(r, is_insert=False)
        assert r.mamba_pool_idx is None
    h.assert_all_free_after_full_eviction()


def test_page_aligned_insert_gets_a_state_only_when_it_covers_the_committed_tokens():
    h = Harness(page_size=4)
    seq = list(range(200, 218))  # 18 tokens
    h.run(seq, chunks=[8])  # chunk end 8 is aligned: state; finish at 18 -> aligned 16: none
    assert h.tree_slots() == 1
    assert h.match(seq).device_prefix_len == 8
    h.run(seq[:16])  # 16 committed, all aligned: a state at 16
    assert h.match(seq).device_prefix_len == 16
    h.assert_all_free_after_full_eviction()


def test_component_needs_the_pool():
    with pytest.raises(ValueError, match="MambaPool"):
        MambaComponent(CacheInitParams(False, None, None, 1))
