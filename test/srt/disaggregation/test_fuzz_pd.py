"""The request fuzzer against PD deployments (issue 13): 1P1D over Mooncake TCP behind the real
sglang-router, behind the in-tree mini_lb (same servers), and hybrid pairs (Qwen3-Next, the
Mamba2 hybrid NemotronH) whose KV and state go by the same-host copy (the default on one machine;
the llama pair's decode switches it off, so Mooncake's data path is served end to end too). The llama
pair shares its cores by turns, as launch_pd's servers do on one machine (`SGLANG_CPU_TURNS_FILE`).

After each run: every valid request got a 200 of the right shape, every invalid one a 4xx, no
5xx; prefill, decode and router are healthy; every pool of both servers (KV tokens, request
slots, metadata rows, state slots, host pool) is back to its free size; greedy output through
the router still equals HF transformers. The first test is the issue's own probe: n=2 on every
route through the router (it used to kill the prefill scheduler).
"""

import os
import subprocess
import sys

import pytest
import requests
import sgl_kernel
import torch
from prometheus_client.parser import text_string_to_metric_families

from sglang.srt.disaggregation.mooncake import same_host
from sglang.srt.layers import cpu_ops, fused_decode, logits_processor
from sglang.test.fuzz.cases import FuzzTarget
from sglang.test.fuzz.runner import assert_pools_restored, run_fuzz
from sglang.test.pd_utils import find_free_port, launch_decode, launch_prefill, launch_router, stop_server
from sglang.test.server_utils import hf_greedy_reference, start_side_by_side, wait_healthy_or_stop
from sglang.test.tiny_models import make_tiny_model

pytestmark = pytest.mark.server

COMMON = ["--context-length", "512", "--max-total-tokens", "4096", "--chunked-prefill-size", "64", "--enable-metrics"]
NUM_CASES = 120  # per front end; kept small enough for the CI time limit
PROMPT = [5, 6, 7, 8, 9, 10]
GREEDY = {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True}


def url(port):
    return f"http://127.0.0.1:{port}"


def _deploy(model, logs, name, decode_extra=(), with_mini_lb=False, prefill_extra=(), decode_env=None,
            prefill_env=None):
    procs = []
    ports = {k: find_free_port() for k in ("prefill", "boot", "decode", "router", "lb")}
    try:
        procs += start_side_by_side(
            lambda: launch_prefill(model, ports["prefill"], ports["boot"], [*COMMON, *prefill_extra],
                                   log_path=str(logs / f"{name}_p.log"), env=prefill_env),
            lambda: launch_decode(model, ports["decode"], [*COMMON, *decode_extra], log_path=str(logs / f"{name}_d.log"),
                                  env=decode_env))
        procs.append(launch_router([(ports["prefill"], ports["boot"])], [ports["decode"]], ports["router"],
                                   log_path=str(logs / f"{name}_router.log")))
        if with_mini_lb:
            lb = subprocess.Popen([sys.executable, "-m", "sglang.srt.router.mini_lb", "--host", "127.0.0.1",
                                   "--port", str(ports["lb"]), "--prefill", url(ports["prefill"]),
                                   "--decode", url(ports["decode"]), "--prefill-bootstrap-ports", str(ports["boot"])],
                                  stdout=open(logs / f"{name}_lb.log", "wb"), stderr=subprocess.STDOUT)
            procs.append(wait_healthy_or_stop(lb, ports["lb"], 60))
    except BaseException:
        for p in reversed(procs):
            stop_server(p)
        raise
    return ports, procs


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    model = make_tiny_model(str(tmp_path_factory.mktemp("pd_fuzz_llama")), "llama", seed=17)
    logs = tmp_path_factory.mktemp("logs")
    turns = {**os.environ, "SGLANG_CPU_TURNS_FILE": str(logs / "turns")}
    ports, procs = _deploy(model, logs, "llama", with_mini_lb=True, prefill_env=turns,
                           decode_env={**turns, "SGLANG_DISAGGREGATION_SAME_HOST_COPY": "0"})
    yield {"ports": ports, "model": model, "decode_log": logs / "llama_d.log", "prefill_log": logs / "llama_p.log"}
    for p in reversed(procs):
        stop_server(p)


@pytest.fixture(scope="module", params=["qwen3_next", "nemotron_h"])
def hybrid(request, tmp_path_factory):
    """The two hybrid families on both PD sides: a gated-DeltaNet + MoE model (Qwen3-Next) and a
    Mamba2 one (NemotronH), each with its state sent over Mooncake and kept in state slots. Their
    prefill servers run optimistic prefill (as under launch_pd): KV and state are computed before
    the decode's slots are known and sent when they arrive (the llama pair keeps the default)."""
    arch = request.param
    model = make_tiny_model(str(tmp_path_factory.mktemp(f"pd_fuzz_{arch}")), arch, seed=18)
    logs = tmp_path_factory.mktemp("logs")
    ports, procs = _deploy(model, logs, arch, prefill_extra=["--optimistic-prefill-attempts", "1"])
    yield {"ports": ports, "model": model, "prefill_log": logs / f"{arch}_p.log"}
    for p in reversed(procs):
        stop_server(p)


def _target(front_port, decode_port, behind_router: bool) -> FuzzTarget:
    info = requests.get(url(decode_port) + "/server_info", timeout=30).json()
    return FuzzTarget(url=url(front_port), vocab_size=info["vocab_size"], context_len=info["context_len"],
                      behind_sglang_router=behind_router, tokenize_routes=False,
                      abort_urls=[url(decode_port)], pd=True)


def _after_run(dep, front: str):
    ports = dep["ports"]
    for p in ("prefill", "decode"):
        assert requests.get(url(ports[p]) + "/health", timeout=10).status_code == 200
    assert requests.get(front + "/health", timeout=10).status_code == 200
    assert_pools_restored([url(ports["prefill"]), url(ports["decode"])])
    for p in ("prefill", "decode"):  # --enable-metrics works on both roles, counted the fuzzed requests
        text = requests.get(url(ports[p]) + "/metrics", timeout=30).text
        samples = {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples}
        assert samples["sglang:num_requests_total"] > 0 and samples["sglang:num_running_reqs"] == 0
    r = requests.post(front + "/generate", json={"input_ids": PROMPT, "sampling_params": GREEDY}, timeout=60)
    want, _, _ = hf_greedy_reference(dep["model"], PROMPT, GREEDY["max_new_tokens"])
    assert r.status_code == 200 and r.json()["output_ids"] == want, r.text


def test_issue_probe_n2_on_every_route_through_the_router(llama):
    """n=2 through the router: one room (completions) or a list of rooms (chat) for two samples."""
    router = url(llama["ports"]["router"])
    want, _, _ = hf_greedy_reference(llama["model"], PROMPT, GREEDY["max_new_tokens"])
    r = requests.post(router + "/generate", timeout=60, json={"input_ids": PROMPT, "sampling_params": {**GREEDY, "n": 2}})
    assert r.status_code == 200, r.text
    assert [o["output_ids"] for o in r.json()] == [want, want]
    r = requests.post(router + "/generate", timeout=60, json={"input_ids": [PROMPT, PROMPT[:3]],
                                                              "sampling_params": {**GREEDY, "n": 2}})
    assert r.status_code == 200, r.text
    outs = [o["output_ids"] for o in r.json()]
    assert len(outs) == 4 and outs[0] == outs[1] == want and outs[2] == outs[3]
    c = requests.post(router + "/v1/completions", timeout=60, json={
        "model": "m", "prompt": "Hello there", "n": 2, "max_tokens": 8, "temperature": 0, "ignore_eos": True})
    assert c.status_code == 200, c.text
    texts = [ch["text"] for ch in c.json()["choices"]]
    assert len(texts) == 2 and texts[0] == texts[1]
    ch = requests.post(router + "/v1/chat/completions", timeout=60, json={
        "model": "m", "messages": [{"role": "user", "content": "Hi"}], "n": 3, "max_tokens": 8, "temperature": 0})
    assert ch.status_code == 200, ch.text
    contents = [x["message"]["content"] for x in ch.json()["choices"]]
    assert len(contents) == 3 and len(set(contents)) == 1
    for port in ("prefill", "decode", "router"):
        assert requests.get(url(llama["ports"][port]) + "/health", timeout=10).status_code == 200


def test_fuzz_through_the_real_router(llama):
    ports = llama["ports"]
    report = run_fuzz(_target(ports["router"], ports["decode"], True), num_cases=NUM_CASES, concurrency=32, seed=1302)
    assert not report.violations, report.summary()
    _after_run(llama, url(ports["router"]))
    if sgl_kernel.load():  # the decode server's batches ran the fused CPU decoder layer
        assert fused_decode.USED_MESSAGE in llama["decode_log"].read_text()
    if cpu_ops.linear_panels_enabled(torch.float32):  # and its all-greedy ones the LM head's argmax
        assert logits_processor.ARGMAX_MESSAGE in llama["decode_log"].read_text()
    assert same_host.COPY_MESSAGE not in llama["prefill_log"].read_text()  # its decode switched it off
    for log in (llama["prefill_log"], llama["decode_log"]):  # the two schedulers took turns on one file
        assert "compute turns: shared with every scheduler on" in log.read_text(), log


def test_fuzz_through_the_in_tree_mini_lb(llama):
    ports = llama["ports"]
    report = run_fuzz(_target(ports["lb"], ports["decode"], False), num_cases=NUM_CASES, concurrency=32, seed=1303)
    assert not report.violations, report.summary()
    _after_run(llama, url(ports["lb"]))


def test_fuzz_hybrid_ssm_pair_through_the_router(hybrid):
    ports = hybrid["ports"]
    # half the cases per family: two deployments instead of one in the CI budget
    report = run_fuzz(_target(ports["router"], ports["decode"], True), num_cases=NUM_CASES // 2, concurrency=32,
                      seed=1304)
    assert not report.violations, report.summary()
    _after_run(hybrid, url(ports["router"]))
    # KV and state went by the copy, where the kernel lets sibling processes copy
    assert (same_host.COPY_MESSAGE in hybrid["prefill_log"].read_text()) == same_host.copy_permitted()
