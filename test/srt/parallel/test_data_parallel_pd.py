"""Data parallelism with PD disaggregation: a prefill server and a decode server with
`--dp-size 2` each, behind the real router (test_data_parallel.py covers a plain server).

Apart from test_data_parallel.py so that its three servers are gone before these start."""

from __future__ import annotations

import concurrent.futures as cf

import pytest
import requests

from sglang.test.dp_utils import assert_replica_pools_whole, replica_states
from sglang.test.server_utils import find_free_port, hf_greedy_reference, start_side_by_side, stop_server
from sglang.test.tiny_models import make_tiny_model

pytestmark = pytest.mark.server

COMMON = ["--dtype", "float32", "--max-total-tokens", "4096"]
GREEDY = {"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": True}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_tiny_model(str(tmp_path_factory.mktemp("dp_pd_llama")), "llama", seed=12)


def greedy_prompts(model: str) -> dict:
    """16 prompts of different lengths (token ids) and HF's greedy continuation of each."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    ids = [tok(f"Prompt {i}: " + "the number " * (1 + i % 4) + str(i))["input_ids"] for i in range(16)]
    return {"ids": ids, "refs": [hf_greedy_reference(model, x, GREEDY["max_new_tokens"])[0] for x in ids]}


def generate(url: str, payload: dict) -> dict:
    r = requests.post(url + "/generate", json=payload, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_pd_prefill_and_decode_with_two_replicas_each(model, tmp_path):
    """A prefill server and a decode server with --dp-size 2 each, behind the real router: the
    prefill dispatches each request to replica `bootstrap_room % 2`, whose KV rank the bootstrap
    server knows under that dp rank, and the decode side fetches the KV from there. Greedy tokens
    equal HF's; all four replicas took work; every pool is whole afterwards."""
    from sglang.test.pd_utils import launch_decode, launch_prefill, launch_router

    prompts = greedy_prompts(model)
    ports = {k: find_free_port() for k in ("prefill", "boot", "decode", "router")}
    procs = start_side_by_side(
        lambda: launch_prefill(model, ports["prefill"], ports["boot"], COMMON + ["--dp-size", "2"],
                               log_path=str(tmp_path / "prefill.log")),
        lambda: launch_decode(model, ports["decode"], COMMON + ["--dp-size", "2"], log_path=str(tmp_path / "decode.log")))
    try:
        procs.append(launch_router([(ports["prefill"], ports["boot"])], [ports["decode"]], ports["router"],
                                   log_path=str(tmp_path / "router.log")))
        urls = {k: f"http://127.0.0.1:{ports[k]}" for k in ports}
        before = {k: [s["num_requests_received"] for s in replica_states(urls[k])] for k in ("prefill", "decode")}
        with cf.ThreadPoolExecutor(16) as ex:
            outs = list(ex.map(lambda ids: generate(urls["router"], {"input_ids": ids, "sampling_params": GREEDY}),
                               prompts["ids"]))
        assert [o["output_ids"] for o in outs] == prompts["refs"]
        for k in ("prefill", "decode"):
            got = [a - b for a, b in zip([s["num_requests_received"] for s in replica_states(urls[k])], before[k])]
            assert sum(got) == 16 and min(got) > 0, (k, got)
        for k in ("prefill", "decode"):
            assert_replica_pools_whole(urls[k])
    finally:
        for proc in reversed(procs):
            stop_server(proc)


def test_pd_prefill_dp_needs_the_room_rule():
    from sglang.srt.server_args import ServerArgs

    with pytest.raises(ValueError, match="--load-balance-method round_robin is not supported on a PD prefill server"):
        ServerArgs(model_path="dummy", disaggregation_mode="prefill", dp_size=2, load_balance_method="round_robin")
    assert ServerArgs(model_path="dummy", disaggregation_mode="prefill", dp_size=2).load_balance_method == \
        "follow_bootstrap_room"
