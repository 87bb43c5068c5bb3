"""--tp-size 2 through launch_server (issue 54): two scheduler processes over torch.distributed
(gloo), rank 0 plans and sends each batch, both ranks run the forward on their shards. Greedy
tokens equal tp=1's (the same engine in one process) and HF transformers' on tiny fp32 Llama and
Qwen3 checkpoints, with chunked prefill (prefix slots travel in the plan) and a prefix-cache hit;
the pools are whole afterwards and each rank is bound to its own core."""

import concurrent.futures as cf

import pytest
import requests

from sglang.test.server_utils import find_free_port, popen_launch_server, read_log, stop_server
from sglang.test.tiny_models import make_tiny_model
from sglang.test.tp_utils import GREEDY, hf_tokens, prompts, rank_pids, tp1_tokens

pytestmark = pytest.mark.server

ARGS = ["--tp-size", "2", "--dtype", "float32", "--max-total-tokens", "4096", "--chunked-prefill-size", "16"]


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def server(request, tmp_path_factory):
    model = make_tiny_model(str(tmp_path_factory.mktemp(f"tp_{request.param}")), request.param, seed=4)
    port = find_free_port()
    log = str(tmp_path_factory.mktemp("tp_logs") / f"{request.param}.log")
    proc = popen_launch_server(model, port, ARGS, log_path=log)
    yield {"url": f"http://127.0.0.1:{port}", "model": model, "proc": proc}
    stop_server(proc)


def generate(url, ids):
    r = requests.post(url + "/generate", json={"input_ids": ids, "sampling_params": GREEDY}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_greedy_tokens_equal_tp1_and_hf(server):
    ids = prompts()
    expected = hf_tokens(server["model"], ids)
    assert tp1_tokens(server["model"], ids) == expected
    with cf.ThreadPoolExecutor(len(ids)) as ex:  # concurrent: prefills and decodes batched together
        outs = list(ex.map(lambda p: generate(server["url"], p), ids))
    assert [o["output_ids"] for o in outs] == expected
    batch = generate(server["url"], ids)  # one batched request
    assert [o["output_ids"] for o in batch] == expected


def test_prefix_cache_hit_keeps_tokens(server):
    base = prompts(seed=9)[2]  # 40 tokens: 2 whole chunks of 16 are cached after the first send
    first = generate(server["url"], base)
    again = generate(server["url"], base[:36] + [101, 102, 103])
    assert again["meta_info"]["cached_tokens"] >= 32
    expected = hf_tokens(server["model"], [base, base[:36] + [101, 102, 103]])
    assert [first["output_ids"], again["output_ids"]] == expected


def test_pools_whole_and_ranks_bound(server):
    info = requests.get(server["url"] + "/server_info", timeout=30).json()
    state = info["internal_states"][0]
    assert state["available_kv_tokens"] + state["evictable_kv_tokens"] == state["max_total_num_tokens"]
    assert info["tp_size"] == 2
    log = read_log(server["proc"])
    assert sorted(rank_pids(log)) == [0, 1]
    assert log.count("bound to cores") == 2  # one core group per rank (2 cores here: "0" and "1")
