"""Drives a `ModelRunner` by hand (no scheduler): allocate request rows and KV slots, prefill
(optionally in chunks, several requests in one batch), decode. Used by model tests to compare
our logits with HF transformers, and handy for debugging outside the scheduler."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import torch

from sglang.srt.model_executor.forward_batch import ForwardBatch


@dataclass
class ManualRequest:
    token_ids: List[int]
    req_pool_idx: int = -1
    kv_len: int = 0  # tokens whose KV is in the pool
    slots: List[torch.Tensor] = field(default_factory=list)

    def last_loc(self, runner) -> int:
        if self.kv_len == 0:
            return 0
        return int(runner.memory.req_to_token_pool.req_to_token[self.req_pool_idx, self.kv_len - 1])


class ManualDriver:
    def __init__(self, runner):
        self.runner = runner

    def new_request(self, token_ids: Sequence[int]) -> ManualRequest:
        rows = self.runner.memory.req_to_token_pool.alloc(1)
        assert rows is not None, "no free request slot"
        return ManualRequest(list(token_ids), rows[0])

    def extend(self, reqs: List[ManualRequest], new_tokens: List[List[int]], return_full_logits: bool = True):
        """One EXTEND forward: request i gets `new_tokens[i]` appended after its cached KV."""
        r = self.runner
        prefix = [q.kv_len for q in reqs]
        seq = [p + len(t) for p, t in zip(prefix, new_tokens)]
        last = [q.last_loc(r) for q in reqs]
        loc = r.memory.allocator.alloc_extend(prefix, seq, last)
        assert loc is not None, "KV pool exhausted"
        off = 0
        for q, p, s in zip(reqs, prefix, seq):
            n = s - p
            r.memory.req_to_token_pool.write(q.req_pool_idx, p, loc[off : off + n])
            q.slots.append(loc[off : off + n])
            off += n
            q.kv_len = s
        fb = ForwardBatch.for_extend(new_tokens, prefix, [q.req_pool_idx for q in reqs], loc,
                                     device=r.device, return_full_logits=return_full_logits)
        return r.forward(fb)

    def decode(self, reqs: List[ManualRequest], tokens: List[int]):
        """One DECODE forward: request i gets token `tokens[i]`."""
        r = self.runner
        seq = [q.kv_len + 1 for q in reqs]
        last = [q.last_loc(r) for q in reqs]
        loc = r.memory.allocator.alloc_decode(seq, last)
        assert loc is not None, "KV pool exhausted"
        for i, q in enumerate(reqs):
            r.memory.req_to_token_pool.write(q.req_pool_idx, q.kv_len, loc[i : i + 1])
            q.slots.append(loc[i : i + 1])
            q.kv_len += 1
        fb = ForwardBatch.for_decode(tokens, seq, [q.req_pool_idx for q in reqs], loc, device=r.device)
        return r.forward(fb)

    def prefill_chunked(self, req: ManualRequest, chunk_size: Optional[int] = None) -> torch.Tensor:
        """Prefills `req.token_ids` in chunks; returns the full logits [len, V] of all prompt tokens."""
        ids = req.token_ids
        chunk_size = chunk_size or len(ids)
        outs = []
        for start in range(0, len(ids), chunk_size):
            out = self.extend([req], [ids[start : start + chunk_size]], return_full_logits=True)
            outs.append(out.full_logits)
        return torch.cat(outs, 0)

    def free(self, req: ManualRequest) -> None:
        r = self.runner
        if req.kv_len:
            slots = r.memory.req_to_token_pool.req_to_token[req.req_pool_idx, : req.kv_len].clone()
            r.memory.allocator.free(slots)
        r.memory.req_to_token_pool.free(req.req_pool_idx)
        req.kv_len = 0
        req.slots = []


def greedy_generate(runner, prompt_ids: Sequence[int], max_new_tokens: int, eos_token_ids=()) -> List[int]:
    """Greedy decoding of one prompt straight through the runner (argmax of next_token_logits)."""
    drv = ManualDriver(runner)
    req = drv.new_request(prompt_ids)
    out = drv.extend([req], [list(prompt_ids)], return_full_logits=False)
    generated: List[int] = []
    try:
        for _ in range(max_new_tokens):
            tok = int(out.next_token_logits[0].argmax())
            generated.append(tok)
            if tok in eos_token_ids:
                break
            out = drv.decode([req], [tok])
    finally:
        drv.free(req)
    return generated
