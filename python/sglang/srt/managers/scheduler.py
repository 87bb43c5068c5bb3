"""(Scheduler process.) The scheduler: continuous batching over one model and one memory.

It plans; its collaborators do the rest, each behind one seam:
  worker   (`tp_worker.py`, `ModelWorker`)       runs forward + sample for a planned batch
  memory   (`mem_cache/memory_manager.py`)       pools, radix tree, retraction backups
  role     (`server_role.py`)                    plain, or a PD role from `disaggregation/`, which
                                                 sees the scheduler only through `SchedulerFacade`
  intake   (`scheduler_intake.py`)               requests in, refusals, aborts, time limits
  output   (`scheduler_output.py`)               a result's tokens into requests, outputs out
  queues   (`request_queues.py`), stats (`scheduler_stats.py`), turns (`utils/compute_turns.py`)

One iteration (`step`): the intake's housekeeping, then, in this scheduler's turn on shared
cores (`ComputeTurns.gate`), one batch: admit waiting requests into a prefill (extend) batch if
any fit, else decode the running requests (retracting some first if the next token does not
fit); the worker runs it and the output processor applies the result. With
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
from typing import Callable, List, Optional, Tuple

import torch

from sglang.srt.managers.io_struct import BatchTokenIDOutput
from sglang.srt.core.finish_reason import FINISH_ABORT
from sglang.srt.core.req import Req
from sglang.srt.managers.request_queues import RequestQueues
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.schedule_policy import PrefillAdder, order_waiting_queue
from sglang.srt.managers.scheduler_memory import build_scheduler_memory
from sglang.srt.managers.scheduler_intake import IntakeLimits, SchedulerIntake
from sglang.srt.managers.scheduler_output import OutputProcessor
from sglang.srt.managers.scheduler_stats import SchedulerStats, embedding_info
from sglang.srt.managers.role_factory import make_role
from sglang.srt.managers.server_role import SchedulerFacade
from sglang.srt.managers.spec_decode import SpecDecodePlanner
from sglang.srt.managers.tp_group_worker import make_worker
from sglang.srt.managers.tp_worker import WorkerBatch
from sglang.srt.speculative.spec_config import SpecConfig
from sglang.srt.utils.compute_turns import ComputeTurns

logger = logging.getLogger(__name__)

INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600


class Scheduler:
    def __init__(self, server_args, dp_rank: int = 0, placement=None):
        """`dp_rank`: which data-parallel replica this scheduler is (`--dp-size`; a PD prefill
        replica registers its KV rank with the bootstrap server under it). `placement`: under
        tensor parallelism, rank 0 of its group (managers/tp_worker.py TpPlacement)."""
        self.dp_rank = dp_rank
        self.server_args = sa = server_args
        set_random_seed(sa.random_seed)  # --random-seed (resolved to a random value when unset)
        self.spec_config = SpecConfig.from_server_args(sa)  # --speculative-algorithm, or None
        # loads the model (under TP, rank 0's shards: `placement`, managers/tp_worker.py)
        self.worker = make_worker(sa, placement)
        if self.spec_config is not None:
            from sglang.srt.speculative.spec_worker import NgramWorker

            self.worker = NgramWorker(self.worker)  # the target's worker, plus verification
        self.model_config = self.worker.model_config
        self.device = self.worker.device
        self.memory = build_scheduler_memory(sa, self.worker)  # pools, radix tree, retraction store
        self.worker.attach_memory(self.memory)
        self.page_size = self.memory.page_size
        self.spec = None
        if self.spec_config is not None:
            _check_speculative_model(self.model_config, self.memory)
            self.spec = SpecDecodePlanner(self.spec_config, self.memory)
        self.max_total_num_tokens = self.memory.max_total_num_tokens
        self.max_running_requests = self.memory.max_running_requests
        # Upstream's limits: a sequence never outgrows the context or the whole KV pool.
        max_req_len = min(self.model_config.context_len - 1, self.max_total_num_tokens - 1)
        self.max_req_input_len = max_req_len - 5

        self.tokenizer = None
        eos_token_ids = _eos_token_ids(self.model_config)
        if not sa.skip_tokenizer_init:
            from sglang.srt.managers.tokenizer_loading import load_tokenizer

            self.tokenizer = load_tokenizer(sa, default_path=self.model_config.model_path)
            if self.tokenizer.eos_token_id is not None:
                eos_token_ids.add(self.tokenizer.eos_token_id)
        self.pooling = self.worker.pooling  # --is-embedding: every request is prefill only, pooled
        self.grammar_manager = _build_grammar_manager(sa, self.tokenizer, self.model_config, eos_token_ids)

        self.queues = RequestQueues()
        self.init_new_token_ratio = min(INIT_NEW_TOKEN_RATIO * sa.schedule_conservativeness, 1.0)
        self.min_new_token_ratio = min(self.init_new_token_ratio * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self.new_token_ratio_decay = (self.init_new_token_ratio - self.min_new_token_ratio) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.new_token_ratio = self.init_new_token_ratio
        # SGLANG_CPU_TURNS_FILE: CPU cores shared with another scheduler, one batch at a time
        self.turns = ComputeTurns.from_env() if sa.device == "cpu" else ComputeTurns(None)
        self.stats = SchedulerStats(self.device, sa.decode_log_interval)
        self.stats.speculative = self.spec is not None
        # Set by the process loop: sends outputs queued before a step's forward (e.g. the first
        # token of a PD request whose KV just arrived) without waiting for that forward.
        self.send_outputs: Optional[Callable[[List[BatchTokenIDOutput]], None]] = None
        self.take_messages: Optional[Callable[[], None]] = None  # the loop's: handles what the tokenizer sent since
        self.in_flight: List[Req] = []  # requests of the batch being built or run (aborted if it fails)

        # What --disaggregation-mode adds (PD queues and transfers) sits behind the role.
        self.role = make_role(sa.disaggregation_mode, SchedulerFacade(self))
        self.enable_mixed_chunk = bool(sa.enable_mixed_chunk and sa.chunked_prefill_size and sa.chunked_prefill_size > 0
                                       and self.role.allows_mixed_chunk)
        self.output = OutputProcessor(queues=self.queues, memory=self.memory, role=self.role, stats=self.stats,
                                      stream_interval=sa.stream_interval,
                                      sliding_window_size=self.model_config.sliding_window_size, pooling=self.pooling,
                                      speculative=self.spec is not None)
        self.intake = SchedulerIntake(
            queues=self.queues, memory=self.memory, role=self.role, grammar_manager=self.grammar_manager,
            output=self.output, tokenizer=self.tokenizer,
            limits=IntakeLimits(max_req_len=max_req_len, max_req_input_len=self.max_req_input_len,
                                vocab_size=self.model_config.vocab_size, eos_token_ids=eos_token_ids,
                                allow_auto_truncate=sa.allow_auto_truncate,
                                max_queued_requests=sa.max_queued_requests,
                                pool_all_tokens=self.pooling is not None and self.pooling.needs_all_tokens))
        # What the process loop, the role facade and the tools call: the intake's and outbox's doors.
        self.add_request = self.intake.add_request
        self.abort_request = self.intake.abort_request
        self.reject_rooms = self.intake.reject_rooms
        self.reject_request = self.intake.reject_request
        self.unqueue = self.intake.unqueue
        self.finish_unscheduled = self.intake.finish_unscheduled
        self.release_after_error = self.intake.release_after_error
        self.emit = self.output.emit
        self.take_outputs = self.output.take

    def close(self) -> None:
        """Stops the role's transfer threads and sockets (in-process schedulers: tests, tools)."""
        self.role.close()
        self.turns.close()
        if self.grammar_manager is not None:
            self.grammar_manager.backend.shutdown()

    # --- views for the loop, the watchdog and the role facade ------------------------------------
    @property
    def waiting_queue(self) -> List[Req]:
        return self.queues.waiting

    @property
    def running_reqs(self) -> List[Req]:
        return self.queues.running

    @property
    def chunked_req(self) -> Optional[Req]:
        return self.queues.chunked

    @property
    def forward_ct(self) -> int:
        return self.worker.forward_ct

    # --- one iteration -----------------------------------------------------------------------
    def has_work(self) -> bool:
        return (self.queues.has_batch_work() or self.role.has_work()
                or bool(self.grammar_manager and self.grammar_manager.queue))

    def step(self) -> List[BatchTokenIDOutput]:
        """Runs one batch (prefill if anything can be admitted, else decode). Returns outputs to send."""
        self.in_flight = []
        self._housekeeping()
        if self.queues.has_batch_work():
            self.turns.gate(self._run_batch, lambda: self.worker.forward_ct, self.role.end_of_turn)
        self.in_flight = []
        return self.take_outputs()

    def _housekeeping(self) -> None:
        """Before a batch: time limits, aborts, ready grammars, the role's queues, early outputs."""
        self.intake.abort_timed_out()
        self.intake.drop_aborted_running()
        self.intake.move_ready_grammar_requests()
        self.role.process()
        self._send_early_outputs()

    def _run_batch(self, waited_for_turn: bool) -> None:
        if waited_for_turn:
            # the other scheduler computed meanwhile: what arrived since (requests, KV, bootstrapped
            # prompts) joins this batch
            if self.take_messages is not None:
                self.take_messages()
            self.role.process()
            self._send_early_outputs()
        batch = self.get_new_prefill_batch()
        if batch is not None:
            self.run_extend(*batch)
        elif self.queues.running:
            self.run_decode()

    def _send_early_outputs(self) -> None:
        """Outputs queued before the forward (first tokens of arrived KV, aborts) go out now."""
        if self.send_outputs is not None and self.output.pending:
            early = self.take_outputs()
            try:
                self.send_outputs(early)
            except Exception:
                self.output.pending[:0] = early  # not lost: they go out with the step's outputs
                raise

    def recover_from_step_error(self, exc: BaseException) -> None:
        """A step raised: its batch's requests end with a 500 that says why, their memory is freed
        (never inserted into the radix tree: their KV may be half written), the rest goes on."""
        message = f"Internal server error while running the batch: {type(exc).__name__}: {exc}"
        victims = [r for r in self.in_flight if not r.finished()]
        self.in_flight = []
        for req in victims:
            self.unqueue(req)
            req.abort(FINISH_ABORT(message, 500, "InternalServerError"))
            self.release_after_error(req)
        if victims:
            logger.error("Aborted %d request(s) of the failed batch: %s", len(victims), [r.rid for r in victims])
            self.emit(victims)

    # --- prefill -------------------------------------------------------------------------------
    def get_new_prefill_batch(self):
        q = self.queues
        if not q.waiting and q.chunked is None:
            return None
        if not self.role.may_prefill():
            return None  # e.g. a PD decode server's retracted requests resume first
        if len(q.running) >= self.max_running_requests and q.chunked is None:
            return None
        sa = self.server_args
        mixing = self._can_mix()
        adder = PrefillAdder(
            memory=self.memory,
            running_reqs=q.running,
            new_token_ratio=self.new_token_ratio,
            max_prefill_tokens=sa.max_prefill_tokens,
            chunked_prefill_size=sa.chunked_prefill_size,
            max_running_requests=self.max_running_requests,
            mixed_with_decode_tokens=len(q.running) if mixing else 0,
        )
        self.in_flight = adder.can_run  # what a failure from here on must abort
        still_chunked = None
        if q.chunked is not None:
            still_chunked = adder.add_chunked_req(q.chunked)
        if still_chunked is None:
            order_waiting_queue(
                q.waiting,
                sa.schedule_policy,
                self.memory,
                sa.enable_priority_scheduling,
                sa.schedule_low_priority_values_first,
            )
            for req in list(q.waiting):
                res = adder.add_one_req(req)
                if res == "no_room":
                    break
                q.waiting.remove(req)
                if req.num_retractions:
                    self.stats.num_recomputed_tokens += req.extend_input_len
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
        q.chunked = still_chunked
        self.stats.log_prefill(reqs, q, self.memory, self.role)
        return batch, forward_batch, decoding

    def _can_mix(self) -> bool:
        """--enable-mixed-chunk: running requests decode inside the prefill batch (not with logprobs, as upstream)."""
        running = self.queues.running
        return self.enable_mixed_chunk and bool(running) and not any(r.return_logprob for r in running)

    def _prepare_mixed_decode(self) -> List[Req]:
        """The running requests to mix in, when their next tokens fit (eviction allowed); else []
        and they decode in their own step, which retracts if needed."""
        running = self.queues.running
        return list(running) if self.memory.decode_fits(running) else []

    def _undo_admission(self, reqs: List[Req]) -> None:
        for req in reversed(reqs):
            if req is self.queues.chunked:
                continue
            self.memory.release(req)
            req.kv.prefix_indices = torch.empty(0, dtype=torch.int64)
            self.queues.waiting.insert(0, req)

    def run_extend(self, batch: ScheduleBatch, forward_batch, decoding: List[Req] = ()) -> None:
        if self.pooling is not None:
            logits_output = self.worker.forward_batch_embedding(forward_batch)
            return self.output.process_pooling(batch.reqs, forward_batch, logits_output)
        # Requests whose prompt is fully prefilled sample their first output token; mixed-in
        # running requests (after the new ones) sample their next one.
        n_new = len(batch.reqs)
        done = [i for i, r in enumerate(batch.reqs) if r is not self.queues.chunked]
        rows = done + list(range(n_new, n_new + len(decoding)))
        sampled = [batch.reqs[i] for i in done] + list(decoding)
        result = self.worker.forward_batch_generation(self._worker_batch(forward_batch, sampled, rows))
        self.output.process_prefill(batch.reqs, forward_batch, result, decoding)

    def _worker_batch(self, forward_batch, sampled: List[Req], rows: Optional[List[int]] = None,
                      info=None) -> WorkerBatch:
        """The planned forward: which rows sample, with what (grammar masks, penalties, logprobs)."""
        if not sampled:
            return WorkerBatch(forward_batch, sample_rows=[])
        return WorkerBatch(
            forward_batch,
            sampling_info=info if info is not None else self._sampling_info(sampled),
            sample_rows=rows,
            return_logprob=any(r.return_logprob for r in sampled),
            top_logprobs_nums=[r.top_logprobs_num if r.return_logprob else 0 for r in sampled],
            token_ids_logprobs=[r.token_ids_logprob if r.return_logprob else None for r in sampled],
        )

    # --- decode --------------------------------------------------------------------------------
    def run_decode(self) -> None:
        batch = ScheduleBatch(self.queues.running, self.memory, self.device)
        self.in_flight = list(batch.reqs)
        if self.spec is not None:
            drafts = self.spec.drafts_for(batch.reqs)
            if drafts is not None:
                return self.run_verify(batch, drafts)
        if not batch.check_decode_mem():
            self.retract(batch)
        else:
            self.new_token_ratio = max(self.new_token_ratio - self.new_token_ratio_decay, self.min_new_token_ratio)
        self.queues.running = batch.reqs
        self.in_flight = list(batch.reqs)
        if not batch.reqs:
            return
        forward_batch = batch.prepare_for_decode()
        assert forward_batch is not None, "decode memory was checked"
        info = self._sampling_info(batch.reqs)
        forward_batch.argmax_only = (info.is_all_greedy and not info.modifies_logits
                                     and not any(r.return_logprob for r in batch.reqs))
        result = self.worker.forward_batch_generation(self._worker_batch(forward_batch, batch.reqs, info=info))
        self.output.process_decode(batch.reqs, result)

    def run_verify(self, batch: ScheduleBatch, drafts: List[List[int]]) -> None:
        """A speculative decode step: every running request's last token and its drafts in one
        forward (`managers/spec_decode.py`); their KV fits (checked with the drafts)."""
        self.new_token_ratio = max(self.new_token_ratio - self.new_token_ratio_decay, self.min_new_token_ratio)
        reqs = batch.reqs
        kv_lens = [r.kv.kv_len for r in reqs]
        forward_batch = batch.prepare_for_verify(drafts)
        assert forward_batch is not None, "verify memory was checked"
        mask = self.grammar_manager.vocab_mask_for(reqs) if self.grammar_manager is not None else None
        info, owner = self.spec.sampling_info(reqs, drafts, self.model_config.vocab_size, self.device, mask)
        if mask is not None:
            info.apply_mask_func = self.grammar_manager.backend.apply_vocab_mask
        logprob = any(r.return_logprob for r in reqs)
        worker_batch = WorkerBatch(
            forward_batch, sampling_info=info, sample_rows=None, return_logprob=logprob,
            top_logprobs_nums=[reqs[i].top_logprobs_num if reqs[i].return_logprob else 0 for i in owner],
            token_ids_logprobs=[reqs[i].token_ids_logprob if reqs[i].return_logprob else None for i in owner],
            drafts=drafts,
        )
        result = self.worker.forward_batch_generation(worker_batch)
        self.output.process_verify(reqs, result, drafts, kv_lens, self.spec.after_verify)

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
        self.stats.num_retracted_total += len(retracted)
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

    # --- introspection -----------------------------------------------------------------------------
    def flush_cache(self) -> bool:
        if self.has_work():
            return False
        self.memory.flush()
        return True

    def ready_info(self) -> dict:
        """What the tokenizer manager learns once the scheduler is up (server_info, limits)."""
        return {
            "max_total_num_tokens": self.max_total_num_tokens,
            "max_running_requests": self.max_running_requests,
            "max_req_input_len": self.max_req_input_len,
            "context_len": self.model_config.context_len,
            "vocab_size": self.model_config.vocab_size,
            "model_path": self.model_config.model_path,
            "architecture": self.model_config.architecture,
            "page_size": self.page_size,
            **embedding_info(self.pooling, self.model_config),
        }

    def load(self, count_tokens: bool = False) -> Tuple[int, int]:
        """(requests, tokens) this scheduler holds: waiting, running, being chunked, in the grammar
        queue, in the role's queues (upstream's `num_reqs` / `num_tokens` for DP dispatch). The
        tokens are counted only when asked (a walk over the queues)."""
        grammar = self.grammar_manager.reqs() if self.grammar_manager is not None else []
        reqs = self.queues.all() + list(grammar) + list(self.role.all_reqs())
        if not count_tokens:
            return len(reqs), 0
        return len(reqs), sum(r.seqlen for r in reqs)

    def internal_state(self) -> dict:
        """`/server_info` and `/metrics`: queues, the memory manager's accounting, the role's queues."""
        st = self.stats
        return {
            "num_waiting_reqs": len(self.queues.waiting),
            "num_running_reqs": len(self.queues.running),
            "num_grammar_queue_reqs": len(self.grammar_manager.queue) if self.grammar_manager is not None else 0,
            **self.memory.stats(),
            "max_running_requests": self.max_running_requests,
            "num_retracted_reqs_total": st.num_retracted_total,
            "num_recomputed_tokens": st.num_recomputed_tokens,
            "new_token_ratio": self.new_token_ratio,
            "forward_ct": self.worker.forward_ct,
            "num_mixed_batches": st.num_mixed_batches,
            **st.spec_info(),
            "disaggregation": {"mode": self.role.mode, **self.role.stats()},
        }


def _check_speculative_model(model_config, memory) -> None:
    """Verification writes KV for drafted tokens and gives back the rejected ones' slots: a
    recurrent state (Mamba) would have advanced over them, and the hybrid sliding-window pool
    frees its window slots by page; neither can take that back here."""
    if memory.has_state_slots:
        raise ValueError(f"Speculative decoding is not supported for {model_config.architecture}: "
                         "its recurrent (Mamba) state cannot be rolled back over rejected drafts.")
    if memory.is_hybrid_swa:
        raise ValueError(f"Speculative decoding is not supported with the hybrid sliding-window KV pool of "
                         f"{model_config.architecture}; start with --disable-hybrid-swa-memory.")


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
