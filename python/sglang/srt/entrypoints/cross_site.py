"""(Tokenizer/HTTP process.) Requests a web page makes the browser send: refused unless meant.

A server on 127.0.0.1 without a key is reachable by every web page its user opens: the page can
make the browser POST to it (a "simple" cross-site request needs no CORS permission; the page just
cannot read the answer) or rebind its own DNS name to 127.0.0.1 and then read answers too. So:

* **Host allow-list** (DNS rebinding): the Host header must name this server: `localhost`,
  `127.0.0.1`, `::1`, the `--host` address, or a name in `--allowed-hosts`; otherwise 400. A
  wildcard bind (`--host 0.0.0.0` / `::`) is meant to be reached under any name, so there every
  Host is allowed unless `--allowed-hosts` is given. `*` in the list allows every Host. A request
  without a Host header (HTTP/1.0 tools) is not a browser's and passes.
* **Cross-site requests** (CSRF): a request whose `Origin` is neither this server's own origin, a
  page on this machine (localhost / loopback address, any port: local code already reaches the
  server), nor in `--allowed-origins` gets a 403; so does one without `Origin` that the browser
  marks `Sec-Fetch-Site: cross-site` (e.g. an `<img>` pointing at `GET /flush_cache`). Browsers
  send `Origin` with every cross-site POST, whatever its body, so this also covers bodies the
  Content-Type rule below cannot see (a Blob without a type). Navigations to the web page itself
  (`GET /`, `/web/...`) are exempt: following a link to the page is fine.
* **JSON bodies only**: POST/PUT/PATCH with a body and a Content-Type other than `application/json`
  (or `application/*+json`) get a 415: the Content-Types a page can send without a CORS preflight
  are `text/plain`, `application/x-www-form-urlencoded` and `multipart/form-data`. A request with
  no Content-Type passes (no browser form sends one; the Origin rule covers scripts).
* **CORS** is off by default (no `Access-Control-Allow-Origin` on any answer, so no page on
  another origin can read one); `--allowed-origins ORIGIN ...` turns it on for those origins
  (`*`: every origin), without credentials (the API uses no cookies; the Authorization header is
  allowed).

Refusals are `{"error": {"message", "type", "code"}}`, which fits both the OpenAI and the native
error shape.
"""

from __future__ import annotations

import ipaddress
from typing import FrozenSet, Optional, Sequence
from urllib.parse import urlsplit

from starlette.responses import JSONResponse

from sglang.srt.entrypoints.web_ui import is_public_path

WILDCARD_BINDS = ("", "0.0.0.0", "::", "[::]")
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
BODY_METHODS = ("POST", "PUT", "PATCH")

BAD_HOST = ("Invalid Host header {host!r}: this server answers only to its own names (localhost, its --host "
            "address, and --allowed-hosts).")
CROSS_SITE = ("Cross-site request refused (Origin {origin}): a web page on another site may not call this server. "
              "Add the page's origin with --allowed-origins if it should.")
CROSS_SITE_NO_ORIGIN = ("Cross-site request refused (Sec-Fetch-Site: cross-site): a web page on another site may not "
                        "call this server. Add the page's origin with --allowed-origins if it should.")
NOT_JSON = "Unsupported Media Type: Only 'application/json' is allowed (got Content-Type {ctype!r})."


def host_name(value: str) -> str:
    """The name part of a Host header or origin authority: no port, no brackets, lower case."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].split("]", 1)[0]
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


def is_loopback_name(name: str) -> bool:
    if name in LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def allowed_host_names(bind_host: str, extra: Optional[Sequence[str]]) -> Optional[FrozenSet[str]]:
    """The Host names to answer; None: any."""
    extra = [h for h in (extra or []) if h]
    if "*" in extra or (bind_host in WILDCARD_BINDS and not extra):
        return None
    names = set(LOOPBACK_NAMES) | {host_name(h) for h in extra}
    if bind_host not in WILDCARD_BINDS:
        names.add(host_name(bind_host))
    return frozenset(names)


def _has_body(headers) -> bool:
    """An empty POST (e.g. aiohttp's `POST /flush_cache`, which it labels application/octet-stream)
    has nothing to parse, so its Content-Type does not matter."""
    length = headers.get(b"content-length")
    if length is not None:
        return length.strip() not in (b"", b"0")
    return b"transfer-encoding" in headers


def _refuse(status: int, message: str) -> JSONResponse:
    phrase = {400: "Bad Request", 403: "Forbidden", 415: "Unsupported Media Type"}[status]
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": phrase, "code": status}})


class CrossSiteGuard:
    """Plain ASGI middleware (see `auth.ApiKeyMiddleware` for why not BaseHTTPMiddleware)."""

    def __init__(self, app, *, hosts: Optional[FrozenSet[str]], origins: Sequence[str]):
        self.app = app
        self.hosts = hosts
        self.any_origin = "*" in origins
        self.origins = frozenset(o.rstrip("/").lower() for o in origins)

    def refusal(self, scope) -> Optional[JSONResponse]:
        headers = dict(scope["headers"])
        host = headers.get(b"host", b"").decode("latin-1")
        if host and self.hosts is not None and host_name(host) not in self.hosts:
            return _refuse(400, BAD_HOST.format(host=host[:200]))
        method = scope["method"]
        if method == "OPTIONS":  # a CORS preflight: answered (or not) by the CORS middleware
            return None
        if method in ("GET", "HEAD") and is_public_path(scope["path"]):
            return None
        origin = headers.get(b"origin")
        if origin is not None:
            if not self._origin_ok(origin.decode("latin-1").strip(), host):
                return _refuse(403, CROSS_SITE.format(origin=origin.decode("latin-1")[:200]))
        elif headers.get(b"sec-fetch-site") == b"cross-site":
            return _refuse(403, CROSS_SITE_NO_ORIGIN)
        if method in BODY_METHODS and _has_body(headers):
            ctype = headers.get(b"content-type")
            if ctype is not None:
                media = ctype.decode("latin-1").split(";", 1)[0].strip().lower()
                if not (media == "application/json" or (media.startswith("application/") and media.endswith("+json"))):
                    return _refuse(415, NOT_JSON.format(ctype=media[:100]))
        return None

    def _origin_ok(self, origin: str, host: str) -> bool:
        if self.any_origin or origin.rstrip("/").lower() in self.origins:
            return True
        netloc = urlsplit(origin).netloc
        if not netloc:  # "null" (sandboxed frames, file://) or garbage
            return False
        return netloc.lower() == host.strip().lower() or is_loopback_name(host_name(netloc))

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            response = self.refusal(scope)
            if response is not None:
                return await response(scope, receive, send)
        return await self.app(scope, receive, send)


def add_cross_site_middlewares(app, server_args) -> None:
    """The guard, then (outside it, so that its refusals carry CORS headers for allowed
    origins) CORS when origins are configured. Add after the auth middleware: Starlette runs the
    last added first."""
    origins = list(server_args.allowed_origins or [])
    app.add_middleware(CrossSiteGuard, hosts=allowed_host_names(server_args.host, server_args.allowed_hosts),
                       origins=origins)
    if origins:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=["*"] if "*" in origins else origins,
                           allow_credentials=False, allow_methods=["*"], allow_headers=["*"])
