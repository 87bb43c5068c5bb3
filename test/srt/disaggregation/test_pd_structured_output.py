"""Structured output and tool calls through a 1P1D deployment (default model, Mooncake over
loopback) behind the real sglang-router, with the official openai client: the prefill server
samples the first token under the grammar, the decode server continues from the same matcher
state, so a greedy constrained answer equals a plain server's and is in the language; bad specs
are a 400 and every pool is free afterwards."""

import json
import re

import jsonschema
import pytest
import requests

from sglang.test.fuzz.runner import assert_pools_restored
from sglang.test.pd_utils import find_free_port, launch_decode, launch_prefill, launch_router, stop_server
from sglang.test.server_utils import popen_launch_server, start_side_by_side

pytestmark = pytest.mark.server

openai = pytest.importorskip("openai")

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 30},
                   "population": {"type": "integer", "minimum": 0, "maximum": 100000000}},
    "required": ["name", "population"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Give the name and population of the capital of France as JSON."}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"],
    "additionalProperties": False}}}]
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


def test_json_schema_n2_greedy_equals_plain_and_validates(cluster):
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}}
    pd = client(cluster["router"]).chat.completions.create(model="m", messages=ASK, n=2, temperature=0, max_tokens=100,
                                                           response_format=fmt)
    plain = client(cluster["plain"]).chat.completions.create(model="m", messages=ASK, temperature=0, max_tokens=100,
                                                             response_format=fmt)
    texts = [c.message.content for c in pd.choices]
    assert texts == [plain.choices[0].message.content] * 2
    for c in pd.choices:
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.message.content), SCHEMA)


def test_regex_stream_and_sampled_n2(cluster):
    regex = r'\{"name": "[\w ]{1,20}", "population": [\d]{1,9}\}'
    stream = client(cluster["router"]).chat.completions.create(
        model="m", messages=ASK, temperature=0.9, n=2, max_tokens=80, stream=True, extra_body={"regex": regex})
    texts, finish = {}, {}
    for ev in stream:
        for c in ev.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            finish[c.index] = c.finish_reason or finish.get(c.index)
    assert sorted(texts) == [0, 1] and set(finish.values()) == {"stop"}
    for t in texts.values():
        assert re.fullmatch(regex, t), t


def test_tool_choice_required_through_the_router(cluster):
    r = client(cluster["router"]).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Weather in Rome?"}], tools=TOOLS, tool_choice="required",
        temperature=0, max_tokens=80)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls"
    (tc,) = c.message.tool_calls
    assert tc.function.name == "get_weather"
    jsonschema.validate(json.loads(tc.function.arguments), TOOLS[0]["function"]["parameters"])


def test_generate_json_schema_through_the_router(cluster):
    body = {"text": "The capital of France as JSON: ",
            "sampling_params": {"max_new_tokens": 80, "temperature": 0, "json_schema": json.dumps(SCHEMA)}}
    pd = requests.post(cluster["router"] + "/generate", json=body, timeout=300)
    plain = requests.post(cluster["plain"] + "/generate", json=body, timeout=300)
    assert pd.status_code == 200, pd.text
    assert pd.json()["text"] == plain.json()["text"]
    jsonschema.validate(json.loads(pd.json()["text"]), SCHEMA)


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
