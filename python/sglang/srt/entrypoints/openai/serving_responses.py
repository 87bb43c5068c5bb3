"""`POST /v1/responses` (OpenAI's Responses API: text, function tools, reasoning items), with
`GET /v1/responses/{id}` and `POST /v1/responses/{id}/cancel`, as upstream SGLang serves them.

A request becomes chat messages (`instructions` as the system message, then the conversation
of `previous_response_id`, then `input`: a string is one user message, a list holds message
items whose content is a string or `input_text` / `output_text` parts, and `function_call`,
`function_call_output` and `reasoning` items, `responses_items.py`) and runs as one chat
completion (`OpenAIServingChat`'s template, sampling mapping, tool-call and reasoning parsers, and
the constraint of tool_choice "required" / a named function). The output is a `reasoning` item,
a `message` item and one `function_call` item per call, as they apply. Stored responses
(`store`, default true) live in this process's memory, the newest `MAX_STORED_RESPONSES`, so a
later request can continue from them; they are lost on restart.

Streams are upstream's (and OpenAI's) typed events, `event: <type>` + `data: <json>` with a
`sequence_number`: response.created, response.in_progress, response.output_item.added,
response.content_part.added, response.output_text.delta..., response.output_text.done,
response.content_part.done, response.output_item.done, response.completed (no `[DONE]`); function
calls stream as response.function_call_arguments.delta / .done, reasoning as
response.reasoning_text.delta / .done, each inside its own output_item.added / .done.
Usage is OpenAI's (`input_tokens`, `output_tokens`, their details, `total_tokens`) in both the
streamed and the plain response; the plain one also keeps upstream's `prompt_tokens` /
`completion_tokens` keys. Not served here: background mode, OpenAI's hosted tools.

On a PD server each turn runs through the deployment's router instead (`responses_via_router.py`:
the real router answers 501 for this route in PD mode, so `launch_pd` users call the decode
server's `/v1/responses`): the rendered prompt goes to the router's /generate and the text comes
back here to be parsed, as on a plain server.
"""

from __future__ import annotations

import collections
import os
import time
import uuid
from typing import Any, Dict, List, Optional, Union

import orjson
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import Field

from sglang.srt.managers.cpu_work_pool import run_cpu
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, _Lenient
from sglang.srt.entrypoints.openai.responses_items import (ResponseItemStream, assistant_turn, call_messages,
                                                          chat_tool_choice, chat_tools, whole_items)
from sglang.srt.entrypoints.openai.responses_via_router import RouterError, generate_through_router
from sglang.srt.entrypoints.openai.serving_base import abort_error, chain_outputs, first_output
from sglang.srt.entrypoints.web_ui import WEB_API_BASE_ENV
from sglang.srt.managers.tokenizer_manager import EngineDeadError, abort_reason

MAX_STORED_RESPONSES = 10000


class ResponsesRequest(_Lenient):
    input: Union[str, List[Dict[str, Any]]]
    model: Optional[str] = None
    instructions: Optional[str] = None
    max_output_tokens: Optional[int] = None
    previous_response_id: Optional[str] = None
    store: Optional[bool] = True
    stream: Optional[bool] = False
    background: Optional[bool] = False
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop: Optional[Union[str, List[str]]] = None
    metadata: Optional[Dict[str, Any]] = None
    user: Optional[str] = None
    tools: List[Dict[str, Any]] = Field(default_factory=list)
    tool_choice: Any = "auto"
    parallel_tool_calls: Optional[bool] = True
    truncation: Optional[str] = "disabled"
    reasoning: Optional[Dict[str, Any]] = None
    request_id: str = Field(default_factory=lambda: f"resp_{uuid.uuid4().hex}")
    priority: Optional[int] = None


def _error(message: str, status_code: int = 400, param: Optional[str] = None,
           err_type: str = "invalid_request_error") -> JSONResponse:
    """The Responses routes' error envelope (nested, as OpenAI and upstream)."""
    return JSONResponse(status_code=status_code, content={"error": {"message": message, "type": err_type,
                                                                    "param": param, "code": status_code}})


def _check_id(response_id: str, store: "ResponseStore") -> Optional[JSONResponse]:
    if not response_id.startswith("resp"):
        return _error(f"Invalid 'response_id': '{response_id}'. Expected an ID that begins with 'resp'.",
                      param="response_id")
    if response_id not in store.responses:
        return _error(f"Response with id '{response_id}' not found.", 404, param="response_id")
    return None


class ResponseStore:
    """Stored responses and the conversation each continued, newest `limit` kept."""

    def __init__(self, limit: int = MAX_STORED_RESPONSES):
        self.limit = limit
        self.responses: "collections.OrderedDict[str, dict]" = collections.OrderedDict()
        self.messages: Dict[str, List[dict]] = {}

    def put(self, response: dict, messages: List[dict]) -> None:
        rid = response["id"]
        self.responses[rid] = response
        self.messages[rid] = messages
        while len(self.responses) > self.limit:
            old, _ = self.responses.popitem(last=False)
            self.messages.pop(old, None)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text"):
            raise ValueError(f"Content of type '{kind}' is not supported by this server yet: only text.")
        texts.append(part.get("text") or "")
    return "".join(texts)


def input_messages(request: ResponsesRequest, history: List[dict]) -> List[dict]:
    """The chat messages of this turn: system instructions, the stored conversation, the input."""
    msgs = [{"role": "system", "content": request.instructions}] if request.instructions else []
    msgs += [m for m in history if m["role"] != "system"]
    if isinstance(request.input, str):
        msgs.append({"role": "user", "content": request.input})
        return msgs
    pending_reasoning: List[str] = []
    for item in request.input:
        kind = item.get("type", "message")
        if kind in ("function_call", "function_call_output", "reasoning"):
            call_messages(item, msgs, pending_reasoning)
            continue
        if kind != "message":
            raise ValueError(f"Input items of type '{kind}' are not supported by this server: only messages, "
                             "function_call, function_call_output and reasoning items.")
        role = item.get("role", "user")
        if role == "developer":
            role = "system"
        if role not in ("user", "assistant", "system"):
            raise ValueError(f"Unknown role '{role}' in a message input item.")
        msg = {"role": role, "content": _content_text(item.get("content"))}
        if role == "assistant" and pending_reasoning:
            msg["reasoning_content"] = "".join(pending_reasoning)
            pending_reasoning.clear()
        msgs.append(msg)
    return msgs


def _usage(meta: dict, report_cached: bool = True) -> dict:
    prompt, completion = meta.get("prompt_tokens", 0), meta.get("completion_tokens", 0)
    cached = meta.get("cached_tokens", 0)
    return {
        "input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


class OpenAIServingResponses:
    def __init__(self, ctx, chat):
        self.ctx = ctx
        self.chat = chat  # OpenAIServingChat: template, sampling mapping
        self.store = ResponseStore()

    # --- the response object ---------------------------------------------------------------------
    def _response(self, request: ResponsesRequest, status: str, output: List[dict], usage: Optional[dict],
                  created_at: int) -> dict:
        return {
            "id": request.request_id, "object": "response", "created_at": created_at,
            "model": request.model or self.ctx.served_model_name, "status": status, "output": output,
            "usage": usage, "error": None, "incomplete_details": None, "instructions": request.instructions,
            "max_output_tokens": request.max_output_tokens, "previous_response_id": request.previous_response_id,
            "parallel_tool_calls": bool(request.parallel_tool_calls), "tool_choice": request.tool_choice,
            "tools": request.tools, "reasoning": {"effort": (request.reasoning or {}).get("effort"), "summary": None},
            "store": request.store, "temperature": request.temperature, "top_p": request.top_p,
            "truncation": request.truncation, "user": request.user, "metadata": request.metadata or {},
            "text": {"format": {"type": "text"}},
        }

    # --- routes ------------------------------------------------------------------------------------------
    async def create(self, request: ResponsesRequest, raw_request: Request):
        if request.background:
            return _error("Background responses are not supported by this server: send the request without "
                          "'background' (or stream it).", param="background")
        history: List[dict] = []
        if request.previous_response_id is not None:
            err = _check_id(request.previous_response_id, self.store)
            if err is not None:
                return err
            history = self.store.messages[request.previous_response_id]
        dead = self.ctx.dead_reason()
        if dead:
            return _error(dead, 503, err_type="ServiceUnavailable")
        try:
            messages = input_messages(request, history)
            tools = chat_tools(request.tools)
            chat_request = ChatCompletionRequest(
                tools=tools, tool_choice=chat_tool_choice(request.tool_choice) if tools else None,
                parallel_tool_calls=request.parallel_tool_calls is not False,
                messages=messages, model=request.model or self.ctx.served_model_name,
                max_completion_tokens=request.max_output_tokens, temperature=request.temperature,
                top_p=request.top_p, top_k=request.top_k, min_p=request.min_p,
                repetition_penalty=request.repetition_penalty, frequency_penalty=request.frequency_penalty,
                presence_penalty=request.presence_penalty, stop=request.stop, stream=bool(request.stream),
                rid=request.request_id, priority=request.priority, user=request.user,
            )
            error = self.chat._validate(chat_request)
            if error:
                return _error(error)
            obj = await run_cpu(self.chat._convert, chat_request)  # template + tokenizer off the loop
            if self.ctx.server_args.disaggregation_mode != "null":
                agen = self._via_router(obj)
            else:
                agen = self.ctx.tokenizer_manager.generate_request(obj, raw_request)
            first = await first_output(agen)
        except RouterError as e:
            return _error(e.message, e.status_code)
        except ValueError as e:
            return _error(str(e))
        except EngineDeadError as e:
            return _error(str(e), 503, err_type="ServiceUnavailable")
        aborted = abort_error([first] if first is not None else [])
        if aborted is not None:
            return _error(aborted.message, aborted.status_code)
        created_at = int(time.time())
        if request.stream:
            return StreamingResponse(self._events(request, chat_request, messages, first, agen, created_at),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "Connection": "keep-alive"})
        meta = first["meta_info"]
        output = whole_items(*self.chat._output(chat_request).whole(first["text"]))
        usage = _usage(meta)
        usage.update(prompt_tokens=usage["input_tokens"], completion_tokens=usage["output_tokens"])
        response = self._response(request, "completed", output, usage, created_at)
        self._remember(request, messages, response)
        return Response(content=orjson.dumps(response), media_type="application/json")

    def _via_router(self, obj):
        """A PD server cannot generate alone: the turn goes through the deployment's router
        (`responses_via_router.py`)."""
        base = os.environ.get(WEB_API_BASE_ENV)
        if not base:
            raise ValueError(f"This is a PD {self.ctx.server_args.disaggregation_mode} server: it serves /v1/responses "
                             f"through the deployment's router, whose URL it gets from {WEB_API_BASE_ENV} (launch_pd "
                             "sets it). Set it, or send the request to a plain server.")
        body = {"input_ids": obj.input_ids, "sampling_params": obj.sampling_params, "stream": bool(obj.stream)}
        return generate_through_router(base, body, self.ctx.server_args.api_key)

    def _remember(self, request: ResponsesRequest, messages: List[dict], response: dict) -> None:
        if request.store:
            self.store.put(response, messages + [assistant_turn(response["output"])])

    async def _events(self, request: ResponsesRequest, chat_request, messages: List[dict], first, agen,
                      created_at: int):
        seq = 0

        def event(kind: str, **fields) -> bytes:
            nonlocal seq
            payload = {"type": kind, "sequence_number": seq, **fields}
            seq += 1
            return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"

        base = self._response(request, "in_progress", [], None, created_at)
        yield event("response.created", response=base)
        yield event("response.in_progress", response=base)
        proc, stream = self.chat._output(chat_request), ResponseItemStream(event)
        text, meta = "", {}
        outputs = chain_outputs(first, agen)
        try:
            async for out in outputs:
                meta = out["meta_info"]
                delta, text = out["text"][len(text):], out["text"]
                for chunk in stream.pieces(proc.delta(delta) if delta else []):
                    yield chunk
                if meta.get("finish_reason"):
                    for chunk in stream.pieces(proc.end()):
                        yield chunk
        except Exception as e:  # noqa: BLE001 - the stream ends with response.failed, not a cut connection
            failed = self._response(request, "failed", [], None, created_at)
            failed["error"] = {"code": "server_error", "message": str(e)}
            yield event("response.failed", response=failed)
            return
        finally:
            await outputs.aclose()
        for chunk in stream.close():
            yield chunk
        output = stream.items
        reason = abort_reason({"meta_info": meta})
        if reason is not None:
            failed = self._response(request, "failed", output, _usage(meta), created_at)
            failed["error"] = {"code": "server_error", "message": str(reason.get("message") or "aborted")}
            yield event("response.failed", response=failed)
            return
        response = self._response(request, "completed", output, _usage(meta), created_at)
        self._remember(request, messages, response)
        yield event("response.completed", response=response)

    def retrieve(self, response_id: str):
        err = _check_id(response_id, self.store)
        if err is not None:
            return err
        return Response(content=orjson.dumps(self.store.responses[response_id]), media_type="application/json")

    def cancel(self, response_id: str):
        err = _check_id(response_id, self.store)
        if err is not None:
            return err
        return _error("Cannot cancel a synchronous response.")


def add_responses_routes(app, ctx, chat, parse_body) -> None:
    serving = OpenAIServingResponses(ctx, chat)

    @app.post("/v1/responses")
    async def v1_responses(raw_request: Request):
        return await serving.create(await parse_body(raw_request, ResponsesRequest), raw_request)

    @app.get("/v1/responses/{response_id}")
    async def v1_retrieve_response(response_id: str):
        return serving.retrieve(response_id)

    @app.post("/v1/responses/{response_id}/cancel")
    async def v1_cancel_response(response_id: str):
        return serving.cancel(response_id)
