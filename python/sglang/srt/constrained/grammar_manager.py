"""(Scheduler process.) The grammar queue: constrained requests wait here, off the batches,
until their grammar is compiled (upstream's `grammar_queue`).

`submit` starts (or reuses) the compilation and parks the request; `poll`, called once per
scheduler step, hands back the requests whose grammar is ready (each with its own matcher) and
those that failed: an invalid spec (400 naming the problem) or a compilation that took longer
than SGLANG_GRAMMAR_TIMEOUT seconds (default 300, as upstream). The request's matcher then
follows its output: `advance` accepts every output token the matcher has not seen yet, so a
request that arrives with tokens (a PD decode server gets the first one from prefill) or
resumes after a retraction continues from the right state without special cases.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import FIRST_COMPLETED
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

from sglang.srt.constrained.base_grammar_backend import BaseGrammarBackend, GrammarKey, grammar_key

logger = logging.getLogger(__name__)

GRAMMAR_BACKEND_NONE_MESSAGE = (
    "Grammar-based generation (json_schema, regex, ebnf, structural_tag) is not supported when the "
    "server is launched with --grammar-backend none"
)


def grammar_timeout_s() -> float:
    return float(os.environ.get("SGLANG_GRAMMAR_TIMEOUT", "300"))


@dataclass
class _Waiting:
    req: Any
    payload: Any  # what the scheduler needs to queue the request once it is ready
    key: GrammarKey
    future: Any
    since: float


class GrammarManager:
    def __init__(self, backend: BaseGrammarBackend, reasoning=None):
        self.backend = backend
        self.queue: List[_Waiting] = []
        self.timeout_s = grammar_timeout_s()
        self.reasoning = reasoning  # (think start id, think end id, forced): grammars start after </think>

    def _matcher(self, compiled, key):
        grammar = self.backend.new_matcher(compiled, key)
        if self.reasoning is None:
            return grammar
        from sglang.srt.constrained.reasoner_grammar_backend import ReasonerGrammar

        return ReasonerGrammar(grammar, *self.reasoning)

    @staticmethod
    def key_of(req) -> "GrammarKey | None":
        return grammar_key(req.sampling_params)

    def submit(self, req, payload) -> None:
        key = grammar_key(req.sampling_params)
        self.queue.append(_Waiting(req, payload, key, self.backend.get_future(key), time.monotonic()))

    def poll(self, wait_s: float = 0.0) -> Tuple[List[Tuple[Any, Any]], List[Tuple[Any, Any, str]]]:
        """(ready [(req, payload)], failed [(req, payload, message)]), in arrival order.
        `wait_s`: an otherwise idle scheduler waits this long for a compilation instead of spinning."""
        if wait_s > 0 and self.queue and not any(w.future.done() for w in self.queue):
            futures_wait([w.future for w in self.queue], timeout=wait_s, return_when=FIRST_COMPLETED)
        ready, failed, still = [], [], []
        now = time.monotonic()
        for w in self.queue:
            if w.future.done():
                err = w.future.exception()
                if err is not None:
                    failed.append((w.req, w.payload, str(err)))
                else:
                    w.req.grammar.matcher = self._matcher(w.future.result(), w.key)
                    w.req.grammar.accepted = 0
                    ready.append((w.req, w.payload))
            elif now - w.since > self.timeout_s:
                failed.append((w.req, w.payload, f"Grammar preprocessing timed out for key={w.key[0]}"))
            else:
                still.append(w)
        self.queue = still
        return ready, failed

    def remove(self, req) -> bool:
        n = len(self.queue)
        self.queue = [w for w in self.queue if w.req is not req]
        return len(self.queue) != n

    def reqs(self) -> list:
        return [w.req for w in self.queue]

    # --- decoding ---------------------------------------------------------------------------
    def vocab_mask_for(self, reqs) -> "Any | None":
        """The batch's token bitmask (rows of unconstrained requests allow everything), or None."""
        rows = [(i, r) for i, r in enumerate(reqs) if r.grammar.matcher is not None]
        if not rows:
            return None
        mask = self.backend.allocate_vocab_mask(len(reqs))
        for i, req in rows:
            req.advance_grammar()
            if not req.grammar.matcher.is_terminated():
                req.grammar.matcher.fill_vocab_mask(mask, i)
        return mask


def create_grammar_backend(server_args, tokenizer, vocab_size: int, eos_token_ids) -> Optional[BaseGrammarBackend]:
    """The backend `--grammar-backend` names (None for `none` or without a tokenizer)."""
    name = server_args.grammar_backend
    if name in (None, "none") or tokenizer is None:
        return None
    if name == "xgrammar":
        from sglang.srt.constrained.xgrammar_backend import XGrammarGrammarBackend

        return XGrammarGrammarBackend(
            tokenizer, vocab_size, eos_token_ids,
            any_whitespace=not server_args.constrained_json_disable_any_whitespace,
            max_whitespace_cnt=server_args.constrained_json_max_whitespace_cnt,
        )
    raise ValueError(f"Invalid grammar backend: {name}")


def reasoning_token_ids(server_args, tokenizer, model_path: Optional[str]):
    """(think start id, think end id, forced) when --reasoning-parser is set and both markers are
    single tokens; None otherwise (then grammars apply from the first token)."""
    from sglang.srt.parser.parser_selection import AUTO_REASONING_PARSERS, reasoning_markers, resolve_auto_parser

    name = resolve_auto_parser(server_args.reasoning_parser, model_path, AUTO_REASONING_PARSERS)
    markers = reasoning_markers(name)
    if markers is None or tokenizer is None:
        return None
    start, end, forced = markers
    ids = [tokenizer.encode(m, add_special_tokens=False) for m in (start, end)]
    if any(len(i) != 1 for i in ids):
        logger.warning("--reasoning-parser %s: %s / %s are not single tokens of this tokenizer; grammars apply "
                       "from the first output token, not after the reasoning section", name, start, end)
        return None
    return ids[0][0], ids[1][0], forced
