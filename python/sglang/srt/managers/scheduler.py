"""(Scheduler process.) The scheduler: continuous batching over one model and one memory.

It owns the `ModelRunner` (the model and its attention backend), the `MemoryManager`
(`mem_cache/memory_manager.py`: pools, radix tree, retraction backups) and the server role
(`server_role.py`: plain, or a PD role from `disaggregation/`, which sees the scheduler only
through `SchedulerFacade`).

One iteration (`step`): admit waiting requests into a prefill (extend) batch if any fit, else
decode the running requests (retracting some first if the next token does not fit), sample,
append tokens, finish requests and release their memory into the radix tree. With
`--enable-mixed-chunk` the running requests ride along a prefill batch as one-token extends.
If a step raises, `recover_from_step_error` aborts the requests of that batch (500) and frees
their memory; everything else keeps running.

It runs in-process (tests, `step()`) or as a subprocess (`run_scheduler_process`) that reads
`TokenizedGenerateReqInput`/`AbortReq`/... from ZMQ and pushes `BatchTokenIDOutput` to the
detokenizer.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, List, Optional

import torch

from sglang.srt.managers.io_struct import BatchTokenIDOutput
from sglang.srt.core.finish_reason import FINISH_ABORT
from sglang.srt.core.req import Req
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.schedule_policy import PrefillAdder, order_waiting_queue
from sglang.srt.managers.scheduler_memory import build_memory
from sglang.srt.managers.scheduler_intake import SchedulerIntakeMixin, running_timeout_s, waiting_timeout_s
from sglang.srt.managers.scheduler_output import collect_outputs, record_logprobs
from sglang.srt.managers.scheduler_stats import SchedulerStatsMixin
from sglang.srt.managers.role_factory import make_role
from sglang.srt.managers.server_role import SchedulerFacade
from sglang.srt.utils.compute_turns import ComputeTurns

logger = logging.getLogger(__name__)

INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600


class Scheduler(SchedulerIntakeMixin, SchedulerStatsMixin):
    def __init__(self, server_args):
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.layers.sampler import Sampler
        from sglang.srt.model_executor.model_runner import ModelRunner
        from sglang.srt.model_loader.default_model import resolve_model_path

        self.server_args = sa = server_args
        set_random_seed(sa.random_seed)  # --random-seed (resolved to a random value when unset)
        model_config = ModelConfig.from_path(resolve_model_path(sa.model_path), sa.context_length)
        self.model_runner = ModelRunner(model_config, sa, build_memory=False)  # loads the weights
        self.model_config = self.model_runner.model_config
        self.device = self.model_runner.device
        self.memory = build_memory(sa, self.model_runner)
        self.model_runner.attach_memory(self.memory)
        self.page_size = self.memory.page_size
        self.max_total_num_tokens = self.memory.max_total_num_tokens
        self.max_running_requests = self.memory.max_running_requests
        # Upstream's limits: a sequence never outgrows the context or the whole KV pool.
        self.max_req_len = min(self.model_config.context_len - 1, self.max_total_num_tokens - 1)
        self.max_req_input_len = self.max_req_len - 5

        self.tokenizer = None
        self.eos_token_ids = _eos_token_ids(self.model_config)
        if not sa.skip_tokenizer_init:
            from sglang.srt.managers.tokenizer_loading import load_tokenizer

            self.tokenizer = load_tokenizer(sa, default_path=self.model_config.model_path)
            if self.tokenizer.eos_token_id is not None:
                self.eos_token_ids.add(self.tokenizer.eos_token_id)
        self.sampler = Sampler()
        # --is-embedding: every request is prefill only and ends with a pooled vector.
        self.pooling = self.model_runner.pooling_config if sa.is_embedding else None
        self.grammar_manager = _build_grammar_manager(sa, self.tokenizer, self.model_config, self.eos_token_ids)

        self.waiting_queue: List[Req] = []
        self.running_reqs: List[Req] = []
        self.chunked_req: Optional[Req] = None
        self.init_new_token_ratio = min(INIT_NEW_TOKEN_RATIO * sa.schedule_conservativeness, 1.0)
        self.min_new_token_ratio = min(self.init_new_token_ratio * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self.new_token_ratio_decay = (self.init_new_token_ratio - self.min_new_token_ratio) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.new_token_ratio = self.init_new_token_ratio
        self.forward_ct = 0
        # SGLANG_CPU_TURNS_FILE: CPU cores shared with another scheduler, one batch at a time
        self.turns = ComputeTurns.from_env() if sa.device == "cpu" else ComputeTurns(None)
        self.num_retracted_total = 0
        self.num_recomputed_tokens = 0  # prompt tokens prefilled again after a retraction
        self.stream_interval = sa.stream_interval
        self.pending_outputs: List[BatchTokenIDOutput] = []
        # Set by the process loop: sends outputs queued before a step's forward (e.g. the first
        # token of a PD request whose KV just arrived) without waiting for that forward.
        self.send_outputs: Optional[Callable[[List[BatchTokenIDOutput]], None]] = None
        self.take_messages: Optional[Callable[[], None]] = None  # the loop's: handles what the tokenizer sent since
        self.waiting_timeout_s = waiting_timeout_s()
        self.running_timeout_s = running_timeout_s()
        self.in_flight: List[Req] = []  # requests of the batch being built or run (aborted if it fails)
        self.num_mixed_batches = 0  # prefill batches that carried decode tokens (--enable-mixed-chunk)
        self.init_stats()

        # What --disaggregation-mode adds (PD queues and transfers) sits behind the role.
        self.role = make_role(sa.disaggregation_mode, SchedulerFacade(self))
        self.enable_mixed_chunk = bool(sa.enable_mixed_chunk and sa.chunked_prefill_size and sa.chunked_prefill_size > 0
                                       and self.role.allows_mixed_chunk)

    def close(self) -> None:
        """Stops the role's transfer threads and sockets (in-process schedulers: tests, tools)."""
        self.role.close()
        self.turns.close()
        if self.grammar_manager is not None:
            self.grammar_manager.backend.shutdown()

    def emit(self, reqs: List[Req]) -> None:
        """Queues the outputs of these requests (new tokens, finish) for the detokenizer."""
        self.pending_outputs.append(collect_outputs(reqs, self.stream_interval))

    # --- one iteration -----------------------------------------------------------------------
    def has_work(self) -> bool:
        return (bool(self.waiting_queue or self.running_reqs or self.chunked_req) or self.role.has_work()
                or bool(self.grammar_manager and self.grammar_manager.queue))

    def step(self) -> List[BatchTokenIDOutput]:
        """Runs one batch (prefill if anything can be admitted, else decode). Returns outputs to send."""
        self.in_flight = []
        self.abort_timed_out()
        self._drop_aborted_running()
        self.move_ready_grammar_requests()
        self.role.process()
        self._send_early_outputs()
        try:
            if (self.waiting_queue or self.running_reqs or self.chunked_req) and self.turns.take():
                # the other scheduler computed meanwhile: what arrived since (requests, KV, bootstrapped
                # prompts) joins this batch
                if self.take_messages is not None:
                    self.take_messages()
                self.role.process()
                self._send_early_outputs()
            batch = self.get_new_prefill_batch()
            if batch is not None:
                self.run_extend(*batch)
            elif self.running_reqs:
                self.run_decode()
            if self.turns.held:
                self.role.end_of_turn()
        finally:
            self.turns.give_back()  # taken by this step, if it had a batch to form
        self.in_flight = []
        return self.take_outputs()

    def _send_early_outputs(self) -> None:
        """Outputs queued before the forward (first tokens of arrived KV, aborts) go out now."""
        if self.send_outputs is not None and self.pending_outputs:
            early = self.take_outputs()
            try:
                self.send_outputs(early)
            except Exception:
                self.pending_outputs[:0] = early  # not lost: they go out with the step's outputs
                raise

    def take_outputs(self) -> List[BatchTokenIDOutput]:
        """Hands out (and forgets) the outputs queued so far, e.g. of requests finished without running."""
        outs, self.pending_outputs = self.pending_outputs, []
        return outs

    def _drop_aborted_running(self) -> None:
        aborted = [r for r in self.running_reqs if r.to_abort is not None]
        if self.chunked_req is not None and self.chunked_req.to_abort is not None:
            aborted.append(self.chunked_req)
            self.chunked_req = None
        for req in aborted:
            if req in self.running_reqs:
                self.running_reqs.remove(req)
            req.finished_reason = req.to_abort
            self.memory.release(req)
            self.role.release(req)
        if aborted:
            self.emit(aborted)

    def recover_from_step_error(self, exc: BaseException) -> None:
        """A step raised: its batch's requests end with a 500 that says why, their memory is freed
        (never inserted into the radix tree: their KV may be half written), the rest goes on."""
        message = f"Internal server error while running the batch: {type(exc).__name__}: {exc}"
        victims = [r for r in self.in_flight if not r.finished()]
        self.in_flight = []
        for req in victims:
            self.unqueue(req)
            req.to_abort = FINISH_ABORT(message, 500, "InternalServerError")
            self.release_after_error(req)
        if victims:
            logger.error("Aborted %d request(s) of the failed batch: %s", len(victims), [r.rid for r in victims])
            self.emit(victims)

    def release_after_error(self, req: Req) -> None:
        """A failed request gives back everything it holds, even if part of that fails."""
        req.finished_reason = req.to_abort
        try:
            self.memory.release(req)
        except Exception:  # noqa: BLE001 - say so loudly; the pool check in the tests catches a leak
            logger.exception("Could not release the memory of request %s", req.rid)
        try:
            self.role.release_after_error(req)
        except Exception:  # noqa: BLE001
            logger.exception("Could not release the transfer state of request %s", req.rid)

    # --- prefill -------------------------------------------------------------------------------
    def get_new_prefill_batch(self):
        if not self.waiting_queue and self.chunked_req is None:
            return None
        if not self.role.may_prefill():
            return None  # e.g. a PD decode server's retracted requests resume first
        if len(self.running_reqs) >= self.max_running_requests and self.chunked_req is None:
            return None
        sa = self.server_args
        mixing = self._can_mix()
        adder = PrefillAdder(
            memory=self.memory,
            running_reqs=self.running_reqs,
            new_token_ratio=self.new_token_ratio,
            max_prefill_tokens=sa.max_prefill_tokens,
            chunked_prefill_size=sa.chunked_prefill_size,
            max_running_requests=self.max_running_requests,
            mixed_with_decode_tokens=len(self.running_reqs) if mixing else 0,
        )
        self.in_flight = adder.can_run  # what a failure from here on must abort
        still_chunked = None
        if self.chunked_req is not None:
            still_chunked = adder.add_chunked_req(self.chunked_req)
        if still_chunked is None:
            order_waiting_queue(
                self.waiting_queue,
                sa.schedule_policy,
                self.memory.tree_cache,
                sa.enable_priority_scheduling,
                sa.schedule_low_priority_values_first,
            )
            for req in list(self.waiting_queue):
                res = adder.add_one_req(req)
                if res == "no_room":
                    break
                self.waiting_queue.remove(req)
                if req.num_retractions:
                    self.num_recomputed_tokens += req.extend_input_len
                if res == "chunked":
                    still_chunked = req
                    break
        if not adder.can_run:
            return None
        reqs = list(adder.can_run)
        decoding = []
        if mixing and not any(r.return_logprob for r in reqs):
            decoding = self._prepare_mixed_decode()
        batch = ScheduleBatch(reqs, self.memory, self.device)
        forward_batch = batch.prepare_for_extend(return_full_logits=any(r.wants_input_logprobs() for r in batch.reqs),
                                                 decoding_reqs=decoding)
        if forward_batch is None:
            self._undo_admission(reqs)
            return None
        forward_batch.return_all_hidden = self.pooling is not None and self.pooling.needs_all_tokens
        self.in_flight = reqs + decoding
        now = time.monotonic()
        for req in reqs:
            if req.forward_entry_time is None:
                req.forward_entry_time = now
        self.chunked_req = still_chunked
        self.log_prefill_stats(reqs, adder)
        return batch, forward_batch, decoding

    def _can_mix(self) -> bool:
        """--enable-mixed-chunk: running requests decode inside the prefill batch (not with logprobs, as upstream)."""
        return (self.enable_mixed_chunk and bool(self.running_reqs)
                and not any(r.return_logprob for r in self.running_reqs))

    def _prepare_mixed_decode(self) -> List[Req]:
        """The running requests to mix in, when their next tokens fit (eviction allowed); else []
        and they decode in their own step, which retracts if needed."""
        return list(self.running_reqs) if self.memory.decode_fits(self.running_reqs) else []

    def _undo_admission(self, reqs: List[Req]) -> None:
        for req in reversed(reqs):
            if req is self.chunked_req:
                continue
            self.memory.release(req)
            req.prefix_indices = torch.empty(0, dtype=torch.int64)
            self.waiting_queue.insert(0, req)

    def run_extend(self, batch: ScheduleBatch, forward_batch, decoding: List[Req] = ()) -> None:
        logits_output = self._forward(forward_batch)
        if self.pooling is not None:
            return self._pool_extend(batch, forward_batch, logits_output)
        n_new = len(batch.reqs)
        # Requests whose prompt is fully prefilled now sample their first output token; mixed-in
        # running requests (after the new ones) sample their next one.
        done = [i for i, r in enumerate(batch.reqs) if r is not self.chunked_req]
        record_logprobs(batch.reqs, forward_batch, logits_output, self.sampler)
        rows = done + list(range(n_new, n_new + len(decoding)))
        sampled_reqs = [batch.reqs[i] for i in done] + list(decoding)
        logits = logits_output.next_token_logits
        if len(rows) < logits.shape[0]:  # rows ascend from 0: all of them means no copy of [rows, vocab]
            logits = logits.index_select(0, torch.tensor(rows, dtype=torch.int64, device=logits.device))
        next_ids, samp = self._sample(sampled_reqs, logits)
        to_emit = []
        for j, i in enumerate(done):
            req = batch.reqs[i]
            req.is_chunked = 0
            self._accept_token(req, int(next_ids[j]), samp, j)
            if self.role.after_prefill(req):
                continue  # a PD prefill server: the KV goes to the decode server first
            req.check_finished()
            to_emit.append(req)
            if req.finished():
                self.memory.release(req, insert=True)
                self.role.release(req)
            else:
                self.memory.cache_unfinished(req)
                self.running_reqs.append(req)
        if decoding:
            self.num_mixed_batches += 1
            base = len(done)
            for j, req in enumerate(decoding):
                self._accept_token(req, int(next_ids[base + j]), samp, base + j)
                req.check_finished()
                if req.finished():
                    self.memory.release(req, insert=True)
            self.running_reqs = [r for r in self.running_reqs if not r.finished()]
            self._after_decode(list(decoding))
            to_emit += list(decoding)
        self._keep_chunk()
        self.emit(to_emit)

    def _pool_extend(self, batch: ScheduleBatch, forward_batch, logits_output) -> None:
        """Embedding servers: pool this chunk of each prompt; a prompt that is fully prefilled
        finishes with its vector (finish reason length 0, as upstream) and its KV goes to the tree."""
        from sglang.srt.core.finish_reason import FINISH_LENGTH
        from sglang.srt.layers import pooler

        offset, done = 0, []
        all_hidden = logits_output.all_hidden_states
        for i, (req, prefix_len, ext_len) in enumerate(zip(batch.reqs, forward_batch.extend_prefix_lens_cpu,
                                                           forward_batch.extend_seq_lens_cpu)):
            chunk = all_hidden[offset:offset + ext_len] if all_hidden is not None else None
            offset += ext_len
            req.pooled = pooler.accumulate(self.pooling, req.pooled, chunk, logits_output.hidden_states[i],
                                           logits_output.next_token_logits[i], prefix_len == 0)
            if req is self.chunked_req:
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
        if self.chunked_req is not None:
            self.chunked_req.is_chunked += 1
            self.memory.cache_unfinished(self.chunked_req, chunked=True)
            self.role.after_chunk(self.chunked_req)

    def _accept_token(self, req: Req, token: int, samp, j: int) -> None:
        """Appends a sampled token. `max_new_tokens == 0`: the prompt only, no token is kept, but
        the next-token distribution is still reported (top / token-id logprobs: `/v1/score`)."""
        if req.sampling_params.max_new_tokens == 0 and not req.output_ids:
            if samp is not None:
                samp(req, j, keep=False)
            return
        req.output_ids.append(token)
        if samp is not None:
            samp(req, j)
        self.num_generated_tokens += 1

    def _forward(self, forward_batch):
        self.turns.take()  # a no-op when the step took it already (given back when the step ends)
        try:
            return self.model_runner.forward(forward_batch)
        finally:
            self.turns.end_of_forward()
            self.forward_ct += 1

    # --- decode --------------------------------------------------------------------------------
    def run_decode(self) -> None:
        batch = ScheduleBatch(self.running_reqs, self.memory, self.device)
        self.in_flight = list(batch.reqs)
        if not batch.check_decode_mem():
            self.retract(batch)
        else:
            self.new_token_ratio = max(self.new_token_ratio - self.new_token_ratio_decay, self.min_new_token_ratio)
        self.running_reqs = batch.reqs
        self.in_flight = list(batch.reqs)
        if not batch.reqs:
            return
        forward_batch = batch.prepare_for_decode()
        assert forward_batch is not None, "decode memory was checked"
        info = self._sampling_info(batch.reqs)
        forward_batch.argmax_only = (info.is_all_greedy and not info.modifies_logits
                                     and not any(r.return_logprob for r in batch.reqs))
        logits_output = self._forward(forward_batch)
        if logits_output.next_token_ids is not None:  # the LM head took the argmax itself
            next_ids, samp = logits_output.next_token_ids.tolist(), None
        else:
            next_ids, samp = self._sample(batch.reqs, logits_output.next_token_logits, info)
        for j, req in enumerate(batch.reqs):
            self._accept_token(req, int(next_ids[j]), samp, j)
            req.check_finished()
            if req.finished():
                self.memory.release(req, insert=True)
        self.running_reqs = [r for r in batch.reqs if not r.finished()]
        self._after_decode(batch.reqs)
        self.emit(batch.reqs)

    def _after_decode(self, reqs: List[Req]) -> None:
        if self.memory.is_hybrid_swa:
            window = self.model_config.sliding_window_size
            for req in reqs:
                if not req.finished():
                    self.memory.free_swa_out_of_window(req, window)
        self.log_decode_stats()

    def retract(self, batch: ScheduleBatch) -> None:
        sa = self.server_args
        before = len(batch.reqs)
        retracted, aborted = batch.retract_decode(
            self.release_req_for_retract, sa.retraction_policy, sa.schedule_low_priority_values_first
        )
        old_ratio = self.new_token_ratio
        self.new_token_ratio = self._ratio_after_retract(batch.reqs)
        logger.info(
            "KV cache pool is full. Retract requests. #retracted_reqs: %d, #new_tokens_gained: %d, "
            "#new_token_ratio: %.4f -> %.4f",
            len(retracted), sum(r.seqlen for r in retracted), old_ratio, self.new_token_ratio,
        )
        self.num_retracted_total += len(retracted)
        for req in aborted:
            req.finished_reason = req.to_abort
        if aborted:
            self.emit(aborted)
        self.role.requeue_retracted(retracted)
        assert len(batch.reqs) + len(retracted) + len(aborted) == before

    def _ratio_after_retract(self, reqs: List[Req]) -> float:
        total_decoded = sum(len(r.output_ids) for r in reqs)
        total_max = sum(r.sampling_params.max_new_tokens for r in reqs)
        ratio = (total_decoded + 0.05 * total_max) / max(total_max, 1)  # upstream's retract estimate
        return min(1.0, ratio)

    def release_req_for_retract(self, req: Req, keep: bool) -> bool:
        """Frees a retraction victim's memory. `keep`: it waits to run again (the role decides how:
        recompute on a plain server, a KV backup on a PD decode server) and False means it could
        not be kept (`to_abort` says why); otherwise it is being aborted."""
        if keep:
            return self.role.retract(req)
        self.memory.release(req)
        return False

    # --- sampling ------------------------------------------------------------------------------
    def _sampling_info(self, reqs: List[Req]):
        """The batch's SamplingBatchInfo, with the grammar masks (each grammar advanced by its
        request's last token: once per step) and custom logit processors attached."""
        from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

        info = SamplingBatchInfo.from_reqs(reqs, self.model_config.vocab_size, self.device)
        if self.grammar_manager is not None:
            info.vocab_mask = self.grammar_manager.vocab_mask_for(reqs)
            info.apply_mask_func = self.grammar_manager.backend.apply_vocab_mask
        if any(r.custom_logit_processor for r in reqs):
            from sglang.srt.sampling.custom_logit_processor import apply_custom_logit_processors

            info.apply_custom_logit_processors = lambda logits: apply_custom_logit_processors(logits, reqs)
        return info

    def _sample(self, reqs: List[Req], logits: torch.Tensor, info=None):
        if not reqs:
            return [], None
        if info is None:
            info = self._sampling_info(reqs)
        want = any(r.return_logprob for r in reqs)
        token_ids = [r.token_ids_logprob if r.return_logprob else None for r in reqs]
        out = self.sampler.forward(logits, info, want, [r.top_logprobs_num if r.return_logprob else 0 for r in reqs],
                                   token_ids if any(t is not None for t in token_ids) else None)
        if not want:
            return out.next_token_ids.tolist(), None

        def attach(req: Req, j: int, keep: bool = True) -> None:
            if not req.return_logprob:
                return
            if keep:
                req.output_token_logprobs.append((float(out.next_token_logprobs[j]), req.output_ids[-1]))
            if req.top_logprobs_num and out.top_logprobs is not None:
                values, ids = out.top_logprobs[j]
                req.output_top_logprobs.append(list(zip(values, ids)))
            if req.token_ids_logprob is not None and out.token_ids_logprobs is not None:
                values, ids = out.token_ids_logprobs[j]
                req.output_token_ids_logprobs.append(list(zip(values, ids)))

        return out.next_token_ids.tolist(), attach


def _build_grammar_manager(server_args, tokenizer, model_config, eos_token_ids):
    """The grammar queue over --grammar-backend (None: constrained requests get a 400); with
    --reasoning-parser, grammars start after the reasoning section."""
    from sglang.srt.constrained.grammar_manager import GrammarManager, create_grammar_backend, reasoning_token_ids

    backend = create_grammar_backend(server_args, tokenizer, model_config.vocab_size, eos_token_ids)
    if backend is None:
        return None
    return GrammarManager(backend, reasoning_token_ids(server_args, tokenizer, model_config.model_path))


def set_random_seed(seed: Optional[int]) -> None:
    """Seeds Python, NumPy and torch, as upstream: sampling without a per-request seed is
    reproducible for a given seed and request sequence."""
    if seed is None:
        return
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


def _eos_token_ids(model_config) -> set:
    eos = model_config.hf_config.get("eos_token_id")
    if eos is None:
        return set()
    return set(eos) if isinstance(eos, list) else {eos}
