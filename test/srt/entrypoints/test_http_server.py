"""The native HTTP API of a real server subprocess (tiny random Llama, 127.0.0.1): /generate
(single, batch, stream, logprobs, abort), health, info, flush_cache, /metrics, the API key,
upstream's error shapes, and the abort of a request whose client went away.

Outputs are checked against HF transformers' greedy continuation of the same model.
"""

from __future__ import annotations

import json
import re
import threading
import time

import pytest
import requests

from sglang.test.server_utils import find_free_port, hf_greedy_reference, popen_launch_server, read_log, stop_server
from sglang.test.tiny_models import make_tiny_model

pytestmark = pytest.mark.server

API_KEY = "sk-test-key"
CONTEXT_LEN = 8192  # the tiny model's max_position_embeddings: room for long requests that get aborted
MAX_TOTAL_TOKENS = CONTEXT_LEN + 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = make_tiny_model(str(tmp_path_factory.mktemp("tiny_llama")), "llama", max_position_embeddings=CONTEXT_LEN)
    port = find_free_port()
    log = str(tmp_path_factory.mktemp("log") / "server.log")
    proc = popen_launch_server(model, port, ["--max-total-tokens", str(MAX_TOTAL_TOKENS), "--enable-metrics",
                                             "--log-requests", "--log-requests-level", "1",
                                             "--allowed-origins", "http://example.test"],
                               api_key=API_KEY, log_path=log)
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {API_KEY}"
    yield {"url": f"http://127.0.0.1:{port}", "model": model, "http": session, "proc": proc}
    session.close()
    stop_server(proc)


@pytest.fixture(scope="module")
def tokenizer(server):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(server["model"])


def _post(server, path, payload, **kw):
    return server["http"].post(server["url"] + path, json=payload, timeout=120, **kw)


def _internal_state(server) -> dict:
    r = server["http"].get(server["url"] + "/server_info", timeout=30)
    assert r.status_code == 200
    return r.json()["internal_states"][0]


def _wait_idle(server, timeout=60.0) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        st = _internal_state(server)
        if st["num_running_reqs"] == 0 and st["num_waiting_reqs"] == 0:
            return st
        time.sleep(0.1)
    raise AssertionError("the scheduler did not become idle")


GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}


# ------------------------------------------------------------------------------------ startup


def test_started_after_warmup(server):
    assert "The server is fired up and ready to roll!" in read_log(server["proc"])
    assert requests.get(server["url"] + "/health", timeout=10).status_code == 200  # no key needed


def test_health_generate(server):
    r = server["http"].get(server["url"] + "/health_generate", timeout=60)
    assert r.status_code == 200
    # it runs a generation, so it needs the key (upstream leaves it open; test/security/test_auth.py)
    assert requests.get(server["url"] + "/health_generate", timeout=60).status_code == 401


# ------------------------------------------------------------------------------------ /generate


def test_generate_text_matches_hf_greedy(server, tokenizer):
    r = _post(server, "/generate", {"text": "The capital of France is", "sampling_params": GREEDY})
    assert r.status_code == 200, r.text
    out = r.json()
    prompt_ids = tokenizer.encode("The capital of France is")
    ref_ids, _, _ = hf_greedy_reference(server["model"], prompt_ids, 8)
    assert out["output_ids"] == ref_ids
    assert out["text"] == tokenizer.decode(ref_ids)
    meta = out["meta_info"]
    assert meta["prompt_tokens"] == len(prompt_ids)
    assert meta["completion_tokens"] == 8
    assert meta["finish_reason"] == {"type": "length", "length": 8}
    assert meta["e2e_latency"] > 0
    for key in ("id", "cached_tokens", "num_retractions", "weight_version"):
        assert key in meta


def test_generate_put_and_input_ids_with_rid(server):
    ids = [1, 504, 3458, 282]
    r = server["http"].put(server["url"] + "/generate",
                           json={"input_ids": ids, "sampling_params": GREEDY, "rid": "my-rid-1"}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["id"] == "my-rid-1"
    ref_ids, _, _ = hf_greedy_reference(server["model"], ids, 8)
    assert r.json()["output_ids"] == ref_ids


def test_generate_batch_equals_single_requests(server):
    prompts = [[1, 504, 3458], [1, 9, 42, 77, 1020], [1, 3000]]
    r = _post(server, "/generate", {"input_ids": prompts, "sampling_params": GREEDY})
    assert r.status_code == 200, r.text
    outs = r.json()
    assert isinstance(outs, list) and len(outs) == 3
    for ids, out in zip(prompts, outs):
        ref_ids, _, _ = hf_greedy_reference(server["model"], ids, 8)
        assert out["output_ids"] == ref_ids
        assert out["meta_info"]["prompt_tokens"] == len(ids)
    # A batch of texts with per-prompt sampling params.
    r = _post(server, "/generate", {"text": ["Hello", "Good morning"],
                                    "sampling_params": [dict(GREEDY, max_new_tokens=3), dict(GREEDY, max_new_tokens=5)]})
    assert [o["meta_info"]["completion_tokens"] for o in r.json()] == [3, 5]


def test_generate_stream_sse(server):
    payload = {"text": "Once upon a time", "sampling_params": GREEDY, "stream": True}
    with server["http"].post(server["url"] + "/generate", json=payload, stream=True, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.content.decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
    assert len(chunks) >= 2
    # Cumulative text/output_ids; the last chunk carries the finish reason.
    assert [len(c["output_ids"]) for c in chunks] == sorted(len(c["output_ids"]) for c in chunks)
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    whole = _post(server, "/generate", {"text": "Once upon a time", "sampling_params": GREEDY}).json()
    assert chunks[-1]["output_ids"] == whole["output_ids"]
    assert chunks[-1]["text"] == whole["text"]


def test_generate_logprobs_match_hf(server):
    ids = [1, 504, 3458, 282, 17]
    r = _post(server, "/generate", {"input_ids": ids, "sampling_params": GREEDY, "return_logprob": True,
                                    "top_logprobs_num": 3, "return_text_in_logprobs": True})
    assert r.status_code == 200, r.text
    meta = r.json()["meta_info"]
    ref_ids, ref_lps, ref_tops = hf_greedy_reference(server["model"], ids, 8, top_k=3)
    out_lps = meta["output_token_logprobs"]
    assert [t[1] for t in out_lps] == ref_ids
    assert [t[0] for t in out_lps] == pytest.approx(ref_lps, abs=2e-3)
    assert all(isinstance(t[2], str) for t in out_lps)
    assert meta["output_token_logprobs_length"] == 8
    for got, ref in zip(meta["output_top_logprobs"], ref_tops):
        assert [t[1] for t in got] == [i for _, i in ref]
        assert [t[0] for t in got] == pytest.approx([v for v, _ in ref], abs=2e-3)


def test_generate_accepts_router_fields(server):
    """The SGLang router adds these to every /generate it forwards."""
    payload = {"text": "Hi", "sampling_params": GREEDY, "model": None, "return_text_in_logprobs": False,
               "stream": False, "log_metrics": True, "return_hidden_states": False, "background": False,
               "no_logs": False, "return_bytes": False, "return_entropy": False, "some_future_field": 1}
    r = _post(server, "/generate", payload)
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["completion_tokens"] == 8


# ------------------------------------------------------------------------------------ errors


def test_malformed_json_is_400_error_response(server):
    r = server["http"].post(server["url"] + "/generate", data=b'{"text": "Hi", ', timeout=30,
                            headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    body = r.json()
    assert body["object"] == "error" and body["code"] == 400 and body["param"] is None
    assert "JSON decode error" in body["message"]


def test_invalid_sampling_value_is_400(server):
    r = _post(server, "/generate", {"text": "Hi", "sampling_params": {"temperature": -1.0}})
    assert r.status_code == 400
    assert r.json() == {"error": {"message": "temperature must be a non-negative finite number, got -1.0."}}
    r = _post(server, "/generate", {"text": "Hi", "sampling_params": {"top_p": 0}})
    assert r.status_code == 400 and "top_p must be in (0, 1], got 0" in r.json()["error"]["message"]


def test_prompt_too_long_is_400(server):
    r = _post(server, "/generate", {"input_ids": [5] * (CONTEXT_LEN + 10), "sampling_params": GREEDY})
    assert r.status_code == 400
    assert "context length" in r.json()["error"]["message"]


def test_generate_regex_and_a_bad_regex(server):
    r = _post(server, "/generate", {"text": "Hi", "sampling_params": {"regex": "[0-9]{1,4}!", "max_new_tokens": 10}})
    assert r.status_code == 200, r.text
    assert re.fullmatch(r"[0-9]{1,4}!", r.json()["text"]), r.json()
    r = _post(server, "/generate", {"text": "Hi", "sampling_params": {"regex": "[0-9"}})
    assert r.status_code == 400 and "Invalid regex" in r.json()["error"]["message"]


def test_bad_field_type_is_400(server):
    r = _post(server, "/generate", {"text": "Hi", "sampling_params": "not a dict"})
    assert r.status_code == 400
    assert r.json()["type"] == "Bad Request"


# ------------------------------------------------------------------------------------ API key


@pytest.mark.parametrize("method,path", [("GET", "/server_info"), ("GET", "/model_info"), ("POST", "/generate"),
                                         ("GET", "/v1/models"), ("POST", "/v1/chat/completions"),
                                         ("GET", "/flush_cache")])
def test_api_key_required(server, method, path):
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = requests.request(method, server["url"] + path, headers=headers, json={"text": "x"}, timeout=30)
        assert r.status_code == 401
        assert r.json() == {"error": "Unauthorized"}


def test_cors_preflight_needs_no_key(server):
    """For an origin given with --allowed-origins (CORS is off without it: test/security)."""
    r = requests.options(server["url"] + "/v1/chat/completions", timeout=30,
                         headers={"Origin": "http://example.test", "Access-Control-Request-Method": "POST"})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "http://example.test"


# ------------------------------------------------------------------------------------ info/control


def test_model_info(server):
    for path in ("/model_info", "/get_model_info"):
        info = server["http"].get(server["url"] + path, timeout=30).json()
        assert info["model_path"] == server["model"]
        assert info["is_generation"] is True
        assert info["model_type"] == "llama" and info["architectures"] == ["LlamaForCausalLM"]
        assert info["weight_version"] == "default"


def test_server_info(server):
    for path in ("/server_info", "/get_server_info"):
        info = server["http"].get(server["url"] + path, timeout=30).json()
        assert info["max_total_tokens"] == MAX_TOTAL_TOKENS
        assert info["enable_metrics"] is True
        assert info["max_total_num_tokens"] == MAX_TOTAL_TOKENS
        assert info["context_len"] == CONTEXT_LEN
        assert info["version"] and info["frontend"] == "python"
        assert info["api_key"] == "<redacted>"
        # Provenance: derived values name the rule that set them (e.g. the attention backend on CPU).
        assert info["resolution_sources"] and all(isinstance(v, str) for v in info["resolution_sources"].values())
        state = info["internal_states"][0]
        assert state["max_total_num_tokens"] == MAX_TOTAL_TOKENS
        assert "available_kv_tokens" in state


def test_flush_cache(server):
    _post(server, "/generate", {"text": "Fill the radix cache with this prompt", "sampling_params": GREEDY})
    before = _wait_idle(server)
    assert before["evictable_kv_tokens"] > 0
    for method in ("POST", "GET"):
        r = server["http"].request(method, server["url"] + "/flush_cache", timeout=30)
        assert r.status_code == 200
        assert r.text.startswith("Cache flushed.\nPlease check backend logs")
    after = _internal_state(server)
    assert after["evictable_kv_tokens"] == 0
    assert after["available_kv_tokens"] == MAX_TOTAL_TOKENS


def _generate_in_thread(server, payload):
    box = {}

    def run():
        box["response"] = _post(server, "/generate", payload)

    t = threading.Thread(target=run)
    t.start()
    return t, box


def _wait_running(server, n=1, timeout=60.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if _internal_state(server)["num_running_reqs"] >= n:
            return
        time.sleep(0.05)
    raise AssertionError("the request never started running")


LONG_TOKENS = 8000  # ~30 s of decoding or more: an abort must cut it short
LONG = {"temperature": 0, "max_new_tokens": LONG_TOKENS, "ignore_eos": True}


def test_abort_request_by_rid(server):
    t, box = _generate_in_thread(server, {"text": "Abort me", "sampling_params": LONG, "rid": "to-abort"})
    _wait_running(server)
    r = _post(server, "/abort_request", {"rid": "to-abort"})
    assert r.status_code == 200
    t.join(60)
    res = box["response"]
    assert res.status_code == 200
    meta = res.json()["meta_info"]
    assert meta["finish_reason"]["type"] == "abort"
    assert meta["completion_tokens"] < LONG_TOKENS
    _wait_idle(server)


def test_abort_matches_the_rid_exactly(server):
    """Aborting "x1" must not abort "x10" (upstream matches rid prefixes; this fork does not)."""
    t10, box10 = _generate_in_thread(server, {"text": "ten", "rid": "x10",
                                              "sampling_params": {"temperature": 0, "max_new_tokens": 2000,
                                                                  "ignore_eos": True}})
    t1, box1 = _generate_in_thread(server, {"text": "one", "sampling_params": LONG, "rid": "x1"})
    _wait_running(server, 2)
    assert _post(server, "/abort_request", {"rid": "x1"}).status_code == 200
    t1.join(60)
    t10.join(120)
    assert box1["response"].json()["meta_info"]["finish_reason"]["type"] == "abort"
    assert box1["response"].json()["meta_info"]["finish_reason"]["message"] == "Aborted"
    assert box10["response"].json()["meta_info"]["finish_reason"] == {"type": "length", "length": 2000}
    _wait_idle(server)


def test_start_up_log_redacts_the_api_key_and_requests_are_logged(server):
    _post(server, "/generate", {"text": "please keep this prompt private", "rid": "logged-1",
                                "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
    log = read_log(server["proc"])
    assert "server_args=ServerArgs(" in log and "api_key='<redacted>'" in log
    assert API_KEY not in log
    receive = [line for line in log.splitlines() if "Receive: obj=GenerateReqInput(" in line and "logged-1" in line]
    finish = [line for line in log.splitlines() if "Finish: obj=GenerateReqInput(" in line and "logged-1" in line]
    assert receive and finish, log[-3000:]
    assert "please keep this prompt private" not in receive[0] + finish[0]  # level 1: no prompt text
    assert "'e2e_latency':" in finish[0] and "'completion_tokens': 2" in finish[0]
    assert "sampling_params={" in receive[0]  # level 1 keeps the sampling parameters


def test_tokenize_accepts_chat_messages(server):
    messages = [{"role": "user", "content": "Hi there"}]
    r = _post(server, "/v1/tokenize", {"messages": messages})
    assert r.status_code == 200, r.text
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(server["model"])
    want = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert r.json()["tokens"] == tok.encode(want, add_special_tokens=False)
    assert r.json()["count"] == len(r.json()["tokens"])
    bad = _post(server, "/v1/tokenize", {"messages": messages, "prompt": "x"})
    assert bad.status_code == 400 and "Exactly one of 'prompt' or 'messages' must be provided." in bad.text


def test_abort_all(server):
    t, box = _generate_in_thread(server, {"text": ["a b", "c d"], "sampling_params": LONG})
    _wait_running(server, 2)
    assert _post(server, "/abort_request", {"abort_all": True}).status_code == 200
    t.join(60)
    assert [o["meta_info"]["finish_reason"]["type"] for o in box["response"].json()] == ["abort", "abort"]
    _wait_idle(server)


def test_client_disconnect_aborts_and_frees_kv(server):
    server["http"].post(server["url"] + "/flush_cache", timeout=30)
    before = _wait_idle(server)
    assert before["available_kv_tokens"] == MAX_TOTAL_TOKENS
    payload = {"text": "A story that never ends", "sampling_params": LONG, "stream": True}
    r = server["http"].post(server["url"] + "/generate", json=payload, stream=True, timeout=60)
    lines = r.iter_lines()
    got = 0
    for line in lines:
        if line.startswith(b"data: {"):
            got += 1
            if got == 3:
                break
    r.close()  # the client goes away mid-stream
    after = _wait_idle(server)
    # Stopped long before its LONG_TOKENS tokens, and every KV slot is back (free or evictable cache).
    assert after["forward_ct"] - before["forward_ct"] < LONG_TOKENS
    assert after["protected_kv_tokens"] == 0
    assert after["available_kv_tokens"] + after["evictable_kv_tokens"] == MAX_TOTAL_TOKENS


def test_non_streaming_client_disconnect_aborts(server):
    """A non-streaming client that gives up: the TokenizerManager notices within seconds."""
    before = _wait_idle(server)
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.post(server["url"] + "/generate", json={"text": "Impatient", "sampling_params": LONG}, timeout=1,
                      headers={"Authorization": f"Bearer {API_KEY}"})
    after = _wait_idle(server)
    assert after["forward_ct"] - before["forward_ct"] < LONG_TOKENS
    assert after["protected_kv_tokens"] == 0
    assert after["available_kv_tokens"] + after["evictable_kv_tokens"] == MAX_TOTAL_TOKENS


# ------------------------------------------------------------------------------------ metrics


def _metrics(server) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    r = requests.get(server["url"] + "/metrics", timeout=30)  # no API key needed, as upstream
    assert r.status_code == 200
    out = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def test_metrics(server):
    before = _metrics(server)
    res = _post(server, "/generate", {"text": "Counting tokens", "sampling_params": GREEDY}).json()
    payload = {"text": "Streaming tokens", "sampling_params": GREEDY, "stream": True}
    with server["http"].post(server["url"] + "/generate", json=payload, stream=True, timeout=60) as r:
        last = [json.loads(x[6:]) for x in r.content.decode().split("\n\n") if x.startswith("data: {")][-1]
    assert server["http"].get(server["url"] + "/health_generate", timeout=60).status_code == 200
    after = _metrics(server)
    meta, smeta = res["meta_info"], last["meta_info"]
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    assert d["sglang:prompt_tokens_total"] == meta["prompt_tokens"] + smeta["prompt_tokens"]
    assert d["sglang:generation_tokens_total"] == 16
    assert d["sglang:num_requests_total"] == 2  # the health check is not a request
    assert d["sglang:num_requests_received_total"] == 2
    assert d["sglang:e2e_request_latency_seconds_count"] == 2
    assert d["sglang:time_to_first_token_seconds_count"] == 1
    assert d["sglang:inter_token_latency_seconds_count"] >= 1
    assert after["sglang:max_total_num_tokens"] == MAX_TOTAL_TOKENS
    assert after["sglang:num_running_reqs"] == 0 and after["sglang:num_queue_reqs"] == 0
    assert 0.0 <= after["sglang:cache_hit_rate"] <= 1.0
    assert "sglang:num_retracted_requests_total" in after
