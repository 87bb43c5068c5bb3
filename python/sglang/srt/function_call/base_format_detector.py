"""The shared machinery of the tool-call detectors (upstream `base_format_detector.py`).

Mirrors upstream SGLang's `BaseFormatDetector` interface: `has_tool_call`, `detect_and_parse`
(the whole output at once) and `parse_streaming_increment` (one chunk at a time, with a buffer),
plus upstream's later `finish` (flush at the end of a stream). Calls of a function that is not
in `tools` are dropped with a warning, as upstream does.

Text is scanned for the start of a tool-call region; the normal text before it streams out at
once, holding back only a suffix that could still become a start marker. While a region is
still growing, its JSON calls stream the way upstream/OpenAI stream them (`json_stream`): an item
with the name and `parameters=""` as soon as the name is complete, then items with `name=None`
and fragments of the arguments JSON as they become stable; the fragments add up to
`json.dumps(args, ensure_ascii=False)`. When the region is complete it is parsed in one go and
what was not sent yet goes out. A region that turns out not to be a tool call (malformed JSON, no
"name") is given back as normal text, unless a call of it had already gone out (then it is
dropped: a stream cannot take a call back). Whitespace (and drop tokens) right after a tool call
are dropped. `detect_and_parse` runs the same scan over the whole text at once (so nothing is
sent early and a malformed region is always text); the one-shot normal text is `.strip()`-ed
when the output held a tool-call region.

A detector sets `bot_token` (and `drop_tokens`: markers removed from normal text) and
implements `_parse_region`; it overrides `_find_call_start` when its start is not `bot_token`,
and `_json_start` when its calls' JSON does not follow `bot_token` (and whitespace), or is not
JSON (pythonic: `-1`, the call goes out whole once complete).
"""

import json
import logging
from typing import Any, Dict, List, Optional, Set, Tuple

from sglang.srt.function_call.core_types import StreamingParseResult, ToolCallItem
from sglang.srt.function_call.json_stream import BracketScan, JsonCallStreamer, call_arguments, skip_ws

logger = logging.getLogger(__name__)

# What `_parse_region` returns: None while the region is incomplete, else (characters consumed,
# the call objects `{"name": ..., "arguments"|"parameters": ...}`, or None if it is no tool call).
RegionResult = Optional[Tuple[int, Optional[List[dict]]]]


def tool_function(tool: Any) -> dict:
    """The `function` part of an OpenAI-format tool (a dict, or a pydantic model of one)."""
    if hasattr(tool, "model_dump"):
        tool = tool.model_dump()
    return (tool or {}).get("function") or {}


def tool_names(tools: Optional[list]) -> Set[str]:
    return {tool_function(t)["name"] for t in tools or () if tool_function(t).get("name")}


def partial_suffix_len(text: str, token: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `token` (0 if none)."""
    for n in range(min(len(text), len(token) - 1), 0, -1):
        if token.startswith(text[-n:]):
            return n
    return 0


def load_calls(text: str) -> Optional[List[dict]]:
    """`text` parsed as one call object or a list of them (dicts with a string "name");
    None when it is not valid JSON of that shape."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    calls = value if isinstance(value, list) else [value]
    if all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in calls):
        return calls
    return None


def merge_call_items(items: List[ToolCallItem]) -> List[ToolCallItem]:
    """Streamed items -> one item per call, with its name and its whole arguments JSON."""
    merged: Dict[int, ToolCallItem] = {}
    for item in items:
        if item.name is not None:
            merged[item.tool_index] = ToolCallItem(item.tool_index, item.name, item.parameters)
        else:
            merged[item.tool_index].parameters += item.parameters
    return list(merged.values())


class BaseFormatDetector:
    """Detects and parses one model family's tool-call format, in one go or streamed."""

    bot_token: str = ""  # the marker that starts a tool-call region
    eot_token: str = ""  # the marker that ends one, where the format has it
    drop_tokens: Tuple[str, ...] = ()  # markers removed from the normal text

    def __init__(self):
        self._buffer = ""  # text received but not yet given out
        self._in_call = False  # the buffer starts at a tool-call region
        self._after_call = False  # the last thing consumed was a tool call
        self._seen_text = False  # some non-whitespace normal text was given out
        self._saw_region = False
        self._stream = JsonCallStreamer()  # the calls sent so far (and the next tool_index)
        self._value_scan: Optional[BracketScan] = None  # where the current region's JSON ends
        # As upstream, for the serving layer: each call's {"name", "arguments"} and its JSON.
        self.prev_tool_call_arr: List[Dict[str, Any]] = []
        self.streamed_args_for_tool: List[str] = []

    # ---- the format: detectors override these ----
    def has_tool_call(self, text: str) -> bool:
        return bool(self.bot_token) and self.bot_token in text

    def _find_call_start(self, buf: str) -> Tuple[int, int]:
        """(where a tool-call region starts in `buf`, else -1; when -1, how many trailing
        characters may still become a start and must be held back)."""
        idx = buf.find(self.bot_token)
        return (idx, 0) if idx >= 0 else (-1, partial_suffix_len(buf, self.bot_token))

    def _parse_region(self, buf: str, final: bool) -> RegionResult:
        """`buf` starts at a tool-call region: see `RegionResult`. `final`: no more text comes."""
        raise NotImplementedError

    def _json_start(self, buf: str) -> int:
        """Where the calls' JSON starts in a region (`buf` starts at the region); -1 while that
        is not known yet, or for a format whose calls are not JSON."""
        i = skip_ws(buf, len(self.bot_token))
        return i if i < len(buf) else -1

    def _parse_json_region(self, buf: str, openers: str) -> RegionResult:
        """`_parse_region` of a format whose region is `_json_start`'s preamble and then one JSON
        value opening with one of `openers` (a call object, or an array of them)."""
        i = self._json_start(buf)
        if i < 0:
            return None
        if buf[i] not in openers:
            return i, None
        if self._value_scan is None:
            self._value_scan = BracketScan(i)
        end = self._value_scan.end(buf)
        if end < 0:
            return None
        return end, load_calls(buf[i:end])

    # ---- the interface ----
    def detect_and_parse(self, text: str, tools: list) -> StreamingParseResult:
        """Parse a whole output: its normal text and one item per (known) tool call."""
        scanner = type(self)()
        scanner._buffer = text
        result = scanner._consume(tools, final=True)
        normal = result.normal_text.strip() if scanner._saw_region else result.normal_text
        return StreamingParseResult(normal_text=normal, calls=merge_call_items(result.calls))

    def parse_streaming_increment(self, new_text: str, tools: list) -> StreamingParseResult:
        """Parse the next chunk of a stream: the normal text and the tool-call items (names,
        argument fragments) it adds."""
        self._buffer += new_text
        return self._consume(tools, final=False)

    def finish(self, tools: list) -> StreamingParseResult:
        """The stream ended: give out what was held back (an unfinished region as normal text)."""
        return self._consume(tools, final=True)

    # ---- the scan ----
    def _consume(self, tools: list, final: bool) -> StreamingParseResult:
        names = tool_names(tools)
        text: List[str] = []
        calls: List[ToolCallItem] = []
        buf = self._buffer
        while buf:
            if not self._in_call:
                if self._after_call:
                    buf = self._strip_after_call(buf)
                    if not buf:
                        break
                start, hold = self._find_call_start(buf)
                if start < 0:
                    if final:
                        hold = 0
                    else:
                        hold = max([hold] + [partial_suffix_len(buf, t) for t in self.drop_tokens])
                    self._emit_text(buf[: len(buf) - hold], text)
                    buf = buf[len(buf) - hold :]
                    break
                self._emit_text(buf[:start], text)
                buf = buf[start:]
                self._in_call = self._saw_region = True
            region = self._parse_region(buf, final)
            if region is None:
                if not final:
                    calls.extend(self._stream_region(buf, names))
                    break
                region = (len(buf), None)
            consumed, actions = region
            consumed = max(consumed, 1)
            self._in_call, self._value_scan = False, None
            if actions is None:
                if self._stream.abandon(buf[:consumed]):
                    self._after_call = True  # a call went out: what follows is as after a call
                else:
                    logger.warning("Not a valid tool call, kept as text: %r", buf[:consumed][:200])
                    self._emit_text(buf[:consumed], text, drop_tokens=False)
            else:
                calls.extend(self._emit_calls(actions, names))
                self._after_call = True
            buf = buf[consumed:]
        self._buffer = buf
        return StreamingParseResult(normal_text="".join(text), calls=calls)

    def _strip_after_call(self, buf: str) -> str:
        """Whitespace (and drop tokens) right after a tool call are not text."""
        while True:
            stripped = buf.lstrip()
            for token in self.drop_tokens:
                if stripped.startswith(token):
                    stripped = stripped[len(token) :]
            if stripped == buf:
                return buf
            buf = stripped

    def _emit_text(self, piece: str, out: List[str], drop_tokens: bool = True) -> None:
        for token in self.drop_tokens if drop_tokens else ():
            piece = piece.replace(token, "")
        if piece:
            out.append(piece)
            if piece.strip():
                self._seen_text = True
                self._after_call = False

    def _stream_region(self, buf: str, names: Set[str]) -> List[ToolCallItem]:
        """Items for the calls of a region that is still growing (see `json_stream`)."""
        start = self._json_start(buf)
        if start < 0 or buf[start] not in "[{":
            return []
        return self._stream.advance(buf, start, names)

    def _emit_calls(self, actions: List[dict], names: Set[str]) -> List[ToolCallItem]:
        """Items for a completed region's calls: what `_stream_region` did not send yet."""
        parsed = []
        for action in actions:
            args = call_arguments(action)
            parsed.append((action["name"], json.dumps(args, ensure_ascii=False)))
            if action["name"] in names:  # as upstream, for the serving layer
                self.prev_tool_call_arr.append({"name": action["name"], "arguments": args})
                self.streamed_args_for_tool.append(parsed[-1][1])
        return self._stream.finish(parsed, names)
