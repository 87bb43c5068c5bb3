"""The OpenAI-compatible API of a real server subprocess, driven by the official `openai`
client: completions, chat (template from the tokenizer), streaming with usage, n, stop,
logprobs, SGLang extensions, models, upstream's error bodies, and router-added fields; the
Responses API (a chat completion per turn, typed stream events, stored conversations) and
upstream's `/v1/score` on a generation model.

Greedy outputs and logprobs are checked against HF transformers on the same tiny model.
"""

from __future__ import annotations

import re

import pytest
import requests

from sglang.test.server_utils import find_free_port, hf_greedy_reference, popen_launch_server, stop_server
from sglang.test.tiny_models import make_tiny_model

pytestmark = pytest.mark.server

openai = pytest.importorskip("openai")

CONTEXT_LEN = 2048
MAX_TOTAL_TOKENS = 1024  # below the context length: the scheduler's own input-length check is reachable
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is the capital of France?"}]
NO_EOS = {"ignore_eos": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = make_tiny_model(str(tmp_path_factory.mktemp("tiny_qwen2")), "qwen2")
    port = find_free_port()
    log = str(tmp_path_factory.mktemp("log") / "server.log")
    proc = popen_launch_server(model, port, ["--max-total-tokens", str(MAX_TOTAL_TOKENS), "--served-model-name", "tiny-test",
                                               "--enable-cache-report"],
                               log_path=log)
    url = f"http://127.0.0.1:{port}"
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
    yield {"url": url, "model": model, "client": client}
    client.close()
    stop_server(proc)


@pytest.fixture(scope="module")
def tokenizer(server):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(server["model"])


@pytest.fixture(scope="module")
def chat_prompt_ids(tokenizer):
    return tokenizer.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True, return_dict=False)


# ------------------------------------------------------------------------------------ completions


def test_completion_matches_hf_greedy(server, tokenizer):
    c = server["client"].completions.create(model="tiny-test", prompt="The capital of France is", max_tokens=8,
                                            temperature=0, extra_body=NO_EOS)
    ref_ids, _, _ = hf_greedy_reference(server["model"], tokenizer.encode("The capital of France is"), 8)
    assert c.object == "text_completion" and c.model == "tiny-test"
    assert c.choices[0].text == tokenizer.decode(ref_ids)
    assert c.choices[0].finish_reason == "length"
    assert c.usage.prompt_tokens == len(tokenizer.encode("The capital of France is"))
    assert c.usage.completion_tokens == 8 and c.usage.total_tokens == c.usage.prompt_tokens + 8
    assert c.usage.prompt_tokens_details.cached_tokens >= 0


def test_completion_default_max_tokens_is_16(server):
    c = server["client"].completions.create(model="tiny-test", prompt="Hello", temperature=0, extra_body=NO_EOS)
    assert c.usage.completion_tokens == 16


def test_completion_token_prompt_batch_and_echo(server, tokenizer):
    prompts = [[1, 504, 3458], [1, 9, 42, 77]]
    c = server["client"].completions.create(model="tiny-test", prompt=prompts, max_tokens=4, temperature=0,
                                            extra_body=NO_EOS)
    assert [ch.index for ch in c.choices] == [0, 1]
    for ids, ch in zip(prompts, c.choices):
        ref_ids, _, _ = hf_greedy_reference(server["model"], ids, 4)
        assert ch.text == tokenizer.decode(ref_ids)
    e = server["client"].completions.create(model="tiny-test", prompt="Echo this", max_tokens=3, temperature=0,
                                            echo=True, extra_body=NO_EOS)
    assert e.choices[0].text.startswith("Echo this") and len(e.choices[0].text) > len("Echo this")


def test_completion_logprobs_match_hf(server, tokenizer):
    prompt_ids = tokenizer.encode("Logprobs please")
    c = server["client"].completions.create(model="tiny-test", prompt="Logprobs please", max_tokens=5, temperature=0,
                                            logprobs=3, extra_body=NO_EOS)
    ref_ids, ref_lps, ref_tops = hf_greedy_reference(server["model"], prompt_ids, 5, top_k=3)
    lp = c.choices[0].logprobs
    assert lp.tokens == [tokenizer.decode([t]) for t in ref_ids]
    assert lp.token_logprobs == pytest.approx(ref_lps, abs=2e-3)
    assert len(lp.top_logprobs) == 5
    for got, ref in zip(lp.top_logprobs, ref_tops):
        assert len(got) == 3
        assert sorted(got.values(), reverse=True) == pytest.approx([v for v, _ in ref], abs=2e-3)


def test_completion_stream_with_usage(server):
    client = server["client"]
    whole = client.completions.create(model="tiny-test", prompt="Stream me", max_tokens=10, temperature=0,
                                      extra_body=NO_EOS)
    chunks = list(client.completions.create(model="tiny-test", prompt="Stream me", max_tokens=10, temperature=0,
                                            stream=True, stream_options={"include_usage": True}, extra_body=NO_EOS))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == whole.choices[0].text
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_completion_stop_string(server, tokenizer):
    client = server["client"]
    full = client.completions.create(model="tiny-test", prompt="Stop test", max_tokens=12, temperature=0,
                                     extra_body=NO_EOS).choices[0].text
    ids = tokenizer.encode(full, add_special_tokens=False)
    stop = tokenizer.decode(ids[4:6])
    assert stop and stop in full
    c = client.completions.create(model="tiny-test", prompt="Stop test", max_tokens=12, temperature=0, stop=[stop],
                                  extra_body=NO_EOS)
    assert c.choices[0].finish_reason == "stop"
    assert c.choices[0].text == full[: full.find(stop)]
    assert c.choices[0].model_extra["matched_stop"] == stop


def test_concurrent_completions_match_hf(server, tokenizer):
    """Requests arriving together are batched by the scheduler; each still gets its own greedy text."""
    from concurrent.futures import ThreadPoolExecutor

    prompts = [f"Concurrent prompt number {i} says" for i in range(6)]

    def ask(p):
        return server["client"].completions.create(model="tiny-test", prompt=p, max_tokens=6, temperature=0,
                                                   extra_body=NO_EOS).choices[0].text

    with ThreadPoolExecutor(len(prompts)) as pool:
        texts = list(pool.map(ask, prompts))
    for p, text in zip(prompts, texts):
        ref_ids, _, _ = hf_greedy_reference(server["model"], tokenizer.encode(p), 6)
        assert text == tokenizer.decode(ref_ids)


# ------------------------------------------------------------------------------------ chat


def test_chat_matches_hf_greedy(server, tokenizer, chat_prompt_ids):
    c = server["client"].chat.completions.create(model="tiny-test", messages=MESSAGES, max_tokens=8, temperature=0,
                                                 extra_body=NO_EOS)
    ref_ids, _, _ = hf_greedy_reference(server["model"], chat_prompt_ids, 8)
    assert c.object == "chat.completion"
    assert c.choices[0].message.role == "assistant"
    assert c.choices[0].message.content == tokenizer.decode(ref_ids, skip_special_tokens=True)
    assert c.usage.prompt_tokens == len(chat_prompt_ids)
    assert c.usage.completion_tokens == 8


def test_chat_max_completion_tokens_wins(server):
    c = server["client"].chat.completions.create(model="tiny-test", messages=MESSAGES, max_completion_tokens=3,
                                                 temperature=0, extra_body=NO_EOS)
    assert c.usage.completion_tokens == 3 and c.choices[0].finish_reason == "length"


def test_chat_stream_with_usage(server):
    client = server["client"]
    whole = client.chat.completions.create(model="tiny-test", messages=MESSAGES, max_tokens=10, temperature=0,
                                           extra_body=NO_EOS)
    chunks = list(client.chat.completions.create(model="tiny-test", messages=MESSAGES, max_tokens=10, temperature=0,
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_body=NO_EOS))
    with_choices = [c for c in chunks if c.choices]
    assert with_choices[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in with_choices) == whole.choices[0].message.content
    assert with_choices[-1].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    assert all(c.object == "chat.completion.chunk" for c in chunks)


def test_chat_stream_continuous_usage(server):
    chunks = list(server["client"].chat.completions.create(
        model="tiny-test", messages=MESSAGES, max_tokens=4, temperature=0, stream=True, extra_body=NO_EOS,
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    counts = [c.usage.completion_tokens for c in chunks if c.choices]
    assert counts == sorted(counts) and counts[-1] == 4
    assert chunks[-1].usage.completion_tokens == 4


def test_chat_stream_without_usage_has_none(server):
    chunks = list(server["client"].chat.completions.create(model="tiny-test", messages=MESSAGES, max_tokens=3,
                                                           temperature=0, stream=True))
    assert all(c.usage is None for c in chunks)


def test_chat_n2_seeded_sampling(server):
    client = server["client"]
    kw = dict(model="tiny-test", messages=MESSAGES, max_tokens=6, temperature=1.0, n=2, seed=1234, extra_body=NO_EOS)
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    assert [ch.index for ch in a.choices] == [0, 1]
    assert a.usage.completion_tokens == 12
    assert [ch.message.content for ch in a.choices] == [ch.message.content for ch in b.choices]
    streamed = list(client.chat.completions.create(stream=True, **kw))
    by_index = {}
    for c in streamed:
        for ch in c.choices:
            by_index[ch.index] = by_index.get(ch.index, "") + (ch.delta.content or "")
    assert sorted(by_index) == [0, 1]


def test_chat_logprobs_match_hf(server, tokenizer, chat_prompt_ids):
    c = server["client"].chat.completions.create(model="tiny-test", messages=MESSAGES, max_tokens=4, temperature=0,
                                                 logprobs=True, top_logprobs=2, extra_body=NO_EOS)
    ref_ids, ref_lps, ref_tops = hf_greedy_reference(server["model"], chat_prompt_ids, 4, top_k=2)
    content = c.choices[0].logprobs.content
    assert [t.token for t in content] == [tokenizer.decode([i]) for i in ref_ids]
    assert [t.logprob for t in content] == pytest.approx(ref_lps, abs=2e-3)
    for t, ref in zip(content, ref_tops):
        assert t.bytes == list(t.token.encode())
        assert [x.logprob for x in t.top_logprobs] == pytest.approx([v for v, _ in ref], abs=2e-3)


def test_chat_sglang_extensions(server):
    c = server["client"].chat.completions.create(
        model="tiny-test", messages=MESSAGES, max_tokens=5, temperature=0.7, top_p=0.9, frequency_penalty=0.5,
        presence_penalty=0.2, extra_body={"top_k": 5, "min_p": 0.01, "repetition_penalty": 1.1, "min_tokens": 5,
                                          "no_stop_trim": True, "skip_special_tokens": False})
    assert c.usage.completion_tokens == 5


def test_chat_accepts_router_fields(server):
    body = {"model": "tiny-test", "messages": MESSAGES, "max_completion_tokens": 3, "temperature": 0,
            "logprobs": False, "no_stop_trim": False, "ignore_eos": True, "continue_final_message": False,
            "skip_special_tokens": True, "separate_reasoning": True, "stream_reasoning": True,
            "return_hidden_states": False, "bootstrap_host": None, "bootstrap_port": None, "bootstrap_room": None,
            "unknown_future_field": {"x": 1}}
    r = requests.post(server["url"] + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3
    body = {"model": "tiny-test", "prompt": "Hi", "max_tokens": 2, "echo": False, "no_stop_trim": False,
            "ignore_eos": True, "skip_special_tokens": True, "return_hidden_states": False, "bootstrap_room": None}
    r = requests.post(server["url"] + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text


# ------------------------------------------------------------------------------------ errors


def _error_body(r, code=400):
    assert r.status_code == code, r.text
    body = r.json()
    assert set(body) == {"object", "message", "type", "param", "code"}
    assert body["object"] == "error" and body["code"] == code and body["param"] is None
    return body


def test_invalid_sampling_value_is_400(server):
    with pytest.raises(openai.BadRequestError):
        server["client"].chat.completions.create(model="tiny-test", messages=MESSAGES, temperature=-1)
    r = requests.post(server["url"] + "/v1/completions", json={"prompt": "Hi", "top_p": 1.5}, timeout=30)
    body = _error_body(r)
    assert body["type"] == "BadRequestError"
    assert body["message"] == "top_p must be in (0, 1], got 1.5."


def test_prompt_too_long_is_400(server):
    r = requests.post(server["url"] + "/v1/completions", json={"prompt": [7] * (CONTEXT_LEN + 5)}, timeout=30)
    assert "context length" in _error_body(r)["message"]
    r = requests.post(server["url"] + "/v1/chat/completions", timeout=30,
                      json={"messages": [{"role": "user", "content": "x " * (CONTEXT_LEN + 5)}], "stream": True})
    assert "context length" in _error_body(r)["message"]


def test_max_completion_tokens_past_the_context_is_upstreams_400(server):
    """Chat checks the completion budget against the context length with upstream's text (its
    missing space included), for both field names."""
    for field in ("max_tokens", "max_completion_tokens"):
        r = requests.post(server["url"] + "/v1/chat/completions", timeout=30,
                          json={"messages": MESSAGES, field: 4 * CONTEXT_LEN})
        body = _error_body(r)
        assert body["type"] == "BadRequestError"
        assert body["message"] == (f"max_completion_tokens is too large: {4 * CONTEXT_LEN}."
                                   f"This model supports at most {CONTEXT_LEN} completion tokens.")


def test_scheduler_rejection_maps_to_400(server):
    """Shorter than the context but longer than the KV pool: the scheduler aborts it with
    status 400, which a non-streaming (and a not-yet-started streaming) response turns into
    an HTTP 400."""
    prompt = [7] * (MAX_TOTAL_TOKENS + 100)
    for stream in (False, True):
        r = requests.post(server["url"] + "/v1/completions", timeout=30,
                          json={"prompt": prompt, "max_tokens": 4, "stream": stream})
        body = _error_body(r)
        assert body["type"] == "BadRequestError"
        assert f"Input length ({len(prompt)} tokens) exceeds the maximum allowed length" in body["message"]


def test_malformed_json_and_missing_fields_are_400(server):
    r = requests.post(server["url"] + "/v1/chat/completions", data=b"{not json", timeout=30,
                      headers={"Content-Type": "application/json"})
    assert _error_body(r)["type"] == "Bad Request"
    r = requests.post(server["url"] + "/v1/chat/completions", json={"model": "tiny-test"}, timeout=30)
    assert "messages" in _error_body(r)["message"]
    r = requests.post(server["url"] + "/v1/chat/completions", json={"messages": []}, timeout=30)
    assert "Messages cannot be empty" in _error_body(r)["message"]
    r = requests.post(server["url"] + "/v1/completions", json={"prompt": ""}, timeout=30)
    assert _error_body(r)["message"] == "Prompt cannot be empty"


def test_non_text_content_is_rejected(server):
    msgs = [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                         {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]
    r = requests.post(server["url"] + "/v1/chat/completions", json={"messages": msgs}, timeout=30)
    assert "'image_url' is not supported" in _error_body(r)["message"]
    # Text-only content parts are joined into one message.
    msgs = [{"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "this?"}]}]
    r = requests.post(server["url"] + "/v1/chat/completions", json={"messages": msgs, "max_tokens": 2}, timeout=30)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("extra, prefix", [({"regex": "[a-z]+"}, r"[a-z]*"), ({"json_schema": "{}"}, r"[\[{\"0-9tfn-].*|"),
                                           ({"ebnf": "root ::= \"abc\""}, r"a?b?c?"),
                                           ({"response_format": {"type": "json_object"}}, r"\{.*|")])
def test_structured_output_cut_by_max_tokens_is_a_prefix(server, extra, prefix):
    """2 tokens are not enough for most grammars: the answer is a 200 whose text starts a word of
    the language (finish "length"), or a whole word (finish "stop")."""
    r = server["client"].chat.completions.create(model="tiny-test", messages=MESSAGES, max_tokens=2, extra_body=extra)
    c = r.choices[0]
    assert c.finish_reason in ("stop", "length")
    assert re.fullmatch(prefix, c.message.content, re.S), c.message.content


# ------------------------------------------------------------------------------------ models


def test_models(server):
    models = server["client"].models.list()
    assert [m.id for m in models.data] == ["tiny-test"]
    assert models.data[0].owned_by == "sglang"
    assert models.data[0].model_extra["max_model_len"] == CONTEXT_LEN
    assert server["client"].models.retrieve("tiny-test").id == "tiny-test"


def test_unknown_model_is_404_as_upstream(server):
    r = requests.get(server["url"] + "/v1/models/no-such-model", timeout=30)
    assert r.status_code == 404
    assert r.json() == {"error": {"message": "The model 'no-such-model' does not exist",
                                  "type": "invalid_request_error", "param": "model", "code": "model_not_found"}}
    with pytest.raises(openai.NotFoundError):
        server["client"].models.retrieve("no-such-model")


# ------------------------------------------------------------------------------------ behind the router


def test_behind_the_sglang_router(server, tmp_path):
    """The real SGLang router in front of this server: it probes the worker, then forwards
    OpenAI and native requests with its own added fields."""
    pytest.importorskip("sglang_router")
    import subprocess
    import sys

    from sglang.test.server_utils import wait_for_health

    port = find_free_port()
    log = open(tmp_path / "router.log", "wb")
    # Its Prometheus port defaults to 29000: pick a free one so parallel runs cannot collide.
    router = subprocess.Popen([sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", server["url"],
                               "--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
                               "--prometheus-port", str(find_free_port())],
                              stdout=log, stderr=subprocess.STDOUT)
    log.close()
    try:
        url = f"http://127.0.0.1:{port}"
        try:
            wait_for_health(url, timeout=60, process=router, path="/v1/models")
        except (RuntimeError, TimeoutError):
            raise AssertionError("the router did not start:\n" + (tmp_path / "router.log").read_text(errors="replace"))
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        c = client.chat.completions.create(model="tiny-test", messages=MESSAGES, max_tokens=4, temperature=0,
                                           extra_body=NO_EOS)
        direct = server["client"].chat.completions.create(model="tiny-test", messages=MESSAGES, max_tokens=4,
                                                          temperature=0, extra_body=NO_EOS)
        assert c.choices[0].message.content == direct.choices[0].message.content
        chunks = list(client.chat.completions.create(model="tiny-test", messages=MESSAGES, max_tokens=4,
                                                     temperature=0, stream=True, extra_body=NO_EOS))
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == c.choices[0].message.content
        r = requests.post(url + "/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 3,
                                                                                   "ignore_eos": True}}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["meta_info"]["completion_tokens"] == 3
        resp = client.responses.create(model="tiny-test", input=MESSAGES[1]["content"], instructions=MESSAGES[0]["content"],
                                       max_output_tokens=4, temperature=0)
        assert resp.status == "completed" and resp.output_text == _chat_text(server, MESSAGES, 4)[0]
        client.close()
    finally:
        router.terminate()
        try:
            router.wait(timeout=15)
        except subprocess.TimeoutExpired:
            router.kill()
            router.wait(timeout=15)


def test_tokenize_and_detokenize(server, tokenizer):
    r = requests.post(server["url"] + "/v1/tokenize", json={"model": "tiny-test", "prompt": "Count my tokens"}, timeout=30)
    assert r.status_code == 200, r.text
    ids = tokenizer.encode("Count my tokens")
    assert r.json() == {"tokens": ids, "count": len(ids), "max_model_len": CONTEXT_LEN}
    r = requests.post(server["url"] + "/tokenize", json={"prompt": ["a b", "c"], "add_special_tokens": False}, timeout=30)
    assert r.json()["count"] == [len(tokenizer.encode(p, add_special_tokens=False)) for p in ("a b", "c")]
    r = requests.post(server["url"] + "/v1/detokenize", json={"tokens": ids}, timeout=30)
    assert r.json() == {"text": tokenizer.decode(ids, skip_special_tokens=True)}
    r = requests.post(server["url"] + "/detokenize", json={"tokens": [ids, ids[:2]]}, timeout=30)
    assert r.json()["text"] == [tokenizer.decode(ids, skip_special_tokens=True),
                                tokenizer.decode(ids[:2], skip_special_tokens=True)]


# ------------------------------------------------------------------------------------ responses


def _chat_text(server, messages, max_tokens):
    c = server["client"].chat.completions.create(model="tiny-test", messages=messages, max_tokens=max_tokens,
                                                 temperature=0)
    return c.choices[0].message.content, c.usage


def test_responses_are_a_chat_completion(server):
    text, usage = _chat_text(server, MESSAGES, 8)
    r = server["client"].responses.create(model="tiny-test", input=MESSAGES[1]["content"],
                                          instructions=MESSAGES[0]["content"], max_output_tokens=8, temperature=0)
    assert r.id.startswith("resp_") and r.object == "response" and r.status == "completed"
    assert r.model == "tiny-test" and r.output_text == text
    item = r.output[0]
    assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")
    assert item.content[0].type == "output_text"
    assert r.usage.input_tokens == usage.prompt_tokens and r.usage.output_tokens == usage.completion_tokens
    assert r.usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    items = [{"type": "message", "role": "system", "content": MESSAGES[0]["content"]},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": MESSAGES[1]["content"]}]}]
    as_list = server["client"].responses.create(model="tiny-test", input=items, max_output_tokens=8, temperature=0)
    assert as_list.output_text == text


def test_responses_stream_openais_events(server):
    plain = server["client"].responses.create(model="tiny-test", input="Tell me a story", max_output_tokens=10,
                                              temperature=0)
    events = list(server["client"].responses.create(model="tiny-test", input="Tell me a story", max_output_tokens=10,
                                                    temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == events[-4].text == plain.output_text == events[-1].response.output_text
    assert events[-1].response.usage.output_tokens == plain.usage.output_tokens


def test_previous_response_id_continues_the_stored_conversation(server):
    client = server["client"]
    first = client.responses.create(model="tiny-test", input="Name a colour.", instructions="You are terse.",
                                    max_output_tokens=6, temperature=0)
    second = client.responses.create(model="tiny-test", input="And another?", previous_response_id=first.id,
                                     instructions="You are terse.", max_output_tokens=6, temperature=0)
    history = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."},
               {"role": "assistant", "content": first.output_text}, {"role": "user", "content": "And another?"}]
    text, usage = _chat_text(server, history, 6)
    assert second.output_text == text and second.usage.input_tokens == usage.prompt_tokens
    assert second.previous_response_id == first.id
    assert client.responses.retrieve(first.id).output_text == first.output_text
    unstored = client.responses.create(model="tiny-test", input="Hi", store=False, max_output_tokens=2)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.retrieve(unstored.id)
    assert e.value.body["message"] == f"Response with id '{unstored.id}' not found."
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="tiny-test", input="x", previous_response_id="resp_unknown")
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="tiny-test", input="x", previous_response_id="abc")
    assert e.value.body["param"] == "response_id"
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.cancel(first.id)
    assert e.value.body["message"] == "Cannot cancel a synchronous response."


@pytest.mark.parametrize("body, needle", [
    ({"model": "tiny-test"}, "input"),
    ({"input": [{"type": "function_call_output", "output": "o"}]}, "needs a 'call_id'"),
    ({"input": [{"type": "image_generation_call", "id": "x"}]}, "image_generation_call"),
    ({"input": "x", "background": True}, "Background"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "hosted tools"),
    ({"input": "x", "tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "mcp"}}, "tool_choice"),
])
def test_responses_refusals_are_400s_in_the_nested_envelope(server, body, needle):
    r = requests.post(server["url"] + "/v1/responses", json=body, timeout=30)
    assert r.status_code == 400 and needle in r.json()["error"]["message"]


# ------------------------------------------------------------------------------------ score


def _hf_next_logprobs(model_dir, ids):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0, -1].log_softmax(-1)


def test_score_matches_hf_next_token_probabilities(server, tokenizer):
    import math

    import torch

    labels = [tokenizer.encode(w, add_special_tokens=False)[0] for w in (" yes", " no", " maybe")]
    body = {"query": "Is Paris in France?", "items": [" Answer:", " Reply:"], "label_token_ids": labels}
    plain = requests.post(server["url"] + "/v1/score", json=body, timeout=60).json()
    soft = requests.post(server["url"] + "/v1/score", json={**body, "apply_softmax": True}, timeout=60).json()
    assert plain["object"] == "scoring" and len(plain["scores"]) == 2
    for i, item in enumerate(body["items"]):
        lp = _hf_next_logprobs(server["model"], tokenizer.encode(body["query"] + item))[labels]
        assert plain["scores"][i] == pytest.approx([math.exp(x) for x in lp.tolist()], rel=1e-4)
        assert soft["scores"][i] == pytest.approx(torch.softmax(lp, 0).tolist(), rel=1e-4)
        assert sum(soft["scores"][i]) == pytest.approx(1.0, abs=1e-6)
    assert plain["usage"]["prompt_tokens"] == sum(len(tokenizer.encode(body["query"] + it)) for it in body["items"])
    ids = requests.post(server["url"] + "/v1/score", timeout=60, json={
        "query": [1, 504], "items": [[3458], [9, 42]], "label_token_ids": labels, "item_first": True}).json()
    ref = _hf_next_logprobs(server["model"], [9, 42, 1, 504])[labels].exp().tolist()
    assert ids["scores"][1] == pytest.approx(ref, rel=1e-4)


@pytest.mark.parametrize("body, message", [
    ({"query": "q", "items": ["a"], "label_token_ids": [999999]}, "Token ID 999999 is out of vocabulary"),
    ({"query": "q", "items": ["a"]}, "label_token_ids is required for generation (CausalLM) models."),
    ({"query": "q", "items": [[1]], "label_token_ids": [1]}, "Invalid combination of query/items types"),
])
def test_score_errors_are_upstreams_400s(server, body, message):
    r = requests.post(server["url"] + "/v1/score", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["type"] == "BadRequestError" and message in r.json()["message"]
    empty = requests.post(server["url"] + "/v1/score", json={"query": "q", "items": [], "label_token_ids": [1]}, timeout=30)
    assert empty.status_code == 200 and empty.json()["scores"] == []


def test_embedding_routes_on_a_generation_server_say_how_to_enable_them(server):
    expected = ("This model does not appear to be an embedding model by default. Please add `--is-embedding` "
                "when launching the server or try another model.")
    for extra in ({}, {"dimensions": 16}):
        with pytest.raises(openai.BadRequestError) as e:
            server["client"].embeddings.create(model="tiny-test", input="hello", **extra)
        assert e.value.body["message"] == expected
    r = requests.post(server["url"] + "/v1/rerank", json={"query": "q", "documents": ["d"]}, timeout=30)
    assert r.status_code == 400 and r.json()["message"] == expected
