"""Drive a Mamba2-hybrid ModelRunner by hand, as the scheduler will: each request owns one
MambaPool slot for its lifetime (zeroed when it starts), and every forward batch carries
`mamba_pool_indices` (request i -> its slot).

`HybridDriver` is `ManualDriver` (request rows, KV slots, chunked prefill, batched decode) plus
that slot bookkeeping; it hands ManualDriver a runner view whose `forward` fills
`mamba_pool_indices` from the batch's request rows. `slot_stride` > 1 spreads the slots of
successive requests apart (non-contiguous slots in one batch).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import torch

from sglang.test.hf_parity import LogitsTrace
from sglang.test.runner_utils import ManualDriver, ManualRequest


class _SlotRunner:
    def __init__(self, runner, slot_of_row: Dict[int, int]):
        self._runner = runner
        self._slot_of_row = slot_of_row

    def __getattr__(self, name):
        return getattr(self._runner, name)

    def forward(self, forward_batch):
        rows = forward_batch.req_pool_indices.tolist()
        forward_batch.mamba_pool_indices = torch.tensor([self._slot_of_row[r] for r in rows], dtype=torch.int64,
                                                        device=forward_batch.input_ids.device)
        return self._runner.forward(forward_batch)


class HybridDriver(ManualDriver):
    def __init__(self, runner, slot_stride: int = 1):
        self.slot_of_row: Dict[int, int] = {}
        super().__init__(_SlotRunner(runner, self.slot_of_row))
        self.real_runner = runner
        self.slot_stride = slot_stride
        self._spacers: List[int] = []

    def new_request(self, token_ids: Sequence[int]) -> ManualRequest:
        req = super().new_request(token_ids)
        pool = self.real_runner.memory.mamba_pool
        slot = pool.alloc(1)[0]
        for _ in range(self.slot_stride - 1):  # keep a gap before the next request's slot
            gap = pool.alloc(1)
            if gap:
                self._spacers.extend(gap)
        pool.clear_slot(slot)
        self.slot_of_row[req.req_pool_idx] = slot
        return req

    def free(self, req: ManualRequest) -> None:
        slot = self.slot_of_row.pop(req.req_pool_idx)
        super().free(req)
        self.real_runner.memory.mamba_pool.free(slot)

    def release_spacers(self) -> None:
        if self._spacers:
            self.real_runner.memory.mamba_pool.free(self._spacers)
            self._spacers = []


def hybrid_logits(runner, prompt: Sequence[int], feed_tokens: Sequence[int], chunk_size: Optional[int] = None) -> LogitsTrace:
    """`hf_parity.our_logits` for hybrid models: prefill (optionally chunked), then decode."""
    drv = HybridDriver(runner)
    req = drv.new_request(prompt)
    try:
        prefill = drv.prefill_chunked(req, chunk_size)
        decode = [drv.decode([req], [t]).next_token_logits[0] for t in feed_tokens]
    finally:
        drv.free(req)
    return LogitsTrace(prefill, decode, list(feed_tokens))


def hybrid_batch_logits(runner, prompts: Sequence[Sequence[int]], feed_tokens: Sequence[Sequence[int]],
                        slot_stride: int = 3) -> List[LogitsTrace]:
    """All prompts in ONE ragged extend, then batched decode steps; slots are non-contiguous."""
    drv = HybridDriver(runner, slot_stride=slot_stride)
    reqs = [drv.new_request(p) for p in prompts]
    try:
        out = drv.extend(reqs, [list(p) for p in prompts], return_full_logits=True)
        traces, off = [], 0
        for p in prompts:
            traces.append(LogitsTrace(out.full_logits[off : off + len(p)], [], []))
            off += len(p)
        for step in range(len(feed_tokens[0])):
            toks = [int(f[step]) for f in feed_tokens]
            dec = drv.decode(reqs, toks).next_token_logits
            for i, tr in enumerate(traces):
                tr.decode.append(dec[i])
                tr.tokens.append(toks[i])
    finally:
        for r in reqs:
            drv.free(r)
        drv.release_spacers()
    return traces


def hybrid_greedy(runner, prompt: Sequence[int], max_new_tokens: int) -> List[int]:
    drv = HybridDriver(runner)
    req = drv.new_request(prompt)
    try:
        out = drv.extend([req], [list(prompt)], return_full_logits=False)
        tokens = []
        for _ in range(max_new_tokens):
            tokens.append(int(out.next_token_logits[0].argmax()))
            out = drv.decode([req], [tokens[-1]])
    finally:
        drv.free(req)
    return tokens
