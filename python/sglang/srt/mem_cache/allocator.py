"""Hands out KV slots of a `MHATokenToKVPool`, a page at a time.

Pages are numbered 1..num_pages (page 0 is the padding page). A request's tokens fill its
last partial page before a new page is taken, so every page belongs to exactly one owner
(a request, or a radix-tree node once the page is full and cached).
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch


class TokenToKVPoolAllocator:
    def __init__(self, size: int, page_size: int, kvcache=None, device: str = "cpu"):
        assert size % page_size == 0, f"KV pool size {size} must be a multiple of page size {page_size}"
        self.size = size
        self.page_size = page_size
        self.num_pages = size // page_size
        self.kvcache = kvcache
        self.device = device
        self.clear()

    def clear(self) -> None:
        self.free_pages: List[int] = list(range(1, self.num_pages + 1))

    def available_size(self) -> int:
        return len(self.free_pages) * self.page_size

    def _take_pages(self, n: int) -> Optional[List[int]]:
        if n > len(self.free_pages):
            return None
        out = self.free_pages[:n]
        del self.free_pages[:n]
        return out

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        """Whole pages only: `need_size` must be a multiple of page_size."""
        assert need_size % self.page_size == 0
        pages = self._take_pages(need_size // self.page_size)
        if pages is None:
            return None
        return self._pages_to_slots(pages)

    def _pages_to_slots(self, pages: Sequence[int]) -> torch.Tensor:
        if not pages:
            return torch.empty(0, dtype=torch.int64, device=self.device)
        base = torch.tensor(pages, dtype=torch.int64, device=self.device) * self.page_size
        return (base[:, None] + torch.arange(self.page_size, device=self.device)).flatten()

    def pages_needed(self, prefix_len: int, seq_len: int) -> int:
        """Pages to allocate to grow a request's KV from prefix_len to seq_len tokens."""
        have = -(-prefix_len // self.page_size)
        need = -(-seq_len // self.page_size)
        return need - have

    def alloc_extend(self, prefix_lens: Sequence[int], seq_lens: Sequence[int], last_locs: Sequence[int]) -> Optional[torch.Tensor]:
        """Slots for tokens [prefix_len, seq_len) of each request, concatenated.

        `last_locs[i]` is the slot of the request's token at prefix_len-1 (ignored when prefix_len is 0);
        the tokens that still fit into its page go there, the rest into new pages.
        """
        ps = self.page_size
        total_pages = sum(self.pages_needed(p, s) for p, s in zip(prefix_lens, seq_lens))
        pages = self._take_pages(total_pages)
        if pages is None:
            return None
        if ps == 1:  # one slot a page, no partial pages: the pages are the slots
            return torch.tensor(pages, dtype=torch.int64, device=self.device)
        slots: List[int] = []  # built as ints, one tensor at the end (a decode step is one slot a request)
        cursor = 0
        for p, s, last in zip(prefix_lens, seq_lens, last_locs):
            n = s - p
            if n <= 0:
                continue
            in_page = min(ps - p % ps, n) if p % ps else 0
            slots.extend(range(int(last) + 1, int(last) + 1 + in_page))
            rest = n - in_page
            for page in pages[cursor : cursor + self.pages_needed(p, s)]:
                take = min(ps, rest)
                slots.extend(range(page * ps, page * ps + take))
                rest -= take
                cursor += 1
        return torch.tensor(slots, dtype=torch.int64, device=self.device)

    def alloc_decode(self, seq_lens: Sequence[int], last_locs: Sequence[int]) -> Optional[torch.Tensor]:
        """One slot per request for its token at position seq_len-1 (seq_lens include the new token)."""
        return self.alloc_extend([s - 1 for s in seq_lens], seq_lens, last_locs)

    def free(self, free_index: torch.Tensor) -> None:
        """Frees the pages that contain these slots. Callers free whole pages they own."""
        if free_index is None or free_index.numel() == 0:
            return
        if self.page_size == 1:
            self.free_pages.extend(free_index.tolist())
        else:
            self.free_pages.extend(torch.unique(free_index // self.page_size).tolist())

    def get_cpu_copy(self, indices: torch.Tensor):
        return self.kvcache.get_cpu_copy(indices)

    def load_cpu_copy(self, kv_cache_cpu, indices: torch.Tensor) -> None:
        self.kvcache.load_cpu_copy(kv_cache_cpu, indices)
