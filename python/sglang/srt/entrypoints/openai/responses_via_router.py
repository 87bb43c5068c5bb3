"""(Tokenizer/HTTP process.) `/v1/responses` and `/v1/messages` on a PD server: each request runs
through the deployment's router.

Why: a PD server alone cannot generate (the prefill and the decode side each do half), and the
real sglang-router (0.3.2) answers 501 for `/v1/responses` in PD mode and has no `/v1/messages`.
So a PD server that knows the router's URL (`SGLANG_WEB_API_BASE`, which `launch_pd` sets, as for
the web page) renders the prompt itself (chat template, sampling params, the tool-call constraint)
and posts its token ids to the router's `/generate` (`generate_through_router`). The router's
outputs are the TokenizerManager's own (`{"text": cumulative text, "meta_info": {...}}`), so the
tool-call and reasoning parsers run here on the raw text and the same code builds the answer as on
a plain server; the Responses conversation store stays in this server.
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
