"""A minimal HTTP load balancer in front of PD-disaggregated prefill and decode servers.

    python -m sglang.srt.router.mini_lb --prefill http://P:30100 --decode http://D:30200 \
        --prefill-bootstrap-ports 8998 [--host 127.0.0.1] [--port 8000]

Why it exists: a PD deployment needs something in front that sends every request to one
prefill *and* one decode server and tells both how to find each other. The production choice is
the `sglang-router` package; this module is the in-tree fallback for users without it, with the
behaviour of upstream's MiniLoadBalancer (random pair per request, no cache awareness).

Per request it picks a random (prefill, decode) pair, injects `bootstrap_host` (the prefill
URL's hostname), `bootstrap_port` and a fresh random `bootstrap_room` (lists for batches on
`/generate`), POSTs the same JSON to both servers concurrently and answers with the decode
server's response. With `return_logprob`, the prefill's `input_token_logprobs` are prepended to
the decode's, because only the prefill server saw the prompt.

Unlike the upstream script, it binds 127.0.0.1 by default and `POST /register` needs the
deployment secret (`SGLANG_DISAGGREGATION_SECRET`, an `X-SGLang-PD-Signature` HMAC over the body,
`sglang.srt.disaggregation.pd_auth.signed_headers(secret, "POST /register", body)`): without a
secret it is refused. And a backend that cannot be reached (or that fails first) ends the
request with a JSON error right away instead of an exception or a hang: the other leg's
connection is closed, which makes our servers abort that request.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import random
import urllib.parse
from contextlib import asynccontextmanager
from http import HTTPStatus
from typing import Any, Dict, List, Optional, Tuple

import aiohttp
import orjson
import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel

from sglang.srt.disaggregation import pd_auth

# Streams are read in 64 KiB pieces: aiohttp's line reader fails with "Chunk too big" on long events.
AIOHTTP_STREAM_READ_CHUNK_SIZE = 1024 * 64
REQUEST_TIMEOUT_S = 3600
# A black-holed host must not hold a request for the whole hour; a refused connection fails at once anyway.
CONNECT_TIMEOUT_S = 30
INFO_TIMEOUT_S = 60

logger = logging.getLogger("pdlb")


def _setup_logging() -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[PDLB (Python)] %(asctime)s - %(levelname)s - %(message)s",
                                          datefmt="%Y-%m-%d %H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


@dataclasses.dataclass
class PrefillConfig:
    url: str
    bootstrap_port: Optional[int] = None


class PDRegistryRequest(BaseModel):
    """Body of `POST /register`: a server announcing itself to the load balancer."""

    mode: str
    registry_url: str
    bootstrap_port: Optional[int] = None


class BackendError(Exception):
    """A backend could not be reached or timed out; becomes a 502/504 JSON answer."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def maybe_wrap_ipv6_address(host: Optional[str]) -> Optional[str]:
    """`urlparse` strips the brackets of an IPv6 literal; the decode server needs them back to
    build `host:port`."""
    if host and ":" in host and not host.startswith("["):
        return f"[{host}]"
    return host


def generate_bootstrap_room() -> int:
    return random.randint(0, 2**63 - 1)


def get_request_batch_size(request: Dict[str, Any]) -> Optional[int]:
    """n for a batch (`text` list, or `input_ids` list of lists), None for a single request."""
    text = request.get("text")
    if text is not None:
        return None if isinstance(text, str) else len(text)
    input_ids = request.get("input_ids")
    if input_ids is not None and isinstance(input_ids, list) and input_ids and isinstance(input_ids[0], list):
        return len(input_ids)
    return None


def inject_bootstrap(request: Dict[str, Any], prefill_url: str, bootstrap_port: Optional[int],
                     allow_batch: bool) -> Dict[str, Any]:
    """The request both servers get: the caller's JSON plus where the decode finds the prefill.

    Each batch item gets its own room: a room identifies one transfer on both sides."""
    hostname = maybe_wrap_ipv6_address(urllib.parse.urlparse(prefill_url).hostname)
    out = dict(request)
    n = get_request_batch_size(request) if allow_batch else None
    if n is not None:
        out.update(bootstrap_host=[hostname] * n, bootstrap_port=[bootstrap_port] * n,
                   bootstrap_room=[generate_bootstrap_room() for _ in range(n)])
    else:
        out.update(bootstrap_host=hostname, bootstrap_port=bootstrap_port, bootstrap_room=generate_bootstrap_room())
    return out


def _prepend_input_logprobs(prefill_out: Any, decode_out: Any) -> None:
    """decode.meta_info.input_token_logprobs = prefill's + decode's, in place (per batch item)."""
    if isinstance(decode_out, list) and isinstance(prefill_out, list):
        for p, d in zip(prefill_out, decode_out):
            _prepend_input_logprobs(p, d)
        return
    if not isinstance(decode_out, dict) or not isinstance(prefill_out, dict):
        return
    d_meta, p_meta = decode_out.get("meta_info"), prefill_out.get("meta_info")
    if not isinstance(d_meta, dict) or not isinstance(p_meta, dict) or "input_token_logprobs" not in d_meta:
        return
    d_meta["input_token_logprobs"] = (p_meta.get("input_token_logprobs") or []) + (d_meta["input_token_logprobs"] or [])


def _sse_events(body: bytes) -> List[bytes]:
    return [e for e in body.split(b"\n\n") if e.strip()]


def _sse_json(event: bytes) -> Optional[Any]:
    event = event.strip()
    if not event.startswith(b"data:"):
        return None
    payload = event[len(b"data:"):].strip()
    if payload == b"[DONE]":
        return None
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None


def _json(content: Any, status_code: int = 200) -> Response:
    return Response(content=orjson.dumps(content), status_code=int(status_code), media_type="application/json")


def _error(status: int, message: str) -> Response:
    return _json({"error": {"message": message, "code": status}}, status_code=status)


def _error_of(e: BackendError) -> Response:
    return _error(e.status, e.message)


def _describe(url: str, e: BaseException) -> BackendError:
    if isinstance(e, asyncio.TimeoutError):
        return BackendError(HTTPStatus.GATEWAY_TIMEOUT, f"Timed out waiting for {url}")
    return BackendError(HTTPStatus.BAD_GATEWAY, f"Failed to reach {url}: {e}")


class MiniLoadBalancer:
    """Holds the registered servers and forwards requests to a random (prefill, decode) pair."""

    def __init__(self, prefill_configs: List[PrefillConfig], decode_servers: List[str],
                 timeout: float = REQUEST_TIMEOUT_S):
        self.prefill_configs = list(prefill_configs)
        self.decode_servers = list(decode_servers)
        self.timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=CONNECT_TIMEOUT_S)
        self.secret = pd_auth.secret_from_env()  # signs /register (pd_auth.py); None: /register refused
        self._session: Optional[aiohttp.ClientSession] = None

    @property
    def prefill_servers(self) -> List[str]:
        return [p.url for p in self.prefill_configs]

    def add_prefill_server(self, config: PrefillConfig) -> None:
        self.prefill_configs.append(config)

    def add_decode_server(self, url: str) -> None:
        self.decode_servers.append(url)

    def select_pair(self) -> Tuple[str, Optional[int], str]:
        if not self.prefill_configs:
            raise BackendError(HTTPStatus.SERVICE_UNAVAILABLE, "No prefill servers available")
        if not self.decode_servers:
            raise BackendError(HTTPStatus.SERVICE_UNAVAILABLE, "No decode servers available")
        p = random.choice(self.prefill_configs)
        return p.url, p.bootstrap_port, random.choice(self.decode_servers)

    # --- sessions -------------------------------------------------------------------------
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # No pool limit: every in-flight request holds two connections for its whole life.
            self._session = aiohttp.ClientSession(timeout=self.timeout, connector=aiohttp.TCPConnector(limit=0))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    # --- the PD pair ----------------------------------------------------------------------
    async def _post_pair(self, prefill: str, decode: str, endpoint: str, payload: Dict[str, Any]):
        """POSTs to both at once. Returns (prefill_resp, decode_resp) once both answered with a
        2xx status; if one leg fails (unreachable, or an error status) first, the other leg is
        cancelled and closed, and the failure is returned as (None, error_response)."""
        session = self.session()
        urls = {"prefill": f"{prefill}/{endpoint}", "decode": f"{decode}/{endpoint}"}
        tasks = {asyncio.ensure_future(session.post(u, json=payload)): role for role, u in urls.items()}
        done_resps: Dict[str, aiohttp.ClientResponse] = {}
        failure = None
        ok = False
        try:
            pending = set(tasks)
            while pending and failure is None:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    role = tasks[t]
                    if t.exception() is not None:
                        failure = failure or _error_of(_describe(urls[role], t.exception()))
                        continue
                    resp = t.result()
                    done_resps[role] = resp
                    if resp.status >= 400 and failure is None:
                        failure = await _relay_error(resp)
            ok = failure is None
        finally:
            if not ok:  # a failed leg, or our own client went away: drop both legs
                for t in tasks:
                    if not t.done():
                        t.cancel()
                    elif not t.cancelled() and t.exception() is None:
                        t.result().close()  # closing the connection is what makes the server abort
        if failure is not None:
            logger.warning("Request to %s failed: status %s", endpoint, failure.status_code)
            return None, failure
        return done_resps["prefill"], done_resps["decode"]

    async def generate(self, payload: Dict[str, Any], prefill: str, decode: str, endpoint: str) -> Response:
        prefill_resp, decode_resp = await self._post_pair(prefill, decode, endpoint, payload)
        if prefill_resp is None:
            return decode_resp
        try:
            decode_json = await decode_resp.json(content_type=None)
            if "return_logprob" in payload:
                prefill_json = await prefill_resp.json(content_type=None)
                _prepend_input_logprobs(prefill_json, decode_json)
            else:
                await prefill_resp.read()
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
            return _error_of(_describe(decode, e))
        finally:
            prefill_resp.release()
            decode_resp.release()
        return _json(decode_json, status_code=decode_resp.status)

    async def generate_stream(self, payload: Dict[str, Any], prefill: str, decode: str, endpoint: str) -> Response:
        prefill_resp, decode_resp = await self._post_pair(prefill, decode, endpoint, payload)
        if prefill_resp is None:
            return decode_resp
        # The prefill's stream is one token long and ends when the KV has been handed over;
        # reading it first costs nothing and gives the prompt logprobs to merge.
        try:
            prefill_body = await prefill_resp.read()
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            decode_resp.close()
            return _error_of(_describe(prefill, e))
        finally:
            prefill_resp.release()
        merge = None
        if payload.get("return_logprob", False):
            merge = {}
            for event in _sse_events(prefill_body):
                obj = _sse_json(event)
                if isinstance(obj, dict):
                    merge.setdefault(obj.get("index", 0), obj)

        async def stream():
            try:
                if merge is None:
                    async for chunk in decode_resp.content.iter_chunked(AIOHTTP_STREAM_READ_CHUNK_SIZE):
                        yield chunk
                    return
                buf = b""
                async for chunk in decode_resp.content.iter_chunked(AIOHTTP_STREAM_READ_CHUNK_SIZE):
                    buf += chunk
                    *events, buf = buf.split(b"\n\n")
                    for event in events:
                        yield _merge_event(event, merge) + b"\n\n"
                if buf.strip():
                    yield _merge_event(buf, merge) + b"\n\n"
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                err = {"error": {"message": _describe(decode, e).message}}
                yield b"data: " + orjson.dumps(err) + b"\n\n"
            finally:
                decode_resp.close()

        return StreamingResponse(stream(), status_code=decode_resp.status, media_type="text/event-stream")

    async def forward(self, request: Dict[str, Any], endpoint: str, allow_batch: bool) -> Response:
        try:
            prefill, bootstrap_port, decode = self.select_pair()
        except BackendError as e:
            return _error(e.status, e.message)
        payload = inject_bootstrap(request, prefill, bootstrap_port, allow_batch)
        if request.get("stream", False):
            return await self.generate_stream(payload, prefill, decode, endpoint)
        return await self.generate(payload, prefill, decode, endpoint)

    # --- fan-out / proxy helpers ----------------------------------------------------------
    async def fan_out(self, method: str, path: str, servers: List[str]) -> List[Tuple[str, int, Any]]:
        """(url, status, body) from every server; status 502 for an unreachable one."""

        async def one(url):
            try:
                async with self.session().request(method, f"{url}{path}",
                                                  timeout=aiohttp.ClientTimeout(total=INFO_TIMEOUT_S,
                                                                                sock_connect=CONNECT_TIMEOUT_S)) as r:
                    body = await r.read()
                    try:
                        return url, r.status, orjson.loads(body) if body else None
                    except orjson.JSONDecodeError:
                        return url, r.status, body.decode("utf-8", "replace")
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                err = _describe(url, e)
                return url, err.status, err.message

        return list(await asyncio.gather(*(one(u) for u in servers)))


async def _relay_error(resp: aiohttp.ClientResponse) -> Response:
    """A backend's error answer, passed on with its status (JSON when it is JSON)."""
    try:
        body = await resp.read()
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        return _error_of(_describe(str(resp.url), e))
    try:
        return _json(orjson.loads(body), status_code=resp.status)
    except orjson.JSONDecodeError:
        return _error(resp.status, body.decode("utf-8", "replace") or HTTPStatus(resp.status).phrase)


def _merge_event(event: bytes, merge: Dict[int, Any]) -> bytes:
    obj = _sse_json(event)
    if not isinstance(obj, dict):
        return event
    prefill_obj = merge.get(obj.get("index", 0))
    if prefill_obj is None:
        return event
    _prepend_input_logprobs(prefill_obj, obj)
    return b"data: " + orjson.dumps(obj)


# --- the HTTP app -------------------------------------------------------------------------------
NO_SERVER_REGISTERED = "There is no server registered"


def create_app(lb: MiniLoadBalancer) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_app):
        yield
        await lb.close()

    app = FastAPI(lifespan=lifespan)
    app.state.load_balancer = lb

    @app.get("/health")
    async def health():
        return Response(status_code=200)

    @app.get("/health_generate")
    async def health_generate():
        results = await lb.fan_out("GET", "/health_generate", lb.prefill_servers + lb.decode_servers)
        failed = {url: int(status) for url, status, _ in results if status != 200}
        if failed:
            return _error(HTTPStatus.SERVICE_UNAVAILABLE, f"Unhealthy servers: {failed}")
        return Response(status_code=200)

    @app.post("/flush_cache")
    async def flush_cache():
        results = await lb.fan_out("POST", "/flush_cache", lb.prefill_servers + lb.decode_servers)
        failed = [(url, status, body) for url, status, body in results if status != 200]
        if failed:
            return _error(failed[0][1], f"Flush cache failed on {[(u, int(s)) for u, s, _ in failed]}: {failed[0][2]}")
        return Response(status_code=200)

    @app.get("/get_server_info")
    async def get_server_info():
        results = await lb.fan_out("GET", "/get_server_info", lb.prefill_servers + lb.decode_servers)
        bad = [(url, int(status)) for url, status, _ in results if status != 200]
        if bad:
            return _error(HTTPStatus.BAD_GATEWAY, f"Failed to get server info from {bad}")
        n = len(lb.prefill_configs)
        prefill_infos = [body for _, _, body in results[:n]]
        decode_infos = [body for _, _, body in results[n:]]
        internal_states = [s for info in decode_infos if isinstance(info, dict)
                           for s in info.get("internal_states") or []]
        if not internal_states:  # what benchmark scripts read when no decode reports any
            internal_states = [{"last_gen_throughput": 0.0, "avg_spec_accept_length": None}]
        return _json({"internal_states": internal_states, "prefill": prefill_infos, "decode": decode_infos})

    async def proxy_first_prefill(path: str):
        if not lb.prefill_configs:
            raise HTTPException(status_code=HTTPStatus.SERVICE_UNAVAILABLE, detail=NO_SERVER_REGISTERED)
        target = lb.prefill_servers[0]
        [(_, status, body)] = await lb.fan_out("GET", path, [target])
        if status != 200:
            code = HTTPStatus.SERVICE_UNAVAILABLE if status in (502, 504) else HTTPStatus.BAD_GATEWAY
            raise HTTPException(status_code=code,
                                detail=f"Failed to get {path} from {target}. Status: {int(status)}, Response: {body}")
        return _json(body)

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info():
        return await proxy_first_prefill("/model_info")

    @app.get("/v1/models")
    async def models():
        return await proxy_first_prefill("/v1/models")

    async def forward_json(request: Request, endpoint: str, allow_batch: bool):
        body = await _json_body(request)
        if not isinstance(body, dict):  # already the 400 response
            return body
        return await lb.forward(body, endpoint, allow_batch=allow_batch)

    @app.post("/generate")
    async def generate(request: Request):
        return await forward_json(request, "generate", allow_batch=True)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await forward_json(request, "v1/chat/completions", allow_batch=False)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await forward_json(request, "v1/completions", allow_batch=False)

    @app.post("/register")
    async def register(request: Request):
        # Whoever registers a server receives users' prompts: only a holder of the deployment secret may.
        body = await request.body()
        if lb.secret is None:
            return _error(HTTPStatus.FORBIDDEN, f"/register is disabled: set {pd_auth.SECRET_ENV} on this load "
                                                f"balancer and sign the body ({pd_auth.SIGNATURE_HEADER})")
        if not pd_auth.verify_http(lb.secret, "POST /register", body, request.headers.get(pd_auth.SIGNATURE_HEADER)):
            logger.warning("Refused /register from %s: no valid %s", request.client.host if request.client else "?",
                           pd_auth.SIGNATURE_HEADER)
            return _error(HTTPStatus.UNAUTHORIZED, f"/register needs the deployment secret: no valid "
                                                   f"{pd_auth.SIGNATURE_HEADER}")
        try:
            obj = PDRegistryRequest.model_validate_json(body)
        except ValueError as e:
            return _error(HTTPStatus.BAD_REQUEST, f"Invalid registration: {e}")
        if obj.mode == "prefill":
            lb.add_prefill_server(PrefillConfig(obj.registry_url, obj.bootstrap_port))
            logger.info("Registered prefill server: %s with bootstrap port: %s", obj.registry_url, obj.bootstrap_port)
        elif obj.mode == "decode":
            lb.add_decode_server(obj.registry_url)
            logger.info("Registered decode server: %s", obj.registry_url)
        else:
            raise HTTPException(status_code=400, detail="Invalid mode. Must be either PREFILL or DECODE.")
        logger.info("#Prefill servers: %d, #Decode servers: %d", len(lb.prefill_configs), len(lb.decode_servers))
        return Response(status_code=200)

    return app


async def _json_body(request: Request):
    """The JSON object the client sent (whatever its Content-Type), or a 400 answer."""
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as e:
        return _error(HTTPStatus.BAD_REQUEST, f"Invalid JSON body: {e}")
    if not isinstance(body, dict):
        return _error(HTTPStatus.BAD_REQUEST, "The request body must be a JSON object")
    return body


# --- command line -------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Mini Load Balancer Server")
    parser.add_argument("--prefill", type=str, default=[], nargs="+", help="URLs for prefill servers")
    parser.add_argument("--decode", type=str, default=[], nargs="+", help="URLs for decode servers")
    parser.add_argument("--prefill-bootstrap-ports", type=int, nargs="+",
                        help="Bootstrap ports for prefill servers (one value applies to all)")
    # Upstream binds 0.0.0.0; here loopback, as the server's own --host: exposing it is a choice.
    parser.add_argument("--host", default="127.0.0.1", help="Host to bind the server (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="Port to bind the server (default: 8000)")
    return parser.parse_args(argv)


def build_prefill_configs(prefill_urls: List[str], bootstrap_ports: Optional[List[int]]) -> List[PrefillConfig]:
    if bootstrap_ports is None:
        bootstrap_ports = [None] * len(prefill_urls)
    elif len(bootstrap_ports) == 1:
        bootstrap_ports = bootstrap_ports * len(prefill_urls)
    elif len(bootstrap_ports) != len(prefill_urls):
        raise ValueError("Number of prefill URLs must match number of bootstrap ports")
    return [PrefillConfig(url.rstrip("/"), port) for url, port in zip(prefill_urls, bootstrap_ports)]


def run(prefill_configs: List[PrefillConfig], decode_addrs: List[str], host: str, port: int) -> None:
    lb = MiniLoadBalancer(prefill_configs, [d.rstrip("/") for d in decode_addrs])
    uvicorn.run(create_app(lb), host=host, port=port, timeout_keep_alive=5)


def main(argv=None) -> None:
    _setup_logging()
    args = parse_args(argv)
    prefill_configs = build_prefill_configs(args.prefill, args.prefill_bootstrap_ports)
    run(prefill_configs, args.decode, args.host, args.port)


if __name__ == "__main__":
    main()
