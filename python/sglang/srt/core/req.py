"""A request as the scheduler process sees it: every field declared here, owned by one component.

A `Req` walks: waiting -> (chunked) prefill -> running (decode) -> finished, possibly
retracted back to waiting on memory pressure (a PD decode server keeps its KV in a backup and
resumes it without prefill). Field owners: the scheduler (queues, outputs), and one sub-record
per other concern: `kv` (`KVState`, the memory manager and radix cache), `logprobs`
(`LogprobState`, output processing), `pd` (`PDTransfer`, the PD roles), `grammar`
(`GrammarState`, the grammar manager), `spec` (`SpecState`, speculative decoding). `abort(reason)` is the one writer of `to_abort`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, List, Optional, Set

import torch

from sglang.srt.core.finish_reason import (
    FINISH_ABORT,
    FINISH_LENGTH,
    FINISH_MATCHED_STR,
    FINISH_MATCHED_TOKEN,
    BaseFinishReason,
)


@dataclasses.dataclass
class KVState:
    """Where the request's KV (and Mamba state) lives; owner: `MemoryManager` and the radix cache
    (`mem_cache/`). Its KV is one row of the ReqToTokenPool (`req_pool_idx`); the first
    `cache_protected_len` entries of that row belong to the radix tree (locked through
    `last_node` / `lock_receipt`), the rest to the request. A retracted PD decode request's KV
    waits in `retraction_backup` until it resumes."""

    req_pool_idx: Optional[int] = None
    prefix_indices: torch.Tensor = dataclasses.field(default_factory=lambda: torch.empty(0, dtype=torch.int64))
    prefix_match: Any = None  # radix match found at admission, before it is locked
    last_node: Any = None
    lock_receipt: Any = None
    cache_protected_len: int = 0
    kv_len: int = 0  # tokens with KV in the pool
    swa_freed_len: int = 0  # hybrid-SWA pool: leading tokens whose SWA slots were given back
    mamba_pool_idx: Optional[int] = None  # hybrid SSM models: this request's MambaPool slot
    retraction_backup: Optional[Any] = None


@dataclasses.dataclass
class LogprobState:
    """Logprobs collected so far, lists of (logprob, token_id); owner: output processing (a PD
    decode server's first token comes from the prefill's metadata row). With token_ids_logprob:
    per position, (logprobs, token ids) of the requested ids. `sent_len` / `sent_input`: how much
    went out already (input logprobs go out once, with the first output)."""

    output_token_logprobs: List[tuple] = dataclasses.field(default_factory=list)
    output_top_logprobs: List[list] = dataclasses.field(default_factory=list)
    output_token_ids_logprobs: List[tuple] = dataclasses.field(default_factory=list)
    input_token_logprobs: Optional[List[tuple]] = None
    input_top_logprobs: Optional[List[list]] = None
    input_token_ids_logprobs: Optional[List[tuple]] = None
    sent_len: int = 0
    sent_input: bool = False


@dataclasses.dataclass
class PDTransfer:
    """PD disaggregation state; owner: the prefill / decode roles (`disaggregation/`)."""

    bootstrap_room: Optional[int] = None
    kv_sender: Optional[Any] = None  # prefill: BaseKVSender of this request
    kv_receiver: Optional[Any] = None  # decode: BaseKVReceiver of this request
    metadata_idx: Optional[int] = None  # row of the metadata buffers (first token, logprobs)
    sent_kv_len: int = 0  # prefill: tokens whose KV pages were handed to the sender
    kv_destination_known: bool = False  # prefill: the decode server's metadata (its KV slots) arrived


@dataclasses.dataclass
class GrammarState:
    """Structured output; owner: `constrained/grammar_manager.py` sets the matcher when the grammar
    is compiled, `Req.advance_grammar` feeds it the output tokens (`accepted` so far)."""

    matcher: Optional[Any] = None
    accepted: int = 0


@dataclasses.dataclass
class SpecState:
    """Speculative decoding; owner: `managers/spec_decode.py` (drafts) and output processing
    (the counters reported in meta_info as upstream's `spec_verify_ct`, `spec_num_correct_drafts`,
    `spec_num_proposed_drafts`). `ngram_index` is rebuilt from the tokens when missing.
    `draft_budget`: how many tokens the next draft may have (adapts to what was accepted);
    `pause_steps` / `misses`: decode steps left without drafting after drafts that were rejected
    outright, and how many such drafts came in a row (the pause doubles with each)."""

    ngram_index: Optional[Any] = None
    draft_budget: Optional[int] = None
    pause_steps: int = 0
    misses: int = 0
    verify_ct: int = 0
    num_proposed_drafts: int = 0
    num_correct_drafts: int = 0


class Req:
    def __init__(
        self,
        rid: str,
        origin_input_text: Optional[str],
        origin_input_ids: List[int],
        sampling_params,
        eos_token_ids: Optional[Set[int]] = None,
        return_logprob: bool = False,
        logprob_start_len: int = -1,
        top_logprobs_num: int = 0,
        stream: bool = False,
        extra_key: Optional[str] = None,
        priority: Optional[int] = None,
        vocab_size: Optional[int] = None,
        token_ids_logprob: Optional[List[int]] = None,
        custom_logit_processor: Optional[str] = None,
    ):
        self.rid = rid
        self.origin_input_text = origin_input_text
        self.origin_input_ids = list(origin_input_ids)
        self.sampling_params = sampling_params
        self.eos_token_ids = set(eos_token_ids or ())
        self.output_ids: List[int] = []
        self.return_logprob = return_logprob
        self.logprob_start_len = logprob_start_len
        self.top_logprobs_num = top_logprobs_num
        self.stream = stream
        self.extra_key = extra_key
        self.priority = priority
        self.vocab_size = vocab_size
        self.token_ids_logprob = token_ids_logprob
        self.custom_logit_processor = custom_logit_processor  # serialized CustomLogitProcessor, or None
        self.arrival_time = time.monotonic()
        self.queue_time_start = self.arrival_time  # entered the waiting queue (again, after a retraction)
        self.forward_entry_time: Optional[float] = None  # first scheduled into a batch

        self.kv = KVState()
        self.fill_ids: List[int] = []  # tokens whose KV is written once the current forward ends
        self.extend_input_len = 0
        self.is_chunked = 0

        # Accounting reported in meta_info.
        self.cached_tokens = 0
        self.num_retractions = 0
        self.finished_reason: Optional[BaseFinishReason] = None
        self._abort_reason: Optional[FINISH_ABORT] = None  # `abort()` writes it, `to_abort` reads it
        self.sent_len = 0  # output ids already streamed out
        self.logprobs = LogprobState()

        # Incremental stop-string check state.
        self.tokenizer = None
        self.stop_regex_matcher: Optional[Any] = None  # StopRegexMatcher, built at the first check

        self.pd = PDTransfer()
        self.grammar = GrammarState()
        self.spec = SpecState()
        # Embedding servers (layers/pooler.py): the pooled state over the chunks prefilled so
        # far, the finished vector, and whether pooling needs every prompt token (mean / CLS:
        # then no radix-cache prefix is used).
        self.pooled: Optional[torch.Tensor] = None
        self.embedding: Optional[List[float]] = None
        self.pool_all_tokens = False

    @property
    def kv_committed_len(self) -> int:
        """KV length the radix cache releases for this request (what is in the pool now)."""
        return self.kv.kv_len

    # --- state ---------------------------------------------------------------------------
    @property
    def to_abort(self) -> Optional[FINISH_ABORT]:
        """Why this request must end (set by `abort`), or None."""
        return self._abort_reason

    def abort(self, reason: FINISH_ABORT) -> None:
        """The one place a request is marked aborted; whoever holds it ends it (releases its
        memory and reports `reason` as its finish reason)."""
        self._abort_reason = reason

    def finished(self) -> bool:
        return self.finished_reason is not None

    @property
    def seqlen(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    def all_ids(self) -> List[int]:
        return self.origin_input_ids + self.output_ids

    def wants_input_logprobs(self) -> bool:
        return self.return_logprob and 0 <= self.logprob_start_len < len(self.origin_input_ids)

    def max_prefix_len(self) -> int:
        """A prefix match must leave at least one token to compute (its logits pick the next token)."""
        limit = len(self.fill_ids) - 1
        if self.pool_all_tokens:
            return 0
        if self.wants_input_logprobs():
            # position start-1 must be computed: its logits score prompt token `start`
            limit = min(limit, max(self.logprob_start_len - 1, 0))
        return max(limit, 0)

    def reset_for_retract(self) -> None:
        self.num_retractions += 1
        # Everything but the backup: the re-prefill (or resume) gets a new row, slots and Mamba slot.
        self.kv = KVState(retraction_backup=self.kv.retraction_backup)
        self.is_chunked = 0

    def advance_grammar(self) -> None:
        """Feeds the matcher the output tokens it has not seen (idempotent). The tokens may come
        from this server's sampler or, on a PD decode server, from the prefill server."""
        state, grammar = self.grammar, self.grammar.matcher
        if grammar is None:
            return
        while state.accepted < len(self.output_ids) and not grammar.is_terminated():
            token = self.output_ids[state.accepted]
            state.accepted += 1
            try:
                grammar.accept_token(token)
            except ValueError as e:
                self.abort(FINISH_ABORT(
                    f"Grammar accept_token failed for req {self.rid} with token {token}: {e}", 500,
                    "InternalServerError"))
                return

    # --- finish checks -------------------------------------------------------------------
    def check_finished(self) -> None:
        if self.finished():
            return
        self.advance_grammar()
        if self.to_abort is not None:
            self.finished_reason = self.to_abort
            return
        sp = self.sampling_params
        if len(self.output_ids) >= sp.max_new_tokens:
            self.finished_reason = FINISH_LENGTH(length=sp.max_new_tokens)
            return
        if not self.output_ids:
            return
        last = self.output_ids[-1]
        if self.grammar.matcher is not None and self.grammar.matcher.is_terminated():  # upstream: before stop tokens
            self.finished_reason = FINISH_MATCHED_TOKEN(matched=last)
            return
        if len(self.output_ids) > sp.min_new_tokens:
            stop_ids = set(sp.stop_token_ids or ())
            if not sp.ignore_eos:
                stop_ids |= self.eos_token_ids
            if last in stop_ids:
                self.finished_reason = FINISH_MATCHED_TOKEN(matched=last)
                return
            if (sp.stop_strs or sp.stop_regex_strs) and self.tokenizer is not None:
                if self._check_str_based_finish():
                    return
        if self.vocab_size is not None and not (0 <= last < self.vocab_size):
            self.finished_reason = FINISH_ABORT("Sampled token id out of the vocabulary.", 500)

    def _check_str_based_finish(self) -> bool:
        """Stop strings, then stop regexes, on the decoded tail of the output (upstream: the tail
        long enough for the longest of them; `matched` is the stop string, or the regex pattern).
        Both are bounded per step: stop strings by their longest one in tokens (whose length is
        validated), stop regexes by `StopRegexMatcher.window_tokens`."""
        sp = self.sampling_params
        if sp.stop_strs:
            tail = self.tokenizer.decode(self.output_ids[-(sp.stop_str_max_len + 1):])
            for stop in sp.stop_strs:
                if stop and stop in tail:
                    self.finished_reason = FINISH_MATCHED_STR(matched=stop)
                    return True
        if sp.stop_regex_strs:
            # RE2 over a bounded tail (sampling/stop_regex.py): linear in the tail, whatever the
            # pattern and however long the output; never Python's backtracking `re`.
            if self.stop_regex_matcher is None:
                from sglang.srt.sampling.stop_regex import StopRegexMatcher

                self.stop_regex_matcher = StopRegexMatcher(sp.stop_regex_strs)
            pattern = self.stop_regex_matcher.first_match(self.output_ids, self.tokenizer.decode)
            if pattern is not None:
                self.finished_reason = FINISH_MATCHED_STR(matched=pattern)
                return True
        return False

    def meta_info_base(self) -> dict:
        return {
            "prompt_tokens": len(self.origin_input_ids),
            "completion_tokens": len(self.output_ids),
            "cached_tokens": self.cached_tokens,
            "num_retractions": self.num_retractions,
        }

    def __repr__(self) -> str:
        return f"Req(rid={self.rid}, input_len={len(self.origin_input_ids)}, output_len={len(self.output_ids)})"
