"""Prometheus metrics with upstream SGLang's names (`sglang:` prefix), in one registry.

Two sources feed it:
- the TokenizerManager's `.metrics` hook, called on every output it receives (not for health
  checks: requests with `log_metrics=False`): `on_request_start(rid, prompt_tokens)`,
  `on_tokens(rid, completion_tokens)` for streamed chunks, `on_request_finish(rid, prompt_tokens,
  completion_tokens, cached_tokens, e2e_latency, aborted)`; these drive the token and request
  counters and the TTFT / inter-token / end-to-end latency histograms;
- a snapshot of the scheduler's internal state, refreshed by the `/metrics` route right
  before rendering (queues of every role, KV / host-pool / Mamba-slot occupancy, retractions,
  KV transfers): scraping asks the scheduler instead of having the scheduler push numbers
  nobody reads. `docs/metrics.md` lists every metric.

TTFT and inter-token latency are observed for streamed requests: only those send their
first tokens before they finish. The cache hit rate is cumulative (cached prompt tokens over
all prompt tokens of finished requests), where upstream reports the last prefill batch's.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, Optional

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
ITL_BUCKETS = [0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060,
               0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0]
E2E_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 800]


class ServerMetricsCollector:
    """The metrics object the HTTP server attaches as `TokenizerManager.metrics`."""

    def __init__(self, labels: Dict[str, str], tokenizer_manager: Any = None):
        self.labels = dict(labels)
        self.tokenizer_manager = tokenizer_manager
        self.registry = CollectorRegistry(auto_describe=True)
        names = list(self.labels)

        def counter(name, doc):
            return Counter(name, doc, names, registry=self.registry).labels(**self.labels)

        def histogram(name, doc, buckets):
            return Histogram(name, doc, names, buckets=buckets, registry=self.registry).labels(**self.labels)

        self.prompt_tokens = counter("sglang:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("sglang:generation_tokens", "Number of generation tokens processed.")
        self.cached_tokens = counter("sglang:cached_tokens", "Number of cached prompt tokens.")
        self.num_requests = counter("sglang:num_requests", "Number of requests processed.")
        self.num_requests_received = counter("sglang:num_requests_received", "Number of requests received.")
        self.num_aborted_requests = counter("sglang:num_aborted_requests", "Number of requests aborted.")
        self.ttft = histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              TTFT_BUCKETS)
        self.itl = histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             ITL_BUCKETS)
        self.e2e = histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
                             E2E_BUCKETS)
        self._lock = threading.Lock()
        self._streams: Dict[str, tuple] = {}  # rid -> (time of last chunk, completion tokens so far)
        self._prompt_total = 0
        self._cached_total = 0
        self._scheduler_state: Dict[str, Any] = {}
        self._last_gen_sample: Optional[tuple] = None  # (time, generation tokens) at the last scrape
        self._gen_total = 0
        self.gen_throughput = 0.0
        self.registry.register(_SchedulerStateCollector(self))

    # --- TokenizerManager hook ------------------------------------------------------------------
    def on_request_start(self, rid: str, prompt_tokens: int) -> None:
        self.num_requests_received.inc()

    def on_tokens(self, rid: str, completion_tokens: int) -> None:
        now = time.time()
        with self._lock:
            prev = self._streams.get(rid)
            if prev is None:
                created = self._created_time(rid)
                if created is not None and completion_tokens > 0:
                    self.ttft.observe(now - created)
            else:
                new = completion_tokens - prev[1]
                if new > 0:
                    per_token = (now - prev[0]) / new
                    for _ in range(new):
                        self.itl.observe(per_token)
            self._streams[rid] = (now, completion_tokens)
            self._prune_streams()

    def on_request_finish(self, rid: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int,
                          e2e_latency: float, aborted: bool = False) -> None:
        with self._lock:
            self._streams.pop(rid, None)
            if aborted:
                self.num_aborted_requests.inc()
            self.prompt_tokens.inc(prompt_tokens)
            self.generation_tokens.inc(completion_tokens)
            self.cached_tokens.inc(cached_tokens)
            self.num_requests.inc()
            self.e2e.observe(e2e_latency)
            self._prompt_total += prompt_tokens
            self._cached_total += cached_tokens
            self._gen_total += completion_tokens

    def _created_time(self, rid: str) -> Optional[float]:
        states = getattr(self.tokenizer_manager, "rid_to_state", None) or {}
        st = states.get(rid)
        return getattr(st, "created_time", None)

    def _prune_streams(self) -> None:
        """Streams whose finish never came (the client went away first): forgotten now and then."""
        states = getattr(self.tokenizer_manager, "rid_to_state", None)
        if states is None or len(self._streams) <= 2 * len(states) + 64:
            return
        self._streams = {rid: v for rid, v in self._streams.items() if rid in states}

    # --- scheduler snapshot ---------------------------------------------------------------------
    def update_scheduler_state(self, state: Dict[str, Any]) -> None:
        now = time.time()
        with self._lock:
            self._scheduler_state = dict(state or {})
            if self._last_gen_sample is not None and now > self._last_gen_sample[0]:
                self.gen_throughput = (self._gen_total - self._last_gen_sample[1]) / (now - self._last_gen_sample[0])
            self._last_gen_sample = (now, self._gen_total)

    def cache_hit_rate(self) -> float:
        return self._cached_total / self._prompt_total if self._prompt_total else 0.0

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _SchedulerStateCollector:
    """Gauges read from the latest scheduler snapshot at scrape time."""

    def __init__(self, owner: ServerMetricsCollector):
        self.owner = owner

    def describe(self):
        return []

    def collect(self):
        o = self.owner
        st = o._scheduler_state
        names = list(o.labels)
        values = [o.labels[k] for k in names]

        def gauge(name, doc, value):
            g = GaugeMetricFamily(name, doc, labels=names)
            g.add_metric(values, float(value))
            return g

        max_total = st.get("max_total_num_tokens", 0) or 0
        free = (st.get("available_kv_tokens", 0) or 0) + (st.get("evictable_kv_tokens", 0) or 0)
        used = max(max_total - free, 0) if max_total else 0
        yield gauge("sglang:num_running_reqs", "The number of running requests.", st.get("num_running_reqs", 0))
        yield gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", st.get("num_waiting_reqs", 0))
        yield gauge("sglang:num_used_tokens", "The number of used tokens.", used)
        yield gauge("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", max_total)
        yield gauge("sglang:token_usage", "The token usage.", used / max_total if max_total else 0.0)
        yield gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", o.cache_hit_rate())
        yield gauge("sglang:gen_throughput", "The generation throughput (token/s).", o.gen_throughput)
        yield gauge("sglang:num_grammar_queue_reqs", "The number of requests in the grammar waiting queue.",
                    st.get("num_grammar_queue_reqs", 0))

        if "spec_accept_length" in st:  # a speculative server (upstream's gauges)
            yield gauge("sglang:spec_accept_length", "The average acceptance length of speculative decoding.",
                        st["spec_accept_length"])
            yield gauge("sglang:spec_accept_rate", "The average acceptance rate of speculative decoding.",
                        st["spec_accept_rate"])

        def counter(name, doc, value, extra=None):
            c = CounterMetricFamily(name, doc, labels=names + list(extra or {}))
            c.add_metric(values + list((extra or {}).values()), float(value or 0))
            return c

        yield counter("sglang:num_retracted_requests", "Number of retracted requests.", st.get("num_retracted_reqs_total"))
        yield counter("sglang:num_recomputed_tokens", "Prompt and output tokens recomputed after retractions.",
                      st.get("num_recomputed_tokens"))
        pd = st.get("disaggregation") or {}
        mode = pd.get("mode")
        yield gauge("sglang:num_retracted_reqs", "The number of requests retracted and waiting to resume.",
                    pd.get("num_retracted_queue_reqs", 0))
        backup = st.get("retraction_backup") or {}
        if backup:
            yield counter("sglang:num_retractions_by_backup", "Retractions on a PD decode server, by backup backend.",
                          st.get("num_retracted_reqs_total"), {"backup": backup.get("backend", "")})
            yield gauge("sglang:num_live_retraction_backups", "Retracted requests holding a backup.",
                        backup.get("live_backups", 0))
            if "host_pool_size" in backup:
                total = backup["host_pool_size"]
                yield gauge("sglang:host_pool_tokens_total", "Tokens of the decode retraction host pool.", total)
                yield gauge("sglang:host_pool_tokens_used", "Tokens of the decode retraction host pool in use.",
                            total - backup.get("host_pool_available", total))
            if "mamba_host_slots_total" in backup:
                total = backup["mamba_host_slots_total"]
                yield gauge("sglang:mamba_host_slots_total", "Mamba state slots of the retraction host pool.", total)
                yield gauge("sglang:mamba_host_slots_used", "Mamba state slots of the retraction host pool in use.",
                            total - backup.get("mamba_host_slots_free", total))
        if st.get("mamba_pool_size"):
            total = st["mamba_pool_size"]
            yield gauge("sglang:mamba_slots_total", "Device Mamba / linear-attention state slots.", total)
            yield gauge("sglang:mamba_slots_used", "Device state slots held by requests (the tree's evictable ones not counted).",
                        total - (st.get("available_mamba_slots") or 0) - (st.get("evictable_mamba_slots") or 0))
        if mode == "prefill":
            yield gauge("sglang:num_prefill_bootstrap_queue_reqs", "The number of requests in the prefill bootstrap queue.",
                        pd.get("num_bootstrap_queue_reqs", 0))
            yield gauge("sglang:num_prefill_inflight_queue_reqs", "The number of requests in the prefill inflight queue.",
                        pd.get("num_inflight_queue_reqs", 0))
            yield gauge("sglang:kv_transfer_speed_gb_s", "The KV transfer speed of the last transfer in GB/s.",
                        pd.get("kv_transfer_speed_gb_s", 0.0))
            yield gauge("sglang:kv_transfer_latency_ms", "The KV transfer latency of the last transfer in ms.",
                        pd.get("kv_transfer_latency_ms", 0.0))
            yield counter("sglang:num_kv_transfers", "KV transfers completed.", pd.get("num_kv_transfers"))
            yield counter("sglang:kv_transfer_bytes", "Bytes of KV (and state) sent.", pd.get("kv_transfer_bytes"))
        if mode == "decode":
            yield gauge("sglang:num_decode_prealloc_queue_reqs", "The number of requests in the decode prealloc queue.",
                        pd.get("num_prealloc_queue_reqs", 0))
            yield gauge("sglang:num_decode_transfer_queue_reqs", "The number of requests in the decode transfer queue.",
                        pd.get("num_transfer_queue_reqs", 0))
            yield counter("sglang:decode_radix_hit_tokens", "Prompt tokens the decode radix cache reused.",
                          pd.get("decode_radix_hit_tokens"))
        if mode in ("prefill", "decode"):
            yield counter("sglang:num_kv_transfer_failures", "KV transfers that failed.", pd.get("num_kv_transfer_failures"))
