"""LFM2 tool calls, as upstream's `Lfm2Detector` ("lfm2"): a pythonic list of calls between markers,

    <|tool_call_start|>[get_weather(city="Paris", days=3)]<|tool_call_end|>

parsed with `ast` like the pythonic format (never evaluated); a call goes out once the list closes.
"""

from typing import List, Optional

from sglang.srt.function_call.marked_call_detector import MarkedCallDetector
from sglang.srt.function_call.pythonic_detector import parse_pythonic_calls


class Lfm2Detector(MarkedCallDetector):
    bot_token = "<|tool_call_start|>"
    eot_token = "<|tool_call_end|>"

    def _parse_call(self, body: str) -> Optional[List[dict]]:
        return parse_pythonic_calls(body)
