"""The front of the engine, in the main process: tokenizes requests, sends them to the
scheduler, and turns the detokenizer's outputs back into response dicts (streamed or whole).

Both the HTTP server and the offline `Engine` call `generate_request`, so there is one path.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any, AsyncIterator, Callable, Dict, List, Optional

from sglang.srt.managers.io_struct import (
    AbortReq,
    BatchStrOutput,
    FlushCacheReqInput,
    FlushCacheReqOutput,
    GenerateReqInput,
    GetInternalStateReq,
    GetInternalStateReqOutput,
    TokenizedGenerateReqInput,
    new_rid,
)

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class ReqState:
    obj: GenerateReqInput
    out_list: List[dict]
    event: asyncio.Event
    created_time: float
    finished: bool = False


class TokenizerManager:
    def __init__(self, server_args, port_args, scheduler_info: Dict[str, Any],
                 is_scheduler_alive: Optional[Callable[[], bool]] = None):
        import zmq
        import zmq.asyncio

        self.server_args = server_args
        self.scheduler_info = scheduler_info
        self.context_len = scheduler_info["context_len"]
        self.vocab_size = scheduler_info["vocab_size"]
        self.is_scheduler_alive = is_scheduler_alive or (lambda: True)
        self.tokenizer = None
        if not server_args.skip_tokenizer_init:
            from sglang.srt.managers.tokenizer_loading import load_tokenizer

            self.tokenizer = load_tokenizer(server_args)
        self.ctx = zmq.asyncio.Context(2)
        self.recv_from_detokenizer = self.ctx.socket(zmq.PULL)
        self.recv_from_detokenizer.bind(port_args.tokenizer_ipc_name)
        self.send_to_scheduler = self.ctx.socket(zmq.PUSH)
        self.send_to_scheduler.connect(port_args.scheduler_input_ipc_name)
        self.rid_to_state: Dict[str, ReqState] = {}
        self.control_waiters: Dict[type, List[asyncio.Future]] = {}
        self.handle_loop_task: Optional[asyncio.Task] = None
        self.dead_reason: Optional[str] = None
        self.gracefully_exit = False
        self.metrics = None  # set by the HTTP server when --enable-metrics
        self.fake_bootstrap_room_counter = 0  # PD with the fake backend: rooms are local counters

    # --- request in ------------------------------------------------------------------------------
    def _validate_and_tokenize(self, obj: GenerateReqInput) -> TokenizedGenerateReqInput:
        from sglang.srt.sampling.sampling_params import SamplingParams

        if obj.input_ids is not None:
            input_ids = list(obj.input_ids)
            text = None
        else:
            if self.tokenizer is None:
                raise ValueError("The engine initialized with skip_tokenizer_init=True cannot accept text prompts. Please provide input_ids or re-initialize the engine with skip_tokenizer_init=False.")
            text = obj.text
            input_ids = self.tokenizer.encode(text)
        n = len(input_ids)
        if n >= self.context_len:
            raise ValueError(f"The input ({n} tokens) is longer than the model's context length ({self.context_len} tokens).")
        sp_dict = dict(obj.sampling_params or {})
        max_new = sp_dict.get("max_new_tokens")
        if max_new is not None and max_new + n >= self.context_len:
            raise ValueError(
                f"Requested token count exceeds the model's maximum context length of {self.context_len} tokens. "
                f"You requested a total of {max_new + n} tokens: {n} tokens from the input messages and "
                f"{max_new} tokens for the completion. Please reduce the number of tokens in the input messages "
                f"or the completion to fit within the limit."
            )
        try:
            sp = SamplingParams(**sp_dict)
        except TypeError as e:
            raise ValueError(f"Invalid sampling parameters: {e}") from None
        sp.normalize(self.tokenizer)
        sp.verify(self.vocab_size)
        if (
            self.server_args.disaggregation_mode != "null"
            and self.server_args.disaggregation_transfer_backend == "fake"
            and obj.bootstrap_room is None
        ):
            obj.bootstrap_room = self.fake_bootstrap_room_counter
            self.fake_bootstrap_room_counter += 1
        return TokenizedGenerateReqInput(
            rid=obj.rid,
            input_text=text,
            input_ids=input_ids,
            sampling_params=sp,
            return_logprob=bool(obj.return_logprob),
            logprob_start_len=-1 if obj.logprob_start_len is None else obj.logprob_start_len,
            top_logprobs_num=obj.top_logprobs_num or 0,
            stream=obj.stream,
            bootstrap_host=obj.bootstrap_host,
            bootstrap_port=obj.bootstrap_port,
            bootstrap_room=obj.bootstrap_room,
            priority=obj.priority,
            extra_key=_combine_extra_key(obj.extra_key, obj.cache_salt),
        )

    def _expand(self, obj: GenerateReqInput) -> List[GenerateReqInput]:
        """One entry per (prompt, sample): a batch and/or n > 1 becomes several single requests."""
        entries = obj.split()
        out = []
        for e in entries:
            sp = dict(e.sampling_params or {})
            n = sp.pop("n", 1) or 1
            if n == 1:
                e.sampling_params = sp
                e.rid = e.rid or new_rid()
                out.append(e)
                continue
            base = e.rid or new_rid()
            for k in range(n):
                c = dataclasses.replace(e, sampling_params=dict(sp), rid=f"{base}_{k}")
                out.append(c)
        return out

    async def generate_request(self, obj: GenerateReqInput, request=None) -> AsyncIterator:
        """Yields one response dict (or a list of them for a batch); with `stream`, many chunks."""
        self.auto_create_handle_loop()
        if self.dead_reason:
            raise RuntimeError(self.dead_reason)
        obj.normalize_batch_and_arguments()
        n = (obj.sampling_params or {}).get("n", 1) if isinstance(obj.sampling_params, dict) else 1
        entries = self._expand(obj)
        tokenized = [self._validate_and_tokenize(e) for e in entries]  # reject the whole batch before sending
        states = []
        for e, t in zip(entries, tokenized):
            states.append(self._send(e, t))
        if obj.is_single and (n or 1) == 1:
            async for out in self._wait_one(entries[0].rid, states[0], request):
                yield out
            return
        if not obj.stream:
            results = []
            for e, st in zip(entries, states):
                last = None
                async for out in self._wait_one(e.rid, st, request):
                    last = out
                results.append(last)
            yield results
            return
        # Streaming a batch: interleave chunks, tagged with their index.
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(i, rid, st):
            try:
                async for out in self._wait_one(rid, st, request):
                    out["index"] = i
                    await queue.put(out)
            finally:
                await queue.put(None)

        tasks = [asyncio.create_task(pump(i, e.rid, st)) for i, (e, st) in enumerate(zip(entries, states))]
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
            else:
                yield item

    def _send(self, obj: GenerateReqInput, tokenized: TokenizedGenerateReqInput) -> ReqState:
        state = ReqState(obj=obj, out_list=[], event=asyncio.Event(), created_time=time.time())
        if tokenized.rid in self.rid_to_state:
            raise ValueError(f"Duplicate request ID: {tokenized.rid}")
        self.rid_to_state[tokenized.rid] = state
        self.send_to_scheduler.send_pyobj(tokenized)
        if self.metrics is not None:
            self.metrics.on_request_start(len(tokenized.input_ids))
        return state

    async def _wait_one(self, rid: str, state: ReqState, request=None) -> AsyncIterator[dict]:
        try:
            while True:
                try:
                    await asyncio.wait_for(state.event.wait(), timeout=4)
                except asyncio.TimeoutError:
                    if request is not None and await request.is_disconnected():
                        self.abort_request(rid)
                        raise ValueError(f"Request is disconnected from the client side (rid={rid}). Abort request.")
                    continue
                outs, state.out_list = state.out_list, []
                state.event.clear()
                for out in outs:
                    if state.obj.stream or state.finished and out is outs[-1]:
                        yield out
                if state.finished:
                    return
                if request is not None and await request.is_disconnected():
                    self.abort_request(rid)
                    raise ValueError(f"Request is disconnected from the client side (rid={rid}). Abort request.")
        finally:
            if not state.finished:
                self.abort_request(rid)
            self.rid_to_state.pop(rid, None)

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        if not abort_all and rid not in self.rid_to_state:
            return
        self.send_to_scheduler.send_pyobj(AbortReq(rid=rid, abort_all=abort_all))

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
            msg = await self.recv_from_detokenizer.recv_pyobj()
            if isinstance(msg, BatchStrOutput):
                self._handle_batch_output(msg)
            else:
                for fut in self.control_waiters.pop(type(msg), []):
                    if not fut.done():
                        fut.set_result(msg)

    def _on_scheduler_death(self) -> None:
        self.dead_reason = "The scheduler process died; the server cannot serve requests. Check the server log."
        logger.error(self.dead_reason)
        for rid, st in list(self.rid_to_state.items()):
            st.out_list.append(self._abort_output(rid, st, self.dead_reason, 500))
            st.finished = True
            st.event.set()

    def _abort_output(self, rid, st, message, status_code) -> dict:
        return {
            "text": "",
            "output_ids": [],
            "meta_info": {
                "id": rid,
                "finish_reason": {"type": "abort", "message": message, "status_code": status_code, "err_type": None},
                "prompt_tokens": 0,
                "completion_tokens": 0,
                "cached_tokens": 0,
                "num_retractions": 0,
                "weight_version": "default",
                "e2e_latency": time.time() - st.created_time,
            },
        }

    def _handle_batch_output(self, out: BatchStrOutput) -> None:
        for i, rid in enumerate(out.rids):
            st = self.rid_to_state.get(rid)
            if st is None:
                continue
            reason = out.finished_reasons[i]
            meta = {
                "id": rid,
                "finish_reason": reason,
                "prompt_tokens": out.prompt_tokens[i],
                "completion_tokens": out.completion_tokens[i],
                "cached_tokens": out.cached_tokens[i],
                "num_retractions": out.retraction_counts[i],
                "weight_version": "default",
            }
            if st.obj.return_logprob:
                self._add_logprobs(meta, st, out, i)
            if reason is not None:
                meta["e2e_latency"] = time.time() - st.created_time
                st.finished = True
                if self.metrics is not None:
                    self.metrics.on_request_finish(out.prompt_tokens[i], out.completion_tokens[i], out.cached_tokens[i], meta["e2e_latency"])
            elif self.metrics is not None:
                self.metrics.on_tokens(rid, out.completion_tokens[i])
            item = {"text": out.output_strs[i], "output_ids": list(out.output_ids[i]), "meta_info": meta}
            if self.server_args.skip_tokenizer_init:
                item.pop("text")
            st.out_list.append(item)
            st.event.set()

    def _add_logprobs(self, meta: dict, st: ReqState, out: BatchStrOutput, i: int) -> None:
        acc = st.__dict__.setdefault("_logprobs", {"output_token_logprobs": [], "output_top_logprobs": [],
                                                   "input_token_logprobs": None, "input_top_logprobs": None})
        acc["output_token_logprobs"].extend(out.output_token_logprobs[i] or [])
        acc["output_top_logprobs"].extend(out.output_top_logprobs[i] or [])
        if out.input_token_logprobs[i] is not None:
            acc["input_token_logprobs"] = out.input_token_logprobs[i]
            acc["input_top_logprobs"] = out.input_top_logprobs[i]
        with_text = st.obj.return_text_in_logprobs

        def fmt(pairs):
            if pairs is None:
                return []
            return [[lp, tid, self._tok_text(tid) if with_text else None] for lp, tid in pairs]

        meta["input_token_logprobs"] = fmt(acc["input_token_logprobs"])
        meta["output_token_logprobs"] = fmt(acc["output_token_logprobs"])
        meta["output_token_logprobs_length"] = len(acc["output_token_logprobs"])
        meta["input_top_logprobs"] = [fmt(t) if t else None for t in (acc["input_top_logprobs"] or [])]
        meta["output_top_logprobs"] = [fmt(t) if t else None for t in acc["output_top_logprobs"]]

    def _tok_text(self, tid):
        return self.tokenizer.decode([tid]) if self.tokenizer is not None else None

    # --- control ---------------------------------------------------------------------------------------
    async def _control(self, req, reply_type, timeout: float = 60):
        self.auto_create_handle_loop()
        fut = asyncio.get_event_loop().create_future()
        self.control_waiters.setdefault(reply_type, []).append(fut)
        self.send_to_scheduler.send_pyobj(req)
        return await asyncio.wait_for(fut, timeout)

    async def flush_cache(self) -> FlushCacheReqOutput:
        return await self._control(FlushCacheReqInput(), FlushCacheReqOutput)

    async def get_internal_state(self) -> dict:
        out: GetInternalStateReqOutput = await self._control(GetInternalStateReq(), GetInternalStateReqOutput)
        return out.internal_state


def _combine_extra_key(extra_key, cache_salt):
    if extra_key is None and cache_salt is None:
        return None
    return f"{extra_key or ''}|{cache_salt or ''}"
