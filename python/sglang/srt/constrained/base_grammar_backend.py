"""The grammar backend interface (upstream `constrained/base_grammar_backend.py`).

A constrained request carries one of `json_schema`, `regex`, `ebnf`, `structural_tag` in its
sampling params; `grammar_key` turns it into a cache key `(kind, spec)`. The backend compiles a
key once, on a worker thread (`get_future`), and caches the compiled grammar, so many requests
with the same schema (n > 1, a JSON API) pay for one compilation and a slow schema never runs on
the scheduler's step. The cache keeps the most recently used SGLANG_GRAMMAR_CACHE_SIZE grammars
(default 1024): clients choose the keys, so an unbounded cache grew with every new schema. Each request then gets its own matcher (`BaseGrammarObject`) from the
compiled grammar: it masks the vocabulary before sampling and advances on each accepted token.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Optional, Tuple

import torch

logger = logging.getLogger(__name__)

GrammarKey = Tuple[str, str]  # (kind, spec): kind in json | regex | ebnf | structural_tag
# Upstream's marker for "any JSON value" (response_format json_object uses a plain object schema).
ANY_JSON = "$$ANY$$"


class InvalidGrammarError(ValueError):
    """The spec cannot be compiled; the text names the problem (the client gets a 400)."""


def grammar_key(sampling_params) -> Optional[GrammarKey]:
    """The constraint of a request, or None (`SamplingParams.verify` allows at most one)."""
    sp = sampling_params
    for kind, spec in (("json", sp.json_schema), ("regex", sp.regex), ("ebnf", sp.ebnf),
                       ("structural_tag", sp.structural_tag)):
        if spec is not None:
            return kind, spec
    return None


class BaseGrammarObject:
    """One request's matcher over a compiled grammar."""

    def accept_token(self, token: int) -> None:
        """Advances over `token`; ValueError if the grammar does not allow it."""
        raise NotImplementedError

    def is_terminated(self) -> bool:
        raise NotImplementedError

    def fill_vocab_mask(self, vocab_mask: torch.Tensor, idx: int) -> None:
        """Writes this matcher's allowed-token bitmask into row `idx` of the batch's mask."""
        raise NotImplementedError

    def rollback(self, k: int) -> None:
        raise NotImplementedError


class BaseGrammarBackend:
    """Compiles and caches grammars off the scheduler thread; subclasses implement `compile`."""

    # The batch mask and how it is applied: set by the subclass.
    allocate_vocab_mask: Callable[[int], torch.Tensor]
    apply_vocab_mask: Callable[[torch.Tensor, torch.Tensor], None]

    def __init__(self, num_threads: int = 1, cache_entries: Optional[int] = None):
        from sglang.srt.managers.request_limits import env_limit

        self._executor = ThreadPoolExecutor(max_workers=num_threads, thread_name_prefix="grammar")
        self._cache: "OrderedDict[GrammarKey, Future]" = OrderedDict()  # least recently used first
        self._cache_entries = cache_entries if cache_entries is not None else env_limit("grammar_cache_entries")
        self._lock = threading.Lock()

    def compile(self, key: GrammarKey):
        """Compiled grammar for `key`; raises InvalidGrammarError with the reason."""
        raise NotImplementedError

    def new_matcher(self, compiled, key: GrammarKey) -> BaseGrammarObject:
        raise NotImplementedError

    def get_future(self, key: GrammarKey) -> Future:
        """A future of the compiled grammar (cached: one compilation per key; failures are
        cached too, so a bad spec sent again fails at once). An evicted entry is only forgotten:
        the requests that hold its future keep it."""
        with self._lock:
            fut = self._cache.get(key)
            if fut is None:
                fut = self._executor.submit(self.compile, key)
                self._cache[key] = fut
                while len(self._cache) > self._cache_entries:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(key)
            return fut

    def cache_size(self) -> int:
        return len(self._cache)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
