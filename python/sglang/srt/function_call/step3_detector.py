"""Step-3 tool calls, as upstream's `Step3Detector` ("step3"):

    <｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="get_weather"><steptml:parameter name="city">Paris</steptml:parameter></steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜>

Values are typed by the tool's schema; a call goes out once it closes.
"""

import re
from typing import List, Optional

from sglang.srt.function_call.marked_call_detector import MarkedCallDetector
from sglang.srt.function_call.minimax_m2 import parse_invokes

TOOL_SEP = "<｜tool_sep｜>"
_INVOKE = re.compile(r"\s*<steptml:invoke name=\"([^\"]+)\">(.*?)</steptml:invoke>\s*", re.S)
_PARAMETER = re.compile(r"\s*<steptml:parameter name=\"([^\"]+)\">(.*?)</steptml:parameter>\s*", re.S)


class Step3Detector(MarkedCallDetector):
    bot_token = "<｜tool_call_begin｜>"
    eot_token = "<｜tool_call_end｜>"
    drop_tokens = ("<｜tool_calls_begin｜>", "<｜tool_calls_end｜>")

    def has_tool_call(self, text: str) -> bool:
        return self.bot_token in text or self.drop_tokens[0] in text

    def _parse_call(self, body: str) -> Optional[List[dict]]:
        kind, sep, rest = body.partition(TOOL_SEP)
        if not sep or kind.strip() != "function":
            return None
        return parse_invokes(rest, _INVOKE, _PARAMETER, self._typed)
