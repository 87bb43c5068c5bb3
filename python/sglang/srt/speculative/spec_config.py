"""What the speculative worker and planner read of the settings (`SpecConfig.from_server_args`)."""

from __future__ import annotations

import dataclasses
from enum import Enum
from typing import Optional


class SpeculativeAlgorithm(str, Enum):
    """Upstream's names (`--speculative-algorithm`)."""

    NGRAM = "NGRAM"
    STANDALONE = "STANDALONE"
    EAGLE = "EAGLE"
    EAGLE3 = "EAGLE3"


# The algorithms this server runs; the others are refused at start (server_args).
IMPLEMENTED_ALGORITHMS = ("NGRAM",)


@dataclasses.dataclass(frozen=True)
class SpecConfig:
    """The resolved speculative settings. `num_draft_tokens` is upstream's verify width: the
    next token plus up to `num_draft_tokens - 1` drafted ones per request and step.
    `max_trie_depth`: the longest n-gram (match plus continuation) the NGRAM drafter looks at."""

    algorithm: str
    num_draft_tokens: int
    max_trie_depth: int = 18
    draft_model_path: Optional[str] = None

    @property
    def max_drafts(self) -> int:
        return max(self.num_draft_tokens - 1, 0)

    @classmethod
    def from_server_args(cls, sa) -> Optional["SpecConfig"]:
        if not sa.speculative_algorithm:
            return None
        return cls(algorithm=str(sa.speculative_algorithm).upper(),
                   num_draft_tokens=int(sa.speculative_num_draft_tokens),
                   max_trie_depth=int(sa.speculative_ngram_max_trie_depth),
                   draft_model_path=sa.speculative_draft_model_path)
