"""The HTTP body before any route sees it: its size (413 past SGLANG_MAX_REQUEST_BODY_BYTES,
checked on Content-Length and again on the bytes that actually arrive, before anything is
parsed), its JSON (invalid UTF-8 or JSON, or nesting past SGLANG_MAX_JSON_DEPTH, is a 400), and
the text of validation errors, which quotes at most a short prefix of the client's values (a
5 MB field used to come back twice in the error).
"""

from __future__ import annotations

from typing import Any, List

import orjson
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from sglang.srt.managers.request_limits import RequestLimits, clip, env_name, json_depth_exceeds, nesting_upper_bound

# Bodies larger than this are parsed and validated on a worker thread rather than on the loop.
PARSE_ON_LOOP_MAX_BYTES = 64 * 1024


def _too_large(limit: int, size: str, path: str = "") -> JSONResponse:
    message = (f"The request body ({size}) is larger than the {limit} bytes this server accepts "
               f"({env_name('max_body_bytes')}).")
    if path.startswith("/v1/messages"):  # Anthropic's API answers in its own error shape
        return JSONResponse(status_code=413, content={"type": "error", "error": {"type": "request_too_large",
                                                                                  "message": message}})
    return JSONResponse(status_code=413, content={"object": "error", "message": message,
                                                  "type": "RequestEntityTooLarge", "param": None, "code": 413})


class BodySizeLimit:
    """ASGI middleware: a body over `limit` bytes is answered 413 without being read further.
    The body is read here in full (routes read it whole anyway) and replayed to the app; later
    `receive` calls go to the client, so a route still sees `http.disconnect`."""

    def __init__(self, app, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            try:
                declared_n = int(declared)
            except ValueError:
                declared_n = -1
            if declared_n > self.limit:
                return await _too_large(self.limit, f"Content-Length {declared_n}", scope["path"])(scope, receive, send)
        chunks: List[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before sending it all
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.limit:
                return await _too_large(self.limit, f"more than {self.limit} bytes", scope["path"])(scope, receive,
                                                                                                    send)
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


def loads_json(raw: bytes, limits: RequestLimits) -> Any:
    """Bytes -> JSON value, or RequestValidationError (a 400 in upstream's shape)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body", e.pos), "msg": "JSON decode error",
                                       "input": {}, "ctx": {"error": e.msg}}]) from None
    if nesting_upper_bound(raw) > limits.max_json_depth and json_depth_exceeds(body, limits.max_json_depth):
        raise RequestValidationError([{
            "type": "json_too_deep", "loc": ("body",), "input": {},
            "msg": f"JSON nesting deeper than {limits.max_json_depth} levels ({env_name('max_json_depth')})"}])
    return body


def _short(value: Any) -> Any:
    """Scalars and short strings as they are; anything else as a clipped repr."""
    if value is None or isinstance(value, (bool, int, float)) or (isinstance(value, str) and len(value) <= 120):
        return value
    if isinstance(value, (dict, list)) and not value:
        return value
    return clip(value)


def clipped_errors(errors: List[dict]) -> List[dict]:
    """Validation errors with every quoted client value shortened."""
    out = []
    for err in errors:
        err = dict(err)
        if "input" in err:
            err["input"] = _short(err["input"])
        if isinstance(err.get("ctx"), dict):
            err["ctx"] = {k: _short(v) for k, v in err["ctx"].items()}
        out.append(err)
    return out
