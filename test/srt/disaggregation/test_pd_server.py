"""PD disaggregation end to end (issue 6): our prefill and decode servers exchange KV over the real
Mooncake engine (TCP on loopback) behind the real sglang-router, and must give exactly the greedy
text of a single plain server."""

import concurrent.futures as cf

import pytest
import requests

from sglang.test.pd_utils import find_free_port, launch_decode, launch_prefill, launch_router, stop_server

pytestmark = pytest.mark.server

PROMPTS = ["The capital of France is", "Once upon a time", "1, 2, 3, 4,", "def fibonacci(n):", "Hello"]
GREEDY = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}
COMMON = ["--max-total-tokens", "4096", "--dtype", "float32"]


def url(port):
    return f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def model_dir(pd_llama_cluster):
    return pd_llama_cluster["model"]


@pytest.fixture(scope="module")
def cluster(pd_llama_cluster, tmp_path_factory):
    """The shared plain server and PD pair (test/srt/conftest.py) behind this module's router."""
    logs = tmp_path_factory.mktemp("pd_logs")
    ports = {**pd_llama_cluster, "router": find_free_port()}
    router = launch_router([(ports["prefill"], ports["boot"])], [ports["decode"]], ports["router"],
                           log_path=str(logs / "router.log"))
    yield ports
    stop_server(router)


def plain_texts(ports, prompts, params=GREEDY):
    r = requests.post(url(ports["plain"]) + "/generate", json={"text": prompts, "sampling_params": params}, timeout=120)
    r.raise_for_status()
    return [o["text"] for o in r.json()]


def test_router_generate_matches_plain_server(cluster):
    expected = plain_texts(cluster, PROMPTS)
    with cf.ThreadPoolExecutor(len(PROMPTS)) as ex:  # concurrent requests through the router
        futs = [ex.submit(requests.post, url(cluster["router"]) + "/generate",
                          json={"text": p, "sampling_params": GREEDY}, timeout=120) for p in PROMPTS]
        outs = [f.result() for f in futs]
    for o, e in zip(outs, expected):
        assert o.status_code == 200, o.text
        body = o.json()
        assert body["text"] == e
        assert body["meta_info"]["completion_tokens"] == 16


def test_router_input_ids_batch_and_stream(cluster):
    ids = [[11, 12, 13, 14, 15], [21, 22, 23]]
    plain = requests.post(url(cluster["plain"]) + "/generate", json={"input_ids": ids, "sampling_params": GREEDY}, timeout=60).json()
    pd = requests.post(url(cluster["router"]) + "/generate", json={"input_ids": ids, "sampling_params": GREEDY}, timeout=60).json()
    assert [o["output_ids"] for o in pd] == [o["output_ids"] for o in plain]
    with requests.post(url(cluster["router"]) + "/generate", json={"text": PROMPTS[0], "stream": True, "sampling_params": GREEDY},
                       stream=True, timeout=60) as r:
        lines = [l for l in r.iter_lines() if l]
    assert lines[-1] == b"data: [DONE]"
    import json

    last = json.loads(lines[-2][len(b"data: "):])
    assert last["text"] == plain_texts(cluster, [PROMPTS[0]])[0]


def test_router_openai_chat_and_completions(cluster):
    import openai

    plain = openai.OpenAI(base_url=url(cluster["plain"]) + "/v1", api_key="x")
    pd = openai.OpenAI(base_url=url(cluster["router"]) + "/v1", api_key="x")
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    a = plain.chat.completions.create(model="m", messages=msgs, max_tokens=12, temperature=0)
    b = pd.chat.completions.create(model="m", messages=msgs, max_tokens=12, temperature=0)
    assert b.choices[0].message.content == a.choices[0].message.content
    a = plain.completions.create(model="m", prompt="Once upon a time", max_tokens=12, temperature=0)
    b = pd.completions.create(model="m", prompt="Once upon a time", max_tokens=12, temperature=0)
    assert b.choices[0].text == a.choices[0].text
    chunks = list(pd.chat.completions.create(model="m", messages=msgs, max_tokens=12, temperature=0, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == plain.chat.completions.create(model="m", messages=msgs, max_tokens=12, temperature=0).choices[0].message.content


def test_mini_lb_text_batch(cluster, tmp_path):
    port = find_free_port()
    lb = launch_router([(cluster["prefill"], cluster["boot"])], [cluster["decode"]], port, mini_lb=True,
                       log_path=str(tmp_path / "minilb.log"))
    try:
        r = requests.post(url(port) + "/generate", json={"text": PROMPTS[:3], "sampling_params": GREEDY}, timeout=120)
        assert r.status_code == 200, r.text
        assert [o["text"] for o in r.json()] == plain_texts(cluster, PROMPTS[:3])
    finally:
        stop_server(lb)


def test_two_prefills_one_decode(cluster, model_dir, tmp_path):
    p2, b2, port = find_free_port(), find_free_port(), find_free_port()
    prefill2 = launch_prefill(model_dir, p2, b2, COMMON, log_path=str(tmp_path / "prefill2.log"))
    try:
        router = launch_router([(cluster["prefill"], cluster["boot"]), (p2, b2)], [cluster["decode"]], port,
                               log_path=str(tmp_path / "router2.log"))
        try:
            outs = [requests.post(url(port) + "/generate", json={"text": p, "sampling_params": GREEDY}, timeout=120).json()["text"]
                    for p in PROMPTS * 2]
            assert outs == plain_texts(cluster, PROMPTS * 2)
        finally:
            stop_server(router)
    finally:
        stop_server(prefill2)


def test_decode_host_pool_retraction_under_pressure(cluster, model_dir, tmp_path):
    """A decode server with a small KV pool retracts, backs up to its host pool, resumes: same text."""
    d2, port = find_free_port(), find_free_port()
    decode2 = launch_decode(model_dir, d2, ["--max-total-tokens", "200", "--dtype", "float32",
                                            "--disaggregation-decode-retraction-backup", "host_pool",
                                            "--num-reserved-decode-tokens", "8"],
                            log_path=str(tmp_path / "decode2.log"))
    try:
        router = launch_router([(cluster["prefill"], cluster["boot"])], [d2], port, log_path=str(tmp_path / "r.log"))
        try:
            params = {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}
            prompts = [p + " and then" for p in PROMPTS] * 2
            with cf.ThreadPoolExecutor(len(prompts)) as ex:
                futs = [ex.submit(requests.post, url(port) + "/generate", json={"text": p, "sampling_params": params},
                                  timeout=300) for p in prompts]
                outs = [f.result().json() for f in futs]
            assert [o["text"] for o in outs] == plain_texts(cluster, prompts, params)
            assert sum(o["meta_info"]["num_retractions"] for o in outs) > 0
            info = requests.get(url(d2) + "/server_info", timeout=30).json()["internal_states"][0]
            assert info["num_recomputed_tokens"] == 0
            assert info["retraction_backup"]["backend"] == "host_pool"
            assert info["retraction_backup"]["host_pool_available"] == info["retraction_backup"]["host_pool_size"]
            assert info["available_kv_tokens"] + info["evictable_kv_tokens"] == info["max_total_num_tokens"]
        finally:
            stop_server(router)
    finally:
        stop_server(decode2)
