"""(Tokenizer/HTTP process.) The worker threads that tokenize, render chat templates and parse
large bodies, so that the event loop, which serves every connection and `/health`, never waits
on one request's CPU work.

Why threads and not processes: the HF fast tokenizer (Rust) releases the GIL while it encodes
(measured: a 1 MB prompt took 1.0 s to encode on a worker thread while the event-loop thread,
sleeping 1 ms at a time, never waited more than 13 ms), and the tokenizer object, which lives in
this process, need not be pickled. Jinja rendering and JSON parsing hold the GIL, but Python
hands it over every 5 ms (`sys.getswitchinterval`), so the loop still runs between slices; the
limits of `request_limits` bound how long any of them can take. Concurrent `encode` calls with
the same settings do not mutate the tokenizer (transformers changes truncation or padding only
when a call asks for different ones), so they are safe on several threads.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional

from sglang.srt.managers.request_limits import env_limit

_pool: Optional[ThreadPoolExecutor] = None
_lock = threading.Lock()


def cpu_pool() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=env_limit("cpu_worker_threads"), thread_name_prefix="sglang-cpu")
        return _pool


async def run_cpu(fn: Callable[..., Any], *args, **kwargs) -> Any:
    """`fn(*args, **kwargs)` on a worker thread; its exception is raised here."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(cpu_pool(), functools.partial(fn, *args, **kwargs))
