"""Life of the HTTP server around its routes: the shared `ServerState`, serving with uvicorn
(with a drain of in-flight requests on SIGINT/SIGTERM), the warm-up request that must pass
before the server declares itself ready, and closing the ZMQ context on the way out.

Kept apart from `http_server` (the routes) so that each file stays about one thing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from typing import Any

from sglang.srt.entrypoints.openai.serving_base import ServingContext, load_model_sampling_defaults

logger = logging.getLogger(__name__)

FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # same value as sglang.srt.disaggregation.utils (which imports torch)


class ServerStatus:
    Starting = "Starting"
    Up = "Up"
    ShuttingDown = "ShuttingDown"


@dataclasses.dataclass
class ServerState:
    ctx: ServingContext
    metrics: Any = None
    status: str = ServerStatus.Starting
    startup_time: float = dataclasses.field(default_factory=time.time)
    uvicorn_server: Any = None
    exit_code: int = 0
    exit_reason: str = ""

    def request_exit(self, code: int, reason: str) -> None:
        """Stops serving (from any thread); `launch_server` then exits with `code`."""
        if not self.exit_code:
            self.exit_code, self.exit_reason = code, reason
        self.status = ServerStatus.ShuttingDown
        if self.uvicorn_server is not None:
            self.uvicorn_server.should_exit = True

    @property
    def tokenizer_manager(self):
        return self.ctx.tokenizer_manager

    @property
    def server_args(self):
        return self.ctx.server_args


def build_state(server_args, procs) -> ServerState:
    """Wires the serving context (and the metrics hook) around started engine processes."""
    tm = procs.tokenizer_manager
    ctx = ServingContext(
        tokenizer_manager=tm,
        server_args=server_args,
        scheduler_info=dict(procs.scheduler_info),
        engine_alive=procs.alive,
        scheduler_heartbeat=procs.heartbeat,
        model_sampling_defaults=load_model_sampling_defaults(procs.scheduler_info.get("model_path")),
    )
    state = ServerState(ctx=ctx)
    if server_args.enable_metrics:
        from sglang.srt.metrics.collector import ServerMetricsCollector

        state.metrics = ServerMetricsCollector({"model_name": ctx.served_model_name}, tokenizer_manager=tm)
        tm.metrics = state.metrics
    return state


def serve(app, server_args, state: ServerState) -> None:
    import uvicorn

    drain_s = float(os.environ.get("SGLANG_SHUTDOWN_DRAIN_TIMEOUT", "3"))

    class _Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            # Runs in the main thread, which is the event loop's thread.
            if state.status != ServerStatus.ShuttingDown:
                state.status = ServerStatus.ShuttingDown  # /health turns 503 at once
                asyncio.get_event_loop().call_soon_threadsafe(lambda: asyncio.ensure_future(_drain(state, drain_s)))
            super().handle_exit(sig, frame)

    config = uvicorn.Config(
        app,
        host=server_args.host,
        port=server_args.port,
        log_level=(server_args.log_level_http or server_args.log_level or "info").lower(),
        timeout_keep_alive=5,
        timeout_graceful_shutdown=drain_s + 3,
        loop="uvloop",
    )
    logging.getLogger("uvicorn.access").addFilter(_HealthCheckFilter())
    server = _Server(config)
    state.uvicorn_server = server
    if state.exit_code:  # a child died before uvicorn started
        return
    server.run()


class _HealthCheckFilter(logging.Filter):
    """Routers and supervisors probe /health every few seconds: a passing probe is not worth an
    access-log line (a failing one still is)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 5 and str(args[2]).startswith("/health") and args[4] == 200:
            return False
        return True


def watch_children(state: ServerState, procs, interval: float = 0.5) -> None:
    """A scheduler or detokenizer that exits (killed, crashed without reporting) takes the server
    down, instead of leaving a server that answers 503 forever."""
    while state.status != ServerStatus.ShuttingDown:
        dead = procs.dead_process()
        if dead is not None:
            name, code = dead
            logger.error("The %s process exited unexpectedly (exit code %s); shutting the server down.", name, code)
            state.request_exit(1, f"the {name} process exited with code {code}")
            return
        time.sleep(interval)


async def _drain(state: ServerState, timeout: float) -> None:
    """On shutdown, in-flight requests get `timeout` seconds to finish; the rest are aborted so
    that their clients get a final chunk (finish_reason abort) instead of a cut connection."""
    tm = state.tokenizer_manager
    deadline = time.time() + timeout
    while tm.rid_to_state and time.time() < deadline:
        await asyncio.sleep(0.05)
    if tm.rid_to_state:
        logger.info("Aborting %d unfinished request(s) for shutdown.", len(tm.rid_to_state))
        tm.abort_request(abort_all=True)


def close_zmq(tm) -> None:
    """Drop unsent messages (a dead scheduler never reads them) so that exit cannot block."""
    ctx = getattr(tm, "ctx", None)
    if ctx is not None:
        try:
            ctx.destroy(linger=0)
        except Exception:  # noqa: BLE001
            pass


def wait_and_warmup(server_args, state: ServerState) -> None:
    """Waits for the HTTP server, sends one real request through it, then declares it up."""
    import requests

    base = server_args.url()
    headers = {"Authorization": f"Bearer {server_args.api_key}"} if server_args.api_key else {}
    deadline = time.time() + 600
    while True:
        try:
            if requests.get(f"{base}/model_info", headers=headers, timeout=5).status_code == 200:
                break
        except requests.RequestException:
            pass
        if time.time() > deadline or state.status == ServerStatus.ShuttingDown:
            logger.error("The HTTP server did not come up; warm-up abandoned.")
            return
        time.sleep(0.2)

    if not server_args.skip_server_warmup:
        payload: dict = {"sampling_params": {"temperature": 0, "max_new_tokens": 8}}
        if server_args.skip_tokenizer_init:
            payload["input_ids"] = [10, 11, 12]
        else:
            payload["text"] = "The capital city of France is"
        if server_args.disaggregation_mode != "null":
            payload["bootstrap_host"] = FAKE_BOOTSTRAP_HOST
            payload["bootstrap_room"] = 0
        route = "/generate"
        if server_args.is_embedding:  # as upstream: embedding servers warm up on /encode
            route = "/encode"
            payload.pop("sampling_params")
        try:
            res = requests.post(f"{base}{route}", json=payload, headers=headers, timeout=600)
            if res.status_code != 200:
                raise RuntimeError(f"status {res.status_code}: {res.text}")
        except Exception as e:  # noqa: BLE001
            logger.error(f"Initialization failed. warmup error: {e}")
            state.request_exit(1, f"warm-up failed: {e}")
            return
    if state.status == ServerStatus.Starting:
        state.status = ServerStatus.Up
        logger.info("The server is fired up and ready to roll!")
