"""`RadixKey`: the token sequence a prefix-cache node is keyed by, plus its namespace.

Requests that must never share KV even when their tokens agree (different LoRA adapters,
different multimodal inputs, a cache salt) carry a different `extra_key`. The key's
`child_key` folds the extra_key in, so two namespaces never meet at a tree node, and
`match` returns 0 across namespaces.

All lengths the tree works with are page-aligned: `match` rounds the common prefix *down* to a
multiple of `page_size`, because a KV page is owned by exactly one tree node.
"""

from __future__ import annotations

from typing import Any, Hashable, Iterator, List, Optional, Sequence, Union


class RadixKey:
    __slots__ = ("token_ids", "extra_key")

    def __init__(self, token_ids: Sequence[int], extra_key: Optional[Hashable] = None):
        self.token_ids: List[int] = token_ids if isinstance(token_ids, list) else [int(t) for t in token_ids]
        self.extra_key = extra_key

    def __len__(self) -> int:
        return len(self.token_ids)

    def __iter__(self) -> Iterator[int]:
        return iter(self.token_ids)

    def __getitem__(self, idx: Union[int, slice]) -> Union[int, "RadixKey"]:
        if isinstance(idx, slice):
            return RadixKey(self.token_ids[idx], self.extra_key)
        return self.token_ids[idx]

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, RadixKey) and self.extra_key == other.extra_key and self.token_ids == other.token_ids

    def __hash__(self) -> int:
        return hash((self.extra_key, tuple(self.token_ids)))

    def __repr__(self) -> str:
        head = self.token_ids[:8]
        more = "..." if len(self.token_ids) > 8 else ""
        return f"RadixKey(extra_key={self.extra_key!r}, len={len(self)}, token_ids={head}{more})"

    def page_aligned(self, page_size: int) -> "RadixKey":
        """The longest prefix whose length is a multiple of page_size."""
        if page_size == 1:
            return self
        n = len(self.token_ids) // page_size * page_size
        return RadixKey(self.token_ids[:n], self.extra_key)

    def match(self, other: "RadixKey", page_size: int = 1) -> int:
        """Length of the common prefix with `other`, rounded down to page_size; 0 across namespaces."""
        if self.extra_key != other.extra_key:
            return 0
        a, b = self.token_ids, other.token_ids
        n = min(len(a), len(b))
        if a[:n] == b[:n]:
            common = n
        else:
            # Gallop to bracket the first mismatch, then bisect inside the bracket.
            lo, step = 0, 1
            while lo + step <= n and a[lo : lo + step] == b[lo : lo + step]:
                lo += step
                step *= 2
            hi = min(n, lo + step)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if a[lo:mid] == b[lo:mid]:
                    lo = mid
                else:
                    hi = mid - 1
            common = lo
        if page_size > 1:
            common = common // page_size * page_size
        return common

    def child_key(self, page_size: int = 1) -> Hashable:
        """The dict key a parent stores this key's node under: its first page, in its namespace."""
        plain = self.token_ids[0] if page_size == 1 else tuple(self.token_ids[:page_size])
        if self.extra_key is None:
            return plain
        return (self.extra_key, plain)
