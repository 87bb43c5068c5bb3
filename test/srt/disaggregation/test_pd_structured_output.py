"""Structured output and tool calls through a 1P1D deployment (default model, Mooncake over
loopback) behind the real sglang-router, with the official openai client: the prefill server
samples the first token under the grammar, the decode server continues from the same matcher
state, so every kind of constraint (json_schema, json_object, regex, EBNF; n=2, streamed or not)
answers in its language, a greedy constrained answer equals a plain server's, tool calls
(required, named, auto through --tool-call-parser) are valid calls, bad specs are a 400 and every
pool is free afterwards. The cases and checks are the plain-server tests' own
(sglang.test.structured_output_cases)."""

import json

import jsonschema
import pytest
import requests

from sglang.test.fuzz.runner import assert_pools_restored
from sglang.test.pd_utils import find_free_port, launch_decode, launch_prefill, launch_router, stop_server
from sglang.test.server_utils import popen_launch_server, start_side_by_side
from sglang.test.structured_output_cases import (ASK, CITY_SCHEMA, KINDS, QWEN_CALL_EBNF, TOOLS,
                                                 WEATHER_ASK, check_call, collect_stream)

pytestmark = pytest.mark.server

openai = pytest.importorskip("openai")

COMMON = ["--constrained-json-max-whitespace-cnt", "2", "--tool-call-parser", "qwen25"]


def url(port):
    return f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    logs = tmp_path_factory.mktemp("pd_so_logs")
    procs = []
    try:
        ports = {k: find_free_port() for k in ("plain", "prefill", "boot", "decode", "router")}
        procs += start_side_by_side(
            lambda: popen_launch_server("default", ports["plain"], COMMON, log_path=str(logs / "plain.log")),
            lambda: launch_prefill("default", ports["prefill"], ports["boot"], COMMON, log_path=str(logs / "prefill.log")),
            lambda: launch_decode("default", ports["decode"], COMMON, log_path=str(logs / "decode.log")))
        procs.append(launch_router([(ports["prefill"], ports["boot"])], [ports["decode"]], ports["router"],
                                   log_path=str(logs / "router.log")))
        yield {k: url(p) for k, p in ports.items() if k != "boot"}
    finally:
        for p in reversed(procs):
            stop_server(p)


def client(base):
    return openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=300)


def chat(base, **kw):
    kw.setdefault("model", "m")
    kw.setdefault("messages", ASK)
    kw.setdefault("max_tokens", 150)
    return client(base).chat.completions.create(**kw)


def test_json_schema_n2_greedy_equals_plain_and_validates(cluster):
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY_SCHEMA}}
    pd = chat(cluster["router"], n=2, temperature=0, max_tokens=100, response_format=fmt)
    plain = chat(cluster["plain"], temperature=0, max_tokens=100, response_format=fmt)
    texts = [c.message.content for c in pd.choices]
    assert texts == [plain.choices[0].message.content] * 2
    for c in pd.choices:
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.message.content), CITY_SCHEMA)


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("stream", [False, True])
def test_every_kind_with_n2_through_the_router(cluster, kind, stream):
    body, in_language = KINDS[kind]
    # json_object is unbounded: a sampled small model may ramble on, so that kind runs greedy
    kw = dict(body, n=2, temperature=0.0 if kind == "json_object" else 0.7, stream=stream)
    if stream:
        got = {i: (st["content"], st["finish"]) for i, st in collect_stream(chat(cluster["router"], **kw)).items()}
    else:
        got = {c.index: (c.message.content, c.finish_reason) for c in chat(cluster["router"], **kw).choices}
    assert sorted(got) == [0, 1]
    for text, finish in got.values():
        assert finish == "stop", (kind, text)
        assert in_language(text), (kind, text)


def test_tool_choice_required_and_named_through_the_router(cluster):
    r = chat(cluster["router"], messages=WEATHER_ASK, tools=TOOLS, tool_choice="required", temperature=0.7, n=2,
             parallel_tool_calls=False)
    for c in r.choices:
        assert c.finish_reason == "tool_calls", c
        (tc,) = c.message.tool_calls
        assert tc.type == "function" and tc.id.startswith("call_")
        check_call(tc.function.name, tc.function.arguments)
    named = {"type": "function", "function": {"name": "get_time"}}
    r = chat(cluster["router"], messages=WEATHER_ASK, tools=TOOLS, tool_choice=named, temperature=0, max_tokens=80)
    (tc,) = r.choices[0].message.tool_calls
    assert tc.function.name == "get_time" and r.choices[0].finish_reason == "tool_calls"
    check_call("get_time", tc.function.arguments)
    st = collect_stream(chat(cluster["router"], messages=WEATHER_ASK, tools=TOOLS, tool_choice=named, temperature=0,
                             max_tokens=80, stream=True))[0]
    assert st["finish"] == "tool_calls" and [c["name"] for c in st["calls"].values()] == ["get_time"]
    check_call("get_time", st["calls"][0]["arguments"])


def test_tool_choice_auto_parses_the_call_through_the_router(cluster):
    r = chat(cluster["router"], messages=WEATHER_ASK, tools=TOOLS, temperature=0, max_tokens=120,
             extra_body={"ebnf": QWEN_CALL_EBNF})
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content == "Let me check."
    (tc,) = c.message.tool_calls
    assert tc.function.name == "get_weather"
    check_call("get_weather", tc.function.arguments)


def test_generate_json_schema_through_the_router(cluster):
    body = {"text": "The capital of France as JSON: ",
            "sampling_params": {"max_new_tokens": 80, "temperature": 0, "json_schema": json.dumps(CITY_SCHEMA)}}
    pd = requests.post(cluster["router"] + "/generate", json=body, timeout=300)
    plain = requests.post(cluster["plain"] + "/generate", json=body, timeout=300)
    assert pd.status_code == 200, pd.text
    assert pd.json()["text"] == plain.json()["text"]
    jsonschema.validate(json.loads(pd.json()["text"]), CITY_SCHEMA)


def test_bad_spec_is_400_and_pools_are_free(cluster):
    c = client(cluster["router"])
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="m", messages=ASK, max_tokens=8, extra_body={"regex": "(unclosed"})
    assert "Invalid regex" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model="m", messages=ASK, max_tokens=8, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}})
    r = c.chat.completions.create(model="m", messages=ASK, max_tokens=8, temperature=0, extra_body={"regex": "(yes|no)"})
    assert r.choices[0].message.content in ("yes", "no")
    for u in (cluster["prefill"], cluster["decode"], cluster["router"]):
        assert requests.get(u + "/health", timeout=10).status_code == 200
    assert_pools_restored([cluster["prefill"], cluster["decode"]])
