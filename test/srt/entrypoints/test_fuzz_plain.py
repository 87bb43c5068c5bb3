"""The request fuzzer against a plain server (issue 13): random valid and invalid requests over
every route and parameter, 32 at a time, streams cut mid-way, random aborts. Afterwards every
valid request got a 200 of the right shape, every invalid one a 4xx, nothing a 5xx; the server is
healthy, its pools are back to their free sizes, and greedy output still equals HF transformers.

The server runs chunked prefill (64), mixed chunks and 16-token pages, and a 512-token context
so that prompts near the limit are cheap.
"""

import pytest
import requests
import sgl_kernel
import torch

from sglang.srt.layers import cpu_ops, fused_decode, logits_processor

from sglang.test.fuzz.cases import FuzzTarget
from sglang.test.fuzz.runner import assert_pools_restored, run_fuzz
from sglang.test.server_utils import find_free_port, hf_greedy_reference, popen_launch_server, stop_server
from sglang.test.tiny_models import make_tiny_model

pytestmark = pytest.mark.server

NUM_CASES = 200
PROMPT = [11, 22, 33, 44, 55, 66, 77]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = make_tiny_model(str(tmp_path_factory.mktemp("fuzz_llama")), "llama", seed=13)
    port = find_free_port()
    log = str(tmp_path_factory.mktemp("logs") / "plain.log")
    proc = popen_launch_server(model, port, ["--context-length", "512", "--max-total-tokens", "4096",
                                             "--chunked-prefill-size", "64", "--enable-mixed-chunk", "--page-size", "16"],
                               log_path=log)
    try:
        yield {"url": f"http://127.0.0.1:{port}", "model": model, "log": log}
    finally:
        stop_server(proc)


def test_fuzz_plain_server(server):
    url = server["url"]
    info = requests.get(url + "/server_info", timeout=30).json()
    target = FuzzTarget(url=url, vocab_size=info["vocab_size"], context_len=info["context_len"], abort_urls=[url])
    report = run_fuzz(target, num_cases=NUM_CASES, concurrency=32, seed=1301)
    assert not report.violations, report.summary()
    statuses = report.by_status()
    assert statuses.get("valid 200", 0) > NUM_CASES // 2 and statuses.get("invalid 400", 0) > NUM_CASES // 10
    assert requests.get(url + "/health", timeout=10).status_code == 200
    assert_pools_restored([url])
    if sgl_kernel.load():  # the fuzzed decode batches ran the fused CPU decoder layer
        assert fused_decode.USED_MESSAGE in open(server["log"]).read()
    if cpu_ops.linear_panels_enabled(torch.float32):  # all-greedy batches took their ids from the LM head
        assert logits_processor.ARGMAX_MESSAGE in open(server["log"]).read()
    r = requests.post(url + "/generate", timeout=60, json={
        "input_ids": PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}})
    want, _, _ = hf_greedy_reference(server["model"], PROMPT, 12)
    assert r.json()["output_ids"] == want


@pytest.fixture(scope="module")
def bf16_server(tmp_path_factory):
    """bf16 with head dim 64: the shapes the AMX set's extend attention takes (on CPUs without AMX,
    the other kernel sets'), the KV written by sgl_kernel.store_kv_; 1024-token context, chunks of
    256 so that long prompts extend over a cached prefix."""
    model = make_tiny_model(str(tmp_path_factory.mktemp("fuzz_llama_hd64")), "llama", seed=14, head_dim=64)
    port = find_free_port()
    log = str(tmp_path_factory.mktemp("logs") / "plain_bf16.log")
    proc = popen_launch_server(model, port, ["--dtype", "bfloat16", "--context-length", "1024",
                                             "--max-total-tokens", "8192", "--chunked-prefill-size", "256"],
                               log_path=log)
    try:
        yield {"url": f"http://127.0.0.1:{port}", "model": model, "log": log}
    finally:
        stop_server(proc)


def test_fuzz_bf16_head_dim_64_server(bf16_server):
    """The fuzzer's requests (n > 1, batches, streams cut mid-way, aborts, invalid values) against
    the bf16 prefill path; then a 700-token prompt (three chunks) still gets HF's fp32 next-token
    distribution, as closely as bf16 allows (its top 5, each logprob within 0.05)."""
    url = bf16_server["url"]
    info = requests.get(url + "/server_info", timeout=30).json()
    target = FuzzTarget(url=url, vocab_size=info["vocab_size"], context_len=info["context_len"], abort_urls=[url])
    report = run_fuzz(target, num_cases=120, concurrency=32, seed=1401)
    assert not report.violations, report.summary()
    assert report.by_status().get("valid 200", 0) > 60
    assert requests.get(url + "/health", timeout=10).status_code == 200
    assert_pools_restored([url])
    prompt = [(i * 37 + 11) % 500 + 10 for i in range(700)]
    r = requests.post(url + "/generate", timeout=120, json={
        "input_ids": prompt, "return_logprob": True, "top_logprobs_num": 5,
        "sampling_params": {"temperature": 0, "max_new_tokens": 1, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    _, _, tops = hf_greedy_reference(bf16_server["model"], prompt, 1, top_k=5)
    want = {tok: lp for lp, tok in tops[0]}
    got = {int(t[1]): float(t[0]) for t in r.json()["meta_info"]["output_top_logprobs"][0]}
    shared = set(want) & set(got)
    assert len(shared) >= 4, (want, got)  # the same leading tokens, near-ties aside
    assert all(abs(got[t] - want[t]) < 0.05 for t in shared), (want, got)
    assert_pools_restored([url])
