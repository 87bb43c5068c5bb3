"""(Scheduler process.) The scheduler's side of speculative decoding: which requests draft and
what, whether the drafted tokens' KV fits, and the sampling rows of a verify forward.

Each decode step on a speculative server, `SpecDecodePlanner.drafts_for` asks the drafter for
every running request's draft. When nobody drafted anything, or the drafted tokens' KV does
not fit even after evicting the tree (the plain step may then retract, as on any server), the
step is a plain decode. Otherwise it is a verify step: `ScheduleBatch.prepare_for_verify`
reserves KV for every request's last token and its drafts (`MemoryManager.reserve_verify`),
the worker scores and verifies them (`speculative/spec_worker.py`) and the output processor
appends the emitted tokens, one at a time with the usual finish checks (a stop token or string
inside an accepted run ends it there; max_new_tokens is never exceeded), then gives back the KV
of what was not kept (`MemoryManager.trim_kv`).

Who does not draft (its step still verifies, with one position): a request with a grammar
(structured output: a drafted token is only valid after the grammar saw the ones before it, so
such requests decode one token a step), and every request of a batch that runs custom logit
processors (they see the batch's requests, not its verify rows). Drafts never reach past
max_new_tokens: k drafts can emit k + 1 tokens.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from sglang.srt.speculative.ngram_drafter import NgramDrafter, NgramIndex
from sglang.srt.speculative.spec_config import SpecConfig


MAX_PAUSE = 32  # decode steps a request waits at most before drafting again after misses


class _RowView:
    """A request as seen by one verify row: its history extended by the drafts before that row
    (`SamplingBatchInfo.from_reqs` then gives the row its own position, penalties and
    min_new_tokens state)."""

    __slots__ = ("sampling_params", "origin_input_ids", "output_ids", "eos_token_ids")

    def __init__(self, req, extra: Sequence[int]):
        self.sampling_params = req.sampling_params
        self.origin_input_ids = req.origin_input_ids
        self.output_ids = list(req.output_ids) + list(extra) if extra else req.output_ids
        self.eos_token_ids = req.eos_token_ids


class SpecDecodePlanner:
    def __init__(self, config: SpecConfig, memory):
        self.config = config
        self.memory = memory
        self.drafter = NgramDrafter(config.max_trie_depth)

    def drafts_for(self, reqs: Sequence) -> Optional[List[List[int]]]:
        """Each request's draft, or None: this step is a plain decode (nothing drafted, or the
        drafts' KV does not fit)."""
        if any(r.custom_logit_processor for r in reqs):
            return None
        drafts = [self._draft(r) for r in reqs]
        if not any(drafts):
            return None
        if not self.memory.verify_fits(reqs, [len(d) + 1 for d in drafts]):
            return None
        return drafts

    def _draft(self, req) -> List[int]:
        if req.grammar.matcher is not None:
            return []
        spec = req.spec
        if spec.pause_steps > 0:
            spec.pause_steps -= 1
            return []
        budget = self.config.max_drafts if spec.draft_budget is None else spec.draft_budget
        k = min(budget, req.sampling_params.max_new_tokens - len(req.output_ids) - 1)
        if k <= 0:
            return []
        if spec.ngram_index is None:
            spec.ngram_index = NgramIndex()
        return self.drafter.propose(req.origin_input_ids + req.output_ids, spec.ngram_index, k)

    def after_verify(self, req, drafted: int, accepted: int) -> None:
        """Adapts the request's drafting to what the target accepts, so that text with nothing to
        copy costs little: a fully accepted draft doubles the next one's length (up to the verify
        width), a partly accepted one shrinks it to what was accepted plus one, and a draft
        rejected outright pauses drafting for 1, 2, 4, ... up to MAX_PAUSE decode steps (plain
        steps when nobody else drafts)."""
        spec = req.spec
        if drafted == 0:
            return
        if accepted >= drafted:
            spec.draft_budget = min(self.config.max_drafts, max(drafted, 1) * 2)
        else:
            spec.draft_budget = max(accepted + 1, 1)
        if accepted == 0:
            spec.pause_steps = min(1 << spec.misses, MAX_PAUSE)
            spec.misses += 1
        else:
            spec.misses = 0

    @staticmethod
    def sampling_info(reqs: Sequence, drafts: Sequence[Sequence[int]], vocab_size: int, device,
                      grammar_mask=None):
        """The SamplingBatchInfo of the verify rows (k_i + 1 per request); `grammar_mask`, the
        batch's grammar mask by request, is spread over their rows."""
        from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

        views, owner = [], []
        for i, (req, d) in enumerate(zip(reqs, drafts)):
            for j in range(len(d) + 1):
                views.append(_RowView(req, d[:j]))
                owner.append(i)
        info = SamplingBatchInfo.from_reqs(views, vocab_size, device)
        if grammar_mask is not None:
            info.vocab_mask = grammar_mask.index_select(0, torch.tensor(owner, dtype=torch.int64,
                                                                        device=grammar_mask.device))
        return info, owner
