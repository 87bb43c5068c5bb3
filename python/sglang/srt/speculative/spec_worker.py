"""(Scheduler process.) The speculative worker: the target's worker plus chain verification,
behind the same `ModelWorker` seam as the plain worker.

A plain batch (`WorkerBatch.drafts` is None: prefill, or a decode step where nothing was
drafted) runs exactly as on the plain worker. A verify batch is one EXTEND forward of every
request's last token followed by its drafted tokens (a chain: the causal mask of an extend
is all it needs), with the logits of every position; `verify.py` decides which drafts the
target accepts and draws the token after them. Logprobs are the target's, computed as the
plain sampler does (after penalties and temperature, before top-k/top-p filtering).

NGRAM drafts come from the request's tokens on the scheduler's side (`managers/spec_decode.py`),
so this worker needs no draft model; a STANDALONE or EAGLE worker would draft here.
"""

from __future__ import annotations

import torch

from sglang.srt.layers.sampler import _LOGPROB_MIN, SamplerOutput, get_token_ids_logprobs, get_top_logprobs
from sglang.srt.managers.tp_worker import GenerationBatchResult, ModelWorker, WorkerBatch
from sglang.srt.speculative.verify import verify_chains


class NgramWorker(ModelWorker):
    """NGRAM speculative decoding over a target worker (`TpModelWorker`)."""

    def __init__(self, target):
        self.target = target
        self.model_runner = target.model_runner
        self.model_config = target.model_config
        self.device = target.device
        self.pooling = target.pooling

    @property
    def forward_ct(self) -> int:
        return self.target.forward_ct

    def memory_spec(self):
        return self.target.memory_spec()

    def attach_memory(self, memory) -> None:
        self.target.attach_memory(memory)

    def forward_batch_embedding(self, forward_batch):
        return self.target.forward_batch_embedding(forward_batch)

    def forward_batch_generation(self, batch: WorkerBatch) -> GenerationBatchResult:
        if batch.drafts is None:
            return self.target.forward_batch_generation(batch)
        return self.verify(batch)

    def verify(self, batch: WorkerBatch) -> GenerationBatchResult:
        fb, info = batch.forward_batch, batch.sampling_info
        assert fb.return_full_logits, "a verify forward scores every drafted position"
        logits_output = self.target._forward(fb)
        logits = logits_output.full_logits.to(torch.float32, copy=info.modifies_logits)
        info.apply_logits_bias(logits)
        verdict = verify_chains(logits, info, batch.drafts)
        out = None
        if batch.return_logprob:
            rows = [r for used in verdict.rows for r in used]
            ids = torch.tensor([t for toks in verdict.tokens for t in toks], dtype=torch.int64)
            idx = torch.tensor(rows, dtype=torch.int64)
            lp = torch.log_softmax(logits.index_select(0, idx) / info.temperatures.index_select(0, idx), dim=-1)
            lp = lp.clamp(min=_LOGPROB_MIN)
            out = SamplerOutput(next_token_ids=ids, next_token_logprobs=lp.gather(1, ids.view(-1, 1)).view(-1))
            nums = list(batch.top_logprobs_nums)
            out.top_logprobs = get_top_logprobs(lp, [nums[r] for r in rows])
            asked = batch.token_ids_logprobs
            if asked is not None and any(t is not None for t in asked):
                out.token_ids_logprobs = get_token_ids_logprobs(lp, [asked[r] for r in rows])
        return GenerationBatchResult(logits_output, [toks[-1] for toks in verdict.tokens], out,
                                     spec_tokens=verdict.tokens, spec_accepted=verdict.accepted)
