"""(Scheduler process.) What the scheduler sends out after a batch: new tokens, finish reasons, logprobs."""

from __future__ import annotations

from typing import List

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
        if req.return_logprob:
            out.output_token_logprobs.append(req.output_token_logprobs[req.sent_logprob_len :])
            out.output_top_logprobs.append(req.output_top_logprobs[req.sent_logprob_len :])
            out.output_token_ids_logprobs.append(req.output_token_ids_logprobs[req.sent_logprob_len :]
                                                 if req.token_ids_logprob is not None else None)
            first = req.sent_len == 0 and not req.sent_input_logprobs
            out.input_token_logprobs.append(req.input_token_logprobs if first else None)
            out.input_top_logprobs.append(req.input_top_logprobs if first else None)
            out.input_token_ids_logprobs.append(req.input_token_ids_logprobs if first else None)
            req.sent_input_logprobs = req.sent_input_logprobs or first
            req.sent_logprob_len = len(req.output_token_logprobs)
        else:
            for lst in (out.output_token_logprobs, out.output_top_logprobs, out.input_token_logprobs,
                        out.input_top_logprobs, out.output_token_ids_logprobs, out.input_token_ids_logprobs):
                lst.append(None)
        req.sent_len = len(req.output_ids)
    return out


def record_logprobs(reqs: List, forward_batch, logits_output, sampler) -> None:
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
        if req.input_token_logprobs is None:
            req.input_token_logprobs, req.input_top_logprobs = [], []
            req.input_token_ids_logprobs = [] if req.token_ids_logprob is not None else None
            if req.logprob_start_len == 0:
                req.input_token_logprobs.append((None, req.origin_input_ids[0]))
                req.input_top_logprobs.append(None)
                if req.input_token_ids_logprobs is not None:
                    req.input_token_ids_logprobs.append(None)
        n_in = len(req.origin_input_ids)
        # positions p in [prefix_len, prefix_len+ext_len) whose next token p+1 is a prompt token >= start
        lo = max(prefix_len, req.logprob_start_len - 1, 0)
        hi = min(prefix_len + ext_len, n_in - 1)
        if hi <= lo:
            continue
        rows = full[seg_start + (lo - prefix_len) : seg_start + (hi - prefix_len)]
        next_ids = req.origin_input_ids[lo + 1 : hi + 1]
        res = compute_prompt_logprobs(rows, next_ids, req.top_logprobs_num, req.token_ids_logprob)
        req.input_token_logprobs.extend(zip(res.token_logprobs.tolist(), next_ids))
        if res.top_logprobs is not None:
            req.input_top_logprobs.extend(list(zip(v, i)) for v, i in res.top_logprobs)
        else:
            req.input_top_logprobs.extend([None] * len(next_ids))
        if res.token_ids_logprobs is not None:
            req.input_token_ids_logprobs.extend(list(zip(v, i)) for v, i in res.token_ids_logprobs)
