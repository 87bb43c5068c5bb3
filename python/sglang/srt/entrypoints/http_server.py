"""The HTTP server: FastAPI routes (native SGLang API and the OpenAI-compatible one) over the
TokenizerManager, served by uvicorn on uvloop.

`launch_server(server_args)` starts the engine processes (scheduler, detokenizer; the
TokenizerManager lives here), serves HTTP, sends a warm-up request from a helper thread
(then logs "The server is fired up and ready to roll!"), and on SIGINT/SIGTERM stops uvicorn
and then the engine processes, so nothing is left running and the ZMQ IPC files are removed.

The routes are built by `build_app(state)` around a `ServerState` rather than module globals,
so the same code serves any TokenizerManager (tests, the launcher).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import uuid
from http import HTTPStatus
from typing import Any

import orjson
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from sglang.srt.entrypoints.auth import (AuthLevel, add_api_key_middleware, auth_level, custom_logit_processor_refusal,
                                         request_role)
from sglang.srt.entrypoints.anthropic.protocol import error_body as anthropic_error_body
from sglang.srt.entrypoints.anthropic.serving import add_anthropic_routes
from sglang.srt.entrypoints.cross_site import add_cross_site_middlewares
from sglang.srt.entrypoints.openai import serving_tokenize
from sglang.srt.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    ErrorResponse,
    ModelCard,
    ModelList,
    TokenizeRequest,
)
from sglang.srt.entrypoints.openai.serving_base import abort_error, chain_outputs, first_output, health_timeout
from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion
from sglang.srt.entrypoints.openai.serving_pooling import add_pooling_routes
from sglang.srt.entrypoints.openai.serving_responses import add_responses_routes
from sglang.srt.entrypoints.request_body import PARSE_ON_LOOP_MAX_BYTES, BodySizeLimit, clipped_errors, loads_json
from sglang.srt.entrypoints.web_ui import add_web_routes
from sglang.srt.server_args.compat import warn_no_effect_flags
from sglang.srt.entrypoints.server_lifecycle import (
    FAKE_BOOTSTRAP_HOST,
    ServerState,
    ServerStatus,
    build_state,
    close_zmq,
    serve,
    wait_and_warmup,
)
from sglang.srt.managers.cpu_work_pool import run_cpu
from sglang.srt.managers.io_struct import EmbeddingReqInput, GenerateReqInput
from sglang.srt.managers.request_limits import RequestLimits, clip_message
from sglang.srt.managers.tokenizer_manager import EngineDeadError

logger = logging.getLogger(__name__)

HEALTH_CHECK_RID_PREFIX = "HEALTH_CHECK"
FLUSH_CACHE_TEXT = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)


class AbortRequestBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    rid: str = ""
    abort_all: bool = False


class ParseFunctionCallBody(BaseModel):
    """Upstream's /parse_function_call request (the parser defaults to --tool-call-parser)."""

    model_config = ConfigDict(extra="ignore")
    text: str
    tools: list = []
    tool_call_parser: Any = None


class SeparateReasoningBody(BaseModel):
    """Upstream's /separate_reasoning request (the parser defaults to --reasoning-parser)."""

    model_config = ConfigDict(extra="ignore")
    text: str
    reasoning_parser: Any = None


def _run_parser(name, flag: str, run) -> Response:
    """The parser routes: a 400 when no parser is named (here or by `flag`) or the name is unknown."""
    if not name:
        return _native_error(f"No {flag[2:].replace('-', '_')} given (and the server has no {flag}).")
    try:
        return _json(run(name))
    except ValueError as e:
        return _native_error(str(e))


def _anthropic_message(errors) -> str:
    """Validation errors as Anthropic words them: `field.path: message`, one per line."""
    lines = []
    for err in errors:
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        msg = err.get("msg", "invalid value")
        if err.get("type") == "extra_forbidden":
            msg = "not supported by this server (no such field)"
        if err.get("type") == "json_invalid":
            msg = f"{msg}: {(err.get('ctx') or {}).get('error', '')}".rstrip(": ")
        lines.append(f"{'.'.join(loc)}: {msg}" if loc else msg)
    return clip_message("; ".join(lines) or "Invalid request.")


def _json(content: Any, status_code: int = 200) -> Response:
    return Response(content=orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY,
                                         default=str),
                    status_code=status_code, media_type="application/json")


def _native_error(message: str, status_code: int = 400) -> Response:
    return _json({"error": {"message": clip_message(message)}}, status_code)


def _stream_error_chunk(message: str, code: int = 400) -> bytes:
    err = {"error": {"message": clip_message(message), "type": "invalid_request_error", "code": code,
                     "retryable": False}}
    return b"data: " + orjson.dumps(err) + b"\n\n"


# Fields of GenerateReqInput a client may set (the rest are filled by normalization).
_GENERATE_FIELDS = frozenset(f.name for f in dataclasses.fields(GenerateReqInput)) - {"is_single", "batch_size"}
_GENERATE_ADAPTER = TypeAdapter(GenerateReqInput)


async def _parse_body(request: Request, model):
    """JSON body -> `model` (a pydantic model class or a TypeAdapter); invalid JSON or values
    raise FastAPI's RequestValidationError, which the app turns into a 400 ErrorResponse. A large
    body is parsed and validated on a worker thread (the size limit was checked before, by
    `BodySizeLimit`)."""
    raw = await request.body()
    limits = _limits_of(request)
    if len(raw) > PARSE_ON_LOOP_MAX_BYTES:
        return await run_cpu(_parse_body_sync, raw, model, limits)
    return _parse_body_sync(raw, model, limits)


def _limits_of(request: Request) -> RequestLimits:
    limits = getattr(request.app.state, "request_limits", None)
    return limits if limits is not None else RequestLimits.from_env(context_len=0)


def _parse_body_sync(raw: bytes, model, limits: RequestLimits):
    body = loads_json(raw, limits)
    if not isinstance(body, dict):
        raise RequestValidationError([{"type": "dict_type", "loc": ("body",), "msg": "Input should be a JSON object",
                                       "input": body}])
    try:
        if isinstance(model, TypeAdapter):
            return model.validate_python({k: v for k, v in body.items() if k in _GENERATE_FIELDS})
        return model.model_validate(body)
    except ValidationError as e:
        raise RequestValidationError(e.errors(include_url=False)) from None


# =============================================================================================
# The app
# =============================================================================================


def build_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="SGLang", openapi_url=None)
    limits = state.tokenizer_manager.limits
    app.state.request_limits = limits
    # The last middleware added runs first: Host/Origin/Content-Type (cross_site.py), then the key
    # against the route's level (auth.py), then the body's size as it arrives (request_body.py).
    sa = state.server_args
    app.add_middleware(BodySizeLimit, limit=limits.max_body_bytes)
    add_api_key_middleware(app, api_key=sa.api_key, admin_api_key=sa.admin_api_key)
    add_cross_site_middlewares(app, sa)
    ctx = state.ctx
    completions = OpenAIServingCompletion(ctx)
    chat = OpenAIServingChat(ctx)

    # --- errors: upstream turns FastAPI's 422 into a 400 ErrorResponse -------------------------
    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        exc = RequestValidationError(clipped_errors(exc.errors()))  # never echo a big input back
        if request.url.path.startswith("/v1/messages"):  # Anthropic's API: its error shape
            return JSONResponse(status_code=400, content=anthropic_error_body(_anthropic_message(exc.errors())))
        exc_str, errors_str = str(exc), str(exc.errors())
        message = f"{exc_str} {errors_str}" if errors_str and errors_str != exc_str else exc_str
        err = ErrorResponse(message=clip_message(message), type=HTTPStatus.BAD_REQUEST.phrase, code=HTTPStatus.BAD_REQUEST.value)
        if request.url.path.startswith("/v1/responses"):  # upstream nests the Responses API's errors
            return JSONResponse(status_code=400, content={"error": err.model_dump(exclude={"object"})})
        return JSONResponse(status_code=400, content=err.model_dump())

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException):
        if request.url.path.startswith("/v1/messages"):
            return JSONResponse(status_code=exc.status_code,
                                content=anthropic_error_body(clip_message(str(exc.detail)), exc.status_code))
        err = ErrorResponse(message=clip_message(str(exc.detail)), type=str(exc.status_code), code=exc.status_code)
        return JSONResponse(status_code=exc.status_code, content=err.model_dump())

    # --- health -------------------------------------------------------------------------------
    @app.get("/health")
    @app.get("/health_generate")
    async def health_generate(request: Request):
        if state.status in (ServerStatus.Starting, ServerStatus.ShuttingDown):
            return Response(status_code=503)
        if ctx.dead_reason():
            return Response(status_code=503)
        stalled = ctx.stall_reason()  # read from shared memory: a stuck scheduler cannot answer
        if stalled:
            return Response(content=stalled, status_code=503)
        if request.url.path == "/health" and os.environ.get("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "0") != "1":
            return Response(status_code=200)
        ok = await _generate_one_token(state)
        if ok:
            return Response(status_code=200)
        return Response(content="Health check failed: no token was generated in time.", status_code=503)

    @app.get("/ready")
    async def ready():
        ok = state.status == ServerStatus.Up and not ctx.dead_reason()
        return Response(status_code=200 if ok else 503)

    # --- info -----------------------------------------------------------------------------------
    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info():
        return _json(_model_info(state))

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info():
        return _json(await _server_info(state))

    @app.get("/v1/models")
    async def available_models():
        card = ModelCard(id=ctx.served_model_name, root=ctx.served_model_name, max_model_len=ctx.context_len)
        return _json(ModelList(data=[card]).model_dump())

    @app.get("/v1/models/{model:path}")
    async def retrieve_model(model: str):
        if model != ctx.served_model_name:
            return _json({"error": {"message": f"The model '{model}' does not exist", "type": "invalid_request_error",
                                    "param": "model", "code": "model_not_found"}}, status_code=404)
        card = ModelCard(id=model, root=model, max_model_len=ctx.context_len)
        return _json(card.model_dump())

    # --- generation -----------------------------------------------------------------------------
    # Bodies are parsed here rather than by FastAPI's parameter binding so that a JSON body is
    # accepted whatever Content-Type the client sent (e.g. curl -d); errors keep upstream's shape.
    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate_request(request: Request):
        obj = await _parse_body(request, _GENERATE_ADAPTER)
        return await _generate(state, obj, request)

    @app.post("/v1/completions")
    async def openai_v1_completions(raw_request: Request):
        request = await _parse_body(raw_request, CompletionRequest)
        return await completions.handle_request(request, raw_request)

    @app.post("/v1/chat/completions")
    async def openai_v1_chat_completions(raw_request: Request):
        request = await _parse_body(raw_request, ChatCompletionRequest)
        return await chat.handle_request(request, raw_request)

    @app.post("/v1/tokenize")
    @app.post("/tokenize")
    async def openai_v1_tokenize(raw_request: Request):
        res = await run_cpu(serving_tokenize.tokenize, ctx, await _parse_body(raw_request, TokenizeRequest), chat)
        return res if isinstance(res, Response) else _json(res.model_dump())

    @app.post("/v1/detokenize")
    @app.post("/detokenize")
    async def openai_v1_detokenize(raw_request: Request):
        res = await run_cpu(serving_tokenize.detokenize, ctx, await _parse_body(raw_request, DetokenizeRequest))
        return res if isinstance(res, Response) else _json(res.model_dump())

    @app.post("/parse_function_call")
    async def parse_function_call(raw_request: Request):
        """{"text", "tools", "tool_call_parser"} -> {"normal_text", "calls": [{tool_index, name, parameters}]}."""
        from sglang.srt.function_call import FunctionCallParser

        obj = await _parse_body(raw_request, ParseFunctionCallBody)

        def run(name):
            normal, calls = FunctionCallParser(obj.tools, name).parse_non_stream(obj.text)
            return {"normal_text": normal, "calls": [dataclasses.asdict(c) for c in calls]}

        return await run_cpu(_run_parser, obj.tool_call_parser or chat.tool_call_parser, "--tool-call-parser", run)

    @app.post("/separate_reasoning")
    async def separate_reasoning(raw_request: Request):
        """{"text", "reasoning_parser"} -> {"text": normal text, "reasoning_text"}."""
        from sglang.srt.parser.reasoning_parser import ReasoningParser

        obj = await _parse_body(raw_request, SeparateReasoningBody)

        def run(name):
            reasoning, normal = ReasoningParser(name).parse_non_stream(obj.text)
            return {"text": normal, "reasoning_text": reasoning}

        return await run_cpu(_run_parser, obj.reasoning_parser or chat.reasoning_parser, "--reasoning-parser", run)

    # --- control --------------------------------------------------------------------------------
    @app.api_route("/flush_cache", methods=["GET", "POST"])
    @auth_level(AuthLevel.ADMIN_OPTIONAL)
    async def flush_cache():
        ret = await state.tokenizer_manager.flush_cache()
        return Response(content=FLUSH_CACHE_TEXT, status_code=200 if ret.success else HTTPStatus.BAD_REQUEST)

    @app.post("/abort_request")
    @auth_level(AuthLevel.ADMIN_OPTIONAL)
    async def abort_request(request: Request):
        obj = await _parse_body(request, AbortRequestBody)
        state.tokenizer_manager.abort_request(obj.rid, obj.abort_all)
        return Response(status_code=200)

    add_pooling_routes(app, ctx, _parse_body)
    add_responses_routes(app, ctx, chat, _parse_body)
    add_anthropic_routes(app, ctx, chat, _parse_body)
    add_web_routes(app, state)

    if state.server_args.enable_metrics and state.metrics is not None:
        from prometheus_client import CONTENT_TYPE_LATEST

        @app.get("/metrics")
        async def metrics():
            try:
                snapshot = await asyncio.wait_for(state.tokenizer_manager.get_internal_state(), 10)
                state.metrics.update_scheduler_state(snapshot)
            except Exception as e:  # noqa: BLE001 - counters are still worth serving
                logger.warning("Could not read the scheduler state for /metrics: %r", e)
            return Response(content=state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app


# =============================================================================================
# Handlers
# =============================================================================================


async def _generate(state: ServerState, obj: GenerateReqInput, request: Request) -> Response:
    """Native `/generate`: errors are `{"error": {"message": ...}}` as upstream."""
    dead = state.ctx.dead_reason()
    if dead:
        return _native_error(dead, 503)
    refusal = custom_logit_processor_refusal(state.server_args, request_role(request), obj.custom_logit_processor)
    if refusal:
        return _native_error(refusal, 403)
    tm = state.tokenizer_manager
    try:
        agen = tm.generate_request(obj, request)
        first = await first_output(agen)
    except ValueError as e:
        logger.error("[http_server] Error: %s", e)
        return _native_error(str(e))
    except EngineDeadError as e:
        return _native_error(str(e), 503)
    except Exception as e:  # noqa: BLE001 - a bug answers this request with a 500, the server goes on
        logger.exception("[http_server] Internal error in /generate: %s", e)
        return _native_error(f"Internal server error: {e}", 500)

    if obj.stream:
        if first is not None:
            aborted = abort_error([first])
            if aborted is not None:
                return _native_error(aborted.message, aborted.status_code)
        return StreamingResponse(_stream_native(first, agen), media_type="text/event-stream")

    outputs = first if isinstance(first, list) else [first]
    aborted = abort_error(outputs)
    if aborted is not None:
        if aborted.status_code == HTTPStatus.BAD_REQUEST:
            return _native_error(aborted.message)
        err = ErrorResponse(message=aborted.message, type=str(aborted.status_code), code=aborted.status_code)
        return _json(err.model_dump(), aborted.status_code)
    return _json(first)


async def _stream_native(first, agen):
    outputs = chain_outputs(first, agen)
    try:
        async for out in outputs:
            yield b"data: " + orjson.dumps(out, option=orjson.OPT_NON_STR_KEYS) + b"\n\n"
    except ValueError as e:
        logger.error("[http_server] Error: %s", e)
        yield _stream_error_chunk(str(e))
    except Exception as e:  # noqa: BLE001 - the stream ends with an error event, not a cut connection
        logger.exception("[http_server] Internal error in a /generate stream: %s", e)
        yield _stream_error_chunk(f"Internal server error: {e}", 500)
    finally:
        await outputs.aclose()
    yield b"data: [DONE]\n\n"


async def _generate_one_token(state: ServerState) -> bool:
    """Upstream's health check: a 1-token greedy request from token id 0."""
    tm = state.tokenizer_manager
    kind = EmbeddingReqInput if state.server_args.is_embedding else GenerateReqInput
    obj = kind(input_ids=[0], sampling_params={"max_new_tokens": 1, "temperature": 0.0},
               rid=f"{HEALTH_CHECK_RID_PREFIX}_{uuid.uuid4().hex}", log_metrics=False)
    if state.server_args.disaggregation_mode != "null":
        obj.bootstrap_host = FAKE_BOOTSTRAP_HOST
        obj.bootstrap_room = 0

    async def run() -> bool:
        async for _ in tm.generate_request(obj, None):
            return True
        return False

    task = asyncio.ensure_future(run())
    try:
        return await asyncio.wait_for(task, health_timeout())
    except Exception as e:  # noqa: BLE001 - any failure is an unhealthy server
        logger.error("Health check failed: %r", e)
        return False


def _model_info(state: ServerState) -> dict:
    sa = state.server_args
    info = state.ctx.scheduler_info
    hf = {}
    try:
        from sglang.srt.configs.model_config import read_hf_config_dict

        hf = read_hf_config_dict(info.get("model_path") or sa.model_path)
    except Exception:  # noqa: BLE001 - model_type/architectures are informative only
        pass
    return {
        "model_path": sa.model_path,
        "served_model_name": state.ctx.served_model_name,
        "tokenizer_path": sa.tokenizer_path,
        "is_generation": not sa.is_embedding,
        # upstream-only flags (accepted, no effect here) are reported as given
        "preferred_sampling_params": sa.ignored_upstream_args.get("preferred_sampling_params"),
        "weight_version": sa.weight_version,
        "load_format": sa.load_format,
        "reasoning_parser": sa.reasoning_parser,
        "tool_call_parser": sa.tool_call_parser,
        "disaggregation_mode": sa.disaggregation_mode,
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": hf.get("model_type"),
        "architectures": hf.get("architectures") or ([info["architecture"]] if info.get("architecture") else None),
    }


async def _server_info(state: ServerState) -> dict:
    sa = state.server_args
    try:
        # One per scheduler replica (--dp-size), in dp_rank order, as upstream.
        internal_states = await asyncio.wait_for(state.tokenizer_manager.get_internal_states(), 10)
    except Exception as e:  # noqa: BLE001 - a dead scheduler must not hang /server_info
        logger.warning("Could not read the scheduler's internal state: %r", e)
        internal_states = []
    extra = {}
    if len(internal_states) > 1:  # the replicas' counts summed (what /metrics shows)
        from sglang.srt.managers.internal_state_sum import sum_internal_states

        extra["internal_states_total"] = sum_internal_states(internal_states)
    sources = {}
    for source, decided in sa.declarations():
        for name in decided:
            sources[name] = source
    from sglang import __version__

    args = sa.resolved_dict()  # secrets redacted
    return {
        **args,
        **state.ctx.scheduler_info,
        "resolution_sources": sources,
        "startup_time": state.startup_time,
        "internal_states": internal_states,
        **extra,
        "version": __version__,
        "frontend": "python",
    }


# =============================================================================================
# Launch
# =============================================================================================


def launch_server(server_args) -> None:
    """Runs the server until SIGINT/SIGTERM, then stops everything it started (children first:
    this returns only after they have exited). A child that dies, or that reports a fatal error
    with SIGQUIT (as upstream's children do), takes the whole server down with exit code 1."""
    import signal
    import sys
    import threading

    from sglang.srt.entrypoints.launch import launch_engine_processes
    from sglang.srt.entrypoints.server_lifecycle import watch_children
    from sglang.srt.utils.process import configure_logging, stop_resource_tracker

    configure_logging(server_args)
    holder = {"state": None, "exiting": False}

    def _on_sigterm(signum, frame):
        # uvicorn handles SIGTERM while it serves and re-raises it once it has stopped; we then
        # leave uvicorn and shut the engine down in `finally`. Later signals are ignored.
        if not holder["exiting"]:
            holder["exiting"] = True
            raise SystemExit(0)

    def _on_sigquit(signum, frame):
        logger.error("Received sigquit from a child process. It usually means the child failed.")
        state = holder["state"]
        if state is None:  # still starting: leave the launch, `finally` cleans up
            raise SystemExit(1)
        state.request_exit(1, "a child process failed")

    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGQUIT, _on_sigquit)
    logger.info(f"{server_args=}")  # secrets are redacted by ServerArgs.__repr__
    warn_no_effect_flags(server_args)
    if server_args.node_rank >= 1:  # multi-node TP: this node runs its ranks only (upstream: no HTTP)
        from sglang.srt.entrypoints.launch import run_nonzero_node

        code = 1
        try:
            code = run_nonzero_node(server_args)
        finally:
            stop_resource_tracker()
        sys.exit(code)
    procs = launch_engine_processes(server_args, notify_parent=True)
    state = None
    try:
        state = build_state(server_args, procs)
        holder["state"] = state
        app = build_app(state)
        threading.Thread(target=wait_and_warmup, args=(server_args, state), name="sglang-warmup", daemon=True).start()
        threading.Thread(target=watch_children, args=(state, procs), name="sglang-child-watch", daemon=True).start()
        serve(app, server_args, state)
    except KeyboardInterrupt:
        pass
    finally:
        if state is not None:
            state.status = ServerStatus.ShuttingDown
        logger.info("Shutting down the engine processes.")
        procs.shutdown()
        close_zmq(procs.tokenizer_manager)
        stop_resource_tracker()
    if state is not None and state.exit_code:
        logger.error("The server exits with code %d: %s", state.exit_code, state.exit_reason)
        sys.exit(state.exit_code)
