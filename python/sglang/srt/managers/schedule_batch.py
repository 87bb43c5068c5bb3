"""(Scheduler process.) The requests of one forward and the memory operations that prepare it.

`Req` and the finish reasons live in `srt/core/`.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from sglang.srt.core.finish_reason import FINISH_ABORT
from sglang.srt.core.req import Req


class ScheduleBatch:
    """The requests of one forward, plus the memory operations that prepare it.

    EXTEND batches are built by the prefill adder (each req's prefix already matched and locked,
    `fill_ids`/`extend_input_len` set); DECODE batches are the running requests. Memory comes
    from the scheduler's `MemoryManager` (`reserve`, `decode_fits`, `reserve_decode`).
    """

    def __init__(self, reqs: List[Req], memory, device: str = "cpu"):
        self.reqs = reqs
        self.memory = memory
        self.device = device

    def __len__(self) -> int:
        return len(self.reqs)

    # --- extend -------------------------------------------------------------------------
    def prepare_for_extend(self, return_full_logits: bool = False, decoding_reqs: Sequence[Req] = ()):
        """Reserves rows, Mamba slots and KV slots for the new tokens; returns the ForwardBatch
        (or None: memory does not suffice, and nothing was taken).

        `decoding_reqs` (--enable-mixed-chunk): running requests that decode their next token in
        the same forward, as one-token extends after the new requests. All slots come from one
        reservation, so a failure leaves nothing allocated for them."""
        from sglang.srt.model_executor.forward_batch import ForwardBatch

        reqs = list(self.reqs) + list(decoding_reqs)
        prefix_lens = [len(r.kv.prefix_indices) for r in self.reqs] + [r.kv.kv_len for r in decoding_reqs]
        seq_lens = [len(r.fill_ids) for r in self.reqs] + [r.kv.kv_len + 1 for r in decoding_reqs]
        out_cache_loc = self.memory.reserve(reqs, prefix_lens, seq_lens)
        if out_cache_loc is None:
            return None
        for req in decoding_reqs:
            req.fill_ids = req.all_ids()
        new_tokens = [r.fill_ids[p:] for r, p in zip(self.reqs, prefix_lens)]
        new_tokens += [[r.output_ids[-1] if r.output_ids else r.origin_input_ids[-1]] for r in decoding_reqs]
        return self._with_mamba(ForwardBatch.for_extend(
            new_tokens,
            prefix_lens,
            [r.kv.req_pool_idx for r in reqs],
            out_cache_loc,
            device=self.device,
            return_full_logits=return_full_logits,
        ), reqs)

    def _with_mamba(self, forward_batch, reqs: Optional[Sequence[Req]] = None):
        """Hybrid SSM models: each request's Mamba state slot (the worker attaches the pool)."""
        if self.memory.has_state_slots:
            forward_batch.mamba_pool_indices = torch.tensor(
                [r.kv.mamba_pool_idx for r in (self.reqs if reqs is None else reqs)], dtype=torch.int64,
                device=self.device,
            )
        return forward_batch

    # --- decode -------------------------------------------------------------------------
    def check_decode_mem(self, reqs: Optional[List[Req]] = None) -> bool:
        return self.memory.decode_fits(self.reqs if reqs is None else reqs)

    def prepare_for_decode(self):
        from sglang.srt.model_executor.forward_batch import ForwardBatch

        seq_lens = [r.kv.kv_len + 1 for r in self.reqs]
        out_cache_loc = self.memory.reserve_decode(self.reqs)
        if out_cache_loc is None:
            return None
        for req in self.reqs:
            req.fill_ids = req.all_ids()
        return self._with_mamba(ForwardBatch.for_decode(
            [r.output_ids[-1] if r.output_ids else r.origin_input_ids[-1] for r in self.reqs],
            seq_lens,
            [r.kv.req_pool_idx for r in self.reqs],
            out_cache_loc,
            device=self.device,
        ))

    def prepare_for_verify(self, drafts: Sequence[Sequence[int]]):
        """Speculative verification: KV for each request's last token and its drafted ones
        (`MemoryManager.verify_fits` was checked), and the EXTEND ForwardBatch that scores every
        one of those positions (a chain per request: the extend's causal mask is its mask)."""
        from sglang.srt.model_executor.forward_batch import ForwardBatch

        prefix_lens = [r.kv.kv_len for r in self.reqs]
        out_cache_loc = self.memory.reserve_verify(self.reqs, [len(d) + 1 for d in drafts])
        if out_cache_loc is None:
            return None
        for req in self.reqs:
            req.fill_ids = req.all_ids()
        new_tokens = [[r.output_ids[-1] if r.output_ids else r.origin_input_ids[-1]] + list(d)
                      for r, d in zip(self.reqs, drafts)]
        return self._with_mamba(ForwardBatch.for_extend(
            new_tokens, prefix_lens, [r.kv.req_pool_idx for r in self.reqs], out_cache_loc,
            device=self.device, return_full_logits=True,
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
            last.abort(FINISH_ABORT(
                "Out of memory even after retracting all other requests in the decode batch. Aborting the last request.",
                500,
            ))
            release_req(last, False)
            aborted.append(last)
            keep = []
        self.reqs = [self.reqs[i] for i in keep]
        return retracted, aborted

