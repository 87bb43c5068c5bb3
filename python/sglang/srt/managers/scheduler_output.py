"""(Scheduler process.) Output processing: what a worker's result does to the requests of a batch,
and what the scheduler sends out (new tokens, finish reasons, logprobs).

`OutputProcessor` (upstream: the scheduler's `process_batch_result_*`) appends each sampled token
with its logprobs, checks whether the request finished, hands memory back through the
`MemoryManager` (finished: into the radix tree; running: its prompt shared) and queues a
`BatchTokenIDOutput` in its outbox (`emit`, `take`). Embedding servers pool instead.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

from sglang.srt.core.finish_reason import FINISH_LENGTH
from sglang.srt.core.req import Req
from sglang.srt.managers.io_struct import BatchTokenIDOutput


def _should_emit(req, stream_interval: int) -> bool:
    if req.finished():
        return True
    if not req.stream:
        return False
    new = len(req.output_ids) - req.sent_len
    return new > 0 and (new >= stream_interval or req.sent_len == 0)


def collect_outputs(reqs: List, stream_interval: int = 1) -> BatchTokenIDOutput:
    """Builds the output message for the requests in `reqs` that have something to report."""
    out = BatchTokenIDOutput(
        rids=[], finished_reasons=[], output_ids=[], read_offsets=[], skip_special_tokens=[],
        spaces_between_special_tokens=[], no_stop_trim=[], stop_strs=[], prompt_tokens=[],
        completion_tokens=[], cached_tokens=[], retraction_counts=[],
    )
    for req in reqs:
        if not _should_emit(req, stream_interval):
            continue
        sp = req.sampling_params
        out.rids.append(req.rid)
        out.finished_reasons.append(req.finished_reason.to_json() if req.finished_reason else None)
        out.output_ids.append(list(req.output_ids))
        out.read_offsets.append(req.sent_len)
        out.skip_special_tokens.append(sp.skip_special_tokens)
        out.spaces_between_special_tokens.append(sp.spaces_between_special_tokens)
        out.no_stop_trim.append(sp.no_stop_trim)
        out.stop_strs.append(list(sp.stop_strs or []))
        out.prompt_tokens.append(len(req.origin_input_ids))
        out.completion_tokens.append(len(req.output_ids))
        out.cached_tokens.append(req.cached_tokens)
        out.retraction_counts.append(req.num_retractions)
        out.embeddings.append(req.embedding)
        out.spec_verify_ct.append(req.spec.verify_ct)
        out.spec_num_proposed_drafts.append(req.spec.num_proposed_drafts)
        out.spec_num_correct_drafts.append(req.spec.num_correct_drafts)
        if req.return_logprob:
            out.output_token_logprobs.append(req.logprobs.output_token_logprobs[req.logprobs.sent_len :])
            out.output_top_logprobs.append(req.logprobs.output_top_logprobs[req.logprobs.sent_len :])
            out.output_token_ids_logprobs.append(req.logprobs.output_token_ids_logprobs[req.logprobs.sent_len :]
                                                 if req.token_ids_logprob is not None else None)
            first = req.sent_len == 0 and not req.logprobs.sent_input
            out.input_token_logprobs.append(req.logprobs.input_token_logprobs if first else None)
            out.input_top_logprobs.append(req.logprobs.input_top_logprobs if first else None)
            out.input_token_ids_logprobs.append(req.logprobs.input_token_ids_logprobs if first else None)
            req.logprobs.sent_input = req.logprobs.sent_input or first
            req.logprobs.sent_len = len(req.logprobs.output_token_logprobs)
        else:
            for lst in (out.output_token_logprobs, out.output_top_logprobs, out.input_token_logprobs,
                        out.input_top_logprobs, out.output_token_ids_logprobs, out.input_token_ids_logprobs):
                lst.append(None)
        req.sent_len = len(req.output_ids)
    return out


def record_logprobs(reqs: List, forward_batch, logits_output) -> None:
    """Input-token logprobs of requests that asked for them, from this extend's full logits.

    The logits at position p score token p+1 of the prompt. Token `logprob_start_len` is the
    first reported; the very first prompt token has no logprob (None), as upstream.
    """
    full = logits_output.full_logits
    if full is None:
        return
    from sglang.srt.layers.sampler import compute_prompt_logprobs

    offset = 0
    for req, prefix_len, ext_len in zip(reqs, forward_batch.extend_prefix_lens_cpu, forward_batch.extend_seq_lens_cpu):
        seg_start = offset
        offset += ext_len
        if not req.wants_input_logprobs() or req.num_retractions:
            continue
        if req.logprobs.input_token_logprobs is None:
            req.logprobs.input_token_logprobs, req.logprobs.input_top_logprobs = [], []
            req.logprobs.input_token_ids_logprobs = [] if req.token_ids_logprob is not None else None
            if req.logprob_start_len == 0:
                req.logprobs.input_token_logprobs.append((None, req.origin_input_ids[0]))
                req.logprobs.input_top_logprobs.append(None)
                if req.logprobs.input_token_ids_logprobs is not None:
                    req.logprobs.input_token_ids_logprobs.append(None)
        n_in = len(req.origin_input_ids)
        # positions p in [prefix_len, prefix_len+ext_len) whose next token p+1 is a prompt token >= start
        lo = max(prefix_len, req.logprob_start_len - 1, 0)
        hi = min(prefix_len + ext_len, n_in - 1)
        if hi <= lo:
            continue
        rows = full[seg_start + (lo - prefix_len) : seg_start + (hi - prefix_len)]
        next_ids = req.origin_input_ids[lo + 1 : hi + 1]
        res = compute_prompt_logprobs(rows, next_ids, req.top_logprobs_num, req.token_ids_logprob)
        req.logprobs.input_token_logprobs.extend(zip(res.token_logprobs.tolist(), next_ids))
        if res.top_logprobs is not None:
            req.logprobs.input_top_logprobs.extend(list(zip(v, i)) for v, i in res.top_logprobs)
        else:
            req.logprobs.input_top_logprobs.extend([None] * len(next_ids))
        if res.token_ids_logprobs is not None:
            req.logprobs.input_token_ids_logprobs.extend(list(zip(v, i)) for v, i in res.token_ids_logprobs)


class OutputProcessor:
    """Applies a worker's result to its batch's requests and queues what goes out."""

    def __init__(self, *, queues, memory, role, stats, stream_interval: int, sliding_window_size: Optional[int],
                 pooling=None, speculative: bool = False):
        self.queues = queues
        self.memory = memory
        self.role = role
        self.stats = stats
        self.stream_interval = stream_interval
        self.sliding_window_size = sliding_window_size
        self.pooling = pooling  # embedding servers: how the hidden states are pooled
        self.speculative = speculative  # every decode step counts as a verify step (spec_verify_ct)
        self.pending: List[BatchTokenIDOutput] = []

    # --- the outbox -------------------------------------------------------------------------------
    def emit(self, reqs: Sequence[Req]) -> None:
        """Queues the outputs of these requests (new tokens, finish) for the detokenizer."""
        self.pending.append(collect_outputs(reqs, self.stream_interval))

    def take(self) -> List[BatchTokenIDOutput]:
        """Hands out (and forgets) the outputs queued so far."""
        outs, self.pending = self.pending, []
        return outs

    # --- results ----------------------------------------------------------------------------------
    def process_prefill(self, reqs: List[Req], forward_batch, result, decoding: Sequence[Req] = ()) -> None:
        """A prefill (extend) batch ran. Requests whose prompt is fully prefilled got their first
        token (sampled rows first), mixed-in running requests (`decoding`) their next one."""
        record_logprobs(reqs, forward_batch, result.logits_output)
        done = [r for r in reqs if r is not self.queues.chunked]
        to_emit = []
        for j, req in enumerate(done):
            req.is_chunked = 0
            self._accept_token(req, result, j)
            if self.role.after_prefill(req):
                continue  # a PD prefill server: the KV goes to the decode server first
            req.check_finished()
            to_emit.append(req)
            if req.finished():
                self.memory.release(req, insert=True)
                self.role.release(req)
            else:
                self.memory.cache_unfinished(req)
                self.queues.running.append(req)
        if decoding:
            self.stats.num_mixed_batches += 1
            base = len(done)
            for j, req in enumerate(decoding):
                self._accept_token(req, result, base + j)
                req.check_finished()
                if req.finished():
                    self.memory.release(req, insert=True)
            self.queues.running = [r for r in self.queues.running if not r.finished()]
            self._after_decode(list(decoding))
            to_emit += list(decoding)
        self._keep_chunk()
        self.emit(to_emit)

    def process_decode(self, reqs: List[Req], result) -> None:
        for j, req in enumerate(reqs):
            if self.speculative:  # a decode step where nothing was drafted: one token per request
                req.spec.verify_ct += 1
                self.stats.record_verify(1, 0, 0)
            self._accept_token(req, result, j)
            req.check_finished()
            if req.finished():
                self.memory.release(req, insert=True)
        self.queues.running = [r for r in reqs if not r.finished()]
        self._after_decode(reqs)
        self.emit(reqs)

    def process_verify(self, reqs: List[Req], result, drafts: Sequence[Sequence[int]], kv_lens: Sequence[int],
                       after_verify=None) -> None:
        """A speculative verify step ran: each request emitted its accepted drafts and one more
        token. They are appended one at a time with the plain finish checks, so a stop token or
        string inside the run ends the request there and what follows is dropped; then the KV
        of every position not kept (rejected or dropped drafts) goes back (`trim_kv`): a
        request keeps the KV of its tokens but the last, as after a plain decode step.
        `kv_lens`: each request's KV length before the step."""
        row = 0
        for j, req in enumerate(reqs):
            tokens = result.spec_tokens[j]
            kept = 0
            for t in tokens:
                req.output_ids.append(int(t))
                self._attach_logprobs(req, result.logprobs, row + kept)
                kept += 1
                req.check_finished()
                if req.finished():
                    break
            row += len(tokens)
            self.stats.num_generated_tokens += kept
            accepted = min(result.spec_accepted[j], kept)
            spec = req.spec
            spec.verify_ct += 1
            spec.num_proposed_drafts += len(drafts[j])
            spec.num_correct_drafts += accepted
            self.stats.record_verify(kept, len(drafts[j]), accepted)
            if after_verify is not None:
                after_verify(req, len(drafts[j]), result.spec_accepted[j])
            self.memory.trim_kv(req, kv_lens[j] + kept)
            if req.finished():
                self.memory.release(req, insert=True)
        self.queues.running = [r for r in reqs if not r.finished()]
        self._after_decode(reqs)
        self.emit(reqs)

    def process_pooling(self, reqs: List[Req], forward_batch, logits_output) -> None:
        """Embedding servers: pool this chunk of each prompt; a prompt that is fully prefilled
        finishes with its vector (finish reason length 0, as upstream) and its KV goes to the tree."""
        from sglang.srt.layers import pooler

        offset, done = 0, []
        all_hidden = logits_output.all_hidden_states
        for i, (req, prefix_len, ext_len) in enumerate(zip(reqs, forward_batch.extend_prefix_lens_cpu,
                                                           forward_batch.extend_seq_lens_cpu)):
            chunk = all_hidden[offset:offset + ext_len] if all_hidden is not None else None
            offset += ext_len
            req.pooled = pooler.accumulate(self.pooling, req.pooled, chunk, logits_output.hidden_states[i],
                                           logits_output.next_token_logits[i], prefix_len == 0)
            if req is self.queues.chunked:
                continue
            req.is_chunked = 0
            req.embedding = pooler.finish(self.pooling, req.pooled, len(req.origin_input_ids)).tolist()
            req.pooled = None
            req.finished_reason = FINISH_LENGTH(length=0)
            self.memory.release(req, insert=True)
            done.append(req)
        self._keep_chunk()
        self.emit(done)

    def _keep_chunk(self) -> None:
        """The request whose prompt is still being chunked keeps its KV (into the tree) for the next chunk."""
        req = self.queues.chunked
        if req is not None:
            req.is_chunked += 1
            self.memory.cache_unfinished(req, chunked=True)
            self.role.after_chunk(req)

    def _after_decode(self, reqs: List[Req]) -> None:
        if self.memory.is_hybrid_swa:
            for req in reqs:
                if not req.finished():
                    self.memory.free_swa_out_of_window(req, self.sliding_window_size)
        self.stats.log_decode(self.queues, self.memory, self.role)

    def _accept_token(self, req: Req, result, j: int) -> None:
        """Appends sampled row `j`. `max_new_tokens == 0`: the prompt only, no token is kept, but
        the next-token distribution is still reported (top / token-id logprobs: `/v1/score`)."""
        if req.sampling_params.max_new_tokens == 0 and not req.output_ids:
            self._attach_logprobs(req, result.logprobs, j, keep=False)
            return
        req.output_ids.append(int(result.next_token_ids[j]))
        self._attach_logprobs(req, result.logprobs, j)
        self.stats.num_generated_tokens += 1

    @staticmethod
    def _attach_logprobs(req: Req, out, j: int, keep: bool = True) -> None:
        if out is None or not req.return_logprob:
            return
        if keep:
            req.logprobs.output_token_logprobs.append((float(out.next_token_logprobs[j]), req.output_ids[-1]))
        if req.top_logprobs_num and out.top_logprobs is not None:
            values, ids = out.top_logprobs[j]
            req.logprobs.output_top_logprobs.append(list(zip(values, ids)))
        if req.token_ids_logprob is not None and out.token_ids_logprobs is not None:
            values, ids = out.token_ids_logprobs[j]
            req.logprobs.output_token_ids_logprobs.append(list(zip(values, ids)))
