"""Prefill-side bootstrap HTTP server (reference 5.4): where decode finds the prefill ranks.

`KVBootstrapServer(host, port)` starts an aiohttp app on its own thread and event loop (so it can
live inside the tokenizer manager process without touching its loop) and returns once the socket
is bound (bind errors raise in the constructor). `close()` stops it; `start()` is idempotent.

Routes:
* `PUT /route`: a prefill rank registers `{attn_tp_size, attn_tp_rank, attn_cp_size, attn_cp_rank,
  attn_dp_size, attn_dp_rank, pp_size, pp_rank, system_dp_size, system_dp_rank, rank_ip, rank_port,
  page_size, kv_cache_dtype, ...}`; the first registration fixes the topology.
* `GET /route?prefill_dp_rank=&prefill_cp_rank=&target_tp_rank=&target_pp_rank=`: all four -1 ->
  the prefill server info; otherwise that rank's `{rank_ip, rank_port}`.
* `POST /register_dp_rank`, `POST /query_dp_ranks`: room -> prefill DP rank (entries expire).
* `GET /health`: the decode heartbeat.

Trust (pd_auth.py): with `SGLANG_DISAGGREGATION_SECRET`, `PUT /route` and `POST /register_dp_rank`
need a valid `X-SGLang-PD-Signature` (else 401, nothing changes) and `GET /route` answers are
signed for the decode side to check. Without it a rank's entry, once registered, can only be
replaced from the address that registered it (a restarted prefill registers from the same host).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from typing import Any, Dict, Optional, Tuple

from aiohttp import web

from sglang.srt.disaggregation import pd_auth
from sglang.srt.disaggregation.base import BaseKVBootstrapServer

logger = logging.getLogger(__name__)

_ROUTE_QUERY_KEYS = ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank")


class KVBootstrapServer(BaseKVBootstrapServer):
    def __init__(self, host: str, port: int, start: bool = True, secret: Optional[bytes] = None):
        self.host = host
        self.port = int(port)
        self.secret = secret if secret is not None else pd_auth.secret_from_env()
        pd_auth.warn_if_unauthenticated(self.secret, "PD bootstrap server")
        self.refusals = pd_auth.RateLimitedLog()
        self.registrants: Dict[tuple, str] = {}  # (dp, cp, tp, pp) -> the address that registered it
        # prefill_port_table[dp_group][cp_rank][tp_rank][pp_rank] = {"rank_ip", "rank_port"}
        self.prefill_port_table: Dict[int, Dict[int, Dict[int, Dict[int, Dict[str, Any]]]]] = {}
        self.topology: Optional[Dict[str, Any]] = None
        self.room_to_dp_rank: Dict[int, Tuple[int, float]] = {}
        self.entry_cleanup_interval = float(os.environ.get("SGLANG_DISAGGREGATION_BOOTSTRAP_ENTRY_CLEANUP_INTERVAL", "120"))
        self._lock = threading.Lock()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._runner: Optional[web.AppRunner] = None
        self._thread: Optional[threading.Thread] = None
        self._started = threading.Event()
        self._start_error: Optional[BaseException] = None
        if start:
            self.start()

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 10.0) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="kv-bootstrap-server", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout):
            raise RuntimeError(f"Bootstrap server on {self.host}:{self.port} did not start within {timeout}s")
        if self._start_error is not None:
            self._thread = None
            raise self._start_error

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        app = web.Application()
        app.router.add_route("*", "/route", self._handle_route)
        app.router.add_get("/health", self._handle_health)
        app.router.add_post("/register_dp_rank", self._handle_register_dp_rank)
        app.router.add_post("/query_dp_ranks", self._handle_query_dp_ranks)
        try:
            self._runner = web.AppRunner(app, access_log=None)
            loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, host=self.host, port=self.port, reuse_address=True)
            loop.run_until_complete(site.start())
        except BaseException as e:  # bind failure: report to the constructor
            self._start_error = e
            self._started.set()
            loop.close()
            return
        self._started.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

    def close(self, timeout: float = 5.0) -> None:
        if self._thread is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        self._thread = None

    # ------------------------------------------------------------------ handlers
    async def _handle_health(self, request: web.Request) -> web.Response:
        return web.Response(text="OK", status=200)

    async def _handle_route(self, request: web.Request) -> web.Response:
        if request.method == "PUT":
            return await self._handle_route_put(request)
        if request.method == "GET":
            return await self._handle_route_get(request)
        return web.Response(text="Method not allowed", status=405)

    def _registered_count(self) -> int:
        return sum(len(pp) for cp in self.prefill_port_table.values() for tp in cp.values() for pp in tp.values())

    def _expected_count(self) -> int:
        t = self.topology
        if t is None:
            return -1
        return t["dp_size"] * t["attn_cp_size"] * t["attn_tp_size"] * t["pp_size"]

    async def _refuse_unsigned(self, request: web.Request, what: str) -> Optional[web.Response]:
        """401 for a request that does not carry the deployment secret's signature (None: go on)."""
        if self.secret is None:
            return None
        body = await request.read()
        if pd_auth.verify_http(self.secret, what, body, request.headers.get(pd_auth.SIGNATURE_HEADER)):
            return None
        self.refusals.warning(what, "Bootstrap server refused %s from %s: no valid %s", what, request.remote,
                              pd_auth.SIGNATURE_HEADER)
        return web.Response(text=f"{what} needs the deployment secret: no valid {pd_auth.SIGNATURE_HEADER} "
                                 f"(set the same {pd_auth.SECRET_ENV} on every PD server)", status=401)

    async def _handle_route_put(self, request: web.Request) -> web.Response:
        refused = await self._refuse_unsigned(request, "PUT /route")
        if refused is not None:
            return refused
        try:
            data = await request.json()
            rank_ip = str(data["rank_ip"])
            rank_port = int(data["rank_port"])
        except Exception as e:
            return web.Response(text=f"Invalid registration: {e}", status=400)
        g = lambda k, d: data.get(k, d) if data.get(k) is not None else d  # noqa: E731
        attn_tp_size, attn_tp_rank = int(g("attn_tp_size", 1)), int(g("attn_tp_rank", 0))
        attn_cp_size, attn_cp_rank = int(g("attn_cp_size", 1)), int(g("attn_cp_rank", 0))
        attn_dp_size, attn_dp_rank = int(g("attn_dp_size", 1)), int(g("attn_dp_rank", 0))
        pp_size, pp_rank = int(g("pp_size", 1)), int(g("pp_rank", 0))
        system_dp_size, system_dp_rank = int(g("system_dp_size", 1)), int(g("system_dp_rank", 0))
        with self._lock:
            if self.topology is None:
                self.topology = {
                    "attn_tp_size": attn_tp_size,
                    "attn_cp_size": attn_cp_size,
                    "dp_size": attn_dp_size if system_dp_size == 1 else system_dp_size,
                    "pp_size": pp_size,
                    "page_size": g("page_size", None),
                    "kv_cache_dtype": g("kv_cache_dtype", None),
                    "kv_layout": g("kv_layout", None),
                    "dsv41_spec_layout": g("dsv41_spec_layout", None),
                    "follow_bootstrap_room": g("load_balance_method", "follow_bootstrap_room") == "follow_bootstrap_room",
                    "enable_dsa_cache_layer_split": bool(g("enable_dsa_cache_layer_split", False)),
                    "decode_allocation_policy": g("decode_allocation_policy", None),
                    "enable_kv_cache_sharding": bool(g("enable_kv_cache_sharding", False)),
                    "prefill_http_port": g("prefill_http_port", None),
                }
            else:
                if g("decode_allocation_policy", None) != self.topology["decode_allocation_policy"]:
                    return web.Response(text="Inconsistent prefill allocation policies", status=400)
            dp_group = attn_dp_rank if system_dp_size == 1 else system_dp_rank
            key = (dp_group, attn_cp_rank, attn_tp_rank, pp_rank)
            first = self.registrants.setdefault(key, str(request.remote))
            if self.secret is None and first != str(request.remote):
                # No secret: the address that registered a rank is the only one that may move it.
                self.refusals.warning("PUT /route owner", "Bootstrap server refused PUT /route for rank %s from %s: "
                                      "registered from %s", key, request.remote, first)
                return web.Response(text=f"Prefill rank dp={dp_group} cp={attn_cp_rank} tp={attn_tp_rank} pp={pp_rank} "
                                         f"is already registered from another address", status=403)
            self.registrants[key] = str(request.remote)
            table = self.prefill_port_table.setdefault(dp_group, {}).setdefault(attn_cp_rank, {}).setdefault(attn_tp_rank, {})
            table[pp_rank] = {"rank_ip": rank_ip, "rank_port": rank_port}
        logger.debug("Registered prefill rank dp=%s cp=%s tp=%s pp=%s at %s:%s", dp_group, attn_cp_rank, attn_tp_rank, pp_rank, rank_ip, rank_port)
        return web.Response(text="OK", status=200)

    async def _handle_route_get(self, request: web.Request) -> web.Response:
        q = request.query
        values = [q.get(k) for k in _ROUTE_QUERY_KEYS]
        if any(v is None or v == "" for v in values):
            return web.Response(text="Missing inputs for bootstrap server.", status=400)
        try:
            dp_rank, cp_rank, tp_rank, pp_rank = (int(v) for v in values)
        except ValueError:
            return web.Response(text="Missing inputs for bootstrap server.", status=400)
        with self._lock:
            n = self._registered_count()
            if self.topology is None or n < self._expected_count():
                return web.Response(text=f"Prefill server not fully registered yet ({n} workers registered).", status=503)
            if (dp_rank, cp_rank, tp_rank, pp_rank) == (-1, -1, -1, -1):
                t = self.topology
                info = {
                    k: t[k]
                    for k in (
                        "attn_tp_size",
                        "attn_cp_size",
                        "dp_size",
                        "pp_size",
                        "page_size",
                        "kv_cache_dtype",
                        "follow_bootstrap_room",
                        "enable_dsa_cache_layer_split",
                        "decode_allocation_policy",
                        "enable_kv_cache_sharding",
                        "prefill_http_port",
                    )
                }
                for k in ("kv_layout", "dsv41_spec_layout"):
                    if t[k] is not None:
                        info[k] = t[k]
                return self._signed_json(request, info)
            entry = self.prefill_port_table.get(dp_rank, {}).get(cp_rank, {}).get(tp_rank, {}).get(pp_rank)
        if entry is None:
            return web.Response(
                text=f"Bootstrap info not found for dp_rank={dp_rank} cp_rank={cp_rank} tp_rank={tp_rank} pp_rank={pp_rank}",
                status=404,
            )
        return self._signed_json(request, dict(entry))

    def _signed_json(self, request: web.Request, obj) -> web.Response:
        """The answer, signed when there is a secret: the decode side registers its buffers only
        with an endpoint that a holder of the secret named."""
        body = json.dumps(obj).encode("utf-8")
        headers = {}
        if self.secret is not None:
            headers[pd_auth.SIGNATURE_HEADER] = pd_auth.sign_http(self.secret, f"GET {request.path_qs}", body)
        return web.Response(body=body, content_type="application/json", headers=headers)

    def _cleanup_room_entries(self, now: float) -> None:
        expired = [room for room, (_, ts) in self.room_to_dp_rank.items() if now - ts > self.entry_cleanup_interval]
        for room in expired:
            del self.room_to_dp_rank[room]

    async def _handle_register_dp_rank(self, request: web.Request) -> web.Response:
        refused = await self._refuse_unsigned(request, "POST /register_dp_rank")
        if refused is not None:
            return refused
        try:
            data = await request.json()
            room, dp_rank = int(data["bootstrap_room"]), int(data["dp_rank"])
        except Exception as e:
            return web.Response(text=f"Invalid request: {e}", status=400)
        now = time.monotonic()
        with self._lock:
            self._cleanup_room_entries(now)
            self.room_to_dp_rank[room] = (dp_rank, now)
        return web.Response(text="OK", status=200)

    async def _handle_query_dp_ranks(self, request: web.Request) -> web.Response:
        try:
            data = await request.json()
            rooms = [int(r) for r in data["bootstrap_rooms"]]
        except Exception as e:
            return web.Response(text=f"Invalid request: {e}", status=400)
        with self._lock:
            self._cleanup_room_entries(time.monotonic())
            found = {str(r): self.room_to_dp_rank[r][0] for r in rooms if r in self.room_to_dp_rank}
        return web.json_response(found)


# Upstream name of the shared implementation.
CommonKVBootstrapServer = KVBootstrapServer
