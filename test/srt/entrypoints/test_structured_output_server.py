"""Structured output, tool calls, reasoning and custom logit processors on a real server with the
default model (SmolLM2-135M-Instruct), driven by the official `openai` client and plain HTTP.

Expectations are the API's contract, not this server's code: a json_schema answer parses and
validates against the schema (jsonschema), a regex answer fullmatches, an EBNF answer is in the
grammar's language, required / named tool calls are valid calls whose arguments validate against
the function's parameters, `n=2` and streams hold under each, and a bad spec is a 400 after which
the server keeps serving."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import requests

from sglang.test.server_utils import find_free_port, popen_launch_server, stop_server
from sglang.test.structured_output_cases import (ASK, CITY_REGEX, CITY_SCHEMA, KINDS, QWEN_CALL_EBNF, TOOLS,
                                                 WEATHER_ASK, check_call, collect_stream)

pytestmark = pytest.mark.server

openai = pytest.importorskip("openai")

ADMIN_KEY = "sk-structured-admin"  # custom logit processors run client code: admin key only (test/security)

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = find_free_port()
    log = str(tmp_path_factory.mktemp("log") / "server.log")
    proc = popen_launch_server("default", port, ["--tool-call-parser", "qwen25", "--reasoning-parser", "qwen3",
                                                 "--enable-custom-logit-processor", "--admin-api-key", ADMIN_KEY,
                                                 "--constrained-json-max-whitespace-cnt", "2"], log_path=log,
                               env={"OMP_NUM_THREADS": "2"})  # the only server of the module: both cores decode
    url = f"http://127.0.0.1:{port}"
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
    yield {"url": url, "client": client}
    client.close()
    stop_server(proc)


def chat(server, **kw):
    kw.setdefault("model", "default")
    kw.setdefault("messages", ASK)
    kw.setdefault("max_tokens", 120)
    return server["client"].chat.completions.create(**kw)


# ------------------------------------------------------------------------------ structured output


def test_response_format_json_schema_n2(server):
    r = chat(server, n=2, temperature=0.8,
             response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": CITY_SCHEMA, "strict": True}})
    assert len(r.choices) == 2
    for c in r.choices:
        assert c.finish_reason == "stop", c
        jsonschema.validate(json.loads(c.message.content), CITY_SCHEMA)


def test_response_format_json_object(server):
    r = chat(server, temperature=0, response_format={"type": "json_object"},
             messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}])
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_regex_and_ebnf_extensions(server):
    r = chat(server, temperature=0.5, n=2, extra_body={"regex": CITY_REGEX})
    for c in r.choices:
        assert re.fullmatch(CITY_REGEX, c.message.content), c.message.content
    ebnf = 'root ::= "The capital of France is " ("Paris" | "Lyon" | "Nice") "."'
    r = server["client"].completions.create(model="default", prompt="Q: capital of France?\nA:", max_tokens=30,
                                            temperature=0, extra_body={"ebnf": ebnf})
    assert re.fullmatch(r"The capital of France is (Paris|Lyon|Nice)\.", r.choices[0].text)
    assert r.choices[0].finish_reason == "stop"


def test_stream_n2_under_json_schema(server):
    stream = chat(server, n=2, temperature=0.8, stream=True,
                  response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": CITY_SCHEMA}})
    got = collect_stream(stream)
    assert sorted(got) == [0, 1]
    for st in got.values():
        assert st["finish"] == "stop"
        jsonschema.validate(json.loads(st["content"]), CITY_SCHEMA)


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("stream", [False, True])
def test_every_kind_with_n2(server, kind, stream):
    body, in_language = KINDS[kind]
    # json_object is unbounded: a sampled small model may ramble on, so that kind runs greedy
    kw = dict(body, n=2, temperature=0.0 if kind == "json_object" else 0.7, max_tokens=150, stream=stream)
    if stream:
        got = {i: (st["content"], st["finish"]) for i, st in collect_stream(chat(server, **kw)).items()}
    else:
        got = {c.index: (c.message.content, c.finish_reason) for c in chat(server, **kw).choices}
    assert sorted(got) == [0, 1]
    for text, finish in got.values():
        assert finish == "stop", (kind, text)
        assert in_language(text), (kind, text)


def test_native_generate_json_schema_and_logprobs(server):
    r = requests.post(server["url"] + "/generate", json={
        "text": "The capital of France as JSON: ", "return_logprob": True,
        "sampling_params": {"max_new_tokens": 80, "temperature": 0, "json_schema": json.dumps(CITY_SCHEMA), "n": 2}},
        timeout=300)
    assert r.status_code == 200, r.text
    for item in r.json():
        jsonschema.validate(json.loads(item["text"]), CITY_SCHEMA)
        meta = item["meta_info"]
        assert meta["finish_reason"]["type"] == "stop"
        assert len(meta["output_token_logprobs"]) == meta["completion_tokens"]


@pytest.mark.parametrize("body, words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}},
     "Invalid json_schema"),
    ({"extra_body": {"regex": "([a-"}}, "Invalid regex"),
    ({"extra_body": {"ebnf": "root ::= missing_rule"}}, "Invalid ebnf"),
    ({"extra_body": {"regex": "a+", "ebnf": 'root ::= "a"'}}, "Only one of regex, json_schema, or ebnf can be set."),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "json_schema.schema"),
    ({"tools": [{"type": "function", "function": {"parameters": {"type": "object"}}}]}, "tools.0.function.name"),
])
def test_bad_spec_is_400_and_server_keeps_serving(server, body, words):
    with pytest.raises(openai.BadRequestError) as e:
        chat(server, **body)
    assert e.value.status_code == 400 and words in str(e.value), str(e.value)
    r = chat(server, temperature=0, max_tokens=8, extra_body={"regex": "(yes|no)"})
    assert r.choices[0].message.content in ("yes", "no")


# ------------------------------------------------------------------------------------ tool calls


def test_tool_choice_required(server):
    # sampled: without parallel_tool_calls=False the array of calls is unbounded (maxItems 1 with it)
    r = chat(server, messages=WEATHER_ASK, tools=TOOLS, tool_choice="required", temperature=0.7, n=2, max_tokens=150,
             parallel_tool_calls=False)
    for c in r.choices:
        assert c.finish_reason == "tool_calls", c
        assert len(c.message.tool_calls) == 1 and c.message.content is None
        for tc in c.message.tool_calls:
            assert tc.type == "function" and tc.id.startswith("call_")
            check_call(tc.function.name, tc.function.arguments)


def test_tool_choice_named_and_streamed(server):
    named = {"type": "function", "function": {"name": "get_time"}}
    r = chat(server, messages=WEATHER_ASK, tools=TOOLS, tool_choice=named, temperature=0, max_tokens=80)
    (tc,) = r.choices[0].message.tool_calls
    assert tc.function.name == "get_time" and r.choices[0].finish_reason == "tool_calls"
    check_call("get_time", tc.function.arguments)
    got = collect_stream(chat(server, messages=WEATHER_ASK, tools=TOOLS, tool_choice="required", temperature=0,
                              max_tokens=150, stream=True))
    st = got[0]
    assert st["finish"] == "tool_calls" and st["calls"], st
    for call in st["calls"].values():
        assert call["id"].startswith("call_")
        check_call(call["name"], call["arguments"])
        assert call["fragments"] > 1, call  # the arguments stream as they are generated


def test_tool_choice_auto_parses_the_call(server):
    r = chat(server, messages=WEATHER_ASK, tools=TOOLS, temperature=0, max_tokens=120, extra_body={"ebnf": QWEN_CALL_EBNF})
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content == "Let me check."
    (tc,) = c.message.tool_calls
    assert tc.function.name == "get_weather"
    assert json.loads(tc.function.arguments)["city"] in ("Paris", "Rome")
    st = collect_stream(chat(server, messages=WEATHER_ASK, tools=TOOLS, temperature=0, max_tokens=120, stream=True,
                             extra_body={"ebnf": QWEN_CALL_EBNF}))[0]
    assert st["finish"] == "tool_calls" and st["content"].strip() == "Let me check."
    assert [c["name"] for c in st["calls"].values()] == ["get_weather"]
    assert st["calls"][0]["arguments"] == tc.function.arguments and st["calls"][0]["fragments"] > 1
    # tool_choice "none": the same text is plain content
    r = chat(server, messages=WEATHER_ASK, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=120,
             extra_body={"ebnf": QWEN_CALL_EBNF})
    assert "<tool_call>" in r.choices[0].message.content and not r.choices[0].message.tool_calls


# --------------------------------------------------------------------------- responses with tools

RESPONSES_TOOLS = [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
                    "parameters": t["function"]["parameters"]} for t in TOOLS]


def test_responses_function_call_and_its_output_round_trip(server):
    client = server["client"]
    named = {"type": "function", "name": "get_weather"}
    first = client.responses.create(model="default", input="What is the weather in Paris?", tools=RESPONSES_TOOLS,
                                    tool_choice=named, max_output_tokens=80, temperature=0)
    (call,) = first.output
    assert first.status == "completed" and call.type == "function_call" and call.name == "get_weather"
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    check_call(call.name, call.arguments)
    # the same turn streamed: the call's arguments arrive in pieces, then whole
    events = list(client.responses.create(model="default", input="What is the weather in Paris?",
                                          tools=RESPONSES_TOOLS, tool_choice=named, max_output_tokens=80,
                                          temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(deltas) > 1 and "".join(deltas) == call.arguments == events[-3].arguments
    assert events[-1].response.output[0].arguments == call.arguments
    # the client runs the tool and sends its output back with the call (stateless), then by previous_response_id
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "18 degrees and sunny"}
    history = [{"type": "message", "role": "user", "content": "What is the weather in Paris?"},
               {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
               result]
    stateless = client.responses.create(model="default", input=history, tools=RESPONSES_TOOLS, max_output_tokens=24,
                                        temperature=0, tool_choice="none")
    stored = client.responses.create(model="default", input=[result], previous_response_id=first.id,
                                     tools=RESPONSES_TOOLS, max_output_tokens=24, temperature=0, tool_choice="none")
    as_chat = [{"role": "user", "content": "What is the weather in Paris?"},
               {"role": "assistant", "content": "", "tool_calls": [{"id": call.call_id, "type": "function", "function": {
                   "name": call.name, "arguments": call.arguments}}]},
               {"role": "tool", "tool_call_id": call.call_id, "content": "18 degrees and sunny"}]
    chat_answer = chat(server, messages=as_chat, tools=TOOLS, tool_choice="none", max_tokens=24, temperature=0)
    for answer in (stateless, stored):
        assert answer.status == "completed" and answer.output[0].type == "message"
        assert answer.output_text == chat_answer.choices[0].message.content
        assert answer.usage.input_tokens == chat_answer.usage.prompt_tokens
    required = client.responses.create(model="default", input="Weather and time in Rome?", tools=RESPONSES_TOOLS,
                                       tool_choice="required", parallel_tool_calls=False, max_output_tokens=120,
                                       temperature=0)
    (call,) = required.output
    check_call(call.name, call.arguments)


# ------------------------------------------------------------------------------------- reasoning

THINK_EBNF = 'root ::= "<think>" [a-z]{2,10} [a-z ]{1,20} "</think>" "The answer is " [0-9] "."'


def test_reasoning_content_is_split(server):
    r = chat(server, temperature=0.5, max_tokens=80, extra_body={"ebnf": THINK_EBNF})
    m = r.choices[0].message
    assert re.fullmatch(r"[a-z]{2,10}[a-z ]*", m.reasoning_content), m.reasoning_content
    assert re.fullmatch(r"The answer is [0-9]\.", m.content)
    st = collect_stream(chat(server, temperature=0.5, max_tokens=80, stream=True, extra_body={"ebnf": THINK_EBNF}))[0]
    assert "<think>" not in st["content"] and re.fullmatch(r"\s*The answer is [0-9]\.", st["content"])
    assert st["reasoning"].strip() and "</think>" not in st["reasoning"]
    r = chat(server, temperature=0, max_tokens=80, extra_body={"ebnf": THINK_EBNF, "separate_reasoning": False})
    assert r.choices[0].message.content.startswith("<think>")



# ------------------------------------------------------------------------- custom logit processor




def test_custom_logit_processor_forces_a_token(server):
    from sglang.test.logit_processors import force_token_processor

    force_token = force_token_processor()
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    r = requests.post(server["url"] + "/generate", headers=admin, json={
        "input_ids": [1, 2, 3], "custom_logit_processor": force_token,
        "sampling_params": {"max_new_tokens": 5, "temperature": 0.9, "custom_params": {"token_id": 42}}}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["output_ids"] == [42] * 5
    r = requests.post(server["url"] + "/generate", headers=admin, timeout=60, json={
        "input_ids": [1, 2, 3], "custom_logit_processor": "{\"callable\": \"zz\"}", "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 400 and "Invalid custom_logit_processor" in r.text
    # the OpenAI routes take it too (upstream), with the same admin-key rule
    admin_client = openai.OpenAI(base_url=server["url"] + "/v1", api_key=ADMIN_KEY, max_retries=0, timeout=120)
    extra = {"custom_logit_processor": force_token, "custom_params": {"token_id": 42}}
    c = admin_client.completions.create(model="default", prompt="Hi", max_tokens=4, temperature=0.9, extra_body=extra)
    tok = requests.post(server["url"] + "/v1/detokenize", json={"tokens": [42] * 4}, timeout=30).json()["text"]
    assert c.choices[0].text == tok
    r = admin_client.chat.completions.create(model="default", messages=ASK, max_tokens=4, extra_body=extra)
    assert r.choices[0].message.content == tok
    with pytest.raises(openai.PermissionDeniedError):
        server["client"].chat.completions.create(model="default", messages=ASK, max_tokens=4, extra_body=extra)
    admin_client.close()


def test_parse_function_call_and_separate_reasoning_routes(server):
    text = 'Sure. <tool_call>\n{"name": "get_time", "arguments": {"city": "Oslo"}}\n</tool_call>'
    r = requests.post(server["url"] + "/parse_function_call", json={"text": text, "tools": TOOLS}, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["normal_text"] == "Sure." and body["calls"] == [
        {"tool_index": 0, "name": "get_time", "parameters": '{"city": "Oslo"}'}]
    r = requests.post(server["url"] + "/parse_function_call", json={"text": text, "tools": TOOLS,
                                                                   "tool_call_parser": "nope"}, timeout=30)
    assert r.status_code == 400 and "nope" in r.text
    r = requests.post(server["url"] + "/separate_reasoning", json={"text": "<think>hmm</think>Paris."}, timeout=30)
    assert r.json() == {"text": "Paris.", "reasoning_text": "hmm"}
    info = requests.get(server["url"] + "/model_info", timeout=30).json()
    assert info["tool_call_parser"] == "qwen25" and info["reasoning_parser"] == "qwen3"
