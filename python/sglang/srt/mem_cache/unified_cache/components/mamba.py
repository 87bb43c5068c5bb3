"""MAMBA: one recurrent-state slot per node (hybrid SSM models: NemotronH, Falcon-H1).

Unlike KV, a Mamba2 layer's state does not grow per token: the conv + SSM state after token t
summarises the whole prefix [0, t]. A cached prefix is therefore only usable where a state was
saved for exactly that prefix, i.e. at the *end* of some node. So:

- Value: a one-element int64 tensor `[slot]`, a `MambaPool` slot owned by the tree (size
  counters then count slots), or None (tombstone: no state for this prefix end).
- Match (validator): a prefix may end at a node only if the node is matched in full and holds a
  state. The walk keeps the longest such prefix (never one that ends inside a node).
- Split: the state belongs to the end of the sequence, so the child (which keeps the end) keeps
  it; the new parent gets none, and no Mamba lock (the lock is single-node, on the anchor).
- New nodes get no state from the insert itself: the cache stores a copy of the request's
  state on the final node (`UnifiedRadixCache._store_mamba_state`) when the inserted key covers
  exactly the tokens that state summarises.
- Copy-on-write: a request never writes into a tree slot. On a match the cache copies the
  anchor's state into the request's own slot (`UnifiedRadixCache.init_req_mamba_state`).
- Lock: single node (the anchor), held from admission until that copy is made.
- Eviction: internal priority 0, below SWA (1) and FULL (2): evicting FULL or SWA on an
  internal node also drops its state; evicting a state alone tombstones an internal node and
  deletes a leaf. Freed slots go back to the `MambaPool`.
"""

from __future__ import annotations

from typing import Optional

import torch

from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_cache.components.base import MatchValidator, TreeComponent

MAMBA = ComponentType.MAMBA


class _MambaStateValidator(MatchValidator):
    """Valid only right after a node that was matched in full and holds a state."""

    def __init__(self):
        self._ok = False

    def advance(self, node, num_tokens: int) -> None:
        self._ok = node.data(MAMBA).value is not None and num_tokens == len(node)

    def ok(self) -> bool:
        return self._ok


class MambaComponent(TreeComponent):
    component_type = MAMBA
    internal_priority = 0

    def __init__(self, params):
        super().__init__()
        self.mamba_pool = getattr(params, "mamba_pool", None)
        if self.mamba_pool is None:
            raise ValueError("The MAMBA tree component needs the MambaPool (CacheInitParams.mamba_pool).")

    def new_match_validator(self) -> MatchValidator:
        return _MambaStateValidator()

    def value_for_new_node(self, full_value: torch.Tensor, tombstone: bool) -> Optional[torch.Tensor]:
        return None  # the cache stores the state on the final node after the insert

    def redistribute_on_split(self, new_parent, child, split_len: int) -> None:
        pd = new_parent.data(MAMBA)
        pd.value = None
        pd.lock_ref = 0
        pd.metadata = {}

    @staticmethod
    def slot_of(node) -> Optional[int]:
        v = node.data(MAMBA).value
        return None if v is None else int(v[0])

    def free_device(self, node) -> None:
        self.mamba_pool.free(node.data(MAMBA).value)

    def lock(self, node):
        self.core.inc_component_lock(node, MAMBA)
        return True

    def unlock(self, node, part) -> None:
        """`part` is False once the cache released the lock early (after the copy-on-write)."""
        if part:
            self.core.dec_component_lock(node, MAMBA)
