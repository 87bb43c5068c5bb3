"""Pythonic tool calls (Llama 3.2 / Llama 4 style), as upstream's `PythonicDetector`.

Format: a Python list of calls with keyword arguments whose values are Python literals,
optionally wrapped in `<|python_start|>` / `<|python_end|>` (removed from the text):
    [get_weather(city="Paris", days=3), search(terms=["a", "b"], exact=True)]
It is parsed with `ast` (never evaluated); the arguments become JSON (`True` -> `true`, tuples
-> arrays, ...). As in upstream's newer versions the list may come after some text. A
bracketed text that is not such a list (positional arguments, non-literal values, ...) stays
normal text; a list of well-formed calls naming unknown functions is dropped, as upstream.
Streams send each call whole (its name, then all its arguments) once the list is closed: upstream
buffers pythonic calls the same way, since a Python literal cannot be re-serialized as JSON before
it ends.
"""

import ast
import json
import re
from typing import List, Optional, Tuple

from sglang.srt.function_call.base_format_detector import BaseFormatDetector, RegionResult

_CALL_START = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")
_PARTIAL_START = re.compile(r"\[\s*(?:[A-Za-z_][\w.]*\s*)?\Z")
_CLOSE = {"]": "[", ")": "(", "}": "{"}


def _python_list_end(text: str) -> int:
    """Index just past the bracket that closes `text[0]`, skipping Python string literals;
    -1 while it is not closed yet."""
    stack: List[str] = []
    quote, escaped = "", False
    for i, c in enumerate(text):
        if quote:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in "([{":
            stack.append(c)
        elif c in _CLOSE:
            if not stack or stack.pop() != _CLOSE[c]:
                return i + 1  # unbalanced: let the parse reject it
            if not stack:
                return i + 1
    return -1


def _dotted_name(node: ast.expr) -> Optional[str]:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted_name(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def parse_pythonic_calls(text: str) -> Optional[List[dict]]:
    """`[f(a=1), g(b="x")]` -> [{"name": "f", "arguments": {"a": 1}}, ...]; None if `text` is
    not a non-empty list of calls with literal keyword arguments only."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls = []
    for call in tree.elts:
        if not isinstance(call, ast.Call) or call.args or any(k.arg is None for k in call.keywords):
            return None
        name = _dotted_name(call.func)
        try:
            arguments = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
            json.dumps(arguments)
        except (ValueError, TypeError, SyntaxError, RecursionError):
            return None
        if name is None:
            return None
        calls.append({"name": name, "arguments": arguments})
    return calls


class PythonicDetector(BaseFormatDetector):
    drop_tokens = ("<|python_start|>", "<|python_end|>")

    def has_tool_call(self, text: str) -> bool:
        return bool(_CALL_START.search(text))

    def _find_call_start(self, buf: str) -> Tuple[int, int]:
        match = _CALL_START.search(buf)
        if match:
            return match.start(), 0
        partial = _PARTIAL_START.search(buf)
        return -1, (len(buf) - partial.start()) if partial else 0

    def _json_start(self, buf: str) -> int:
        return -1  # not JSON: nothing streams before the list is complete (see the module doc)

    def _parse_region(self, buf: str, final: bool) -> RegionResult:
        end = _python_list_end(buf)
        if end < 0:
            return None
        return end, parse_pythonic_calls(buf[:end])
