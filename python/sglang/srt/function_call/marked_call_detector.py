"""The shared shape of the tool-call formats where each call sits between a start and an end
marker, possibly inside a section whose own markers are dropped from the text (DeepSeek, Kimi,
GLM, Qwen3-Coder, MiniMax, Step3, InternLM, LFM2, gpt-oss's harmony):

    <section begin> <call begin> ...one call... <call end> <call begin> ... <call end> <section end>

A detector sets `bot_token` (call begin), `eot_token` (call end), `drop_tokens` (the section
markers and any other marker that is not text) and implements `_parse_call(body)` -> the call
objects `{"name", "arguments"}` of one call's body (None when malformed: the region is then given
back as text, or dropped if part of it had gone out). A call left open when the output ends is
parsed from what there is.

Streaming: formats whose arguments are one JSON object after the name implement
`_name_and_args(buf)` -> (name, where the arguments start) once the name is complete; the name goes
out then, and the arguments as they become stable (`json_stream`, as for the JSON formats). Formats
whose arguments are markup (`<arg_key>`, `<parameter=...>`) send each call whole once it closes:
their values only become JSON when the call is complete (and typed by the tool's schema).

Markup argument values are typed by the tool's `input_schema` / `parameters`, as upstream does:
a string parameter keeps the text; others are read as JSON (then as a Python literal), and kept
as text if neither reads (`typed_argument`).
"""

from __future__ import annotations

import ast
import json
from typing import Any, Dict, List, Optional, Set, Tuple

from sglang.srt.function_call.base_format_detector import BaseFormatDetector, RegionResult, tool_function
from sglang.srt.function_call.core_types import StreamingParseResult, ToolCallItem


def parameter_schema(tools: list, function: str, parameter: str) -> Dict[str, Any]:
    for tool in tools or ():
        fn = tool_function(tool)
        if fn.get("name") == function:
            props = (fn.get("parameters") or {}).get("properties") or {}
            schema = props.get(parameter)
            return schema if isinstance(schema, dict) else {}
    return {}


def typed_argument(text: str, schema: Dict[str, Any]) -> Any:
    """A markup argument's text -> its value (see the module docstring)."""
    kinds = schema.get("type")
    kinds = set(kinds) if isinstance(kinds, list) else {kinds} if kinds else set()
    if "string" in kinds:
        return None if text == "null" and "null" in kinds else text
    for read in (json.loads, ast.literal_eval):
        try:
            value = read(text)
            json.dumps(value)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        return value
    return text


class MarkedCallDetector(BaseFormatDetector):
    def __init__(self):
        super().__init__()
        self._tools: list = []

    # ---- the format ----
    def _parse_call(self, body: str) -> Optional[List[dict]]:
        raise NotImplementedError

    def _name_and_args(self, buf: str) -> Optional[Tuple[str, int]]:
        """(name, index where its JSON arguments start) once known; None otherwise (or for a
        format whose arguments are not JSON)."""
        return None

    def has_tool_call(self, text: str) -> bool:
        return self.bot_token in text

    # ---- the scan ----
    def _consume(self, tools: list, final: bool) -> StreamingParseResult:
        self._tools = list(tools or [])
        return super()._consume(tools, final)

    def _parse_region(self, buf: str, final: bool) -> RegionResult:
        end = buf.find(self.eot_token, len(self.bot_token))
        if end < 0:
            if not final:
                return None
            return len(buf), self._parse_call(buf[len(self.bot_token):])
        return end + len(self.eot_token), self._parse_call(buf[len(self.bot_token):end])

    def _stream_region(self, buf: str, names: Set[str]) -> List[ToolCallItem]:
        found = self._name_and_args(buf)
        if found is None:
            return []
        name, start = found
        if start >= len(buf) or buf[start] != "{":
            return []
        return self._stream.advance(buf, start, names, name=name)

    def _typed(self, function: str, parameter: str, text: str) -> Any:
        return typed_argument(text, parameter_schema(self._tools, function, parameter))


def json_call(name: str, args_text: str) -> Optional[List[dict]]:
    """One call whose arguments are a JSON object's text; None when it is not one."""
    name = name.strip()
    try:
        args = json.loads(args_text) if args_text.strip() else {}
    except ValueError:
        return None
    if not name or not isinstance(args, dict):
        return None
    return [{"name": name, "arguments": args}]
