"""Requests as the scheduler sees them, and the finish reasons they end with.

A `Req` walks: waiting -> (chunked) prefill -> running (decode) -> finished, possibly
retracted back to waiting on memory pressure. Its KV lives in one row of the
ReqToTokenPool (`req_pool_idx`); the first `cache_protected_len` entries of that row belong to
the radix tree (locked through `last_node`), the rest to the request.
"""

from __future__ import annotations

import re
import time
from typing import List, Optional, Sequence, Set

import torch


# A stop regex that can match more than this many characters is checked on the whole output.
STOP_REGEX_FULL_DECODE = 1 << 16


class BaseFinishReason:
    def __init__(self, is_error: bool = False):
        self.is_error = is_error

    def to_json(self) -> dict:
        raise NotImplementedError


class FINISH_MATCHED_TOKEN(BaseFinishReason):
    def __init__(self, matched):
        super().__init__()
        self.matched = matched

    def to_json(self):
        return {"type": "stop", "matched": self.matched}


class FINISH_MATCHED_STR(BaseFinishReason):
    def __init__(self, matched: str):
        super().__init__()
        self.matched = matched

    def to_json(self):
        return {"type": "stop", "matched": self.matched}


class FINISH_LENGTH(BaseFinishReason):
    def __init__(self, length: int):
        super().__init__()
        self.length = length

    def to_json(self):
        return {"type": "length", "length": self.length}


class FINISH_ABORT(BaseFinishReason):
    def __init__(self, message: str = "Unknown error", status_code: Optional[int] = None, err_type: Optional[str] = None):
        super().__init__(is_error=True)
        self.message = message
        self.status_code = status_code
        self.err_type = err_type

    def to_json(self):
        return {"type": "abort", "message": self.message, "status_code": self.status_code, "err_type": self.err_type}


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
        self.arrival_time = time.monotonic()
        self.queue_time_start = self.arrival_time  # entered the waiting queue (again, after a retraction)
        self.forward_entry_time: Optional[float] = None  # first scheduled into a batch

        # Memory state (see module docstring).
        self.req_pool_idx: Optional[int] = None
        self.fill_ids: List[int] = []  # tokens whose KV is written once the current forward ends
        self.prefix_indices: torch.Tensor = torch.empty(0, dtype=torch.int64)
        self.prefix_match = None  # radix match found at admission, before it is locked
        self.last_node = None
        self.lock_receipt = None
        self.cache_protected_len = 0
        self.kv_len = 0  # tokens with KV in the pool
        self.swa_freed_len = 0  # hybrid-SWA pool: leading tokens whose SWA slots were given back
        self.mamba_pool_idx: Optional[int] = None  # hybrid SSM models: this request's MambaPool slot
        self.extend_input_len = 0
        self.is_chunked = 0

        # Accounting reported in meta_info.
        self.cached_tokens = 0
        self.num_retractions = 0
        self.finished_reason: Optional[BaseFinishReason] = None
        self.to_abort: Optional[FINISH_ABORT] = None
        self.sent_len = 0  # output ids already streamed out

        # Logprobs collected so far (lists of (logprob, token_id)).
        self.output_token_logprobs: List[tuple] = []
        self.output_top_logprobs: List[list] = []
        self.input_token_logprobs: Optional[List[tuple]] = None
        self.input_top_logprobs: Optional[List[list]] = None
        # With token_ids_logprob: per position, (logprobs, token ids) of the requested ids.
        self.output_token_ids_logprobs: List[tuple] = []
        self.input_token_ids_logprobs: Optional[List[tuple]] = None
        self.sent_logprob_len = 0
        self.sent_input_logprobs = False  # input logprobs go out once, with the first output

        # Incremental stop-string check state.
        self.tokenizer = None

    @property
    def kv_committed_len(self) -> int:
        """KV length the radix cache releases for this request (what is in the pool now)."""
        return self.kv_len

    # --- state ---------------------------------------------------------------------------
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
        if self.wants_input_logprobs():
            # position start-1 must be computed: its logits score prompt token `start`
            limit = min(limit, max(self.logprob_start_len - 1, 0))
        return max(limit, 0)

    def reset_for_retract(self) -> None:
        self.num_retractions += 1
        self.prefix_indices = torch.empty(0, dtype=torch.int64)
        self.last_node = None
        self.lock_receipt = None
        self.cache_protected_len = 0
        self.kv_len = 0
        self.swa_freed_len = 0
        self.req_pool_idx = None
        self.mamba_pool_idx = None  # freed with the KV; the re-prefill (or resume) gets a new one
        self.is_chunked = 0

    # --- finish checks -------------------------------------------------------------------
    def check_finished(self) -> None:
        if self.finished():
            return
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
        long enough for the longest of them; `matched` is the stop string, or the regex pattern)."""
        sp = self.sampling_params
        if sp.stop_strs:
            tail = self.tokenizer.decode(self.output_ids[-(sp.stop_str_max_len + 1):])
            for stop in sp.stop_strs:
                if stop and stop in tail:
                    self.finished_reason = FINISH_MATCHED_STR(matched=stop)
                    return True
        if sp.stop_regex_strs:
            n = len(self.output_ids) if sp.stop_regex_max_len >= STOP_REGEX_FULL_DECODE else sp.stop_regex_max_len + 1
            tail = self.tokenizer.decode(self.output_ids[-n:])
            for pattern in sp.stop_regex_strs:
                if re.search(pattern, tail):
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


class ScheduleBatch:
    """The requests of one forward, plus the memory operations that prepare it.

    EXTEND batches are built by the prefill adder (each req's prefix already matched and locked,
    `fill_ids`/`extend_input_len` set); DECODE batches are the running requests.
    """

    def __init__(self, reqs: List[Req], req_to_token_pool, allocator, tree_cache, device: str = "cpu"):
        self.reqs = reqs
        self.req_to_token_pool = req_to_token_pool
        self.allocator = allocator
        self.tree_cache = tree_cache
        self.device = device
        self.page_size = allocator.page_size
        # Hybrid SSM models: requests own MambaPool slots, the tree cache holds the pool.
        self.mamba_pool = getattr(tree_cache, "mamba_pool", None)

    def __len__(self) -> int:
        return len(self.reqs)

    def _last_loc(self, req: Req, prefix_len: int) -> int:
        if prefix_len == 0:
            return 0
        return int(self.req_to_token_pool.req_to_token[req.req_pool_idx, prefix_len - 1])

    def _alloc_with_eviction(self, alloc_fn, num_tokens: int):
        out = alloc_fn()
        if out is None and self.tree_cache is not None:
            self.tree_cache.evict(_evict_params(num_tokens))
            out = alloc_fn()
        return out

    # --- extend -------------------------------------------------------------------------
    def prepare_for_extend(self, return_full_logits: bool = False, decoding_reqs: Sequence[Req] = ()):
        """Allocates req rows and KV slots for the new tokens; returns the ForwardBatch (or None: no memory).

        `decoding_reqs` (--enable-mixed-chunk): running requests that decode their next token in
        the same forward, as one-token extends after the new requests. All slots come from one
        allocation, so a failure leaves nothing allocated for them."""
        from sglang.srt.model_executor.forward_batch import ForwardBatch

        for req in self.reqs:
            if req.req_pool_idx is None:
                slots = self.req_to_token_pool.alloc(1)
                if slots is None:
                    raise RuntimeError("ReqToTokenPool is full; admission should have prevented this.")
                req.req_pool_idx = slots[0]
                if len(req.prefix_indices):
                    self.req_to_token_pool.write(req.req_pool_idx, 0, req.prefix_indices)
            if self.mamba_pool is not None and req.mamba_pool_idx is None:
                slot = self.tree_cache.alloc_mamba_slot()  # evicts a tree state when none is free
                if slot is None:
                    return None  # the scheduler undoes the admission (and frees what was taken)
                req.mamba_pool_idx = slot
                self.tree_cache.init_req_mamba_state(req)  # copy-on-write of the prefix state, or zeros
        reqs = list(self.reqs) + list(decoding_reqs)
        prefix_lens = [len(r.prefix_indices) for r in self.reqs] + [r.kv_len for r in decoding_reqs]
        seq_lens = [len(r.fill_ids) for r in self.reqs] + [r.kv_len + 1 for r in decoding_reqs]
        last_locs = [self._last_loc(r, p) for r, p in zip(reqs, prefix_lens)]
        need = sum(s - p for s, p in zip(seq_lens, prefix_lens)) + self.page_size * len(reqs)
        out_cache_loc = self._alloc_with_eviction(
            lambda: self.allocator.alloc_extend(prefix_lens, seq_lens, last_locs), need
        )
        if out_cache_loc is None:
            return None
        offset = 0
        for req, p, s in zip(reqs, prefix_lens, seq_lens):
            self.req_to_token_pool.write(req.req_pool_idx, p, out_cache_loc[offset : offset + s - p])
            offset += s - p
            req.kv_len = s
        for req in decoding_reqs:
            req.fill_ids = req.all_ids()
        new_tokens = [r.fill_ids[p:] for r, p in zip(self.reqs, prefix_lens)]
        new_tokens += [[r.output_ids[-1] if r.output_ids else r.origin_input_ids[-1]] for r in decoding_reqs]
        return self._with_mamba(ForwardBatch.for_extend(
            new_tokens,
            prefix_lens,
            [r.req_pool_idx for r in reqs],
            out_cache_loc,
            device=self.device,
            return_full_logits=return_full_logits,
        ), reqs)

    def _with_mamba(self, forward_batch, reqs: Optional[Sequence[Req]] = None):
        if self.mamba_pool is not None:
            forward_batch.mamba_pool = self.mamba_pool
            forward_batch.mamba_pool_indices = torch.tensor(
                [r.mamba_pool_idx for r in (self.reqs if reqs is None else reqs)], dtype=torch.int64,
                device=self.device,
            )
        return forward_batch

    # --- decode -------------------------------------------------------------------------
    def new_pages_for_decode(self, reqs: Optional[List[Req]] = None) -> int:
        reqs = self.reqs if reqs is None else reqs
        return sum(1 for r in reqs if r.kv_len % self.page_size == 0) * self.page_size

    def check_decode_mem(self, reqs: Optional[List[Req]] = None) -> bool:
        need = self.new_pages_for_decode(reqs)
        if self.allocator.available_size() >= need:
            return True
        if self.tree_cache is not None:
            self.tree_cache.evict(_evict_params(need))
        return self.allocator.available_size() >= need

    def prepare_for_decode(self):
        from sglang.srt.model_executor.forward_batch import ForwardBatch

        seq_lens = [r.kv_len + 1 for r in self.reqs]
        last_locs = [self._last_loc(r, r.kv_len) for r in self.reqs]
        out_cache_loc = self._alloc_with_eviction(
            lambda: self.allocator.alloc_decode(seq_lens, last_locs), self.new_pages_for_decode()
        )
        if out_cache_loc is None:
            return None
        for i, req in enumerate(self.reqs):
            self.req_to_token_pool.req_to_token[req.req_pool_idx, req.kv_len] = out_cache_loc[i]
            req.kv_len += 1
            req.fill_ids = req.all_ids()
        return self._with_mamba(ForwardBatch.for_decode(
            [r.output_ids[-1] if r.output_ids else r.origin_input_ids[-1] for r in self.reqs],
            seq_lens,
            [r.req_pool_idx for r in self.reqs],
            out_cache_loc,
            device=self.device,
        ))

    # --- retraction -----------------------------------------------------------------------
    def retraction_order(self, policy: str = "length", low_priority_values_first: bool = False) -> List[int]:
        """Indices sorted so that popping from the end yields the next victim (upstream's order)."""
        idx = list(range(len(self.reqs)))
        if policy == "priority":
            import sys

            sign = 1 if low_priority_values_first else -1
            default = sys.maxsize if low_priority_values_first else -sys.maxsize

            def key(i):
                r = self.reqs[i]
                p = r.priority if r.priority is not None else default
                return (p * -sign, len(r.output_ids), -len(r.origin_input_ids))

        else:

            def key(i):
                r = self.reqs[i]
                return (len(r.output_ids), -len(r.origin_input_ids))

        idx.sort(key=key, reverse=True)
        return idx

    def retract_decode(self, release_req, policy: str = "length", low_priority_values_first: bool = False):
        """Frees KV of victims until the next decode step fits; always keeps one request.

        `release_req(req, backup) -> bool` frees the request's memory (backing its KV up first when
        `backup` and the server has a backup backend); False means it could not be kept: the request
        gets `to_abort` set by release_req and is returned in `aborted`. Returns (retracted, aborted) lists and
        leaves the survivors in `self.reqs`.
        """
        order = self.retraction_order(policy, low_priority_values_first)
        retracted, aborted = [], []
        first = True
        while first or not self.check_decode_mem([self.reqs[i] for i in order]):
            first = False
            if len(order) == 1:
                break
            victim = self.reqs[order.pop()]
            if release_req(victim, True):
                retracted.append(victim)
            else:
                aborted.append(victim)
        keep = sorted(order)
        if len(keep) == 1 and not self.check_decode_mem([self.reqs[keep[0]]]):
            last = self.reqs[keep[0]]
            last.to_abort = FINISH_ABORT(
                "Out of memory even after retracting all other requests in the decode batch. Aborting the last request.",
                500,
            )
            release_req(last, False)
            aborted.append(last)
            keep = []
        self.reqs = [self.reqs[i] for i in keep]
        return retracted, aborted


def _evict_params(num_tokens: int):
    from sglang.srt.mem_cache.unified_radix_cache import EvictParams

    # Hybrid-SWA pools: each new token also needs an SWA slot, so free as many of those.
    return EvictParams(num_tokens=num_tokens, swa_num_tokens=num_tokens)
