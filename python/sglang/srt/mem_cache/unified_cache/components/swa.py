"""SWA: sliding-window-attention KV in the separate SWA pool (`SWATokenToKVPoolAllocator`).

The tree indexes everything by FULL slots; the SWA data of a FULL slot `f` is the SWA slot
`allocator.full_to_swa_index_mapping[f]` (0 = none). A node's SWA value holds those SWA slots
(for inspection and the attention backend); freeing goes through the allocator by FULL slot.

- Tombstone: an internal node may lose its SWA data (value None) and keep its FULL data: a
  request only needs SWA KV for the last `sliding_window_size` tokens of its prefix.
- Match: a prefix is usable only if at least `sliding_window_size` tokens of contiguous
  non-tombstone SWA data end at its end (or it has no tombstone at all since the root).
- Insert over a tombstone: if the inserting request still has SWA data for those positions
  (its own duplicate slots), the node takes that SWA data over ("tombstone recovery").
- New segment whose leading tokens have no SWA data (the scheduler freed them because they
  slid out of the window): those tokens become a tombstone node above the data node.
- Lock: the segment of nodes covering the last `sliding_window_size` tokens above the anchor.
"""

from __future__ import annotations

import math

import torch

from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_cache.components.base import MatchValidator, TreeComponent

SWA = ComponentType.SWA


class _SWAWindowValidator(MatchValidator):
    def __init__(self, window: int):
        self.window = window
        self.since_tombstone = math.inf  # no tombstone since the root: everything is present

    def advance(self, node, num_tokens: int) -> None:
        if node.data(SWA).value is None:
            self.since_tombstone = 0
        else:
            self.since_tombstone += num_tokens

    def ok(self) -> bool:
        return self.since_tombstone >= self.window


class SWAComponent(TreeComponent):
    component_type = SWA
    internal_priority = 1

    def __init__(self, swa_allocator, sliding_window_size: int, page_size: int):
        super().__init__()
        assert sliding_window_size is not None and sliding_window_size > 0
        self.allocator = swa_allocator
        self.window = int(sliding_window_size)
        self.page_size = page_size

    @property
    def mapping(self) -> torch.Tensor:
        return self.allocator.full_to_swa_index_mapping

    def new_match_validator(self) -> MatchValidator:
        return _SWAWindowValidator(self.window)

    def value_for_new_node(self, full_value, tombstone: bool):
        return None if tombstone else self.mapping[full_value].clone()

    def _ceil_page(self, n: int) -> int:
        return -(-n // self.page_size) * self.page_size

    def tombstone_prefix_len(self, full_value: torch.Tensor) -> int:
        has = self.mapping[full_value] > 0
        if bool(has.all()):
            return 0
        t = min(self._ceil_page(int((~has).nonzero()[-1]) + 1), len(full_value))
        # Normalize: SWA data left inside the tombstone part would be unaccounted for.
        self.allocator.free_swa(full_value[:t])
        return t

    def on_insert_overlap(self, node, new_full_value: torch.Tensor):
        if node.data(SWA).value is not None:
            return node
        own = node.full_value
        ok = (new_full_value != own) & (self.mapping[new_full_value] > 0)
        if not bool(ok[-1]):
            return node
        bad = (~ok).nonzero()
        start = 0 if bad.numel() == 0 else self._ceil_page(int(bad[-1]) + 1)
        if start >= len(node):
            return node
        if start > 0:
            self.core.split_node(node, start)  # `node` keeps the suffix [start, len)
        self.allocator.transfer_swa_slots(new_full_value[start:], node.full_value)
        self.core.set_component_value(node, SWA, self.mapping[node.full_value].clone())
        return node

    def free_device(self, node) -> None:
        self.allocator.free_swa(node.full_value)

    def lock(self, node):
        covered = 0
        while not node.is_root and covered < self.window:
            self.core.inc_component_lock(node, SWA)
            covered += len(node)
            node = node.parent
        return covered

    def unlock(self, node, covered) -> None:
        done = 0
        while done < covered:
            assert not node.is_root, "SWA lock receipt does not match the tree"
            self.core.dec_component_lock(node, SWA)
            done += len(node)
            node = node.parent
        assert done == covered, "SWA lock receipt does not match the tree"
