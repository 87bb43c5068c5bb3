"""The Responses API's items <-> the chat pipeline (`entrypoints/openai/responses_items.py`),
without a server: input items become the chat conversation the template renders, and the chat
route's real `ChoiceOutput` (qwen3 reasoning parser, qwen25 tool-call parser), fed real markup one
character at a time, becomes OpenAI's event sequence with the same items as the one-shot parse."""

import json

import orjson
import pytest

from sglang.srt.entrypoints.openai.chat_output import ChoiceOutput
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
from sglang.srt.entrypoints.openai.responses_items import (ResponseItemStream, assistant_turn, chat_tool_choice,
                                                          chat_tools, whole_items)
from sglang.srt.entrypoints.openai.serving_responses import ResponsesRequest, input_messages

TOOLS = [{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}}}}]
MARKUP = ('<think>Weather, so a tool.</think>\n\nLet me check. <tool_call>\n{"name": "get_weather", "arguments": '
          '{"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n'
          '</tool_call>')


def test_input_items_become_the_chat_conversation():
    request = ResponsesRequest(instructions="Be brief.", input=[
        {"type": "message", "role": "user", "content": "Weather?"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city": "Rome"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_2", "output": {"t": 3}},
    ])
    assert input_messages(request, []) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "reasoning_content": "hm", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": '{"t": 3}'},
    ]
    assert chat_tools(TOOLS)[0]["function"]["name"] == "get_weather"
    assert chat_tool_choice({"type": "function", "name": "f"}) == {"type": "function", "function": {"name": "f"}}
    with pytest.raises(ValueError, match="hosted tools"):
        chat_tools([{"type": "file_search"}])


def test_streamed_events_and_items_match_the_one_shot_parse():
    chat = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], tools=chat_tools(TOOLS))
    whole = whole_items(*ChoiceOutput(chat, "qwen25", "qwen3").whole(MARKUP))
    assert [i["type"] for i in whole] == ["reasoning", "message", "function_call", "function_call"]
    events = []

    def event(kind, **fields):
        events.append({"type": kind, **fields})
        return orjson.dumps(events[-1])

    proc, stream = ChoiceOutput(chat, "qwen25", "qwen3"), ResponseItemStream(event)
    for ch in MARKUP:
        stream.pieces(proc.delta(ch))
    stream.pieces(proc.end())
    stream.close()
    kinds = [e["type"] for e in events]
    reasoning_deltas = kinds.count("response.reasoning_text.delta")
    assert kinds[:2] == ["response.output_item.added", "response.reasoning_text.delta"] and reasoning_deltas > 1
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 4
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.done"] == [0, 1, 2, 3]
    items = stream.items
    assert [i["type"] for i in items] == [i["type"] for i in whole]
    assert items[0]["content"][0]["text"].strip() == whole[0]["content"][0]["text"]
    assert items[1]["content"][0]["text"].strip() == whole[1]["content"][0]["text"] == "Let me check."
    assert [json.loads(i["arguments"]) for i in items[2:]] == [{"city": "Paris"}, {"city": "Rome"}]
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert [e["arguments"] for e in done] == [i["arguments"] for i in items[2:]]
    turn = assistant_turn(items)
    assert [c["function"]["arguments"] for c in turn["tool_calls"]] == [i["arguments"] for i in items[2:]]
    assert turn["content"].strip() == "Let me check." and turn["reasoning_content"].strip() == "Weather, so a tool."
