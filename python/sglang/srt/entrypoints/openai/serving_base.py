"""What the OpenAI-compatible handlers share: the serving context, upstream's error shapes,
the mapping of OpenAI sampling fields onto SGLang sampling params, usage and logprob helpers,
and the rule that turns an aborted request into an HTTP error.

Why the abort rule lives here: the TokenizerManager reports scheduler-side aborts as an
ordinary output whose `finish_reason` is `{"type": "abort", "status_code": ...}`. Upstream
raises for 400 (bad request) and 500/503 (server-side, e.g. retraction without a KV backup)
so that a non-streaming client gets that HTTP status; a user-requested abort stays a normal
200 response with `finish_reason: abort`. Both the native `/generate` and the OpenAI routes
apply the same rule, so it is written once.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from http import HTTPStatus
from typing import Any, Dict, Iterable, List, Optional

from fastapi.responses import JSONResponse

from sglang.srt.entrypoints.auth import custom_logit_processor_refusal, request_role
from sglang.srt.managers.cpu_work_pool import run_cpu
from sglang.srt.managers.request_limits import clip_message
from sglang.srt.managers.tokenizer_manager import EngineDeadError, abort_reason
from sglang.srt.entrypoints.openai.protocol import (
    ChatCompletionTokenLogprob,
    ChoiceLogprobs,
    ErrorResponse,
    LogProbs,
    TopLogprob,
    UsageInfo,
)

logger = logging.getLogger(__name__)

# Generation-config keys used as sampling defaults when a request leaves them unset
# (upstream's default `--sampling-defaults model`).
_MODEL_DEFAULT_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


class RequestAborted(Exception):
    """A request the scheduler aborted with an HTTP-worthy status (400, 500, 503, ...)."""

    def __init__(self, status_code: int, message: str):
        super().__init__(message)
        self.status_code = status_code
        self.message = message


@dataclasses.dataclass
class ServingContext:
    """Everything a request handler needs from the running server."""

    tokenizer_manager: Any
    server_args: Any
    scheduler_info: Dict[str, Any]
    engine_alive: Any = None  # callable -> bool (EngineProcesses.alive)
    scheduler_heartbeat: Any = None  # utils/heartbeat.Heartbeat of the scheduler loop, or None
    model_sampling_defaults: Dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def served_model_name(self) -> str:
        return self.server_args.served_model_name or self.server_args.model_path

    @property
    def enable_cache_report(self) -> bool:
        return bool(self.server_args.enable_cache_report)

    @property
    def context_len(self) -> int:
        return self.tokenizer_manager.context_len

    def dead_reason(self) -> Optional[str]:
        """Why the engine cannot serve (scheduler or detokenizer gone), or None."""
        reason = getattr(self.tokenizer_manager, "dead_reason", None)
        if reason:
            return reason
        if self.engine_alive is not None and not self.engine_alive():
            return "The engine's scheduler or detokenizer process died; the server cannot serve requests."
        return None

    def stall_reason(self) -> Optional[str]:
        """Why the scheduler counts as stuck (its loop has not turned within `health_timeout()`), or None."""
        if self.scheduler_heartbeat is None:
            return None
        age, bound = self.scheduler_heartbeat.age(), health_timeout()
        if age <= bound:
            return None
        return (f"Health check failed: the scheduler loop has not turned for {age:.1f} s "
                f"(SGLANG_HEALTH_CHECK_TIMEOUT={bound:g} s).")


def health_timeout() -> float:
    """Upstream's `SGLANG_HEALTH_CHECK_TIMEOUT` (default 20 s): how long /health_generate waits for
    a token, and how old the scheduler loop's heartbeat may be before /health answers 503."""
    return float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))


def load_model_sampling_defaults(model_path: Optional[str]) -> Dict[str, Any]:
    """Sampling defaults from the model's generation_config.json (empty if none)."""
    if not model_path:
        return {}
    path = os.path.join(model_path, "generation_config.json")
    try:
        with open(path) as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return {}
    out = {k: cfg[k] for k in _MODEL_DEFAULT_KEYS if cfg.get(k) is not None}
    if cfg.get("do_sample") is False and "temperature" in out:
        # HF: do_sample=False means greedy regardless of the temperature written next to it.
        out["temperature"] = 0.0
    return out


# ----------------------------------------------------------------------------- errors


def create_error_response(message: str, err_type: str = "BadRequestError", status_code: int = 400,
                          param: Optional[str] = None) -> JSONResponse:
    err = ErrorResponse(message=clip_message(message), type=err_type, param=param, code=status_code)
    return JSONResponse(content=err.model_dump(), status_code=status_code)


def create_streaming_error_response(message: str, err_type: str = "BadRequestError", status_code: int = 400) -> str:
    err = ErrorResponse(message=clip_message(message), type=err_type, code=status_code)
    return json.dumps({"error": err.model_dump()})


def abort_error(outputs: Iterable[dict]) -> Optional[RequestAborted]:
    """The error a non-streaming response must become, if one of `outputs` was aborted with
    a 400 or a 5xx status; None otherwise (a user abort stays a normal response)."""
    for out in outputs:
        reason = abort_reason(out)
        if reason is None:
            continue
        status = reason.get("status_code")
        if status == HTTPStatus.BAD_REQUEST or (isinstance(status, int) and status >= 500):
            return RequestAborted(int(status), str(reason.get("message") or "The request was aborted."))
    return None


def error_from_exception(e: Exception) -> JSONResponse:
    """Upstream's mapping of a failed request: ValueError is the client's fault (400), a dead
    engine 503, anything else a 500 that says why (and the log gets the traceback)."""
    if isinstance(e, ValueError):
        return create_error_response(str(e))
    if isinstance(e, EngineDeadError):
        return create_error_response(str(e), err_type="ServiceUnavailable", status_code=503)
    logger.exception("Error in request: %s", e)
    return create_error_response(f"Internal server error: {e}", err_type="InternalServerError", status_code=500)


def error_from_abort(exc: RequestAborted) -> JSONResponse:
    if exc.status_code == HTTPStatus.BAD_REQUEST:
        return create_error_response(exc.message)
    return create_error_response(exc.message, err_type=str(exc.status_code), status_code=exc.status_code)


def structured_output_params(request) -> Dict[str, Any]:
    """The constraint of an OpenAI request as `sampling_params` fields (upstream's mapping):
    `response_format` json_schema -> its schema, json_object -> any JSON object, structural_tag ->
    the whole format object; the `regex` / `json_schema` / `ebnf` / `structural_tag` extensions as
    given. More than one is refused later by SamplingParams (upstream's message)."""
    params = {k: getattr(request, k) for k in ("regex", "json_schema", "ebnf", "structural_tag")
              if getattr(request, k) is not None}
    fmt = request.response_format
    if fmt is None or fmt.type == "text":
        return params
    if fmt.type == "json_schema":
        spec = fmt.json_schema or {}
        schema = spec.get("schema", spec.get("schema_"))
        if not isinstance(schema, dict):
            raise ValueError("response_format json_schema needs a 'json_schema.schema' object.")
        params["json_schema"] = json.dumps(schema)
    elif fmt.type == "json_object":
        params["json_schema"] = '{"type": "object"}'
    elif fmt.type == "structural_tag":
        params["structural_tag"] = json.dumps(fmt.model_dump())
    else:
        raise ValueError(f"response_format type must be 'text', 'json_object', 'json_schema' or "
                         f"'structural_tag', got {fmt.type!r}.")
    if sum(k in params for k in ("regex", "json_schema", "ebnf", "structural_tag")) > 1:
        raise ValueError("Only one of regex, json_schema, or ebnf can be set.")
    return params


# ----------------------------------------------------------------------------- sampling


def build_sampling_params(req, max_new_tokens: Optional[int], defaults: Dict[str, Any]) -> Dict[str, Any]:
    """OpenAI request -> SGLang `sampling_params` (upstream's field mapping)."""

    def pick(value, name, fallback):
        return value if value is not None else defaults.get(name, fallback)

    params = {
        "temperature": pick(req.temperature, "temperature", 1.0),
        "top_p": pick(req.top_p, "top_p", 1.0),
        "top_k": req.top_k if req.top_k != -1 else defaults.get("top_k", -1),
        "min_p": req.min_p if req.min_p != 0.0 else defaults.get("min_p", 0.0),
        "repetition_penalty": req.repetition_penalty if req.repetition_penalty != 1.0 else defaults.get("repetition_penalty", 1.0),
        "min_new_tokens": req.min_tokens,
        "stop": req.stop,
        "stop_token_ids": req.stop_token_ids,
        "stop_regex": req.stop_regex,
        "presence_penalty": req.presence_penalty,
        "frequency_penalty": req.frequency_penalty,
        "n": req.n,
        "no_stop_trim": req.no_stop_trim,
        "ignore_eos": req.ignore_eos,
        "skip_special_tokens": req.skip_special_tokens,
        "spaces_between_special_tokens": req.spaces_between_special_tokens,
        "logit_bias": req.logit_bias,
        "custom_params": req.custom_params,
        "sampling_seed": req.seed,
        **structured_output_params(req),
    }
    if max_new_tokens is not None:
        params["max_new_tokens"] = max_new_tokens
    # Leave unset optional fields to SamplingParams' own defaults.
    return {k: v for k, v in params.items() if v is not None}


# ----------------------------------------------------------------------------- usage


def passthrough_fields(req) -> Dict[str, Any]:
    """GenerateReqInput fields that OpenAI requests carry unchanged (SGLang extensions, PD routing)."""
    return dict(
        stream=req.stream,
        rid=req.rid,
        priority=req.priority,
        extra_key=req.extra_key,
        cache_salt=req.cache_salt,
        bootstrap_host=req.bootstrap_host,
        bootstrap_port=req.bootstrap_port,
        bootstrap_room=req.bootstrap_room,
        bootstrap_pair_key=req.bootstrap_pair_key,
        return_hidden_states=req.return_hidden_states,
        custom_logit_processor=req.custom_logit_processor,
    )


def usage_from_outputs(outputs: List[dict], n: int, report_cached: bool = False) -> UsageInfo:
    """Prompt tokens count once per prompt (every n-th output); completions count per choice."""
    prompt = sum(o["meta_info"]["prompt_tokens"] for o in outputs[::max(n, 1)])
    cached = sum(o["meta_info"].get("cached_tokens", 0) for o in outputs[::max(n, 1)])
    completion = sum(o["meta_info"]["completion_tokens"] for o in outputs)
    return make_usage(prompt, completion, cached, report_cached)


def make_usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int, report_cached: bool = False) -> UsageInfo:
    """`prompt_tokens_details.cached_tokens` only with --enable-cache-report, as upstream."""
    return UsageInfo(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details={"cached_tokens": cached_tokens} if report_cached else None,
    )


def streaming_usage(prompt: Dict[int, int], completion: Dict[int, int], cached: Dict[int, int], n: int,
                    report_cached: bool = False) -> UsageInfo:
    n = max(n, 1)
    p = sum(v for i, v in prompt.items() if i % n == 0)
    c = sum(completion.values())
    ca = sum(v for i, v in cached.items() if i % n == 0)
    return make_usage(p, c, ca, report_cached)


# ----------------------------------------------------------------------------- finish reasons


def finish_fields(meta: dict):
    """(finish_reason type, matched_stop) of an output's meta_info."""
    reason = meta.get("finish_reason")
    if not reason:
        return None, None
    return reason.get("type"), reason.get("matched")


# ----------------------------------------------------------------------------- logprobs


def completion_logprobs(input_token_logprobs, output_token_logprobs, input_top_logprobs,
                        output_top_logprobs) -> LogProbs:
    """Native logprob triples `(logprob, token_id, text)` -> the legacy completions shape."""
    ret = LogProbs()
    for triples in (input_token_logprobs or [], output_token_logprobs or []):
        for logprob, _tid, text in triples:
            ret.tokens.append(text if text is not None else "")
            ret.token_logprobs.append(logprob)
            ret.text_offset.append(-1)  # upstream does not compute offsets either
    for tops in (input_top_logprobs or [], output_top_logprobs or []):
        for top in tops:
            ret.top_logprobs.append({t[2]: t[0] for t in top} if top else None)
    return ret


def chat_logprobs(token_logprobs: List[list], top_logprobs: List[Optional[list]]) -> ChoiceLogprobs:
    """Native logprob triples -> `choices[].logprobs.content` of the chat API."""
    content = []
    for i, (logprob, _tid, text) in enumerate(token_logprobs):
        text = text if text is not None else ""
        tops = []
        top = top_logprobs[i] if i < len(top_logprobs) else None
        for t in top or []:
            t_text = t[2] if t[2] is not None else ""
            tops.append(TopLogprob(token=t_text, bytes=list(t_text.encode("utf-8")), logprob=_finite(t[0])))
        content.append(ChatCompletionTokenLogprob(token=text, bytes=list(text.encode("utf-8")),
                                                  logprob=_finite(logprob), top_logprobs=tops))
    return ChoiceLogprobs(content=content)


def _finite(x) -> float:
    """OpenAI's schema has float logprobs; -inf (a banned token) is reported as a very low value."""
    if x is None:
        return -9999.0
    x = float(x)
    return max(x, -9999.0)


# ----------------------------------------------------------------------------- streaming


async def first_output(agen) -> Optional[dict]:
    """Runs a TokenizerManager generator up to its first output.

    Why: validation (bad sampling values, prompt too long) happens inside the generator. Pulling
    the first output before the streaming response starts lets those errors become a plain
    HTTP 400 instead of a 200 whose body carries the error."""
    try:
        return await agen.__anext__()
    except StopAsyncIteration:
        return None


async def chain_outputs(first: Optional[dict], agen):
    """Yields `first`, then the rest of `agen`; always closes `agen` so that a client that goes
    away mid-stream makes the TokenizerManager abort the request in the scheduler."""
    try:
        if first is not None:
            yield first
            async for out in agen:
                yield out
    finally:
        await agen.aclose()


# ----------------------------------------------------------------------------- handler skeleton


class OpenAIServingBase:
    """The request flow shared by completions and chat: validate, convert to a
    `GenerateReqInput`, run it through the one TokenizerManager path, shape the answer.

    Subclasses implement `_validate`, `_convert` (-> GenerateReqInput), `_build_response`
    (non-streaming outputs -> response model) and `_stream_chunks` (an async generator of
    SSE strings, given the first output and the rest)."""

    def __init__(self, ctx: ServingContext):
        self.ctx = ctx

    @property
    def limits(self):
        return self.ctx.tokenizer_manager.limits

    def _validate(self, request) -> Optional[str]:
        return None

    async def handle_request(self, request, raw_request):
        from fastapi.responses import Response, StreamingResponse

        error = self._validate(request)
        if error:
            return create_error_response(error)
        refusal = custom_logit_processor_refusal(self.ctx.server_args, request_role(raw_request),
                                                 request.custom_logit_processor)
        if refusal:  # it runs the client's code: the admin key only, as on /generate
            return create_error_response(refusal, err_type="Forbidden", status_code=403)
        dead = self.ctx.dead_reason()
        if dead:
            return create_error_response(dead, err_type="ServiceUnavailable", status_code=503)
        try:
            # The chat template and the tokenizer run on a worker thread, not on the event loop.
            obj = await run_cpu(self._convert, request)
            agen = self.ctx.tokenizer_manager.generate_request(obj, raw_request)
            first = await first_output(agen)
        except Exception as e:  # noqa: BLE001 - mapped to a status, never a crashed route
            return error_from_exception(e)

        if request.stream:
            aborted = abort_error([first])
            if aborted is not None:
                return error_from_abort(aborted)
            return StreamingResponse(self._sse(request, first, agen), media_type="text/event-stream")

        outputs = first if isinstance(first, list) else [first]
        aborted = abort_error(outputs)
        if aborted is not None:
            return error_from_abort(aborted)
        try:
            if getattr(request, "logprobs", None):  # up to SGLANG_MAX_LOGPROB_ENTRIES objects: not on the loop
                content = await run_cpu(lambda: self._build_response(request, outputs).model_dump_json())
            else:
                content = self._build_response(request, outputs).model_dump_json()
        except Exception as e:  # noqa: BLE001
            logger.exception("Error building a response: %s", e)
            return create_error_response(f"Internal server error: {e}", err_type="InternalServerError", status_code=500)
        return Response(content=content, media_type="application/json")

    async def _sse(self, request, first, agen):
        outputs = chain_outputs(first, agen)
        try:
            async for chunk in self._stream_chunks(request, outputs):
                yield chunk
        except ValueError as e:
            yield f"data: {create_streaming_error_response(str(e))}\n\n"
        except Exception as e:  # noqa: BLE001 - the stream ends with an error event, not a cut connection
            logger.exception("Error in a stream: %s", e)
            yield f"data: {create_streaming_error_response(f'Internal server error: {e}', 'InternalServerError', 500)}\n\n"
        finally:
            await outputs.aclose()
        yield "data: [DONE]\n\n"
