"""`/v1/messages` (Anthropic's Messages API) on a real server with the default model
(SmolLM2-135M-Instruct), driven by the official `anthropic` client (and plain HTTP where the client
cannot send a malformed request). The anchor is the chat route on the same server: the same
conversation gives the same greedy text, usage and prompt; tool calls under tool_choice any/tool
validate against the tool's input_schema; streams follow Anthropic's event grammar
(`anthropic_cases.collect_events`); errors are Anthropic's shape."""

from __future__ import annotations

import json

import jsonschema
import pytest
import requests

from sglang.test.anthropic_cases import (CAPITAL_ASK, TOOLS, WEATHER_ASK, check_tool_use, collect_events,
                                          sse_event_names)
from sglang.test.server_utils import find_free_port, popen_launch_server, stop_server
from sglang.test.structured_output_cases import CITY_SCHEMA

pytestmark = pytest.mark.server

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

KEY = "sk-anthropic-test"
GREEDY = {"temperature": 0}  # the client (2.x) has no temperature argument: Anthropic's API still takes it


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = find_free_port()
    log = str(tmp_path_factory.mktemp("log") / "server.log")
    proc = popen_launch_server("default", port, ["--tool-call-parser", "qwen25", "--reasoning-parser", "qwen3"],
                               api_key=KEY, log_path=log, env={"OMP_NUM_THREADS": "2"})
    url = f"http://127.0.0.1:{port}"
    client = anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=300)
    oai = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=300)
    yield {"url": url, "client": client, "openai": oai}
    client.close()
    oai.close()
    stop_server(proc)


def create(server, **kw):
    kw.setdefault("model", "default")
    kw.setdefault("max_tokens", 24)
    kw.setdefault("messages", CAPITAL_ASK)
    return server["client"].messages.create(**kw)


def post(server, body, headers=None):
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"} if headers is None else headers
    return requests.post(server["url"] + "/v1/messages", json=body, headers=headers, timeout=120)


def test_plain_message_matches_the_chat_route(server):
    r = create(server, system="Be brief.", extra_body=GREEDY)
    chat = server["openai"].chat.completions.create(
        model="default", max_tokens=24, temperature=0,
        messages=[{"role": "system", "content": "Be brief."}] + CAPITAL_ASK)
    (block,) = r.content
    assert block.type == "text" and block.text == chat.choices[0].message.content
    assert "Paris" in block.text
    assert r.type == "message" and r.role == "assistant" and r.id.startswith("msg_") and r.model == "default"
    assert r.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[chat.choices[0].finish_reason]
    assert r.stop_sequence is None
    assert r.usage.output_tokens == chat.usage.completion_tokens
    # Anthropic's split: uncached + cache-read input tokens are the whole prompt
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens == chat.usage.prompt_tokens
    count = server["client"].messages.count_tokens(model="default", system="Be brief.", messages=CAPITAL_ASK)
    assert count.input_tokens == chat.usage.prompt_tokens


def test_sampling_fields_stop_sequences_and_max_tokens(server):
    greedy = create(server, extra_body=GREEDY).content[0].text
    assert greedy.startswith("The capital of France is Paris"), greedy
    # top_k 1 at temperature 1 is greedy: top_k is honoured (as is top_p, here 1)
    assert create(server, extra_body={"temperature": 1.0, "top_k": 1, "top_p": 1.0}).content[0].text == greedy
    r = create(server, stop_sequences=["Paris", "Lyon"], extra_body=GREEDY)
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == "Paris"
    assert r.content[0].text == greedy[: greedy.index("Paris")]
    r = create(server, max_tokens=3, extra_body=GREEDY)
    assert r.stop_reason == "max_tokens" and r.usage.output_tokens == 3


def test_stream_event_sequence(server):
    whole = create(server, system=[{"type": "text", "text": "Be brief."}], extra_body=GREEDY)
    got = collect_events(create(server, system=[{"type": "text", "text": "Be brief."}], stream=True,
                                extra_body=GREEDY))
    types = got["types"]
    n_deltas = len(types) - 5
    assert types == (["message_start", "content_block_start"] + ["content_block_delta"] * n_deltas
                     + ["content_block_stop", "message_delta", "message_stop"]), types
    assert n_deltas > 1
    # on the wire (the SDK hides pings): a ping follows message_start
    body = {"model": "default", "max_tokens": 24, "messages": CAPITAL_ASK, "system": "Be brief.", "stream": True,
            **GREEDY}
    with requests.post(server["url"] + "/v1/messages", json=body, headers={"x-api-key": KEY}, stream=True,
                       timeout=120) as raw:
        assert raw.headers["content-type"].startswith("text/event-stream")
        assert sse_event_names(raw) == types[:1] + ["ping"] + types[1:]
    (block,) = got["blocks"]
    assert block["type"] == "text" and block["text"] == whole.content[0].text
    assert got["stop_reason"] == whole.stop_reason and got["stop_sequence"] is None
    assert got["usage"].output_tokens == whole.usage.output_tokens
    assert got["start_usage"].output_tokens == 0
    total = got["start_usage"].input_tokens + got["start_usage"].cache_read_input_tokens
    assert total == whole.usage.input_tokens + whole.usage.cache_read_input_tokens
    # the SDK's own stream helper assembles the same message
    with server["client"].messages.stream(model="default", max_tokens=24, messages=CAPITAL_ASK,
                                          system="Be brief.", extra_body=GREEDY) as s:
        final = s.get_final_message()
    assert final.content[0].text == whole.content[0].text and final.stop_reason == whole.stop_reason


def test_tool_choice_any_and_tool(server):
    r = create(server, messages=WEATHER_ASK, tools=TOOLS, tool_choice={"type": "any", "disable_parallel_tool_use": True},
               max_tokens=120, extra_body={"temperature": 0.7})
    assert r.stop_reason == "tool_use", r
    (block,) = r.content  # one call: disable_parallel_tool_use
    check_tool_use(block)
    r = create(server, messages=WEATHER_ASK, tools=TOOLS, tool_choice={"type": "tool", "name": "get_time"},
               max_tokens=80, extra_body=GREEDY)
    (block,) = r.content
    assert r.stop_reason == "tool_use" and block.name == "get_time"
    check_tool_use(block)
    got = collect_events(create(server, messages=WEATHER_ASK, tools=TOOLS, stream=True, max_tokens=120,
                                tool_choice={"type": "tool", "name": "get_weather"}, extra_body=GREEDY))
    (block,) = got["blocks"]
    assert got["stop_reason"] == "tool_use" and block["type"] == "tool_use" and block["name"] == "get_weather"
    assert block["fragments"] > 1  # the input streams as it is generated
    jsonschema.validate(block["input"], TOOLS[0]["input_schema"])
    assert got["types"][:2] == ["message_start", "content_block_start"]


def test_multi_turn_tool_result(server):
    first = create(server, messages=WEATHER_ASK, tools=TOOLS, tool_choice={"type": "tool", "name": "get_weather"},
                   max_tokens=80, extra_body=GREEDY)
    (call,) = first.content
    turn = WEATHER_ASK + [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                      "content": [{"type": "text", "text": "18 degrees and sunny"}]},
                                     {"type": "text", "text": "Summarize."}]},
    ]
    r = create(server, messages=turn, tools=TOOLS, max_tokens=20, extra_body=GREEDY)
    assert r.stop_reason in ("end_turn", "max_tokens") and r.content[0].type == "text" and r.content[0].text
    # the conversation is the chat route's: assistant tool_calls, a tool message, a user message
    as_chat = WEATHER_ASK + [
        {"role": "assistant", "content": "", "tool_calls": [{"id": call.id, "type": "function", "function": {
            "name": call.name, "arguments": json.dumps(call.input)}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"},
        {"role": "user", "content": "Summarize."},
    ]
    openai_tools = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                      "parameters": t["input_schema"]}} for t in TOOLS]
    tok = requests.post(server["url"] + "/v1/tokenize", headers={"Authorization": f"Bearer {KEY}"}, timeout=60,
                        json={"messages": as_chat, "tools": openai_tools, "add_special_tokens": False}).json()
    count = server["client"].messages.count_tokens(model="default", messages=turn, tools=TOOLS)
    assert count.input_tokens == tok["count"]
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens == count.input_tokens
    turn[2]["content"][0]["is_error"] = True  # an error result reads "Error: ..."
    assert server["client"].messages.count_tokens(model="default", messages=turn, tools=TOOLS).input_tokens > count.input_tokens


def test_output_config_json_schema(server):
    r = create(server, max_tokens=80, messages=[{"role": "user", "content": "The capital of France as JSON."}],
               output_config={"format": {"type": "json_schema", "schema": CITY_SCHEMA}}, extra_body=GREEDY)
    assert r.stop_reason == "end_turn"
    jsonschema.validate(json.loads(r.content[0].text), CITY_SCHEMA)


def _error(r, status, kind, words):
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    assert words in body["error"]["message"], body


def test_error_shapes(server):
    base = {"model": "default", "max_tokens": 4, "messages": CAPITAL_ASK}
    _error(post(server, {"model": "default", "messages": CAPITAL_ASK}), 400, "invalid_request_error", "max_tokens")
    with pytest.raises(anthropic.BadRequestError) as e:
        create(server, messages=[{"role": "system", "content": "hi"}])
    assert e.value.status_code == 400
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
    assert "messages.0.role" in e.value.body["error"]["message"]
    wrong = anthropic.Anthropic(base_url=server["url"], api_key="sk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        wrong.messages.create(model="default", max_tokens=4, messages=CAPITAL_ASK)
    assert e.value.status_code == 401 and e.value.body["error"]["type"] == "authentication_error"
    wrong.close()
    _error(post(server, base, headers={}), 401, "authentication_error", "x-api-key")
    assert post(server, base, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200  # beside x-api-key
    _error(post(server, {**base, "container": "c1"}), 400, "invalid_request_error", "container: not supported")
    _error(post(server, {**base, "max_tokens": 0}), 400, "invalid_request_error", "max_tokens")
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    _error(post(server, {**base, "messages": [{"role": "user", "content": [image]}]}), 400, "invalid_request_error",
           "type 'image' are not supported")
    _error(post(server, {**base, "tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}}), 400,
           "invalid_request_error", "'nope' is not in 'tools'")
    _error(post(server, {**base, "tool_choice": {"type": "any"}}), 400, "invalid_request_error", "needs 'tools'")
    _error(post(server, {**base, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}), 400,
           "invalid_request_error", "server tools")
    _error(post(server, {**base, "thinking": {"type": "enabled", "budget_tokens": 100}}), 400,
           "invalid_request_error", "budget_tokens")
    r = requests.post(server["url"] + "/v1/messages/count_tokens", headers={"x-api-key": KEY}, timeout=60,
                      json={"model": "default"})
    _error(r, 400, "invalid_request_error", "messages")
    assert create(server, max_tokens=4).content  # the server keeps serving
