"""The Anthropic request -> chat request mapping and the chat pieces -> Anthropic blocks / events
(`entrypoints/anthropic/request_conversion.py`, `response_conversion.py`), without a server: the
chat route's real `ChoiceOutput` (qwen3 reasoning parser, qwen25 tool-call parser) splits real
model markup, fed one character at a time, and the events must be Anthropic's: thinking, then
text, then tool_use blocks, each opened once and closed once, whose deltas add up to the whole
parse."""

import json

import pytest

from sglang.srt.entrypoints.anthropic.protocol import AnthropicCountTokensRequest, AnthropicMessagesRequest
from sglang.srt.entrypoints.anthropic.request_conversion import to_chat_request
from sglang.srt.entrypoints.anthropic.response_conversion import StreamBlocks, stop_reason, whole_content
from sglang.srt.entrypoints.openai.chat_output import ChoiceOutput

TOOL = {"name": "get_weather", "description": "weather",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def req(**kw):
    kw.setdefault("model", "m")
    kw.setdefault("max_tokens", 2000)
    kw.setdefault("messages", [{"role": "user", "content": "hi"}])
    return AnthropicMessagesRequest.model_validate(kw)


def test_messages_map_to_the_chat_conversation():
    r = req(system=[{"type": "text", "text": "A"}, {"type": "text", "text": "B", "cache_control": {"type": "ephemeral"}}],
            tools=[TOOL], stop_sequences=["X"], top_k=5, top_p=0.5, temperature=0.2,
            messages=[
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"},
                                                  {"type": "text", "text": "Let me see."},
                                                  {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                                   "input": {"city": "Oslo"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "cold"},
                                             {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
                                              "content": [{"type": "text", "text": "down"}]},
                                             {"type": "text", "text": "And?"}]}])
    c = to_chat_request(r, reasoning_parser=None)
    msgs = [m.model_dump(exclude_none=True) for m in c.messages]
    assert msgs == [
        {"role": "system", "content": "A\nB"},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Let me see.", "reasoning_content": "hmm",
         "tool_calls": [{"id": "toolu_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "content": "cold", "tool_call_id": "toolu_1"},
        {"role": "tool", "content": "Error: down", "tool_call_id": "toolu_2"},
        {"role": "user", "content": "And?"},
    ]
    assert c.tools[0]["function"]["parameters"] == TOOL["input_schema"] and c.tool_choice == "auto"
    assert (c.max_tokens, c.stop, c.top_k, c.top_p, c.temperature) == (2000, ["X"], 5, 0.5, 0.2)
    assert c.parallel_tool_calls and c.chat_template_kwargs is None


@pytest.mark.parametrize("choice, expected", [
    ({"type": "any"}, "required"),
    ({"type": "none"}, "none"),
    ({"type": "tool", "name": "get_weather"}, {"type": "function", "function": {"name": "get_weather"}}),
])
def test_tool_choice(choice, expected):
    c = to_chat_request(req(tools=[TOOL], tool_choice={**choice, "disable_parallel_tool_use": True}), None)
    assert c.tool_choice == expected and c.parallel_tool_calls is False


def test_thinking_switches_the_template_and_needs_a_reasoning_parser():
    c = to_chat_request(req(thinking={"type": "enabled", "budget_tokens": 1024}), "qwen3")
    assert c.chat_template_kwargs == {"enable_thinking": True, "thinking": True}
    c = to_chat_request(req(thinking={"type": "disabled"}), None)
    assert c.chat_template_kwargs == {"enable_thinking": False, "thinking": False}
    with pytest.raises(ValueError, match="--reasoning-parser"):
        to_chat_request(req(thinking={"type": "adaptive"}), None)
    for budget, words in ((1023, "at least 1024"), (2000, "less than max_tokens")):
        with pytest.raises(ValueError, match=words):
            to_chat_request(req(thinking={"type": "enabled", "budget_tokens": budget}), "qwen3")


@pytest.mark.parametrize("body, words", [
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "type 'document'"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "b", "input": {}}]}]},
     "cannot appear here"),
    ({"messages": [{"role": "assistant", "content": [{"type": "text", "text": "x", "input": {}}]}]}, "no field input"),
    ({"messages": [{"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]}]},
     "redacted_thinking"),
    ({"tools": [{"name": "t", "input_schema": {"type": "array"}}]}, "must be 'object'"),
    ({"tools": [{"name": "t"}]}, "input_schema: Field required"),
    ({"tool_choice": {"type": "auto", "name": "x"}}, "only allowed with type 'tool'"),
    ({"output_config": {"effort": "high"}}, "effort"),
])
def test_what_the_server_cannot_do_is_refused_by_name(body, words):
    with pytest.raises(ValueError, match=words):
        to_chat_request(req(**body), None)


def test_count_tokens_request_has_no_sampling():
    c = to_chat_request(AnthropicCountTokensRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "system": "S"}), None)
    assert [m.role for m in c.messages] == ["system", "user"] and c.max_tokens is None


def _stream(text, tools=True, tool_choice="auto", single_call=False):
    c = to_chat_request(req(tools=[TOOL] if tools else None, tool_choice={"type": tool_choice} if tools else None),
                        "qwen3")
    proc, blocks = ChoiceOutput(c, "qwen25", "qwen3"), StreamBlocks(single_call)
    events = []
    for ch in text:  # one character at a time: every marker arrives split
        events += blocks.pieces(proc.delta(ch))
    events += blocks.pieces(proc.end()) + blocks.close()
    whole = ChoiceOutput(c, "qwen25", "qwen3").whole(text)
    return events, whole, blocks


def _assemble(events):
    blocks, open_index = [], None
    for kind, ev in events:
        assert ev["type"] == kind
        if kind == "content_block_start":
            assert open_index is None and ev["index"] == len(blocks)
            open_index = ev["index"]
            blocks.append(dict(ev["content_block"], partial=""))
        elif kind == "content_block_delta":
            assert ev["index"] == open_index
            d, b = ev["delta"], blocks[open_index]
            b["text" if d["type"] == "text_delta" else "thinking" if d["type"] == "thinking_delta" else "partial"] += \
                d.get("text", d.get("thinking", d.get("partial_json")))
        else:
            assert kind == "content_block_stop" and ev["index"] == open_index
            open_index = None
    assert open_index is None
    return blocks


MARKUP = ('<think>The user wants weather.</think>\n\nLet me check. <tool_call>\n'
          '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n'
          '{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>')


def test_stream_blocks_thinking_text_and_tool_use_match_the_whole_parse():
    events, (content, reasoning, calls), blocks = _stream(MARKUP)
    got = _assemble(events)
    assert [b["type"] for b in got] == ["thinking", "text", "tool_use", "tool_use"]
    assert got[0]["thinking"].strip() == reasoning == "The user wants weather."
    assert got[1]["text"].strip() == content == "Let me check."
    assert [json.loads(b["partial"]) for b in got[2:]] == [{"city": "Paris"}, {"city": "Rome"}]
    assert [b["name"] for b in got[2:]] == ["get_weather"] * 2 and all(b["id"].startswith("toolu_") for b in got[2:])
    assert blocks.called_tools and len(calls) == 2
    whole = whole_content(content, reasoning, calls, single_call=False)
    assert [b["type"] for b in whole] == ["thinking", "text", "tool_use", "tool_use"]
    assert whole[3]["input"] == {"city": "Rome"}
    # disable_parallel_tool_use with tool_choice auto: the first call only
    events, (content, reasoning, calls), _ = _stream(MARKUP, single_call=True)
    assert [b["type"] for b in _assemble(events)] == ["thinking", "text", "tool_use"]
    assert len(whole_content(content, reasoning, calls, single_call=True)) == 3
    # thinking display "omitted": the block is there, its text empty
    omitted = whole_content(content, reasoning, calls, single_call=True, show_thinking=False)
    assert omitted[0] == {"type": "thinking", "thinking": "", "signature": ""}


def test_stream_blocks_plain_text_and_a_malformed_call():
    events, (content, _, calls), blocks = _stream("Paris is the capital.", tools=False)
    assert [k for k, _ in events] == ["content_block_start"] + ["content_block_delta"] * 21 + ["content_block_stop"]
    assert _assemble(events)[0]["text"] == content and not blocks.called_tools
    bad = 'Sure <tool_call>\n{"title" 1}\n</tool_call> done'  # malformed before a name went out: text
    events, (content, _, calls), blocks = _stream(bad)
    got = _assemble(events)
    assert [b["type"] for b in got] == ["text"] and not calls and not blocks.called_tools
    assert "<tool_call>" in got[0]["text"] and got[0]["text"].strip() == content


@pytest.mark.parametrize("finish, matched, called, expected", [
    ("stop", 2, False, ("end_turn", None)),
    ("stop", "END", False, ("stop_sequence", "END")),
    ("stop", 2, True, ("tool_use", None)),
    ("length", None, True, ("max_tokens", None)),
])
def test_stop_reasons(finish, matched, called, expected):
    assert stop_reason(finish, matched, called) == expected


def test_a_body_over_the_limit_is_a_413_in_anthropics_shape():
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from sglang.srt.entrypoints.request_body import BodySizeLimit

    app = FastAPI()
    app.add_middleware(BodySizeLimit, limit=16)

    @app.post("/v1/messages")
    @app.post("/v1/chat/completions")
    async def route():
        return {}

    client = TestClient(app)
    r = client.post("/v1/messages", content=b"x" * 100)
    assert r.status_code == 413 and r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "request_too_large"
    r = client.post("/v1/chat/completions", content=b"x" * 100)
    assert r.status_code == 413 and r.json()["type"] == "RequestEntityTooLarge"
