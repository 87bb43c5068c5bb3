"""The Prometheus collector fed the way the TokenizerManager feeds it, read back through the
text exposition format (what /metrics serves)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from sglang.srt.metrics.collector import ServerMetricsCollector


def _samples(collector) -> dict:
    out = {}
    for fam in text_string_to_metric_families(collector.render().decode()):
        for s in fam.samples:
            assert s.labels.get("model_name") == "m" or s.name.endswith("_created")
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def test_token_counters_and_latency_histograms():
    tm = SimpleNamespace(rid_to_state={})
    c = ServerMetricsCollector({"model_name": "m"}, tokenizer_manager=tm)
    tm.rid_to_state["r1"] = SimpleNamespace(created_time=time.time() - 0.5)
    c.on_request_start(10)
    c.on_tokens("r1", 1)  # first streamed chunk: TTFT ~0.5 s
    c.on_tokens("r1", 4)  # three more tokens: three inter-token latencies
    c.on_request_finish(10, 6, 4, 1.5)
    c.on_request_start(5)
    c.on_request_finish(5, 3, 0, 0.2)  # a non-streamed request: e2e only
    s = _samples(c)
    assert s["sglang:num_requests_received_total"] == 2
    assert s["sglang:prompt_tokens_total"] == 15
    assert s["sglang:generation_tokens_total"] == 9
    assert s["sglang:cached_tokens_total"] == 4
    assert s["sglang:num_requests_total"] == 2
    assert s["sglang:time_to_first_token_seconds_count"] == 1
    assert 0.5 <= s["sglang:time_to_first_token_seconds_sum"] < 5
    assert s["sglang:inter_token_latency_seconds_count"] == 3
    assert s["sglang:e2e_request_latency_seconds_count"] == 2
    assert abs(s["sglang:e2e_request_latency_seconds_sum"] - 1.7) < 1e-9
    assert abs(s["sglang:cache_hit_rate"] - 4 / 15) < 1e-9


def test_scheduler_snapshot_gauges():
    c = ServerMetricsCollector({"model_name": "m"})
    c.update_scheduler_state({"num_running_reqs": 3, "num_waiting_reqs": 2, "max_total_num_tokens": 1000,
                              "available_kv_tokens": 600, "evictable_kv_tokens": 150, "num_retracted_reqs_total": 7})
    s = _samples(c)
    assert s["sglang:num_running_reqs"] == 3 and s["sglang:num_queue_reqs"] == 2
    assert s["sglang:max_total_num_tokens"] == 1000
    assert s["sglang:num_used_tokens"] == 250 and s["sglang:token_usage"] == 0.25
    assert s["sglang:num_retracted_requests_total"] == 7


def test_forgets_finished_streams():
    tm = SimpleNamespace(rid_to_state={})
    c = ServerMetricsCollector({"model_name": "m"}, tokenizer_manager=tm)
    for i in range(200):
        c.on_tokens(f"gone-{i}", 1)  # requests whose state is already gone
    assert len(c._streams) <= 2 * len(tm.rid_to_state) + 65
