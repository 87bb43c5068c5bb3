"""InternLM / Intern-S1 tool calls, as upstream's `InternlmDetector` ("interns1"):

    <|action_start|><|plugin|>
    {"name": "get_weather", "parameters": {"city": "Paris"}}<|action_end|>

The call object streams like the other JSON formats (name first, then its arguments).
"""

from typing import List, Optional, Set

from sglang.srt.function_call.base_format_detector import load_calls
from sglang.srt.function_call.core_types import ToolCallItem
from sglang.srt.function_call.json_stream import skip_ws
from sglang.srt.function_call.marked_call_detector import MarkedCallDetector

PLUGIN = "<|plugin|>"


class InternlmDetector(MarkedCallDetector):
    bot_token = "<|action_start|>"
    eot_token = "<|action_end|>"

    def _json_at(self, buf: str) -> int:
        i = skip_ws(buf, len(self.bot_token))
        if PLUGIN.startswith(buf[i:]):
            return -1
        if buf.startswith(PLUGIN, i):
            i = skip_ws(buf, i + len(PLUGIN))
        return i if i < len(buf) else -1

    def _parse_call(self, body: str) -> Optional[List[dict]]:
        body = body.strip()
        if body.startswith(PLUGIN):
            body = body[len(PLUGIN):]
        calls = load_calls(body)
        return calls if calls and len(calls) == 1 else None

    def _stream_region(self, buf: str, names: Set[str]) -> List[ToolCallItem]:
        i = self._json_at(buf)
        if i < 0 or buf[i] != "{":
            return []
        return self._stream.advance(buf, i, names)
