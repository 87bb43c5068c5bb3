"""Grammars that start after the reasoning section (upstream `reasoner_grammar_backend.py`).

With `--reasoning-parser`, a constrained request of a thinking model first reasons freely between
`<think>` and `</think>`; the grammar applies to what follows. `ReasonerGrammar` wraps a request's
matcher with that state: forced parsers (deepseek-r1, qwen3-thinking) start inside the reasoning;
the others (qwen3) let the first token be either `<think>` (then reason) or one the grammar allows
(then no reasoning at all). Both markers must be single tokens of the vocabulary; otherwise the
grammar applies from the first token and the server says so once at start.
"""

from __future__ import annotations

import torch

from sglang.srt.constrained.base_grammar_backend import BaseGrammarObject

UNDECIDED, REASONING, CONSTRAINED = "undecided", "reasoning", "constrained"


def allow_token(vocab_mask: torch.Tensor, idx: int, token: int) -> None:
    """Sets `token`'s bit in row `idx` of a packed int32 bitmask (bit 31 is the sign bit)."""
    word, bit = divmod(int(token), 32)
    value = -(1 << 31) if bit == 31 else (1 << bit)
    vocab_mask[idx, word] |= value


class ReasonerGrammar(BaseGrammarObject):
    def __init__(self, grammar: BaseGrammarObject, think_start_id: int, think_end_id: int, forced: bool):
        self.grammar = grammar
        self.think_start_id = think_start_id
        self.think_end_id = think_end_id
        self.state = REASONING if forced else UNDECIDED

    def accept_token(self, token: int) -> None:
        if self.state == UNDECIDED:
            if token == self.think_start_id:
                self.state = REASONING
                return
            self.state = CONSTRAINED
        elif self.state == REASONING:
            if token == self.think_end_id:
                self.state = CONSTRAINED
            return
        self.grammar.accept_token(token)

    def is_terminated(self) -> bool:
        return self.state == CONSTRAINED and self.grammar.is_terminated()

    def fill_vocab_mask(self, vocab_mask: torch.Tensor, idx: int) -> None:
        if self.state == REASONING:
            return  # the row stays all-allowed
        self.grammar.fill_vocab_mask(vocab_mask, idx)
        if self.state == UNDECIDED:
            allow_token(vocab_mask, idx, self.think_start_id)

    def rollback(self, k: int) -> None:
        self.grammar.rollback(k)
