"""(Tokenizer/HTTP process.) `/v1/responses` on a PD server: each turn runs as a chat completion
through the deployment's router.

Why: a PD server alone cannot generate (the prefill and the decode side each do half), and the
real sglang-router (0.3.2) answers 501 for `/v1/responses` in PD mode. So a PD server that knows
the router's URL (`SGLANG_WEB_API_BASE`, which `launch_pd` sets, as for the web page) posts the
turn to the router's `/v1/chat/completions` and shapes the answer exactly as a plain server's
Responses API would; the conversation store stays in this server. Outputs come back in the
TokenizerManager's form (`{"text": cumulative text, "meta_info": {...}}`), so the same code builds
the response object and the stream events.

`/v1/messages` (Anthropic's API, `entrypoints/anthropic/`) is the same case: the real router has no
such route. Its relay, `generate_through_router`, posts the request already turned into token ids
and sampling params (template and constraints applied here) to the router's `/generate`, whose
outputs are the TokenizerManager's own; the tool-call and reasoning parsers then run here, on the
raw text, exactly as on a plain server.
"""

from __future__ import annotations

import json
from typing import AsyncIterator, Optional


class RouterError(Exception):
    def __init__(self, status_code: int, message: str):
        super().__init__(message)
        self.status_code = status_code
        self.message = message


def _message(status: int, raw: bytes) -> str:
    try:
        body = json.loads(raw)
        err = body.get("error", body) if isinstance(body, dict) else body
        return str(err.get("message", err) if isinstance(err, dict) else err)
    except ValueError:
        return raw.decode(errors="replace")[:500] or f"status {status}"


def _meta(usage: Optional[dict], finish: Optional[str]) -> dict:
    usage = usage or {}
    return {"prompt_tokens": usage.get("prompt_tokens", 0), "completion_tokens": usage.get("completion_tokens", 0),
            "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
            "finish_reason": {"type": finish} if finish else None}


def _headers(api_key: Optional[str]) -> dict:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def generate_through_router(base_url: str, body: dict, api_key: Optional[str] = None) -> AsyncIterator[dict]:
    """Runs `body` (a native /generate request for one sequence) at `base_url`; yields its outputs
    as the router's /generate gives them (the TokenizerManager's shape, cumulative text; one when
    not streaming). A non-200 answer raises RouterError before anything is yielded; an error in
    the stream raises RuntimeError."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async with session.post(base_url.rstrip("/") + "/generate", json=body, headers=_headers(api_key)) as resp:
            if resp.status != 200:
                raise RouterError(resp.status, _message(resp.status, await resp.read()))
            if not body.get("stream"):
                yield await resp.json()
                return
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                out = json.loads(line[6:])
                if "error" in out:
                    raise RuntimeError(_message(500, line[6:]))
                yield out


async def chat_through_router(base_url: str, body: dict, api_key: Optional[str] = None) -> AsyncIterator[dict]:
    """Runs `body` (a chat completion request) at `base_url`; yields TokenizerManager-shaped outputs
    (one when not streaming). A non-200 answer raises RouterError before anything is yielded."""
    import aiohttp

    headers = _headers(api_key)
    stream = bool(body.get("stream"))
    if stream:
        body = {**body, "stream_options": {"include_usage": True}}
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async with session.post(base_url.rstrip("/") + "/v1/chat/completions", json=body, headers=headers) as resp:
            if resp.status != 200:
                raise RouterError(resp.status, _message(resp.status, await resp.read()))
            if not stream:
                data = await resp.json()
                choice = data["choices"][0]
                yield {"text": choice["message"].get("content") or "",
                       "meta_info": _meta(data.get("usage"), choice.get("finish_reason"))}
                return
            text, finish = "", None
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise RuntimeError(_message(500, line[6:]))
                for choice in chunk.get("choices") or []:
                    text += (choice.get("delta") or {}).get("content") or ""
                    finish = choice.get("finish_reason") or finish
                if chunk.get("usage"):
                    yield {"text": text, "meta_info": _meta(chunk["usage"], finish)}
                elif chunk.get("choices"):
                    yield {"text": text, "meta_info": _meta(None, None)}
