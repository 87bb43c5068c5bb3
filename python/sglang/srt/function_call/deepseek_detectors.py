"""DeepSeek tool calls, as upstream's `DeepSeekV3Detector` ("deepseekv3") and
`DeepSeekV31Detector` ("deepseekv31"). Calls sit in a section; each call:

    V3 / R1:   <｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\\n```json\\n{"city": "Paris"}\\n```<｜tool▁call▁end｜>
    V3.1:      <｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>

inside `<｜tool▁calls▁begin｜>` ... `<｜tool▁calls▁end｜>` (dropped from the text). The arguments
stream as they are generated once the name is complete.
"""

import re
from typing import List, Optional, Tuple

from sglang.srt.function_call.marked_call_detector import MarkedCallDetector, json_call

TOOL_SEP = "<｜tool▁sep｜>"
_V3_CALL = re.compile(r"\s*(?:function)?" + re.escape(TOOL_SEP) + r"([^\n]+)\n```json\n(.*?)(?:\n?```\s*)?\Z", re.S)
_V3_HEAD = re.compile(r"\s*(?:function)?" + re.escape(TOOL_SEP) + r"([^\n]+)\n```json\n")


class DeepSeekV3Detector(MarkedCallDetector):
    bot_token = "<｜tool▁call▁begin｜>"
    eot_token = "<｜tool▁call▁end｜>"
    drop_tokens = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")

    def has_tool_call(self, text: str) -> bool:
        return self.bot_token in text or self.drop_tokens[0] in text

    def _parse_call(self, body: str) -> Optional[List[dict]]:
        m = _V3_CALL.match(body)
        return json_call(m.group(1), m.group(2)) if m else None

    def _name_and_args(self, buf: str) -> Optional[Tuple[str, int]]:
        m = _V3_HEAD.match(buf, len(self.bot_token))
        return (m.group(1).strip(), m.end()) if m else None


class DeepSeekV31Detector(DeepSeekV3Detector):
    def _parse_call(self, body: str) -> Optional[List[dict]]:
        name, sep, args = body.partition(TOOL_SEP)
        return json_call(name, args) if sep else None

    def _name_and_args(self, buf: str) -> Optional[Tuple[str, int]]:
        i = buf.find(TOOL_SEP, len(self.bot_token))
        if i < 0:
            return None
        return buf[len(self.bot_token):i].strip(), i + len(TOOL_SEP)
