"""KV memory for hybrid sliding-window models: a full pool, a smaller SWA pool, one index space.

Why: a sliding-window layer only ever reads the last `sliding_window_size` tokens, so its KV
for older tokens can be freed long before the full-attention layers' KV. `SWAKVPool` keeps
two `MHATokenToKVPool`s: one for the full-attention layers (`size` slots) and one for the
sliding-window layers (`size_swa` = `size` x `--swa-full-tokens-ratio`, page-aligned).

Everything outside this file (req_to_token rows, the radix tree, `out_cache_loc`) speaks
FULL slots. `SWATokenToKVPoolAllocator` gives each allocated full slot an SWA slot and
records it in `full_to_swa_index_mapping[full_slot]` (0 = no SWA slot: never allocated, or
freed with `free_swa` because the token slid out of the window). Pages map to pages: full slot
`p*page_size + o` maps to SWA slot `q*page_size + o`.

For attention backends:
- writing: `pool.set_kv_buffer(layer_id, full_loc, k, v)` works for every layer; for an SWA
  layer the pool translates `full_loc` to SWA slots itself.
- reading: `pool.get_key_buffer(layer_id)` / `get_value_buffer` return the buffer of the
  pool that owns the layer. For an SWA layer (`pool.is_swa_layer(layer_id)`) index it with
  `pool.translate_loc_from_full_to_swa(full_locs)`; only the last `sliding_window_size`
  positions of a request are guaranteed to have SWA slots (others translate to 0, the padding
  slot, and must be masked out by the sliding-window mask anyway).
- `pool.get_kv_at(layer_id, full_locs)` does the translation and the gather in one call.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool


def swa_pool_size(full_size: int, swa_full_tokens_ratio: float, page_size: int) -> int:
    """SWA slots for a full pool of `full_size` slots: full x ratio, rounded down to pages (>= 1 page)."""
    if not (0 < swa_full_tokens_ratio <= 1.0):
        raise ValueError("--swa-full-tokens-ratio should be in range (0, 1.0].")
    size = int(full_size * swa_full_tokens_ratio) // page_size * page_size
    return max(size, page_size)


class SWAKVPool:
    def __init__(
        self,
        size: int,
        size_swa: int,
        page_size: int,
        dtype: torch.dtype,
        head_num: int,
        head_dim: int,
        swa_layer_ids: Sequence[int],
        full_layer_ids: Sequence[int],
        device: str = "cpu",
        v_head_dim: Optional[int] = None,
    ):
        self.size = size
        self.size_swa = size_swa
        self.page_size = page_size
        self.dtype = dtype
        self.head_num = head_num
        self.head_dim = head_dim
        self.v_head_dim = v_head_dim or head_dim
        self.device = device
        self.swa_layer_ids = list(swa_layer_ids)
        self.full_layer_ids = list(full_layer_ids)
        self._swa_layers = set(self.swa_layer_ids)
        self.layer_ids = sorted(self.swa_layer_ids + self.full_layer_ids)
        kw = dict(dtype=dtype, head_num=head_num, head_dim=head_dim, device=device, v_head_dim=v_head_dim)
        self.full_kv_pool = MHATokenToKVPool(size, page_size, layer_ids=self.full_layer_ids, **kw)
        self.swa_kv_pool = MHATokenToKVPool(size_swa, page_size, layer_ids=self.swa_layer_ids, **kw)
        self.full_to_swa_index_mapping: Optional[torch.Tensor] = None

    def register_mapping(self, full_to_swa_index_mapping: torch.Tensor) -> None:
        self.full_to_swa_index_mapping = full_to_swa_index_mapping

    @property
    def layer_num(self) -> int:
        return len(self.layer_ids)

    def is_swa_layer(self, layer_id: int) -> bool:
        return layer_id in self._swa_layers

    def translate_loc_from_full_to_swa(self, full_loc: torch.Tensor) -> torch.Tensor:
        assert self.full_to_swa_index_mapping is not None, "SWAKVPool: no allocator registered its mapping"
        return self.full_to_swa_index_mapping[full_loc]

    def _pool(self, layer_id: int) -> MHATokenToKVPool:
        return self.swa_kv_pool if layer_id in self._swa_layers else self.full_kv_pool

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self._pool(layer_id).get_key_buffer(layer_id)

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self._pool(layer_id).get_value_buffer(layer_id)

    def get_kv_buffer(self, layer_id: int):
        return self._pool(layer_id).get_kv_buffer(layer_id)

    def get_kv_at(self, layer_id: int, full_loc: torch.Tensor):
        """K and V of these FULL slots for one layer (translated for an SWA layer)."""
        loc = self.translate_loc_from_full_to_swa(full_loc) if self.is_swa_layer(layer_id) else full_loc
        k, v = self.get_kv_buffer(layer_id)
        return k[loc], v[loc]

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, loc_is_swa: bool = False) -> None:
        """`loc` are FULL slots (translated here for an SWA layer) unless `loc_is_swa`."""
        if self.is_swa_layer(layer_id) and not loc_is_swa:
            loc = self.translate_loc_from_full_to_swa(loc)
        self._pool(layer_id).set_kv_buffer(layer_id, loc, cache_k, cache_v)

    def bytes_per_token(self) -> int:
        """Full-layer bytes per full slot (SWA-layer bytes scale with size_swa, see get_kv_size_bytes)."""
        return self.full_kv_pool.bytes_per_token()

    def get_kv_size_bytes(self) -> int:
        return self.full_kv_pool.get_kv_size_bytes() + self.swa_kv_pool.get_kv_size_bytes()

    def get_cpu_copy(self, indices: torch.Tensor) -> List[List[torch.Tensor]]:
        """[full-layer copies, SWA-layer copies] of these FULL slots (SWA part translated)."""
        return [self.full_kv_pool.get_cpu_copy(indices), self.swa_kv_pool.get_cpu_copy(self.translate_loc_from_full_to_swa(indices))]

    def load_cpu_copy(self, kv_cache_cpu, indices: torch.Tensor) -> None:
        full, swa = kv_cache_cpu
        self.full_kv_pool.load_cpu_copy(full, indices)
        self.swa_kv_pool.load_cpu_copy(swa, self.translate_loc_from_full_to_swa(indices))


class SWATokenToKVPoolAllocator:
    """Allocates FULL slots (the index space everyone uses) and backs each with an SWA slot.

    Same calls as `TokenToKVPoolAllocator` (alloc, alloc_extend, alloc_decode, free,
    available_size); plus `free_swa(full_indices)` to release only the SWA slots of tokens that
    slid out of the window, `translate_loc_from_full_to_swa`, and `transfer_swa_slots` (the
    radix tree's tombstone recovery). Callers free whole pages they own.
    """

    def __init__(self, size: int, size_swa: int, page_size: int, kvcache: Optional[SWAKVPool] = None, device: str = "cpu"):
        self.size = size
        self.size_full = size
        self.size_swa = size_swa
        self.page_size = page_size
        self.device = device
        self.kvcache = kvcache
        self.full_attn_allocator = TokenToKVPoolAllocator(size, page_size, kvcache.full_kv_pool if kvcache else None, device)
        self.swa_attn_allocator = TokenToKVPoolAllocator(size_swa, page_size, kvcache.swa_kv_pool if kvcache else None, device)
        self.full_to_swa_index_mapping = torch.zeros(size + page_size, dtype=torch.int64, device=device)
        if kvcache is not None:
            kvcache.register_mapping(self.full_to_swa_index_mapping)

    def clear(self) -> None:
        self.full_attn_allocator.clear()
        self.swa_attn_allocator.clear()
        self.full_to_swa_index_mapping.zero_()

    def full_available_size(self) -> int:
        return self.full_attn_allocator.available_size()

    def swa_available_size(self) -> int:
        return self.swa_attn_allocator.available_size()

    def available_size(self) -> int:
        """Tokens that can be allocated now: each new token takes a full and an SWA slot."""
        return min(self.full_available_size(), self.swa_available_size())

    def get_kvcache(self) -> Optional[SWAKVPool]:
        return self.kvcache

    def translate_loc_from_full_to_swa(self, full_loc: torch.Tensor) -> torch.Tensor:
        return self.full_to_swa_index_mapping[full_loc]

    def pages_needed(self, prefix_len: int, seq_len: int) -> int:
        return self.full_attn_allocator.pages_needed(prefix_len, seq_len)

    def _page_slots(self, pages: torch.Tensor) -> torch.Tensor:
        return (pages[:, None] * self.page_size + torch.arange(self.page_size, device=self.device)).flatten()

    def _map_new_slots(self, full_slots: torch.Tensor) -> bool:
        """Give SWA slots to these new full slots. A page that already has an SWA page (a
        request's partly filled last page) keeps it; the others get fresh SWA pages."""
        ps = self.page_size
        mapping = self.full_to_swa_index_mapping
        pages = torch.unique(full_slots // ps)
        existing = mapping[self._page_slots(pages)].view(-1, ps)
        has_swa = (existing > 0).any(dim=1)
        fresh = pages[~has_swa]
        swa = self.swa_attn_allocator.alloc(len(fresh) * ps)
        if swa is None:
            return False
        swa_page = torch.zeros_like(pages)
        swa_page[has_swa] = existing[has_swa].max(dim=1).values // ps
        if len(fresh):
            swa_page[~has_swa] = swa.view(-1, ps)[:, 0] // ps
        where = torch.searchsorted(pages, full_slots // ps)
        mapping[full_slots] = swa_page[where] * ps + full_slots % ps
        return True

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        full = self.full_attn_allocator.alloc(need_size)
        if full is None:
            return None
        if not self._map_new_slots(full):
            self.full_attn_allocator.free(full)
            return None
        return full

    def alloc_extend(self, prefix_lens: Sequence[int], seq_lens: Sequence[int], last_locs: Sequence[int]) -> Optional[torch.Tensor]:
        full = self.full_attn_allocator.alloc_extend(prefix_lens, seq_lens, last_locs)
        if full is None or full.numel() == 0:
            return full
        ps = self.page_size
        continuing = {int(l) // ps for p, s, l in zip(prefix_lens, seq_lens, last_locs) if p % ps != 0 and s > p}
        pages = torch.unique(full // ps)
        new_pages = pages[torch.tensor([int(p) not in continuing for p in pages], dtype=torch.bool)] if continuing else pages
        if not self._map_new_slots(full):
            self.full_attn_allocator.free(self._page_slots(new_pages))
            return None
        return full

    def alloc_decode(self, seq_lens: Sequence[int], last_locs: Sequence[int]) -> Optional[torch.Tensor]:
        return self.alloc_extend([s - 1 for s in seq_lens], seq_lens, last_locs)

    def _clear_mapping(self, full_indices: torch.Tensor) -> None:
        pages = torch.unique(full_indices // self.page_size)
        self.full_to_swa_index_mapping[self._page_slots(pages)] = 0

    def free_swa(self, full_indices: torch.Tensor) -> None:
        """Free only the SWA slots behind these FULL slots (whole pages); the FULL slots stay."""
        if full_indices is None or full_indices.numel() == 0:
            return
        swa = self.full_to_swa_index_mapping[full_indices]
        self.swa_attn_allocator.free(swa[swa > 0])
        self._clear_mapping(full_indices)

    def free(self, free_index: torch.Tensor) -> None:
        """Free FULL slots (whole pages) and whatever SWA slots they still have."""
        if free_index is None or free_index.numel() == 0:
            return
        self.free_swa(free_index)
        self.full_attn_allocator.free(free_index)

    def transfer_swa_slots(self, src_full: torch.Tensor, dst_full: torch.Tensor) -> None:
        """Move the SWA slots of `src_full` to `dst_full` (same length, page-aligned runs).

        The radix tree uses it to revive a tombstoned node from a request's duplicate KV:
        same tokens at the same positions, so the SWA KV is the same.
        """
        assert src_full.shape == dst_full.shape
        mapping = self.full_to_swa_index_mapping
        assert bool((mapping[src_full] > 0).all()) and bool((mapping[dst_full] == 0).all())
        mapping[dst_full] = mapping[src_full]
        self._clear_mapping(src_full)

    def get_cpu_copy(self, indices: torch.Tensor):
        return self.kvcache.get_cpu_copy(indices)

    def load_cpu_copy(self, kv_cache_cpu, indices: torch.Tensor) -> None:
        self.kvcache.load_cpu_copy(kv_cache_cpu, indices)
