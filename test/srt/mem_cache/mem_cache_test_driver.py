"""A miniature scheduler for prefix-cache tests: real pools and allocators, a Req-like record.

`ReqLike` has exactly the attributes the cache's request protocol names (it is the scheduler's
data, not the code under test). Every KV slot gets a fingerprint of the *whole prefix* that
produced it (what real attention KV depends on), so a test can check that any prefix the cache
hands out really holds that prefix's KV, and `check_conservation` proves no slot is leaked or
double-owned: free + tree-owned + request-owned == pool size, for the full and the SWA pool.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

import torch

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.radix_key import RadixKey
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool, SWATokenToKVPoolAllocator
from sglang.srt.mem_cache.unified_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import EvictParams, MatchPrefixParams, UnifiedRadixCache

FULL_LAYER, SWA_LAYER = 0, 1


@dataclass
class ReqLike:
    origin_input_ids: List[int]
    output_ids: List[int] = field(default_factory=list)
    fill_ids: List[int] = field(default_factory=list)
    extra_key: Optional[str] = None
    req_pool_idx: Optional[int] = None
    prefix_indices: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))
    last_node: Any = None
    lock_receipt: Any = None
    cache_protected_len: int = 0
    mamba_pool_idx: Optional[int] = None

    @property
    def kv(self):
        """The request's KV record (`Req.kv`): this fake keeps its fields itself."""
        return self

    @property
    def kv_committed_len(self) -> int:
        """KV written so far: every token but the last sampled one (the scheduler's Req.kv_len)."""
        return len(self.origin_input_ids) + len(self.output_ids) - 1


def fingerprints(tokens: List[int], extra_key: Optional[str]) -> torch.Tensor:
    """fp[i] identifies tokens[: i + 1] in namespace extra_key (exact in float32: < 2**23)."""
    h = sum(ord(c) for c in extra_key) + 7 if extra_key else 1
    out = []
    for t in tokens:
        h = (h * 1000003 + t + 11) % (1 << 23)
        out.append(float(h))
    return torch.tensor(out, dtype=torch.float32)


def build(page_size: int, size: int, window: Optional[int] = None, swa_ratio: float = 0.5, disable: bool = False,
          eviction_policy: str = "lru", max_reqs: int = 8, max_ctx: int = 512):
    req_pool = ReqToTokenPool(max_reqs, max_ctx)
    if window is None:
        kv = MHATokenToKVPool(size, page_size, torch.float32, 1, 1, [FULL_LAYER])
        alloc = TokenToKVPoolAllocator(size, page_size, kv)
        comps = (ComponentType.FULL,)
    else:
        size_swa = int(size * swa_ratio) // page_size * page_size
        kv = SWAKVPool(size, size_swa, page_size, torch.float32, 1, 1, [SWA_LAYER], [FULL_LAYER])
        alloc = SWATokenToKVPoolAllocator(size, size_swa, page_size, kv)
        comps = (ComponentType.FULL, ComponentType.SWA)
    cache = UnifiedRadixCache(
        CacheInitParams(disable, req_pool, alloc, page_size, eviction_policy, sliding_window_size=window, tree_components=comps)
    )
    return MiniScheduler(cache, req_pool, alloc, kv, window)


class MiniScheduler:
    def __init__(self, cache, req_pool, alloc, kv, window):
        self.cache, self.req_pool, self.alloc, self.kv, self.window = cache, req_pool, alloc, kv, window
        self.ps = alloc.page_size
        self.swa = window is not None
        self.active: List[ReqLike] = []
        self.evictions_under_pressure = 0
        self.kv_len = {}
        self.full_free0 = self.full_available()
        self.swa_free0 = alloc.swa_available_size() if self.swa else None

    def full_available(self) -> int:
        return self.alloc.full_available_size() if self.swa else self.alloc.available_size()

    def row(self, req: ReqLike) -> torch.Tensor:
        return self.req_pool.req_to_token[req.req_pool_idx]

    def _alloc(self, fn, need: int):
        out = fn()
        if out is None:
            self.evictions_under_pressure += 1
            self.cache.evict(EvictParams(num_tokens=need + self.ps, swa_num_tokens=need + self.ps))
            out = fn()
        assert out is not None, "test workload does not fit the pool"
        return out

    def _write_kv(self, req: ReqLike, start: int, end: int) -> None:
        tokens = (req.origin_input_ids + req.output_ids)[:end]
        fp = fingerprints(tokens, req.extra_key)[start:end].view(-1, 1)
        loc = self.row(req)[start:end]
        self.kv.set_kv_buffer(FULL_LAYER, loc, fp, fp)
        if self.swa:
            self.kv.set_kv_buffer(SWA_LAYER, loc, fp, fp)

    def verify_prefix(self, tokens: List[int], extra_key, indices: torch.Tensor) -> None:
        n = len(indices)
        assert n % self.ps == 0
        fp = fingerprints(tokens[:n], extra_key)
        k = self.kv.get_key_buffer(FULL_LAYER)
        assert torch.equal(k[indices, 0, 0], fp), "cached prefix holds another prefix's KV"
        if self.swa and n:
            lo = max(0, n - self.window)
            swa_loc = self.alloc.translate_loc_from_full_to_swa(indices[lo:])
            assert bool((swa_loc > 0).all()), "window of a matched prefix has no SWA KV"
            assert torch.equal(self.kv.get_key_buffer(SWA_LAYER)[swa_loc, 0, 0], fp[lo:])

    # ---- the lifecycle, as the scheduler drives it --------------------------------------------
    def admit(self, req: ReqLike) -> int:
        ids = req.origin_input_ids + req.output_ids
        m = self.cache.match_prefix(MatchPrefixParams(key=RadixKey(ids[:-1], req.extra_key)))
        self.verify_prefix(ids, req.extra_key, m.device_indices)
        self.cache.assign_prefix(req, m)
        req.req_pool_idx = self.req_pool.alloc(1)[0]
        self.req_pool.write(req.req_pool_idx, 0, m.device_indices)
        self.kv_len[id(req)] = len(m.device_indices)
        self.active.append(req)
        return len(m.device_indices)

    def extend(self, req: ReqLike, upto: int) -> None:
        p = len(req.prefix_indices)
        last = int(self.row(req)[p - 1]) if p else 0
        out = self._alloc(lambda: self.alloc.alloc_extend([p], [upto], [last]), upto - p)
        self.req_pool.write(req.req_pool_idx, p, out)
        self.kv_len[id(req)] = upto
        self._write_kv(req, p, upto)
        req.fill_ids = req.origin_input_ids[:upto]

    def prefill(self, req: ReqLike, chunk: int, first_token: int) -> None:
        n = len(req.origin_input_ids)
        while True:
            p = len(req.prefix_indices)
            upto = min(n, p + chunk)
            self.extend(req, upto)
            if upto < n:
                self.cache.cache_unfinished_req(req, chunked=True)
                self.check()
                continue
            req.output_ids.append(first_token)
            self.cache.cache_unfinished_req(req)
            self.check()
            return

    def decode(self, req: ReqLike, token: int) -> None:
        pos = len(req.origin_input_ids) + len(req.output_ids) - 1  # the last sampled token gets KV now
        last = int(self.row(req)[pos - 1])
        out = self._alloc(lambda: self.alloc.alloc_decode([pos + 1], [last]), 1)
        self.row(req)[pos] = out[0]
        self.kv_len[id(req)] = pos + 1
        self._write_kv(req, pos, pos + 1)
        req.output_ids.append(token)
        if self.swa:  # release SWA KV of own whole pages that slid out of the window
            start = req.cache_protected_len
            end = (pos + 1 - self.window) // self.ps * self.ps
            if end > start:
                self.alloc.free_swa(self.row(req)[start:end])

    def finish(self, req: ReqLike, is_insert: bool = True) -> None:
        self.cache.cache_finished_req(req, is_insert=is_insert)
        self.active.remove(req)
        del self.kv_len[id(req)]
        req.req_pool_idx = None

    # ---- checks -----------------------------------------------------------------------------
    def check(self) -> None:
        """Tree invariants, and every full/SWA slot is free, tree-owned or request-owned, once."""
        self.cache.sanity_check()
        if self.cache.disable:
            assert self.cache.total_size() == 0
        owned_pages, owned_swa_pages = set(), set()
        for req in self.active:
            slots = self.row(req)[req.cache_protected_len : self.kv_len[id(req)]]
            pages = set((slots // self.ps).tolist())
            assert not (pages & owned_pages), "two requests own one page"
            owned_pages |= pages
            if self.swa:
                swa = self.alloc.translate_loc_from_full_to_swa(slots)
                owned_swa_pages |= set((swa[swa > 0] // self.ps).tolist())
        assert self.full_available() + self.cache.total_size() + len(owned_pages) * self.ps == self.full_free0
        if self.swa:
            tree_swa = self.cache.swa_evictable_size() + self.cache.swa_protected_size()
            assert self.alloc.swa_available_size() + tree_swa + len(owned_swa_pages) * self.ps == self.swa_free0

    def drain(self) -> None:
        """Finish everything and evict the whole tree: the pools must be back to their initial state."""
        for req in list(self.active):
            self.finish(req)
        self.check()
        self.cache.evict(EvictParams(num_tokens=1 << 30, swa_num_tokens=1 << 30))
        self.check()
        assert self.cache.total_size() == 0 and not self.cache.root_node.children
        assert self.full_available() == self.full_free0
        if self.swa:
            assert self.alloc.swa_available_size() == self.swa_free0
            assert int(self.alloc.full_to_swa_index_mapping.count_nonzero()) == 0
        assert self.req_pool.available_size() == self.req_pool.size
