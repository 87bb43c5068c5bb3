"""`POST /v1/messages` and `POST /v1/messages/count_tokens`: Anthropic's Messages API over the chat
pipeline (upstream SGLang's `AnthropicServing`).

A request is turned into the chat request it means (`request_conversion.py`), checked and
rendered by `OpenAIServingChat` (chat template, sampling mapping, the JSON-schema constraint of
tool_choice any/tool), run through the TokenizerManager, and its text split by the chat route's
`ChoiceOutput` (reasoning parser, tool-call parser) into Anthropic blocks
(`response_conversion.py`). Unlike upstream, the OpenAI response is never built and re-parsed:
the blocks come from the same pieces the OpenAI stream is made of.

Streams are Anthropic's server-sent events, `event: <type>` + `data: <json>`: message_start (the
message with no content and the input usage), ping, then per block content_block_start,
content_block_delta..., content_block_stop, then message_delta (stop_reason, stop_sequence, the
final usage) and message_stop. A failure after the stream began is an `error` event.

Errors are Anthropic's shape, `{"type": "error", "error": {"type": "invalid_request_error",
"message": ...}}` (protocol.error_body), for validation errors too (http_server routes those here
by path).

On a PD server the request runs through the deployment's router (the real router has no
/v1/messages): its token ids and sampling params go to the router's /generate
(`responses_via_router.generate_through_router`) and the text comes back here to be parsed.
"""

from __future__ import annotations

import logging
import os
import uuid

import orjson
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from sglang.srt.entrypoints.anthropic.protocol import (
    AnthropicCountTokensRequest,
    AnthropicMessagesRequest,
    AnthropicMessagesResponse,
    error_body,
)
from sglang.srt.entrypoints.anthropic.request_conversion import to_chat_request
from sglang.srt.entrypoints.anthropic.response_conversion import StreamBlocks, stop_reason, usage, whole_content
from sglang.srt.entrypoints.openai.responses_via_router import RouterError, generate_through_router
from sglang.srt.entrypoints.openai.serving_base import abort_error, chain_outputs, finish_fields, first_output
from sglang.srt.entrypoints.web_ui import WEB_API_BASE_ENV
from sglang.srt.managers.cpu_work_pool import run_cpu
from sglang.srt.managers.request_limits import clip_message
from sglang.srt.managers.tokenizer_manager import EngineDeadError, abort_reason

logger = logging.getLogger(__name__)


def anthropic_error(message: str, status_code: int = 400) -> JSONResponse:
    return JSONResponse(status_code=status_code, content=error_body(clip_message(message), status_code))


def _sse(kind: str, payload: dict) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


class AnthropicServing:
    def __init__(self, ctx, chat):
        self.ctx = ctx
        self.chat = chat  # OpenAIServingChat: template, sampling mapping, parsers

    def _chat_request(self, request):
        return to_chat_request(request, self.chat.reasoning_parser)

    # --- count_tokens ----------------------------------------------------------------------------
    async def count_tokens(self, request: AnthropicCountTokensRequest) -> Response:
        try:
            chat_request = self._chat_request(request)
            if self.ctx.tokenizer_manager.tokenizer is None:
                raise ValueError("Counting tokens needs the tokenizer; the server runs with --skip-tokenizer-init.")
            ids = await run_cpu(self.chat.prompt_ids, chat_request)
        except ValueError as e:
            return anthropic_error(str(e))
        return Response(content=orjson.dumps({"input_tokens": len(ids)}), media_type="application/json")

    # --- messages --------------------------------------------------------------------------------
    async def create(self, request: AnthropicMessagesRequest, raw_request: Request) -> Response:
        try:
            chat_request = self._chat_request(request)
        except ValueError as e:
            return anthropic_error(str(e))
        error = self.chat._validate(chat_request)
        if error:
            return anthropic_error(error)
        dead = self.ctx.dead_reason()
        if dead:
            return anthropic_error(dead, 503)
        try:
            obj = await run_cpu(self.chat._convert, chat_request)  # template + tokenizer off the loop
            if self.ctx.server_args.disaggregation_mode != "null":
                agen = self._via_router(obj)
            else:
                agen = self.ctx.tokenizer_manager.generate_request(obj, raw_request)
            first = await first_output(agen)
        except RouterError as e:
            return anthropic_error(e.message, e.status_code)
        except ValueError as e:
            return anthropic_error(str(e))
        except EngineDeadError as e:
            return anthropic_error(str(e), 503)
        except Exception as e:  # noqa: BLE001 - mapped to a status, never a crashed route
            logger.exception("Error in /v1/messages: %s", e)
            return anthropic_error(f"Internal server error: {e}", 500)
        if first is None:
            return anthropic_error("The request produced no output.", 500)
        aborted = abort_error([first])
        if aborted is not None:
            return anthropic_error(aborted.message, aborted.status_code)
        message_id = f"msg_{uuid.uuid4().hex[:24]}"
        single_call = not chat_request.parallel_tool_calls
        if request.stream:
            return StreamingResponse(self._events(request, chat_request, message_id, first, agen, single_call),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        proc = self.chat._output(chat_request)
        content, reasoning, tool_calls = proc.whole(first.get("text", ""))
        blocks = whole_content(content, reasoning, tool_calls, single_call, _shows_thinking(request))
        meta = first["meta_info"]
        reason, sequence = stop_reason(*finish_fields(meta), called_tools=bool(tool_calls))
        response = AnthropicMessagesResponse(id=message_id, content=blocks, model=request.model, stop_reason=reason,
                                             stop_sequence=sequence, usage=usage(meta))
        return Response(content=response.model_dump_json(), media_type="application/json")

    def _via_router(self, obj):
        """A PD server cannot generate alone: the request goes through the deployment's router."""
        base = os.environ.get(WEB_API_BASE_ENV)
        if not base:
            raise ValueError(f"This is a PD {self.ctx.server_args.disaggregation_mode} server: it serves /v1/messages "
                             f"through the deployment's router, whose URL it gets from {WEB_API_BASE_ENV} (launch_pd "
                             "sets it). Set it, or send the request to a plain server.")
        body = {"input_ids": obj.input_ids, "sampling_params": obj.sampling_params, "stream": bool(obj.stream)}
        return generate_through_router(base, body, self.ctx.server_args.api_key)

    async def _events(self, request, chat_request, message_id: str, first, agen, single_call: bool):
        meta = first["meta_info"]
        start_usage = usage(meta).model_dump()
        start_usage["output_tokens"] = 0
        yield _sse("message_start", {"type": "message_start", "message": {
            "id": message_id, "type": "message", "role": "assistant", "content": [], "model": request.model,
            "stop_reason": None, "stop_sequence": None, "usage": start_usage}})
        yield _sse("ping", {"type": "ping"})
        proc = self.chat._output(chat_request)
        blocks = StreamBlocks(single_call, _shows_thinking(request))
        sent = ""
        outputs = chain_outputs(first, agen)
        try:
            async for out in outputs:
                meta = out["meta_info"]
                reason = abort_reason(out)
                if reason is not None:
                    status = reason.get("status_code")
                    message = str(reason.get("message") or "The request was aborted.")
                    yield _sse("error", error_body(message, status if isinstance(status, int) else 500))
                    return
                full = out.get("text", "")
                delta, sent = full[len(sent):], full
                for kind, payload in blocks.pieces(proc.delta(delta) if delta else []):
                    yield _sse(kind, payload)
                if finish_fields(meta)[0] is not None:
                    for kind, payload in blocks.pieces(proc.end()):
                        yield _sse(kind, payload)
        except Exception as e:  # noqa: BLE001 - the stream ends with an error event, not a cut connection
            logger.exception("Error in a /v1/messages stream: %s", e)
            yield _sse("error", error_body(f"Internal server error: {e}", 500))
            return
        finally:
            await outputs.aclose()
        for kind, payload in blocks.close():
            yield _sse(kind, payload)
        reason, sequence = stop_reason(*finish_fields(meta), called_tools=blocks.called_tools)
        yield _sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                     "usage": usage(meta).model_dump()})
        yield _sse("message_stop", {"type": "message_stop"})


def _shows_thinking(request) -> bool:
    return not (request.thinking is not None and request.thinking.display == "omitted")


def add_anthropic_routes(app, ctx, chat, parse_body) -> None:
    serving = AnthropicServing(ctx, chat)

    @app.post("/v1/messages")
    async def anthropic_v1_messages(raw_request: Request):
        return await serving.create(await parse_body(raw_request, AnthropicMessagesRequest), raw_request)

    @app.post("/v1/messages/count_tokens")
    async def anthropic_v1_count_tokens(raw_request: Request):
        return await serving.count_tokens(await parse_body(raw_request, AnthropicCountTokensRequest))
