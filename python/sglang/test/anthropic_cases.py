"""What the /v1/messages tests send and how they judge the answers, shared by the plain-server
tests and the PD-through-the-router tests. Expectations are Anthropic's API contract: the exact
event order of a stream, a tool_use block's input validates against the tool's input_schema, the
stop reasons and the error shape."""

from __future__ import annotations

import json
from typing import List

import jsonschema

from sglang.test.structured_output_cases import TOOLS as OPENAI_TOOLS

# The OpenAI tools of the structured-output tests, as Anthropic tools.
TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
          "input_schema": t["function"]["parameters"]} for t in OPENAI_TOOLS]
SCHEMAS = {t["name"]: t["input_schema"] for t in TOOLS}
WEATHER_ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CAPITAL_ASK = [{"role": "user", "content": "What is the capital of France?"}]


def check_tool_use(block) -> None:
    """A tool_use block calling one of TOOLS with an input valid for its input_schema."""
    assert block.type == "tool_use" and block.id.startswith("toolu_"), block
    assert block.name in SCHEMAS, block.name
    jsonschema.validate(block.input, SCHEMAS[block.name])


def sse_event_names(response) -> List[str]:
    """The `event:` names of a raw SSE response (requests, stream=True), each checked to match its
    data's `type`. The SDK drops `ping` events, so the full sequence is read here."""
    names: List[str] = []
    event = None
    for line in response.iter_lines(decode_unicode=True):
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            assert json.loads(line[6:])["type"] == event, (event, line)
            names.append(event)
    return names


def collect_events(stream) -> dict:
    """The events of a `messages.create(stream=True)` (the SDK drops pings), checked against
    Anthropic's grammar: message_start, then blocks (content_block_start, content_block_delta...,
    content_block_stop with indexes 0, 1, ...), message_delta, message_stop. Returns the event
    types, the blocks as assembled from their deltas (tool inputs as parsed JSON, with the count of
    their fragments), the stop reason and sequence, and both usages."""
    types: List[str] = []
    blocks: List[dict] = []
    out = {"types": types, "blocks": blocks}
    open_index = None
    for ev in stream:
        types.append(ev.type)
        if ev.type == "message_start":
            assert len(types) == 1, types
            assert ev.message.content == [] and ev.message.stop_reason is None
            out["start_usage"] = ev.message.usage
        elif ev.type == "content_block_start":
            assert open_index is None and ev.index == len(blocks), (types, ev)
            open_index = ev.index
            block = ev.content_block.model_dump()
            block.update(partial="", fragments=0)
            blocks.append(block)
        elif ev.type == "content_block_delta":
            assert ev.index == open_index, ev
            block, d = blocks[ev.index], ev.delta
            kind = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "tool_use"}[d.type]
            assert block["type"] == kind, (block, d)
            if d.type == "text_delta":
                block["text"] += d.text
            elif d.type == "thinking_delta":
                block["thinking"] += d.thinking
            else:
                block["partial"] += d.partial_json
                block["fragments"] += 1
        elif ev.type == "content_block_stop":
            assert ev.index == open_index, ev
            open_index = None
            block = blocks[ev.index]
            if block["type"] == "tool_use":
                block["input"] = json.loads(block["partial"])
        elif ev.type == "message_delta":
            assert open_index is None
            out["stop_reason"], out["stop_sequence"] = ev.delta.stop_reason, ev.delta.stop_sequence
            out["usage"] = ev.usage
        elif ev.type == "message_stop":
            assert types[-2] == "message_delta", types
        else:
            raise AssertionError(f"unexpected event {ev.type}: {ev}")
    assert types[-1] == "message_stop", types
    return out
