"""(Tokenizer/HTTP process.) The front of the engine: validates and tokenizes requests, sends
them to the scheduler, and turns the detokenizer's outputs back into response dicts (streamed
or whole).

Both the HTTP server and the offline `Engine` call `generate_request`, so there is one path.
A request is expanded into one sequence per (prompt, sample) (`request_expansion`); the whole
request is validated before anything is sent, so a bad entry rejects the request with a 400 and
nothing runs. Whatever way the caller stops listening (finished, client gone, error), every
sequence of the request that is still running is aborted in the scheduler and forgotten here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any, AsyncIterator, Callable, Dict, List, Optional

from sglang.srt.managers.internal_channel import bind_private, recv_msg_async
from sglang.srt.managers.io_struct import (
    NOT_EMBEDDING_MODEL,
    NOT_GENERATION_MODEL,
    BatchStrOutput,
    EmbeddingReqInput,
    FlushCacheReqInput,
    FlushCacheReqOutput,
    GenerateReqInput,
    GetInternalStateReq,
    GetInternalStateReqOutput,
    RejectedRequest,
)
from sglang.srt.managers.cpu_work_pool import run_cpu
from sglang.srt.managers.data_parallel_controller import (
    DataParallelController,
    check_routed_rank,
    replica_input_names,
)
from sglang.srt.managers.internal_state_sum import sum_internal_states
from sglang.srt.managers.request_expansion import expand_request
from sglang.srt.managers.request_limits import RequestLimits
from sglang.srt.managers.request_logger import RequestLogger
from sglang.srt.managers.request_validation import RequestValidator

logger = logging.getLogger(__name__)

class EngineDeadError(RuntimeError):
    """The scheduler (or detokenizer) process is gone: the server cannot serve (HTTP 503)."""


# How often a non-streaming request checks whether its client is still connected.
DISCONNECT_CHECK_INTERVAL_S = 4.0


@dataclasses.dataclass
class ReqState:
    obj: GenerateReqInput
    group: Optional[str]  # the rid the client gave (aborting it aborts every sequence of the request)
    out_list: List[dict] = dataclasses.field(default_factory=list)
    event: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    created_time: float = dataclasses.field(default_factory=time.time)
    finished: bool = False
    input_len: int = 0
    # Logprobs accumulated over the chunks of a stream, formatted ([logprob, token_id, text]).
    output_token_logprobs: List[list] = dataclasses.field(default_factory=list)
    output_top_logprobs: List[Any] = dataclasses.field(default_factory=list)
    input_token_logprobs: Optional[List[tuple]] = None
    input_top_logprobs: Optional[List[Any]] = None
    output_token_ids_logprobs: List[Any] = dataclasses.field(default_factory=list)
    input_token_ids_logprobs: Optional[List[Any]] = None
    dp_rank: Optional[int] = None  # the scheduler replica that runs it (--dp-size)


class TokenizerManager:
    def __init__(self, server_args, port_args, scheduler_info: Dict[str, Any],
                 is_scheduler_alive: Optional[Callable[[], bool]] = None, tokenizer=None, replica_loads=None):
        """`replica_loads`: with --dp-size > 1, each replica's `ReplicaLoad` (what the
        shortest-queue dispatch reads)."""
        import zmq
        import zmq.asyncio

        self.server_args = server_args
        self.scheduler_info = scheduler_info
        self.context_len = scheduler_info["context_len"]
        self.vocab_size = scheduler_info["vocab_size"]
        self.is_scheduler_alive = is_scheduler_alive or (lambda: True)
        self.tokenizer = tokenizer  # loaded by the caller (launch_engine_processes), or here
        if tokenizer is None and not server_args.skip_tokenizer_init:
            from sglang.srt.managers.tokenizer_loading import load_tokenizer

            self.tokenizer = load_tokenizer(server_args)
        self.limits = RequestLimits.from_env(self.context_len)
        self.validator = RequestValidator(server_args, self.tokenizer, self.context_len, self.vocab_size, self.limits)
        # token id -> its text, for logprobs with text (the vocabulary bounds it).
        self._token_texts: Dict[int, Optional[str]] = {}
        self.ctx = zmq.asyncio.Context(2)
        self.recv_from_detokenizer = self.ctx.socket(zmq.PULL)
        bind_private(self.recv_from_detokenizer, port_args.tokenizer_ipc_name)
        self.dp_size = max(int(server_args.dp_size or 1), 1)
        self.schedulers = self._connect_schedulers(server_args, port_args, replica_loads)
        self.rid_to_state: Dict[str, ReqState] = {}
        self.control_waiters: Dict[type, List[_Gather]] = {}
        self.handle_loop_task: Optional[asyncio.Task] = None
        self.dead_reason: Optional[str] = None
        self.gracefully_exit = False
        self.metrics = None  # set by the HTTP server when --enable-metrics
        # Running totals of finished requests (health checks excluded), for the web page.
        self.totals = {"requests": 0, "prompt_tokens": 0, "cached_tokens": 0, "completion_tokens": 0}
        self.request_logger = RequestLogger.from_server_args(server_args)  # --log-requests

    def _connect_schedulers(self, server_args, port_args, replica_loads) -> DataParallelController:
        """One PUSH socket per scheduler replica, behind the data-parallel controller."""
        import zmq

        sockets = []
        for name in replica_input_names(port_args.scheduler_input_ipc_name, self.dp_size):
            sock = self.ctx.socket(zmq.PUSH)
            sock.connect(name)
            sockets.append(sock)
        return DataParallelController(sockets, server_args.load_balance_method, replica_loads,
                                      rooms_fix_replica=server_args.disaggregation_mode == "prefill")

    def close(self) -> None:
        """Closes the sockets and their context now (the owner calls it at shutdown): left to the
        garbage collector at interpreter exit, zmq.asyncio's socket finalizer runs after asyncio is
        torn down and prints a TypeError traceback."""
        self.recv_from_detokenizer.close(linger=0)
        self.schedulers.close()
        self.ctx.term()

    # --- request in ------------------------------------------------------------------------------
    async def generate_request(self, obj: GenerateReqInput, request=None) -> AsyncIterator:
        """Yields one response dict (a list of them for a batch or n > 1); with `stream`, many chunks
        (tagged with their sequence `index` unless the request is one sequence)."""
        self.auto_create_handle_loop()
        if self.dead_reason:
            raise EngineDeadError(self.dead_reason)
        if isinstance(obj, EmbeddingReqInput) != bool(self.server_args.is_embedding):
            raise ValueError(NOT_GENERATION_MODEL if self.server_args.is_embedding else NOT_EMBEDDING_MODEL)
        obj.normalize_batch_and_arguments()
        entries = expand_request(obj, self.limits)
        try:
            # All or nothing; tokenizing runs on a worker thread, never on the event loop.
            tokenized = await run_cpu(lambda: [self.validator.validate_and_tokenize(e) for e in entries])
        except ValueError as e:
            self._tell_pd_peer(entries, str(e))
            raise
        group = obj.rid if isinstance(obj.rid, str) else None
        states = self._register(entries, tokenized, group)
        try:
            if obj.is_single and len(states) == 1:
                async for out in self._wait_one(states[0], request):
                    yield out
            elif not obj.stream:
                yield await self._wait_all(states, request)
            else:
                async for out in self._stream_all(states, request):
                    yield out
        finally:
            self._forget(states)

    def _tell_pd_peer(self, entries: List[GenerateReqInput], message: str) -> None:
        """A PD server refused a request the router also sent to its peer: the scheduler tells
        the peer, so that it does not wait for this request until a timeout."""
        if self.server_args.disaggregation_mode == "null":
            return
        by_host = {}
        for e in entries:
            if isinstance(e.bootstrap_host, str) and isinstance(e.bootstrap_room, int):
                by_host.setdefault((e.bootstrap_host, e.bootstrap_port), []).append(e.bootstrap_room)
        for (host, port), rooms in by_host.items():
            self.schedulers.broadcast(RejectedRequest(host, port if isinstance(port, int) else None, rooms, message, 400))

    def _register(self, entries, tokenized, group) -> List[ReqState]:
        routed = [e.routed_dp_rank if e.routed_dp_rank is not None else e.data_parallel_rank for e in entries]
        if self.dp_size > 1:
            for r in routed:
                check_routed_rank(r, self.dp_size)
        seen = set()
        for t in tokenized:
            if t.rid in self.rid_to_state or t.rid in seen:
                raise ValueError(f"Duplicate request ID detected: {t.rid}")
            seen.add(t.rid)
        states = []
        for e, t in zip(entries, tokenized):
            state = ReqState(obj=e, group=group, input_len=len(t.input_ids))
            self.rid_to_state[t.rid] = state
            states.append(state)
        try:
            ranks = self.schedulers.send_requests(tokenized, routed)
        except Exception:  # e.g. a value the channel cannot encode: nothing was sent, forget it all
            for t in tokenized:
                self.rid_to_state.pop(t.rid, None)
                self.schedulers.forget(t.rid)
            raise
        for st, rank in zip(states, ranks):
            st.dp_rank = rank
        for e, t in zip(entries, tokenized):
            if self.metrics is not None and e.log_metrics:  # health checks are not requests
                self.metrics.on_request_start(t.rid, len(t.input_ids))
        for e in entries:
            if self.request_logger is not None:
                self.request_logger.on_receive(e)
        return states

    def _forget(self, states: List[ReqState]) -> None:
        """The caller stopped listening: abort what still runs, drop the states."""
        for st in states:
            rid = st.obj.rid
            if not st.finished and rid in self.rid_to_state:
                self.schedulers.abort(rid)
            self.rid_to_state.pop(rid, None)
            self.schedulers.forget(rid)

    async def _wait_one(self, state: ReqState, request=None) -> AsyncIterator[dict]:
        rid = state.obj.rid
        while True:
            try:
                await asyncio.wait_for(state.event.wait(), timeout=DISCONNECT_CHECK_INTERVAL_S)
            except asyncio.TimeoutError:
                if request is not None and await request.is_disconnected():
                    raise ValueError(f"Request is disconnected from the client side (rid={rid}). Abort request.")
                continue
            # Drain and read `finished` together: while this generator is suspended in a yield, the
            # handle loop may append the final chunk and set `finished`; that chunk is in the next
            # drain, so returning on the flag read after the yields would lose it.
            outs, state.out_list = state.out_list, []
            finished = state.finished
            state.event.clear()
            for out in outs:
                if state.obj.stream or (finished and out is outs[-1]):
                    yield out
            if finished:
                return
            if request is not None and not state.obj.stream and await request.is_disconnected():
                raise ValueError(f"Request is disconnected from the client side (rid={rid}). Abort request.")

    async def _wait_all(self, states: List[ReqState], request) -> List[dict]:
        results: List[Optional[dict]] = [None] * len(states)

        async def collect(i: int, st: ReqState) -> None:
            async for out in self._wait_one(st, request):
                results[i] = out

        await _run_all([collect(i, st) for i, st in enumerate(states)])
        return results

    async def _stream_all(self, states: List[ReqState], request) -> AsyncIterator[dict]:
        """Interleaves the chunks of several sequences, each tagged with its index."""
        queue: asyncio.Queue = asyncio.Queue()
        done = object()

        async def pump(i: int, st: ReqState) -> None:
            try:
                async for out in self._wait_one(st, request):
                    out["index"] = i
                    await queue.put(out)
            finally:
                await queue.put(done)

        tasks = [asyncio.ensure_future(pump(i, st)) for i, st in enumerate(states)]
        try:
            remaining = len(tasks)
            while remaining:
                item = await queue.get()
                if item is done:
                    remaining -= 1
                    continue
                yield item
            for t in tasks:
                t.result()  # re-raise a pump's error
        finally:
            for t in tasks:
                t.cancel()

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        """Aborts the sequence `rid`, or every sequence of the request the client called `rid`
        (a batch or `n > 1` has rids `rid_0 ... rid_{k}`); exact matches only."""
        if abort_all:
            self.schedulers.abort(abort_all=True)
            return
        for r, st in list(self.rid_to_state.items()):
            if r == rid or (st.group is not None and st.group == rid):
                self.schedulers.abort(r)

    # --- outputs back --------------------------------------------------------------------------------
    def auto_create_handle_loop(self) -> None:
        if self.handle_loop_task is None or self.handle_loop_task.done():
            self.handle_loop_task = asyncio.get_event_loop().create_task(self.handle_loop())

    async def handle_loop(self) -> None:
        while True:
            if await self.recv_from_detokenizer.poll(timeout=1000) == 0:
                if not self.is_scheduler_alive():
                    self._on_scheduler_death()
                    return
                continue
            msg = await recv_msg_async(self.recv_from_detokenizer, "tokenizer input")
            if msg is None:  # not one of our messages: dropped (and logged)
                continue
            try:
                if isinstance(msg, BatchStrOutput):
                    self._handle_batch_output(msg)
                else:
                    self._handle_control_reply(msg)
            except Exception:  # noqa: BLE001 - one bad output must not stop every other request
                logger.exception("TokenizerManager failed to handle a %s; its requests are aborted.", type(msg).__name__)
                for rid in getattr(msg, "rids", []) or []:
                    self._fail(rid, "Internal server error while handling the request's output.", 500)

    def _on_scheduler_death(self) -> None:
        self.dead_reason = "The scheduler process died; the server cannot serve requests. Check the server log."
        logger.error(self.dead_reason)
        for rid in list(self.rid_to_state):
            self._fail(rid, self.dead_reason, 500)

    def _fail(self, rid: str, message: str, status_code: int) -> None:
        st = self.rid_to_state.get(rid)
        if st is None or st.finished:
            return
        st.out_list.append(self._abort_output(rid, st, message, status_code))
        st.finished = True
        st.event.set()
        self.schedulers.abort(rid)

    def _abort_output(self, rid, st, message, status_code) -> dict:
        return {
            "text": "",
            "output_ids": [],
            "meta_info": {
                "id": rid,
                "finish_reason": {"type": "abort", "message": message, "status_code": status_code, "err_type": None},
                "prompt_tokens": st.input_len,
                "completion_tokens": 0,
                "cached_tokens": 0,
                "num_retractions": 0,
                "weight_version": self.server_args.weight_version,
                "e2e_latency": time.time() - st.created_time,
            },
        }

    def _handle_batch_output(self, out: BatchStrOutput) -> None:
        for i, rid in enumerate(out.rids):
            st = self.rid_to_state.get(rid)
            if st is None or st.finished:
                continue
            reason = out.finished_reasons[i]
            meta = {
                "id": rid,
                "finish_reason": reason,
                "prompt_tokens": out.prompt_tokens[i],
                "completion_tokens": out.completion_tokens[i],
                "cached_tokens": out.cached_tokens[i],
                "num_retractions": out.retraction_counts[i],
                "weight_version": self.server_args.weight_version,
            }
            if self.dp_size > 1:  # upstream's meta_info field: the replica that ran it
                meta["dp_rank"] = st.dp_rank
            if st.obj.return_logprob:
                self._add_logprobs(meta, st, out, i)
            item = {"text": out.output_strs[i], "output_ids": list(out.output_ids[i]), "meta_info": meta}
            if self.server_args.skip_tokenizer_init:
                item.pop("text")
            if self.server_args.is_embedding:  # upstream's embedding output: the vector and meta_info
                item = {"embedding": _at(out.embeddings, i), "meta_info": meta}
            if reason is not None:
                meta["e2e_latency"] = time.time() - st.created_time
                st.finished = True
                if reason.get("type") == "abort" and reason.get("status_code") == 500:
                    # e.g. the detokenizer failed it: make sure the scheduler stops it too (a no-op
                    # when the scheduler is the one that ended it).
                    self.schedulers.abort(rid)
                if st.obj.log_metrics:
                    self._count_finished(out, i)
                if self.metrics is not None and st.obj.log_metrics:
                    self.metrics.on_request_finish(rid, out.prompt_tokens[i], out.completion_tokens[i],
                                                   out.cached_tokens[i], meta["e2e_latency"],
                                                   aborted=reason.get("type") == "abort")
                if self.request_logger is not None:
                    self.request_logger.on_finish(st.obj, item)
            elif self.metrics is not None and st.obj.log_metrics:
                self.metrics.on_tokens(rid, out.completion_tokens[i])
            st.out_list.append(item)
            st.event.set()

    def _count_finished(self, out: BatchStrOutput, i: int) -> None:
        t = self.totals
        t["requests"] += 1
        t["prompt_tokens"] += out.prompt_tokens[i]
        t["cached_tokens"] += out.cached_tokens[i]
        t["completion_tokens"] += out.completion_tokens[i]

    def _add_logprobs(self, meta: dict, st: ReqState, out: BatchStrOutput, i: int) -> None:
        """Each position's logprobs are formatted once, when they arrive (formatting the whole
        history again for every chunk of a stream made streaming quadratic); every chunk's
        meta_info gets a snapshot of the lists so far, as upstream (cumulative)."""
        with_text = st.obj.return_text_in_logprobs

        def fmt(pairs):
            if pairs is None:
                return []
            if not with_text:
                return [[lp, tid, None] for lp, tid in pairs]
            return [[lp, tid, self._tok_text(tid)] for lp, tid in pairs]

        def fmt_rows(rows):
            return [fmt(t) if t else None for t in (rows or [])]

        st.output_token_logprobs.extend(fmt(out.output_token_logprobs[i] or []))
        st.output_top_logprobs.extend(fmt_rows(out.output_top_logprobs[i]))
        st.output_token_ids_logprobs.extend(fmt_rows(_at(out.output_token_ids_logprobs, i)))
        if out.input_token_logprobs[i] is not None:
            st.input_token_logprobs = fmt(out.input_token_logprobs[i])
            st.input_top_logprobs = fmt_rows(out.input_top_logprobs[i])
            st.input_token_ids_logprobs = fmt_rows(_at(out.input_token_ids_logprobs, i))

        meta["input_token_logprobs"] = st.input_token_logprobs or []
        meta["output_token_logprobs"] = list(st.output_token_logprobs)
        meta["output_token_logprobs_length"] = len(st.output_token_logprobs)
        meta["input_top_logprobs"] = st.input_top_logprobs or []
        meta["output_top_logprobs"] = list(st.output_top_logprobs)
        if st.obj.token_ids_logprob is not None:  # upstream's keys, one list per position
            meta["input_token_ids_logprobs"] = st.input_token_ids_logprobs or []
            meta["output_token_ids_logprobs"] = list(st.output_token_ids_logprobs)

    def _tok_text(self, tid):
        """A token's text, decoded once per token id (the vocabulary bounds the cache)."""
        if self.tokenizer is None:
            return None
        text = self._token_texts.get(tid)
        if text is None:
            text = self._token_texts[tid] = self.tokenizer.decode([tid])
        return text

    # --- control ---------------------------------------------------------------------------------------
    async def _control(self, req, reply_type, timeout: float = 60) -> list:
        """Sends `req` to every replica; returns their replies in dp_rank order."""
        self.auto_create_handle_loop()
        gather = _Gather(asyncio.get_event_loop().create_future(), set(range(self.schedulers.size)))
        self.control_waiters.setdefault(reply_type, []).append(gather)
        self.schedulers.broadcast(req)
        try:
            return await asyncio.wait_for(gather.future, timeout)
        finally:
            waiters = self.control_waiters.get(reply_type, [])
            if gather in waiters:
                waiters.remove(gather)

    def _handle_control_reply(self, msg) -> None:
        """Each replica answers control messages in the order it got them, so a reply belongs to
        the oldest waiter that has none from its replica yet."""
        rank = getattr(msg, "dp_rank", 0)
        waiters = self.control_waiters.get(type(msg), [])
        for gather in waiters:
            if rank in gather.pending:
                gather.add(rank, msg)
                if gather.future.done():
                    waiters.remove(gather)
                return

    async def flush_cache(self) -> FlushCacheReqOutput:
        replies = await self._control(FlushCacheReqInput(), FlushCacheReqOutput)
        return FlushCacheReqOutput(success=all(r.success for r in replies))

    async def get_internal_states(self) -> List[dict]:
        """One internal state per replica, in dp_rank order."""
        replies: List[GetInternalStateReqOutput] = await self._control(GetInternalStateReq(), GetInternalStateReqOutput)
        return [r.internal_state for r in replies]

    async def get_internal_state(self) -> dict:
        """The scheduler's internal state; with several replicas, their counts summed
        (`sum_internal_states`)."""
        states = await self.get_internal_states()
        return states[0] if len(states) == 1 else sum_internal_states(states)


@dataclasses.dataclass
class _Gather:
    """A control request sent to every replica: the replies so far, by dp_rank."""

    future: asyncio.Future
    pending: set
    replies: Dict[int, Any] = dataclasses.field(default_factory=dict)

    def add(self, rank: int, msg) -> None:
        self.pending.discard(rank)
        self.replies[rank] = msg
        if not self.pending and not self.future.done():
            self.future.set_result([self.replies[r] for r in sorted(self.replies)])


def abort_reason(output: Optional[dict]) -> Optional[dict]:
    """The finish reason of an output that was aborted (`{"type": "abort", "message", "status_code"}`), else None."""
    reason = (output or {}).get("meta_info", {}).get("finish_reason")
    return reason if isinstance(reason, dict) and reason.get("type") == "abort" else None


def _at(values: list, i: int):
    return values[i] if i < len(values) else None


async def _run_all(coros) -> None:
    """Runs coroutines concurrently; the first error cancels the others and is raised."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
