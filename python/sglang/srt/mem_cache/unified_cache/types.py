"""Parameters and results of the prefix-cache API (upstream's names)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict

import torch

from sglang.srt.mem_cache.radix_key import RadixKey
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType


@dataclass
class MatchPrefixParams:
    key: RadixKey
    # False: the caller brings its own recurrent (Mamba) state, e.g. a PD decode request whose
    # state the prefill sends; the prefix then needs KV only and may end where no state is stored.
    with_state: bool = True


@dataclass
class MatchResult:
    """device_indices: int64 FULL-pool slots of the usable cached prefix (page-aligned length).

    last_device_node: the node the prefix ends at; lock it with `inc_lock_ref` before using the
    indices. There is no host tier yet, so the host fields equal the device ones.
    """

    device_indices: torch.Tensor
    last_device_node: Any
    last_host_node: Any = None
    best_match_node: Any = None
    host_hit_length: int = 0

    @property
    def device_prefix_len(self) -> int:
        return int(self.device_indices.numel())


@dataclass
class InsertParams:
    key: RadixKey
    value: torch.Tensor  # FULL-pool slots, one per token of key


@dataclass
class InsertResult:
    """prefix_len: how many leading tokens of the key were already in the tree.

    The caller owns `value[:prefix_len]` still and frees the part of it that was its own
    (the tree keeps its own copies); `value[prefix_len:]` now belongs to the tree.
    """

    prefix_len: int
    last_device_node: Any = None


@dataclass
class EvictParams:
    num_tokens: int = 0  # FULL tokens to free
    swa_num_tokens: int = 0  # SWA tokens to free
    mamba_num: int = 0


@dataclass
class EvictResult:
    num_tokens_evicted: int = 0
    swa_num_tokens_evicted: int = 0
    mamba_num_evicted: int = 0


@dataclass
class LockReceipt:
    """What `inc_lock_ref` did, so `dec_lock_ref` undoes exactly that.

    node: the anchor the lock was taken on (the FULL lock covers anchor..root).
    component_parts: per component, what that component recorded (SWA: the token length of the
    locked segment above the anchor; it stays valid when nodes on the path are split, because a
    split copies lock counts into the new parent and keeps the segment's top on a node boundary).
    """

    node: Any
    component_parts: Dict[ComponentType, Any] = field(default_factory=dict)
