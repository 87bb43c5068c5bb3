"""Streaming the JSON tool calls of an output while it is being generated.

Upstream SGLang streams a call as OpenAI does: one item with the call's name and empty arguments
as soon as the name is known, then fragments of the arguments JSON as they are generated, so a
client can show (or start acting on) a long call before it ends. Upstream re-parses the partial
JSON (`partial_json_parser`, not available here) and sends the newly-stable prefix of
`json.dumps(arguments)`. This module does the same without the dependency:

- `stable_json_prefix` turns the text of a JSON value that may still be growing into the prefix
  of its normalized serialization (`json.dumps(value, ensure_ascii=False)`: `", "` and `": "`
  separators, re-escaped strings, re-printed numbers) that no continuation can change. A number
  or literal only counts once something ends it (`1` may become `10`); a string's text counts
  as it arrives, up to its last complete escape. The fragments therefore concatenate to exactly
  the arguments JSON a one-shot parse gives.
- `scan_partial_calls` finds, in a call object (or an array of them) that may still be growing,
  each call's complete `"name"` and where its `"parameters"`/`"arguments"` value starts.
- `JsonCallStreamer` turns successive scans into `ToolCallItem`s for one tool-call region, and
  `finish` completes them from the region's one-shot parse.
- `StablePrefix` (behind `stable_json_prefix`) and `BracketScan` (behind `json_value_end`) resume
  where the previous chunk left off, and strings are read by the regex engine, so a call whose
  arguments run to tens of kilobytes still costs each chunk about its own length, not the
  length of everything before it.

What was sent cannot be taken back: a call whose JSON turns out malformed after its name went
out stays a started call (its region is then dropped, not given back as text), and arguments with
a duplicated key (the one-shot parse keeps the last value) can differ from what was streamed; both
are logged. The closing brace of the arguments is held until the call object itself closes; then
the rest of the call's one-shot arguments goes out (so a call that says `"parameters": {}` and then
`"arguments": {...}` still streams what the one-shot parse gives), before any later call starts.
"""

import json
import logging
import re
from dataclasses import dataclass
from typing import Any, List, Optional, Set, Tuple

from sglang.srt.function_call.core_types import ToolCallItem

logger = logging.getLogger(__name__)

_SCALAR_CHARS = frozenset("0123456789+-.eEtrufalsnNIiy")  # numbers, true, false, null, NaN, Infinity
_CLOSER = {"{": "}", "[": "]"}


def call_arguments(call: dict) -> Any:
    """A call's arguments: upstream reads `parameters`, else `arguments` (a JSON string of an
    object is decoded)."""
    args = call.get("parameters") or call.get("arguments") or {}
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            pass
    return args


def skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


# A JSON string (group 1 is its closing quote: None while it is open; never failing, so never
# backtracking), or a bracket: what `json_value_end` needs, found by the regex engine so long
# strings cost little per chunk.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(")?', re.S)
_STRINGS_AND_BRACKETS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(")?|[\[\]{}]', re.S)
_STRING_REST = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*(")?', re.S)  # the rest of an open string
# The whole characters at the start of an open string's body (an escape cut short stops it).
_OPEN_BODY = re.compile(r'[^"\\]*(?:(?:\\u[0-9a-fA-F]{4}|\\[^u])[^"\\]*)*', re.S)
_HIGH_SURROGATE_END = re.compile(r"(\\+)u[dD][89abAB][0-9a-fA-F]{2}\Z")


class BracketScan:
    """`json_value_end` of one value in a text that only grows, resumed where it stopped, so a
    region's end is found in about the length of each new chunk."""

    def __init__(self, start: int):
        self._pos = start  # where to read on (never inside an escape)
        self._depth = 0
        self._in_string = False

    def end(self, text: str) -> int:
        if self._in_string:
            match = _STRING_REST.match(text, self._pos)
            self._pos, self._in_string = match.end(), match.group(1) is None
            if self._in_string:
                return -1
        for match in _STRINGS_AND_BRACKETS.finditer(text, self._pos):
            token = match.group()
            if token[0] == '"':
                if match.group(1) is None:  # a string still open
                    self._pos, self._in_string = match.end(), True
                    return -1
                continue
            self._depth += 1 if token in "[{" else -1
            if self._depth == 0:
                return match.end()
        self._pos = len(text)
        return -1


def json_value_end(text: str, start: int) -> int:
    """Index just past the JSON object/array that opens at `text[start]`, by bracket depth
    outside strings; -1 while it is not closed yet."""
    return BracketScan(start).end(text)


def string_end(text: str, start: int) -> int:
    """Index just past the JSON string that opens at `text[start]`; -1 while it is open."""
    match = _STRING.match(text, start)
    return match.end() if match.group(1) is not None else -1


def _scalar_end(text: str, start: int) -> int:
    """Index just past the number/literal at `text[start]`; -1 while nothing has ended it."""
    i = start
    while i < len(text) and text[i] in _SCALAR_CHARS:
        i += 1
    return i if i < len(text) else -1


def _value_end(text: str, start: int) -> int:
    c = text[start]
    if c in "{[":
        return json_value_end(text, start)
    if c == '"':
        return string_end(text, start)
    return _scalar_end(text, start)


class StablePrefix:
    """`stable_json_prefix` of one value in a text that only grows, resumed where the last call
    stopped (the whole tokens already read are not read again), so streaming long arguments
    costs each chunk about its own length."""

    def __init__(self, start: int):
        self._i = start  # where the next token starts
        self._out = ""  # the normalized text of the whole tokens read
        self._stack: List[str] = []  # the open brackets
        self._expect = "value"  # value | key | colon | next (a comma or the container's close)
        self._can_close = False  # right after an opening bracket, or after a value
        self._state = "open"  # open | complete | malformed (malformed: stopped for good)
        self._string: Optional[List] = None  # an open string: [where its body is read to, its normalized text]

    def update(self, text: str) -> Tuple[str, bool]:
        """(the stable normalized prefix of the value in `text`, whether it is complete)."""
        tail = self._read(text) if self._state == "open" else ""
        return self._out + tail, self._state == "complete"

    @property
    def is_open(self) -> bool:
        """Neither complete nor malformed: the value may still grow."""
        return self._state == "open"

    def _token(self, piece: str, end: int, expect: str, can_close: bool) -> None:
        self._out += piece
        self._i, self._expect, self._can_close = end, expect, can_close
        if expect == "next" and not self._stack:
            self._state = "complete"

    def _read_string(self, text: str, start: int) -> int:
        """Read on in the string opening at `text[start]` (a long one is read once, a chunk at a
        time); -> the index past it once it is closed, else -1 (`self._string` holds its stable
        part: an escape cut short, or a `\\uD8xx` whose low surrogate may follow, waits)."""
        if self._string is None:
            self._string = [start + 1, '"']
        pos, normalized = self._string
        body = _OPEN_BODY.match(text, pos).group()
        end = pos + len(body)
        closed = end < len(text) and text[end] == '"'
        held = None if closed else _HIGH_SURROGATE_END.search(body)
        if held and len(held.group(1)) % 2 == 1:  # an odd run of backslashes: a real escape
            body = body[: held.start() + len(held.group(1)) - 1]
        try:
            piece = json.dumps(json.loads('"' + body + '"'), ensure_ascii=False)[1:-1]
        except ValueError:
            self._state, self._string = "malformed", None
            return -1
        self._string = [pos + len(body), normalized + piece]
        return end + 1 if closed else -1

    def _read(self, text: str) -> str:
        """Read the whole tokens of `text` from `self._i`; -> the stable part of a token cut short."""
        while self._state == "open":
            i = skip_ws(text, self._i)
            if i >= len(text):
                return ""
            c, stack = text[i], self._stack
            if self._can_close and stack and c == _CLOSER[stack[-1]]:
                stack.pop()
                self._token(c, i + 1, "next", True)
            elif self._expect in ("next", "colon"):
                if c != ("," if self._expect == "next" else ":"):
                    self._state = "malformed"
                elif c == ",":
                    self._token(", ", i + 1, "key" if stack[-1] == "{" else "value", False)
                else:
                    self._token(": ", i + 1, "value", False)
            elif c in "{[" and self._expect == "value":
                stack.append(c)
                self._token(c, i + 1, "key" if c == "{" else "value", True)
            elif c == '"':
                end = self._read_string(text, i)
                if end < 0:
                    return self._string[1] if self._string else ""
                piece, self._string = self._string[1] + '"', None
                is_key = self._expect == "key"
                self._token(piece, end, "colon" if is_key else "next", not is_key)
            elif self._expect == "key":
                self._state = "malformed"
            else:
                end = _scalar_end(text, i)
                if end < 0:
                    return ""  # `1` may still become `10`
                try:
                    self._token(json.dumps(json.loads(text[i:end]), ensure_ascii=False), end, "next", True)
                except ValueError:
                    self._state = "malformed"
        return ""


def stable_json_prefix(text: str, start: int) -> Tuple[str, bool]:
    """The JSON value at `text[start]`, possibly still growing -> (the prefix of its normalized
    serialization that cannot change any more, whether the value is complete). Malformed text
    stops the prefix where it goes wrong (the one-shot parse then decides)."""
    return StablePrefix(start).update(text)


@dataclass
class PartialCall:
    """What is known so far of one call object: its complete "name" (None until then), where the
    value of its first "parameters"/"arguments" key starts (-1: not yet), and the object's span
    (`end` -1 while it is open)."""

    start: int = -1
    name: Optional[str] = None
    args_start: int = -1
    end: int = -1


def _scan_call(text: str, i: int) -> PartialCall:
    """The `PartialCall` of the object opening at `text[i]`; stops where the text ends or goes wrong."""
    call = PartialCall(start=i)
    i = skip_ws(text, i + 1)
    if i < len(text) and text[i] == "}":
        call.end = i + 1
        return call
    while i < len(text) and text[i] == '"':
        key_end = string_end(text, i)
        if key_end < 0:
            return call
        try:
            key = json.loads(text[i:key_end])
        except ValueError:
            return call
        i = skip_ws(text, key_end)
        if i >= len(text) or text[i] != ":":
            return call
        i = skip_ws(text, i + 1)
        if i >= len(text):
            return call
        if key in ("parameters", "arguments") and call.args_start < 0:
            call.args_start = i
        end = _value_end(text, i)
        if end < 0:
            return call
        if key == "name" and text[i] == '"' and call.name is None:
            try:
                call.name = json.loads(text[i:end])
            except ValueError:
                return call
        i = skip_ws(text, end)
        if i < len(text) and text[i] == "}":
            call.end = i + 1
            return call
        if i >= len(text) or text[i] != ",":
            return call
        i = skip_ws(text, i + 1)
    return call


def scan_partial_calls(text: str, start: int) -> List[PartialCall]:
    """The calls of the call object, or array of call objects, opening at `text[start]`, in order,
    as far as the text goes."""
    calls: List[PartialCall] = []
    in_array = text[start] == "["
    i = skip_ws(text, start + 1) if in_array else start
    while i < len(text) and text[i] == "{":
        call = _scan_call(text, i)
        calls.append(call)
        if call.end < 0 or not in_array:
            break
        i = skip_ws(text, call.end)
        if i >= len(text) or text[i] != ",":
            break
        i = skip_ws(text, i + 1)
    return calls


@dataclass
class _StreamedCall:
    tool_index: int
    sent: str = ""  # the arguments JSON sent so far
    closed: bool = False  # the call object closed and its whole arguments went out
    args: Optional[StablePrefix] = None  # reads the arguments as they grow


_SKIPPED = None  # a call naming a function not in `tools`: never streamed (dropped, as upstream)


class JsonCallStreamer:
    """The streamed state of the calls of one tool-call region (or one constrained output).

    Calls go out in order: a call's name is sent once it is complete and names a known function;
    a later call waits until every earlier one is decided, so tool indexes follow the text.
    `next_index` (the tool_index of the next call) runs on over the regions of one output."""

    def __init__(self):
        self._calls: List[Optional[_StreamedCall]] = []  # per call position in the region
        self._scanned: List[PartialCall] = []  # the last `scan_partial_calls`
        self.next_index = 0

    @property
    def started(self) -> bool:
        """Whether some call of this region has already gone out."""
        return any(c is not _SKIPPED for c in self._calls)

    def advance(self, text: str, start: int, names: Set[str], name: Optional[str] = None) -> List[ToolCallItem]:
        """Items for what `text` adds since the last call: new calls' names, new argument
        fragments. `text[start]` opens a call object or an array of them; with `name`, it opens
        the arguments object of that one call (a named tool_choice)."""
        if name is not None:
            return self._advance(text, [PartialCall(name=name, args_start=start)], names)
        items: List[ToolCallItem] = []
        for _ in range(2):  # again when the arguments that were open closed: what follows them
            reused = self._args_open()
            if not reused:
                self._scanned = scan_partial_calls(text, start)
            items += self._advance(text, self._scanned, names)
            if not reused or self._args_open():
                break
        return items

    def _args_open(self) -> bool:
        """Whether the last call's arguments are still open: then no later key or call can have
        come and the last scan still holds (long arguments are not scanned again each chunk)."""
        last = self._calls[-1] if self._calls else None
        return last is not None and last.args is not None and last.args.is_open

    def _advance(self, text: str, calls: List[PartialCall], names: Set[str]) -> List[ToolCallItem]:
        items: List[ToolCallItem] = []
        for k, call in enumerate(calls):
            if k == len(self._calls):
                if call.name is None:
                    break
                if call.name not in names:
                    self._calls.append(_SKIPPED)
                    continue
                self._calls.append(_StreamedCall(self.next_index))
                items.append(ToolCallItem(tool_index=self.next_index, name=call.name, parameters=""))
                self.next_index += 1
            state = self._calls[k]
            if state is _SKIPPED or state.closed or call.args_start < 0 or text[call.args_start] != "{":
                continue  # non-object arguments (a JSON string of them, null, ...) go out whole at the end
            if state.args is None:
                state.args = StablePrefix(call.args_start)
            prefix, complete = state.args.update(text)
            if complete:
                prefix = prefix[:-1]  # the closing brace waits for the whole call (see the module doc)
                if call.end >= 0:
                    prefix, state.closed = self._closed_arguments(text, call, state.sent)
            if len(prefix) > len(state.sent) and prefix.startswith(state.sent):
                items.append(ToolCallItem(tool_index=state.tool_index, parameters=prefix[len(state.sent) :]))
                state.sent = prefix
        return items

    @staticmethod
    def _closed_arguments(text: str, call: PartialCall, sent: str) -> Tuple[str, bool]:
        """A call object that closed -> (its one-shot arguments JSON, True) when they continue what
        was sent; else (what was sent, False), and `finish` decides."""
        try:
            args_json = json.dumps(call_arguments(json.loads(text[call.start : call.end])), ensure_ascii=False)
        except ValueError:
            return sent, False
        return (args_json, True) if args_json.startswith(sent) else (sent, False)

    def finish(self, parsed: List[Tuple[str, str]], names: Set[str]) -> List[ToolCallItem]:
        """The region is complete and parsed into (name, arguments JSON) per call: items for what
        was not sent yet (a call not started: its name, then its whole arguments). Resets."""
        items: List[ToolCallItem] = []
        for k, (name, args_json) in enumerate(parsed):
            state = self._calls[k] if k < len(self._calls) else None
            if name not in names:
                logger.warning("Model attempted to call undefined function: %s", name)
            elif state is None:
                items.append(ToolCallItem(tool_index=self.next_index, name=name, parameters=""))
                items.append(ToolCallItem(tool_index=self.next_index, parameters=args_json))
                self.next_index += 1
            elif args_json.startswith(state.sent):
                if len(args_json) > len(state.sent):
                    items.append(ToolCallItem(tool_index=state.tool_index, parameters=args_json[len(state.sent) :]))
            else:
                logger.warning("Streamed arguments of %s (%r) differ from its parsed arguments %r (duplicate keys?)",
                               name, state.sent[:200], args_json[:200])
        self._calls = []
        return items

    def abandon(self, region: str) -> bool:
        """The region turned out not to be a valid call: whether some of it had already gone out
        (then it is dropped, with a warning, instead of being given back as text). Resets."""
        started = self.started
        if started:
            logger.warning("A streamed tool call turned out malformed; the rest is dropped: %r", region[:200])
        self._calls = []
        return started
