"""Llama 3.1 / 3.2 JSON tool calls, as upstream's `Llama32Detector` ("llama3").

Format: `<|python_tag|>` then a JSON call, or a bare JSON call that starts the output (leading
whitespace allowed); the call object says "parameters" or "arguments"; several calls are
separated by `;` (upstream's choice of separator; a newline or nothing works too):
    <|python_tag|>{"name": "func1", "parameters": {...}};{"name": "func2", "parameters": {...}}
Text before `<|python_tag|>` and after the last call is normal text. A JSON object without a
"name" (say, a JSON answer) is normal text, not a call.
"""

from typing import Tuple

from sglang.srt.function_call.base_format_detector import BaseFormatDetector, RegionResult, partial_suffix_len
from sglang.srt.function_call.json_stream import skip_ws


class Llama32Detector(BaseFormatDetector):
    bot_token = "<|python_tag|>"
    tool_call_separator = ";"

    def has_tool_call(self, text: str) -> bool:
        return self.bot_token in text or text.lstrip().startswith("{")

    def _find_call_start(self, buf: str) -> Tuple[int, int]:
        if self._after_call and buf[0] in self.tool_call_separator + "{":
            return 0, 0
        if not self._seen_text:
            stripped = buf.lstrip()
            if stripped.startswith("{"):
                return len(buf) - len(stripped), 0
        idx = buf.find(self.bot_token)
        return (idx, 0) if idx >= 0 else (-1, partial_suffix_len(buf, self.bot_token))

    def _json_start(self, buf: str) -> int:
        """A region is an optional `;`, optional `<|python_tag|>` (whitespace around) and the call."""
        i = skip_ws(buf, 1 if buf.startswith(self.tool_call_separator) else 0)
        if self.bot_token.startswith(buf[i:]):  # nothing yet, or a partial <|python_tag|>
            return -1
        if buf.startswith(self.bot_token, i):
            i = skip_ws(buf, i + len(self.bot_token))
        return i if i < len(buf) else -1

    def _parse_region(self, buf: str, final: bool) -> RegionResult:
        return self._parse_json_region(buf, "{")
