"""(Scheduler process.) Which waiting requests join the next prefill batch.

`order_waiting_queue` applies --schedule-policy (fcfs: arrival order; lpm: longest cached prefix
first; priority via --enable-priority-scheduling). `PrefillAdder` admits requests under three
budgets: the KV pool (including what running requests will still decode, scaled by
new_token_ratio), --max-prefill-tokens, and the chunked-prefill chunk (--chunked-prefill-size);
the first request that does not fit into the chunk is split, and the rest wait. Memory is
asked through the `MemoryManager` only (its admission budget, rows, state slots, prefix
match and lock), never its pools or tree.
"""

from __future__ import annotations

from typing import List, Optional

from sglang.srt.core.req import Req

CLIP_MAX_NEW_TOKENS = 4096  # upstream's SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION default


def match_prefix(req: Req, memory) -> None:
    """Sets req.fill_ids (the whole sequence so far) and its cached prefix (no lock taken here)."""
    req.fill_ids = req.all_ids()
    memory.match_prefix(req)


def order_waiting_queue(queue: List[Req], policy: str, memory, priority_scheduling: bool = False,
                        low_priority_values_first: bool = False) -> None:
    if policy == "lpm" and len(queue) > 1:
        for r in queue:
            match_prefix(r, memory)
        queue.sort(key=lambda r: -len(r.kv.prefix_indices))
    if priority_scheduling:
        sign = 1 if low_priority_values_first else -1
        queue.sort(key=lambda r: (sign * (r.priority or 0), r.arrival_time))


class PrefillAdder:
    def __init__(self, *, memory, running_reqs: List[Req], new_token_ratio: float, max_prefill_tokens: int,
                 chunked_prefill_size: Optional[int], max_running_requests: int, mixed_with_decode_tokens: int = 0):
        page_size = memory.page_size
        self.page_size = page_size
        self.memory = memory
        self.max_running_requests = max_running_requests
        self.num_running = len(running_reqs)
        reserved = sum(
            min(r.sampling_params.max_new_tokens - len(r.output_ids), CLIP_MAX_NEW_TOKENS) * new_token_ratio
            for r in running_reqs
        )
        self.new_token_ratio = new_token_ratio
        self.rem_total_tokens = memory.admissible_tokens(reserved)
        # --enable-mixed-chunk: the running requests' decode tokens share the batch's token budgets
        # (never below one page, or a page-aligned chunk could not make progress at all).
        self.rem_input_tokens = max(max_prefill_tokens - mixed_with_decode_tokens, page_size)
        self.rem_chunk_tokens = chunked_prefill_size if chunked_prefill_size and chunked_prefill_size > 0 else None
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens = max(self.rem_chunk_tokens - mixed_with_decode_tokens, page_size)
        self.can_run: List[Req] = []
        self.new_chunked_req: Optional[Req] = None

    def _state_slot_available(self, match=None) -> bool:
        """Hybrid SSM models: a Mamba slot for one more request; `match`: the prefix it will lock,
        whose state the admission pins until it is copied (so it cannot be evicted for the slot)."""
        need = sum(1 for r in self.can_run if r.kv.mamba_pool_idx is None) + 1
        return self.memory.state_slots_admissible(need, match)

    def add_chunked_req(self, req: Req) -> Optional[Req]:
        """Continues a request whose prompt is being prefilled in chunks. Returns it if still chunked."""
        full = req.all_ids()
        prefix_len = len(req.kv.prefix_indices)
        remaining = len(full) - prefix_len
        take = min(remaining, self._room())
        if take < remaining:  # not the last chunk: end it on a page boundary
            take = max((prefix_len + take) // self.page_size * self.page_size - prefix_len, 0)
        req.fill_ids = full[: prefix_len + take]
        req.extend_input_len = take
        self._account(req, take)
        self.can_run.append(req)
        return req if take < remaining else None

    def _room(self) -> int:
        if self.rem_chunk_tokens is None:
            return self.rem_input_tokens
        return min(self.rem_input_tokens, self.rem_chunk_tokens)

    def _account(self, req: Req, extend_len: int) -> None:
        self.rem_input_tokens -= extend_len
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= extend_len
        left = req.sampling_params.max_new_tokens - len(req.output_ids)
        self.rem_total_tokens -= extend_len + min(left, CLIP_MAX_NEW_TOKENS) * self.new_token_ratio

    def budget_exhausted(self) -> bool:
        if self.rem_input_tokens <= 0 or (self.rem_chunk_tokens is not None and self.rem_chunk_tokens <= 0):
            return True
        return self.num_running + len(self.can_run) >= self.max_running_requests

    def add_one_req(self, req: Req) -> str:
        """Returns "added", "chunked" (added, and it is the new chunked req), or "no_room"."""
        if self.budget_exhausted() or self.memory.free_request_rows() <= len(self.can_run):
            return "no_room"
        if not self._state_slot_available():
            return "no_room"
        match_prefix(req, self.memory)
        if self.memory.has_state_slots and not self._state_slot_available(req.kv.prefix_match):
            # The only state that could be evicted for this request's slot is the one its match
            # needs: start from no prefix rather than wait for a slot that never comes.
            self.memory.match_prefix(req, empty=True)
        prefix_len = len(req.kv.prefix_indices)
        extend_len = len(req.fill_ids) - prefix_len
        left = req.sampling_params.max_new_tokens - len(req.output_ids)
        total_need = extend_len + min(left, CLIP_MAX_NEW_TOKENS) * self.new_token_ratio
        if total_need > self.rem_total_tokens and self.can_run:
            return "no_room"
        if extend_len > self.rem_total_tokens and not self.can_run and self.num_running > 0:
            return "no_room"
        room = self._room()
        chunked = False
        if extend_len > room:
            if self.rem_chunk_tokens is None and not self.can_run:
                room = extend_len  # no chunking: one long prompt still runs alone
            else:
                # Chunks end on a page boundary so the next chunk continues a whole page.
                room = (prefix_len + room) // self.page_size * self.page_size - prefix_len
                if room <= 0:
                    return "no_room"
                chunked = True
                extend_len = room
                req.fill_ids = req.fill_ids[: prefix_len + extend_len]
        req.extend_input_len = extend_len
        req.cached_tokens = max(req.cached_tokens, prefix_len) if req.num_retractions == 0 else req.cached_tokens
        # Lock the matched prefix now so that allocating this batch cannot evict it.
        self.memory.lock_prefix(req)
        self._account(req, extend_len)
        self.can_run.append(req)
        if chunked:
            self.new_chunked_req = req
            return "chunked"
        return "added"
