"""Kimi-K2 tool calls, as upstream's `KimiK2Detector` ("kimi_k2"):

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>

The call id is `functions.NAME:INDEX`; the function is NAME. Arguments stream once the id is complete.
"""

from typing import List, Optional, Tuple

from sglang.srt.function_call.marked_call_detector import MarkedCallDetector, json_call

ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"


def _function_of(call_id: str) -> str:
    name = call_id.strip().rsplit(":", 1)[0]
    return name[len("functions."):] if name.startswith("functions.") else name


class KimiK2Detector(MarkedCallDetector):
    bot_token = "<|tool_call_begin|>"
    eot_token = "<|tool_call_end|>"
    drop_tokens = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>")

    def has_tool_call(self, text: str) -> bool:
        return self.bot_token in text or self.drop_tokens[0] in text

    def _parse_call(self, body: str) -> Optional[List[dict]]:
        call_id, sep, args = body.partition(ARGUMENT_BEGIN)
        return json_call(_function_of(call_id), args) if sep else None

    def _name_and_args(self, buf: str) -> Optional[Tuple[str, int]]:
        i = buf.find(ARGUMENT_BEGIN, len(self.bot_token))
        if i < 0:
            return None
        return _function_of(buf[len(self.bot_token):i]), i + len(ARGUMENT_BEGIN)
