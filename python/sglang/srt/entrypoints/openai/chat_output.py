"""One chat choice's generated text -> `content`, `reasoning_content` and `tool_calls`, whole or
streamed (upstream `serving_chat.py`'s `_process_tool_calls` / reasoning handling).

How tools are handled depends on `tool_choice` (upstream's rules):
- `"none"` or no tools: the text is the content.
- `"required"` or a named function: the output was constrained by the grammar backend to the
  JSON schema `get_json_schema_constraint` builds, so it *is* the call(s); it is parsed back with
  `parse_required_tool_calls` (when the output was cut by `max_tokens` it stays content). Streams
  send each call's name, then its arguments as they are generated (`RequiredCallParser`).
- `"auto"` (the default when tools are given): the `--tool-call-parser` format's detector splits
  the text into content and calls; without a parser the text is the content, as upstream.
With `--reasoning-parser` (and the request's `separate_reasoning`, default true) the reasoning
section is split off first and tools are parsed from what follows it.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Dict, List, Optional, Tuple

from sglang.srt.function_call import FunctionCallParser, RequiredCallParser, ToolCallItem, parse_required_tool_calls
from sglang.srt.parser.reasoning_parser import ReasoningParser

def tool_mode(request) -> str:
    """none | constrained | parser (see the module docstring)."""
    choice = request.tool_choice
    if not request.tools or choice == "none":
        return "none"
    if choice == "required" or isinstance(choice, dict):
        return "constrained"
    return "parser"


def make_tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _call_dict(item: ToolCallItem, index: int, call_id: str) -> dict:
    return {"id": call_id, "index": index, "type": "function",
            "function": {"name": item.name, "arguments": item.parameters}}


class ChoiceOutput:
    """The output processing of one choice (one per choice index in a stream)."""

    def __init__(self, request, tool_call_parser: Optional[str], reasoning_parser: Optional[str]):
        self.request = request
        self.mode = tool_mode(request)
        if self.mode == "parser" and not tool_call_parser:
            self.mode = "none"
        self.tool_parser = FunctionCallParser(request.tools, tool_call_parser) if self.mode == "parser" else None
        self.required_parser = (RequiredCallParser(request.tools, request.tool_choice)
                                if self.mode == "constrained" else None)
        self.reasoning = None
        if reasoning_parser and request.separate_reasoning:
            self.reasoning = ReasoningParser(reasoning_parser, stream_reasoning=request.stream_reasoning,
                                             request=request)
        self.num_calls = 0  # tool calls emitted so far
        self._ids: Dict[int, str] = {}

    @property
    def has_tool_calls(self) -> bool:
        return self.num_calls > 0

    # --- whole output ---------------------------------------------------------------------------
    def whole(self, text: str) -> Tuple[Optional[str], Optional[str], List[dict]]:
        """(content, reasoning_content, tool_calls) of a finished output."""
        reasoning = None
        if self.reasoning is not None:
            reasoning, text = self.reasoning.parse_non_stream(text)
            reasoning = reasoning or None
            text = text or ""
        calls: List[ToolCallItem] = []
        if self.mode == "constrained":
            try:
                calls = parse_required_tool_calls(text, self.request.tool_choice)
                text = ""
            except ValueError:
                calls = []  # cut short by max_tokens: what came out stays the content
        elif self.mode == "parser":
            text, calls = self.tool_parser.parse_non_stream(text)
        self.num_calls = len(calls)
        return text, reasoning, [_call_dict(c, i, make_tool_call_id()) for i, c in enumerate(calls)]

    # --- streams --------------------------------------------------------------------------------
    def delta(self, text: str) -> List[dict]:
        """DeltaMessage fields for the next piece of text (possibly several, possibly none)."""
        out: List[dict] = []
        if self.reasoning is not None:
            reasoning, text = self.reasoning.parse_stream_chunk(text)
            if reasoning:
                out.append({"reasoning_content": reasoning})
        out += self._content_delta(text or "")
        return out

    def end(self) -> List[dict]:
        """What is still held back once the choice finished."""
        out: List[dict] = []
        text = ""
        if self.reasoning is not None:
            reasoning, text = self.reasoning.finish()
            if reasoning:
                out.append({"reasoning_content": reasoning})
        out += self._content_delta(text or "")
        if self.mode == "parser":
            normal, calls = self.tool_parser.parse_stream_end()
            out += self._emit(normal, calls)
        elif self.mode == "constrained":
            out += self._emit(*self.required_parser.parse_stream_end())
        return out

    def _content_delta(self, text: str) -> List[dict]:
        if not text:
            return []
        if self.mode == "constrained":
            return self._emit("", self.required_parser.parse_stream_chunk(text))
        if self.mode == "parser":
            normal, calls = self.tool_parser.parse_stream_chunk(text)
            return self._emit(normal, calls)
        return [{"content": text}]

    def _emit(self, normal: str, calls: List[ToolCallItem]) -> List[dict]:
        out: List[dict] = [{"content": normal}] if normal else []
        for item in calls:
            index = item.tool_index
            if item.name is not None:
                self._ids[index] = make_tool_call_id()
                self.num_calls = max(self.num_calls, index + 1)
                out.append({"tool_calls": [{"index": index, "id": self._ids[index], "type": "function",
                                            "function": {"name": item.name, "arguments": ""}}]})
                if item.parameters:
                    out.append({"tool_calls": [{"index": index, "function": {"arguments": item.parameters}}]})
            elif item.parameters:
                out.append({"tool_calls": [{"index": index, "function": {"arguments": item.parameters}}]})
        return out


def chat_finish_reason(reason: Optional[str], matched: Any, has_tool_calls: bool) -> Tuple[Optional[str], Any]:
    """A choice that called tools and stopped naturally finishes with "tool_calls" (upstream)."""
    if has_tool_calls and reason == "stop":
        return "tool_calls", None
    return reason, matched


def tool_json_schema(request) -> Optional[str]:
    """The json_schema constraint of a required / named tool_choice (None otherwise)."""
    if tool_mode(request) != "constrained":
        return None
    from sglang.srt.function_call import get_json_schema_constraint

    schema = get_json_schema_constraint(request.tools, request.tool_choice,
                                        getattr(request, "parallel_tool_calls", True) is not False)
    return json.dumps(schema) if schema is not None else None


def dump_tool_calls_for_template(messages: List[Dict[str, Any]]) -> None:
    """Assistant tool_calls in the history: templates (Qwen, Llama) read `arguments` as a dict."""
    for m in messages:
        for call in m.get("tool_calls") or []:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                try:
                    fn["arguments"] = json.loads(fn["arguments"])
                except ValueError:
                    pass
