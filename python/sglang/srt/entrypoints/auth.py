"""(Tokenizer/HTTP process.) Who may call which route: the API keys and the control routes.

Three kinds of route (upstream's `AuthLevel`, `python/sglang/srt/utils/auth.py` there):

* public: `/health`, `/ready`, `/metrics` (probes and scrapers carry no secret) and the web
  page's own files (`web_ui.is_public_path`); never a key.
* `NORMAL` (every other route unless marked): with `--api-key` it needs that key (the admin key
  is accepted too: it may do everything the ordinary key may); without `--api-key`, open.
  `/health_generate` is one of these: it runs a generation (upstream leaves it public).
* `ADMIN_OPTIONAL` (control routes, marked with `@auth_level(AuthLevel.ADMIN_OPTIONAL)`:
  `/flush_cache`, `/abort_request`): with `--admin-api-key` only the admin key; else with
  `--api-key` that key; with no key at all only clients on this machine (loopback), others get a
  403. Upstream leaves them open to everyone when no key is set.

A key travels as `Authorization: Bearer KEY` or `x-api-key: KEY` (upstream accepts both) and is
compared in constant time. Failing the key is upstream's 401 `{"error": "Unauthorized"}`, or on
Anthropic's routes (`/v1/messages...`, whose clients send `x-api-key`) Anthropic's shape with an
`authentication_error`.

The middleware records what the request proved in the ASGI scope (`request_role`): "admin",
"user" or "anonymous", so that a route can ask for more than its level, as `/generate` does for a
`custom_logit_processor` (it runs the client's code, so it needs the admin key).
"""

from __future__ import annotations

import enum
import hmac
import ipaddress
from typing import Any, Optional

from starlette.responses import JSONResponse
from starlette.routing import Match

from sglang.srt.entrypoints.anthropic.protocol import error_body as anthropic_error_body
from sglang.srt.entrypoints.web_ui import is_public_path

ROLE_SCOPE_KEY = "sglang.auth_role"
ADMIN, USER, ANONYMOUS = "admin", "user", "anonymous"

REMOTE_CONTROL_REFUSED = (
    "This is a control route and the server has no API key (--api-key / --admin-api-key, or SGLANG_API_KEY / "
    "SGLANG_ADMIN_API_KEY): it answers only clients on the server's own machine."
)


class AuthLevel(str, enum.Enum):
    NORMAL = "normal"
    ADMIN_OPTIONAL = "admin_optional"


def auth_level(level: AuthLevel):
    """Marks a route's endpoint with its level (read by the middleware through the route table)."""

    def mark(func):
        func._auth_level = level
        return func

    return mark


def is_always_public(path: str) -> bool:
    if path == "/health_generate":  # runs a generation: a NORMAL route
        return False
    return path.startswith(("/health", "/metrics")) or path == "/ready" or is_public_path(path)


def is_loopback_client(scope) -> bool:
    client = scope.get("client")
    if not client:  # a Unix socket or an in-process transport: the same machine
        return True
    try:
        addr = ipaddress.ip_address(client[0].split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(addr, "ipv4_mapped", None)  # a dual-stack "::" bind sees 127.0.0.1 as ::ffff:127.0.0.1
    return (mapped or addr).is_loopback


def _same_secret(given: Optional[bytes], expected: Optional[bytes]) -> bool:
    return bool(given) and bool(expected) and hmac.compare_digest(given, expected)


def presented_key(headers) -> Optional[bytes]:
    """The key a request carries (`Authorization: Bearer KEY`, else `x-api-key: KEY`), as bytes."""
    auth = headers.get(b"authorization")
    if auth:
        scheme, _, token = auth.partition(b" ")
        if scheme.lower() == b"bearer" and token:
            return token.strip()
    return headers.get(b"x-api-key") or None


def role_of(key: Optional[bytes], api_key: Optional[bytes], admin_api_key: Optional[bytes]) -> str:
    # Both comparisons always run, so the time taken does not tell which key was close.
    is_admin = _same_secret(key, admin_api_key)
    is_user = _same_secret(key, api_key)
    return ADMIN if is_admin else USER if is_user else ANONYMOUS


def allowed(level: AuthLevel, role: str, *, has_api_key: bool, has_admin_key: bool, local: bool) -> Optional[int]:
    """None when the request may go on, else the status to refuse it with (401 or 403)."""
    if level == AuthLevel.ADMIN_OPTIONAL:
        if has_admin_key:
            return None if role == ADMIN else 401
        if has_api_key:
            return None if role in (ADMIN, USER) else 401
        return None if local else 403
    if has_api_key:
        return None if role in (ADMIN, USER) else 401
    return None


def level_of(app: Any, scope) -> AuthLevel:
    """The level of the route that will serve this request (NORMAL when none matches: a 404)."""
    for route in app.router.routes:
        try:
            match, child = route.matches(scope)
        except Exception:  # noqa: BLE001 - a route that cannot match this scope
            continue
        if match == Match.FULL:
            endpoint = child.get("endpoint") or getattr(route, "endpoint", None)
            level = getattr(endpoint, "_auth_level", None)
            return level if isinstance(level, AuthLevel) else AuthLevel.NORMAL
    return AuthLevel.NORMAL


def request_role(request) -> str:
    """What the request proved: "admin", "user" or "anonymous" (set by `ApiKeyMiddleware`)."""
    return request.scope.get(ROLE_SCOPE_KEY, ANONYMOUS)


class ApiKeyMiddleware:
    """A plain ASGI middleware, not `@app.middleware("http")`: Starlette's BaseHTTPMiddleware
    hides the client's `http.disconnect` from the route, and the TokenizerManager relies on
    `request.is_disconnected()` to abort non-streaming requests whose client went away."""

    def __init__(self, app, *, fastapi_app, api_key: Optional[str], admin_api_key: Optional[str]):
        self.app = app
        self.fastapi_app = fastapi_app
        self.api_key = api_key.encode() if api_key else None
        self.admin_api_key = admin_api_key.encode() if admin_api_key else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        role = role_of(presented_key(dict(scope["headers"])), self.api_key, self.admin_api_key)
        scope[ROLE_SCOPE_KEY] = role
        if scope["method"] == "OPTIONS" or is_always_public(scope["path"]):
            return await self.app(scope, receive, send)
        status = allowed(level_of(self.fastapi_app, scope), role, has_api_key=self.api_key is not None,
                         has_admin_key=self.admin_api_key is not None, local=is_loopback_client(scope))
        if status is None:
            return await self.app(scope, receive, send)
        if status == 401 and scope["path"].startswith("/v1/messages"):
            response = JSONResponse(content=anthropic_error_body("invalid x-api-key", 401), status_code=401)
        elif status == 401:
            response = JSONResponse(content={"error": "Unauthorized"}, status_code=401)
        else:
            response = JSONResponse(status_code=403, content={
                "error": {"message": REMOTE_CONTROL_REFUSED, "type": "Forbidden", "code": 403}})
        return await response(scope, receive, send)


def add_api_key_middleware(app, *, api_key: Optional[str], admin_api_key: Optional[str]) -> None:
    """Always added (also without keys): the control routes are local-only then, and routes read
    `request_role`."""
    app.add_middleware(ApiKeyMiddleware, fastapi_app=app, api_key=api_key, admin_api_key=admin_api_key)


CUSTOM_LOGIT_PROCESSOR_NO_ADMIN_KEY = (
    "custom_logit_processor runs code the client sends (a dill-pickled class) on the server, so it needs the "
    "admin API key, and this server was started without one (--admin-api-key or SGLANG_ADMIN_API_KEY)."
)
CUSTOM_LOGIT_PROCESSOR_NEEDS_ADMIN = (
    "custom_logit_processor runs code the client sends (a dill-pickled class) on the server, so it needs the "
    "admin API key: send Authorization: Bearer <admin key>."
)


def custom_logit_processor_refusal(server_args, role: str, processor: Any) -> Optional[str]:
    """Why a request carrying `processor` may not run (None: it may). Without
    --enable-custom-logit-processor the request validator answers upstream's 400 instead; with
    it, only a request that authenticated with the admin key gets as far as `dill.loads`."""
    has = any(processor) if isinstance(processor, list) else bool(processor)
    if not has or not server_args.enable_custom_logit_processor or role == ADMIN:
        return None
    return CUSTOM_LOGIT_PROCESSOR_NEEDS_ADMIN if server_args.admin_api_key else CUSTOM_LOGIT_PROCESSOR_NO_ADMIN_KEY
