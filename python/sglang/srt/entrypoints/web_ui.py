"""(Tokenizer/HTTP process.) The built-in web page: a chat playground and a live view of the
server, served by the HTTP server itself (beyond upstream; llama.cpp's server has one).

    GET /                  the page (`web/index.html`; plain HTML/JS/CSS shipped in the package,
                           no build step, no CDN)
    GET /web/{file}        its script and style sheet
    GET /dashboard/state   one JSON snapshot of what the page plots (`dashboard_state`)

`SGLANG_WEB_API_BASE` (set by `launch_pd` for its servers to the router's URL) sends the page's
chat and model list there instead of to this server: a PD server alone cannot serve a request,
the router can; the live view always shows the server that serves the page.

The page and its files hold no data, so they load without the API key (the page then asks for
the key and sends it as `Authorization: Bearer ...` on every API call); `/dashboard/state` and
the API routes keep needing it. The chat uses the OpenAI routes (`/v1/models`,
`/v1/chat/completions` with `stream`), exactly as any client would.
"""

from __future__ import annotations

import asyncio
import html
import logging
import os
import time
from typing import Any, Dict, Optional

from fastapi import FastAPI, HTTPException
from fastapi.responses import FileResponse, HTMLResponse

logger = logging.getLogger(__name__)

WEB_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "web")
WEB_API_BASE_ENV = "SGLANG_WEB_API_BASE"
WEB_FILES = {"app.js": "application/javascript", "style.css": "text/css"}
def is_public_path(path: str) -> bool:
    """The page and its files need no API key (see the module docstring)."""
    return path == "/" or path.startswith("/web/")


def _used(total: Optional[int], free: Optional[int]) -> Optional[Dict[str, int]]:
    if not total:
        return None
    return {"used": int(total - (free or 0)), "total": int(total)}


def dashboard_state(internal: Dict[str, Any], totals: Dict[str, int], server_args) -> Dict[str, Any]:
    """The page's view of one scheduler snapshot (`internal_states[0]` of /server_info) and the
    tokenizer manager's running totals."""
    st = internal or {}
    max_total = st.get("max_total_num_tokens") or 0
    kv_free = (st.get("available_kv_tokens") or 0) + (st.get("evictable_kv_tokens") or 0)
    pd = st.get("disaggregation") or {}
    backup = st.get("retraction_backup") or {}
    mamba = None
    if st.get("mamba_pool_size"):
        mamba = _used(st["mamba_pool_size"], (st.get("available_mamba_slots") or 0) + (st.get("evictable_mamba_slots") or 0))
    prompt = totals.get("prompt_tokens", 0)
    return {
        "time": time.time(),
        "model": server_args.served_model_name or server_args.model_path,
        "mode": pd.get("mode", server_args.disaggregation_mode),
        "num_running_reqs": st.get("num_running_reqs", 0),
        "num_waiting_reqs": st.get("num_waiting_reqs", 0),
        "num_grammar_queue_reqs": st.get("num_grammar_queue_reqs", 0),
        "kv_tokens": _used(max_total, kv_free),
        "host_pool_tokens": _used(backup.get("host_pool_size"), backup.get("host_pool_available")),
        "mamba_slots": mamba,
        "mamba_host_slots": _used(backup.get("mamba_host_slots_total"), backup.get("mamba_host_slots_free")),
        "cache_hit_rate": (totals.get("cached_tokens", 0) / prompt) if prompt else 0.0,
        "num_requests": totals.get("requests", 0),
        "generation_tokens": totals.get("completion_tokens", 0),
        "num_retractions": st.get("num_retracted_reqs_total", 0),
        "num_recomputed_tokens": st.get("num_recomputed_tokens", 0),
        "retraction_backup": backup.get("backend"),
        "spec_accept_length": st.get("avg_spec_accept_length"),  # None on a plain server
        "spec_accept_rate": (st["spec_num_correct_drafts_total"] / st["spec_num_proposed_drafts_total"]
                             if st.get("spec_num_proposed_drafts_total") else None),
        "pd_queues": {k: v for k, v in pd.items() if k.endswith("_queue_reqs")},
    }


def add_web_routes(app: FastAPI, state) -> None:
    with open(os.path.join(WEB_DIR, "index.html"), encoding="utf-8") as f:
        page = f.read().replace("{{API_BASE}}", html.escape(os.environ.get(WEB_API_BASE_ENV, "").rstrip("/"), quote=True))

    @app.get("/", include_in_schema=False)
    async def index():
        return HTMLResponse(page)

    @app.get("/web/{name}", include_in_schema=False)
    async def web_file(name: str):
        if name not in WEB_FILES:
            raise HTTPException(status_code=404, detail=f"No such file: {name}")
        return FileResponse(os.path.join(WEB_DIR, name), media_type=WEB_FILES[name])

    @app.get("/dashboard/state")
    async def dashboard():
        try:
            internal = await asyncio.wait_for(state.tokenizer_manager.get_internal_state(), 10)
        except Exception as e:  # noqa: BLE001 - a dead scheduler: say so instead of hanging
            raise HTTPException(status_code=503, detail=f"The scheduler did not answer: {e!r}")
        return dashboard_state(internal, state.tokenizer_manager.totals, state.server_args)
