"""NGRAM drafting: the tokens that followed the latest earlier occurrence of the request's own
suffix (prompt + output so far), the "prompt lookup" idea behind upstream's NGRAM algorithm.

Upstream keeps one token trie over all requests (`--speculative-ngram-capacity` tokens, BFS or
PROB branch choice, up to `--speculative-ngram-max-bfs-breadth` branches verified as a tree).
This server verifies one chain per request, drafted from the request's own tokens only: a
suffix of `MATCH_WINDOWS` tokens (longest first) is looked up in a per-request index of every
earlier n-gram of that length, and the continuation after its latest occurrence is the draft.
`--speculative-ngram-max-trie-depth` bounds match plus draft, as upstream's trie depth does.

The index is rebuilt from the tokens whenever it is missing (a retracted request, a PD decode
server's request), so nothing of it needs to be saved or transferred: drafting never needs the
prefill server.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

# Suffix lengths tried, longest first: a one-token match is too weak a guess to pay for its
# verification on a CPU, so the shortest match is two tokens.
MATCH_WINDOWS = (4, 3, 2)


class NgramIndex:
    """For each window length w: n-gram (w tokens) -> end position of its latest occurrence,
    over the first `indexed` positions of the request's tokens."""

    __slots__ = ("maps", "indexed")

    def __init__(self):
        self.maps: Dict[int, Dict[Tuple[int, ...], int]] = {w: {} for w in MATCH_WINDOWS}
        self.indexed = 0  # n-grams ending at positions <= indexed are in the maps

    def extend(self, tokens: Sequence[int], upto: int) -> None:
        """Indexes the n-grams ending at positions (indexed, upto] (end exclusive indices)."""
        for end in range(self.indexed + 1, upto + 1):
            for w, m in self.maps.items():
                if end >= w:
                    m[tuple(tokens[end - w:end])] = end
        self.indexed = max(self.indexed, upto)


class NgramDrafter:
    def __init__(self, max_trie_depth: int = 18):
        self.max_trie_depth = max(int(max_trie_depth), 2)

    def propose(self, tokens: Sequence[int], index: NgramIndex, max_drafts: int) -> List[int]:
        """Up to `max_drafts` tokens guessed to follow `tokens`; [] when the suffix was not seen."""
        n = len(tokens)
        if max_drafts <= 0 or n < 2:
            return []
        # Occurrences must end before the suffix itself does (end < n): index up to n - 1.
        index.extend(tokens, n - 1)
        for w in MATCH_WINDOWS:
            if n < w:
                continue
            end = index.maps[w].get(tuple(tokens[n - w:]))
            if end is None:
                continue
            k = min(max_drafts, self.max_trie_depth - w)
            if k <= 0:
                continue
            # Copy what followed the match; a copy that reaches the end of the tokens goes on
            # over what it drafted (an overlapping copy: a text cycling with period p drafts
            # the full k tokens, not p).
            draft: List[int] = []
            for i in range(k):
                j = end + i
                draft.append(tokens[j] if j < n else draft[j - n])
            return draft
        return []
