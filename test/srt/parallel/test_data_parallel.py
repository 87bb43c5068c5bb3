"""Data parallelism (`--dp-size 2`): two scheduler replicas behind one HTTP/tokenizer front.

Three real servers on one tiny fp32 Llama, started side by side once: `dp2` (round_robin, the
default), `sq` (`--load-balance-method total_requests`, the shortest queue) and `dp1` (one
replica, the reference). Checked: greedy tokens under concurrent load (official openai client,
/generate batches, n > 1) equal HF transformers' and the dp=1 server's; both replicas get work
(per-replica `internal_states` in /server_info, `meta_info.dp_rank`); round-robin and
shortest-queue dispatch differ observably while one replica is busy; an aborted stream (cut by
the client, or by /abort_request) frees its replica's pool; every replica's pools are whole
afterwards; /metrics sums the replicas; `routed_dp_rank` routes; `sglang.Engine(dp_size=2)`;
killing one replica's process takes the server down with exit code 1 within 30 s.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import signal
import time

import pytest
import requests

from sglang.test.dp_utils import assert_replica_pools_whole, replica_states
from sglang.test.server_utils import (
    find_free_port,
    hf_greedy_reference,
    popen_launch_server,
    read_log,
    start_side_by_side,
    stop_server,
)
from sglang.test.tiny_models import make_tiny_model

pytestmark = pytest.mark.server

openai = pytest.importorskip("openai")

MAX_TOTAL_TOKENS = 4096  # per replica
COMMON = ["--dtype", "float32", "--max-total-tokens", str(MAX_TOTAL_TOKENS)]
GREEDY = {"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": True}
# Keeps one replica busy for many seconds (the context is 2048); the tests abort it.
LONG = {"temperature": 0.0, "max_new_tokens": 1900, "ignore_eos": True}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("dp_llama")), "llama", seed=11)


@pytest.fixture(scope="module")
def cluster(model, tmp_path_factory):
    logs = tmp_path_factory.mktemp("dp_logs")
    ports = {name: find_free_port() for name in ("dp2", "sq", "dp1")}
    args = {
        "dp2": COMMON + ["--dp-size", "2", "--enable-metrics"],
        "sq": COMMON + ["--dp-size", "2", "--load-balance-method", "total_requests"],
        "dp1": COMMON,
    }
    # `sq` names its replicas' cores the other way round: SGLANG_CPU_OMP_THREADS_BIND, one group per replica
    env = {"sq": {"SGLANG_CPU_OMP_THREADS_BIND": "1|0"}}
    procs = start_side_by_side(*[
        (lambda n=name: popen_launch_server(model, ports[n], args[n], log_path=str(logs / f"{n}.log"), env=env.get(n)))
        for name in ports])
    out = {"model": model}
    for name, proc in zip(ports, procs):
        out[name] = {"url": f"http://127.0.0.1:{ports[name]}", "proc": proc}
    yield out
    for proc in procs:
        stop_server(proc)


@pytest.fixture(scope="module")
def prompts(model):
    return greedy_prompts(model)


def greedy_prompts(model: str) -> dict:
    """16 prompts of different lengths (token ids) and HF's greedy continuation of each."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    texts = [f"Request number {i}: " + "tell me something about the number " * (1 + i % 4) + str(i) for i in range(16)]
    ids = [tok(t)["input_ids"] for t in texts]
    refs = [hf_greedy_reference(model, x, GREEDY["max_new_tokens"])[0] for x in ids]
    return {"texts": texts, "ids": ids, "refs": refs}


def _generate(url: str, payload: dict) -> dict:
    r = requests.post(url + "/generate", json=payload, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _start_long_stream(url: str, rid: str):
    """A streamed /generate that runs LONG; returns (response, line iterator, dp_rank of its first chunk)."""
    r = requests.post(url + "/generate", json={"text": "Keep going forever", "sampling_params": LONG, "stream": True,
                                               "rid": rid}, stream=True, timeout=120)
    assert r.status_code == 200
    lines = r.iter_lines()
    for line in lines:
        if line.startswith(b"data: {"):
            chunk = json.loads(line[len(b"data: "):])
            assert chunk["meta_info"]["finish_reason"] is None
            return r, lines, chunk["meta_info"]["dp_rank"]
    raise AssertionError("the stream ended before its first chunk")


def _short_ranks(url: str, n: int = 4) -> list:
    """The replicas that n short requests, sent one after the other, ran on."""
    return [_generate(url, {"text": f"short {i}", "sampling_params": GREEDY})["meta_info"]["dp_rank"] for i in range(n)]


# ----------------------------------------------------------------------------------- correctness


def test_concurrent_openai_completions_equal_dp1(cluster, prompts):
    """16 concurrent completions through the official openai client: the dp=2 server answers each
    with the dp=1 server's greedy text, and both replicas took some of them."""
    before = [s["num_requests_received"] for s in replica_states(cluster["dp2"]["url"])]

    def complete(url, prompt):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        try:
            out = client.completions.create(model="any", prompt=prompt, max_tokens=8, temperature=0,
                                            extra_body={"ignore_eos": True})
            return out.choices[0].text
        finally:
            client.close()

    with cf.ThreadPoolExecutor(16) as ex:
        dp2 = list(ex.map(lambda p: complete(cluster["dp2"]["url"], p), prompts["ids"]))
        dp1 = list(ex.map(lambda p: complete(cluster["dp1"]["url"], p), prompts["ids"]))
    assert dp2 == dp1
    after = [s["num_requests_received"] for s in replica_states(cluster["dp2"]["url"])]
    got = [a - b for a, b in zip(after, before)]
    assert sum(got) == 16 and min(got) >= 4, got  # round robin: 8 each, give or take the health checks


def test_generate_batch_and_n_equal_hf(cluster, prompts):
    """/generate with a batch of 16 prompts (each once) and with n=2 (greedy samples): HF's tokens,
    spread over both replicas (`meta_info.dp_rank`)."""
    url = cluster["dp2"]["url"]
    outs = _generate(url, {"input_ids": prompts["ids"], "sampling_params": GREEDY})
    assert [o["output_ids"] for o in outs] == prompts["refs"]
    assert {o["meta_info"]["dp_rank"] for o in outs} == {0, 1}
    outs = _generate(url, {"input_ids": prompts["ids"][:3], "sampling_params": {**GREEDY, "n": 2}})
    assert [o["output_ids"] for o in outs] == [r for r in prompts["refs"][:3] for _ in range(2)]
    assert {o["meta_info"]["dp_rank"] for o in outs} == {0, 1}
    ref = _generate(cluster["dp1"]["url"], {"input_ids": prompts["ids"], "sampling_params": GREEDY})
    assert [o["output_ids"] for o in ref] == prompts["refs"]
    assert "dp_rank" not in ref[0]["meta_info"]  # one replica: upstream's meta_info has none


def test_routed_dp_rank(cluster, prompts):
    url = cluster["dp2"]["url"]
    for rank in (1, 1, 0):
        out = _generate(url, {"input_ids": prompts["ids"][0], "sampling_params": GREEDY, "routed_dp_rank": rank})
        assert out["meta_info"]["dp_rank"] == rank and out["output_ids"] == prompts["refs"][0]
    r = requests.post(url + "/generate", json={"text": "x", "routed_dp_rank": 2}, timeout=30)
    assert r.status_code == 400 and "routed_dp_rank must be an integer in [0, 2)" in r.json()["error"]["message"]


# ----------------------------------------------------------------------------------- dispatch


def test_round_robin_alternates_while_a_replica_is_busy_and_a_cut_stream_frees_it(cluster):
    """round_robin ignores load: with one replica busy on a long stream, four short requests still
    alternate. Then the client cuts the stream mid-way: its replica aborts it and every pool is
    whole again."""
    url = cluster["dp2"]["url"]
    resp, lines, busy = _start_long_stream(url, "dp-long-rr")
    ranks = _short_ranks(url)
    assert ranks == [1 - busy, busy, 1 - busy, busy]
    state = replica_states(url)[busy]
    assert state["num_running_reqs"] == 1  # still running when the shorts were done
    resp.close()  # the client goes away mid-stream
    assert_replica_pools_whole(url)


def test_shortest_queue_avoids_the_busy_replica_and_abort_request_frees_it(cluster):
    """total_requests (the shortest queue, from each replica's reported queue): with one replica
    busy, every short request goes to the other; /abort_request reaches the busy replica."""
    url = cluster["sq"]["url"]
    resp, lines, busy = _start_long_stream(url, "dp-long-sq")
    ranks = _short_ranks(url)
    assert ranks == [1 - busy] * 4
    r = requests.post(url + "/abort_request", json={"rid": "dp-long-sq"}, timeout=30)
    assert r.status_code == 200
    last = None
    for line in lines:
        if line.startswith(b"data: {"):
            last = json.loads(line[len(b"data: "):])
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    assert last["meta_info"]["completion_tokens"] < LONG["max_new_tokens"]
    resp.close()
    assert_replica_pools_whole(url)


# ------------------------------------------------------------------------------ info and metrics


def test_server_info_and_metrics_report_each_replica_and_the_sum(cluster):
    url = cluster["dp2"]["url"]
    info = requests.get(url + "/server_info", timeout=30).json()
    states, total = info["internal_states"], info["internal_states_total"]
    assert [s["dp_rank"] for s in states] == [0, 1] and len({s["pid"] for s in states}) == 2
    assert all(s["max_total_num_tokens"] == MAX_TOTAL_TOKENS and s["num_requests_received"] > 0 for s in states)
    assert total["dp_size"] == 2 and total["max_total_num_tokens"] == 2 * MAX_TOTAL_TOKENS
    assert total["num_requests_received"] == sum(s["num_requests_received"] for s in states)
    assert info["dp_size"] == 2 and info["replica_max_total_num_tokens"] == [MAX_TOTAL_TOKENS] * 2
    metrics = requests.get(url + "/metrics", timeout=30).text
    line = next(x for x in metrics.splitlines() if x.startswith("sglang:max_total_num_tokens{"))
    assert float(line.rsplit(" ", 1)[1]) == 2 * MAX_TOTAL_TOKENS
    assert_replica_pools_whole(url)
    # each replica on its own cores: the even split of the cores, or SGLANG_CPU_OMP_THREADS_BIND's groups
    from sglang.srt.utils.cpu_binding import available_cores, format_cores, replica_cores

    split = replica_cores(2)
    log = read_log(cluster["dp2"]["proc"])
    for i in (0, 1):
        assert f"scheduler DP{i}] CPU threads: {len(split[i])}, bound to cores {format_cores(split[i])} (given)" in log
    if len(available_cores()) >= 2 and available_cores()[:2] == [0, 1]:
        log = read_log(cluster["sq"]["proc"])
        assert "scheduler DP0] CPU threads: 1, bound to cores 1 (given)" in log
        assert "scheduler DP1] CPU threads: 1, bound to cores 0 (given)" in log


def test_replica_cores(monkeypatch):
    from sglang.srt.utils.cpu_binding import ENV, available_cores, replica_cores

    cores = available_cores()
    monkeypatch.delenv(ENV, raising=False)
    assert replica_cores(1) == [None]
    if len(cores) >= 2:
        split = replica_cores(2)
        assert sum(split, []) == cores and all(split) and abs(len(split[0]) - len(split[1])) <= 1
    with pytest.raises(ValueError, match="needs at least one CPU core per replica"):
        replica_cores(len(cores) + 1)
    c = cores[0]
    monkeypatch.setenv(ENV, f"{c}|{c}|{c}")  # upstream's syntax; overlapping groups are the user's choice
    assert replica_cores(2) == [[c], [c]]
    monkeypatch.setenv(ENV, f"{c}|{c}")
    with pytest.raises(ValueError, match="needs one per replica"):
        replica_cores(3)
    monkeypatch.setenv(ENV, ",".join(map(str, cores)))  # one list (launch_pd's): split among the replicas
    assert replica_cores(1) == [cores] and sum(replica_cores(min(2, len(cores))), []) == cores


def test_flush_cache_reaches_every_replica(cluster):
    url = cluster["dp2"]["url"]
    assert requests.post(url + "/flush_cache", timeout=30).status_code == 200
    assert all(s["evictable_kv_tokens"] == 0 for s in assert_replica_pools_whole(url))


# ----------------------------------------------------------------------------------- engine


def test_engine_dp2(model, prompts):
    import sglang

    engine = sglang.Engine(model_path=model, dp_size=2, dtype="float32", max_total_tokens=1024)
    try:
        outs = engine.generate(input_ids=prompts["ids"][:4], sampling_params=GREEDY)
        assert [o["output_ids"] for o in outs] == prompts["refs"][:4]
        assert sorted(o["meta_info"]["dp_rank"] for o in outs) == [0, 0, 1, 1]
        states = engine.get_server_info()["internal_states"]
        assert [s["num_requests_received"] for s in states] == [2, 2]
    finally:
        engine.shutdown()


# ----------------------------------------------------------------------------------- faults


def test_killing_one_replica_takes_the_server_down(cluster):
    """Last in the module: it ends the `sq` server."""
    s = cluster["sq"]
    import psutil

    victim = psutil.Process(replica_states(s["url"])[1]["pid"])
    victim.send_signal(signal.SIGKILL)
    t0 = time.time()

    def health():
        try:
            return requests.get(s["url"] + "/health", timeout=5).status_code
        except requests.RequestException:
            return None  # already gone

    # The server notices within its child-watch interval (0.5 s); from then on /health is never 200.
    while health() == 200 and time.time() - t0 < 5:
        time.sleep(0.05)
    seen = [health() for _ in range(5)]
    assert all(h in (503, None) for h in seen), seen
    assert s["proc"].wait(timeout=30) == 1
    assert time.time() - t0 < 30
    log = read_log(s["proc"])
    assert "The sglang::scheduler_DP1 process exited unexpectedly" in log
    assert "The server exits with code 1" in log
