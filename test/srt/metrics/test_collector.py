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
    c.on_request_start("r1", 10)
    c.on_tokens("r1", 1)  # first streamed chunk: TTFT ~0.5 s
    c.on_tokens("r1", 4)  # three more tokens: three inter-token latencies
    c.on_request_finish("r1", 10, 6, 4, 1.5)
    assert "r1" not in c._streams  # forgotten once finished
    c.on_request_start("r2", 5)
    c.on_request_finish("r2", 5, 3, 0, 0.2, aborted=True)  # a non-streamed request: e2e only
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
    assert s["sglang:num_aborted_requests_total"] == 1


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


def test_pd_queue_transfer_and_pool_gauges():
    prefill = ServerMetricsCollector({"model_name": "m"})
    prefill.update_scheduler_state({"disaggregation": {
        "mode": "prefill", "num_bootstrap_queue_reqs": 2, "num_inflight_queue_reqs": 1, "num_kv_transfers": 5,
        "kv_transfer_bytes": 4096, "kv_transfer_latency_ms": 1.5, "kv_transfer_speed_gb_s": 0.25,
        "num_kv_transfer_failures": 1}})
    s = _samples(prefill)
    assert s["sglang:num_prefill_bootstrap_queue_reqs"] == 2 and s["sglang:num_prefill_inflight_queue_reqs"] == 1
    assert s["sglang:num_kv_transfers_total"] == 5 and s["sglang:kv_transfer_bytes_total"] == 4096
    assert s["sglang:kv_transfer_latency_ms"] == 1.5 and s["sglang:kv_transfer_speed_gb_s"] == 0.25
    assert s["sglang:num_kv_transfer_failures_total"] == 1
    assert "sglang:num_decode_prealloc_queue_reqs" not in s
    decode = ServerMetricsCollector({"model_name": "m"})
    decode.update_scheduler_state({
        "num_retracted_reqs_total": 4, "num_recomputed_tokens": 0, "mamba_pool_size": 8, "available_mamba_slots": 3,
        "evictable_mamba_slots": 1,
        "retraction_backup": {"backend": "host_pool", "live_backups": 2, "host_pool_size": 100, "host_pool_available": 60,
                              "mamba_host_slots_total": 8, "mamba_host_slots_free": 6},
        "disaggregation": {"mode": "decode", "num_prealloc_queue_reqs": 3, "num_transfer_queue_reqs": 1,
                           "num_retracted_queue_reqs": 2, "decode_radix_hit_tokens": 49, "num_kv_transfer_failures": 0}})
    s = _samples(decode)
    assert s["sglang:num_decode_prealloc_queue_reqs"] == 3 and s["sglang:num_decode_transfer_queue_reqs"] == 1
    assert s["sglang:num_retracted_reqs"] == 2 and s["sglang:num_retracted_requests_total"] == 4
    assert s["sglang:num_retractions_by_backup_total"] == 4 and s["sglang:num_live_retraction_backups"] == 2
    assert s["sglang:host_pool_tokens_used"] == 40 and s["sglang:host_pool_tokens_total"] == 100
    assert s["sglang:mamba_host_slots_used"] == 2 and s["sglang:mamba_slots_used"] == 4
    assert s["sglang:decode_radix_hit_tokens_total"] == 49 and s["sglang:num_recomputed_tokens_total"] == 0
