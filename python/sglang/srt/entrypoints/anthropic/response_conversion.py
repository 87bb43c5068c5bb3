"""The chat pipeline's output of one message -> Anthropic content blocks and stream events.

The text is split by the same `ChoiceOutput` as the OpenAI route (reasoning parser, then the
tool-call parser or the constrained-call parser); its pieces become blocks here:
`reasoning_content` -> a `thinking` block, `content` -> a `text` block, each tool call -> a
`tool_use` block whose `input` is the call's arguments. A stream opens a block when its first
piece arrives and closes it when a piece of another block arrives or the message ends, so the
events are Anthropic's: content_block_start, content_block_delta (text_delta, thinking_delta,
input_json_delta), content_block_stop, with indexes counting up from 0.

Stop reasons: a message that called a tool and stopped -> `tool_use`; stopped on one of
`stop_sequences` -> `stop_sequence` (with the sequence); cut by max_tokens -> `max_tokens`; any
other stop (EOS, a stop token) -> `end_turn`.

`disable_parallel_tool_use` with tool_choice auto keeps the first call only (any/tool are
constrained to one call already).
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Dict, List, Optional, Tuple

from sglang.srt.entrypoints.anthropic.protocol import AnthropicUsage

THINKING, TEXT, TOOL_USE = "thinking", "text", "tool_use"


def tool_use_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


def stop_reason(finish_type: Optional[str], matched: Any, called_tools: bool) -> Tuple[str, Optional[str]]:
    """(stop_reason, stop_sequence) of a finished message (see the module docstring)."""
    if finish_type == "length":
        return "max_tokens", None
    if called_tools:
        return "tool_use", None
    if isinstance(matched, str):
        return "stop_sequence", matched
    return "end_turn", None


def usage(meta: Dict[str, Any]) -> AnthropicUsage:
    prompt, cached = meta.get("prompt_tokens", 0), meta.get("cached_tokens", 0) or 0
    return AnthropicUsage(input_tokens=prompt - cached, output_tokens=meta.get("completion_tokens", 0),
                          cache_read_input_tokens=cached)


def _tool_input(arguments: str) -> Dict[str, Any]:
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def whole_content(content: Optional[str], reasoning: Optional[str], tool_calls: List[dict],
                  single_call: bool, show_thinking: bool = True) -> List[dict]:
    """The blocks of a finished message, in Anthropic's order: thinking, text, tool_use.
    `show_thinking` False (thinking.display "omitted"): the thinking block is there, its text empty."""
    blocks: List[dict] = []
    if reasoning:
        blocks.append({"type": THINKING, "thinking": reasoning if show_thinking else "", "signature": ""})
    if content:
        blocks.append({"type": TEXT, "text": content})
    for call in tool_calls[:1] if single_call else tool_calls:
        fn = call["function"]
        blocks.append({"type": TOOL_USE, "id": tool_use_id(), "name": fn["name"],
                       "input": _tool_input(fn["arguments"])})
    return blocks


class StreamBlocks:
    """Pieces of a streamed message (`ChoiceOutput.delta` / `.end`) -> content-block events, as
    (event type, payload) pairs."""

    def __init__(self, single_call: bool, show_thinking: bool = True):
        self.single_call = single_call
        self.show_thinking = show_thinking
        self.index = -1  # the open (or last) block's index
        self.open: Optional[str] = None  # the kind of the open block
        self.called_tools = False
        self._tool_index: Optional[int] = None  # the chat tool-call index of the open tool_use block

    def pieces(self, pieces: List[dict]) -> List[Tuple[str, dict]]:
        events: List[Tuple[str, dict]] = []
        for piece in pieces:
            if piece.get("reasoning_content"):
                delta = {"type": "thinking_delta", "thinking": piece["reasoning_content"]}
                events += self._delta(THINKING, delta if self.show_thinking else None)
            if piece.get("content"):
                events += self._delta(TEXT, {"type": "text_delta", "text": piece["content"]})
            for call in piece.get("tool_calls") or []:
                events += self._tool_call(call)
        return events

    def close(self) -> List[Tuple[str, dict]]:
        if self.open is None:
            return []
        self.open = None
        return [("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def _start(self, kind: str, block: dict) -> List[Tuple[str, dict]]:
        events = self.close()
        self.index += 1
        self.open = kind
        return events + [("content_block_start", {"type": "content_block_start", "index": self.index,
                                                  "content_block": block})]

    def _delta(self, kind: str, delta: Optional[dict]) -> List[Tuple[str, dict]]:
        """Opens a `kind` block unless one is open, then sends `delta` (None: the block only)."""
        events: List[Tuple[str, dict]] = []
        if self.open != kind:
            empty = {THINKING: {"type": THINKING, "thinking": "", "signature": ""}, TEXT: {"type": TEXT, "text": ""}}
            events += self._start(kind, empty[kind])
        if delta is None:
            return events
        return events + [("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})]

    def _tool_call(self, call: dict) -> List[Tuple[str, dict]]:
        index = call.get("index", 0)
        if self.single_call and index > 0:
            return []
        fn = call.get("function") or {}
        events: List[Tuple[str, dict]] = []
        if fn.get("name") is not None:  # a new call: its name first, arguments in later pieces
            self.called_tools = True
            self._tool_index = index
            events += self._start(TOOL_USE, {"type": TOOL_USE, "id": tool_use_id(), "name": fn["name"], "input": {}})
        if fn.get("arguments") and self.open == TOOL_USE and self._tool_index == index:
            events.append(("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                                   "delta": {"type": "input_json_delta",
                                                             "partial_json": fn["arguments"]}}))
        return events
