"""gpt-oss (harmony) tool calls, as upstream's `GptOssDetector` ("gpt-oss"):

    <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>

The recipient after `to=` names the function (`functions.` dropped); the JSON after `<|message|>`
is its arguments, which stream once the name is known. The final answer's channel markers
(`<|start|>assistant`, `<|channel|>final<|message|>`, `<|return|>`, `<|end|>`) are not text. The
analysis channel is the reasoning parser's ("gpt-oss").
"""

import re
from typing import List, Optional, Tuple

from sglang.srt.function_call.marked_call_detector import MarkedCallDetector, json_call

MESSAGE = "<|message|>"
_HEAD = re.compile(r"([^\s<]+)[^<]*(?:<\|constrain\|>[^<]*)?" + re.escape(MESSAGE))


class GptOssDetector(MarkedCallDetector):
    bot_token = "<|channel|>commentary to="
    eot_token = "<|call|>"
    drop_tokens = ("<|start|>assistant", "<|channel|>final<|message|>", "<|channel|>commentary<|message|>",
                   "<|return|>", "<|end|>")

    def _head(self, buf: str):
        return _HEAD.match(buf, len(self.bot_token))

    @staticmethod
    def _function(recipient: str) -> str:
        return recipient[len("functions."):] if recipient.startswith("functions.") else recipient

    def _parse_call(self, body: str) -> Optional[List[dict]]:
        m = _HEAD.match(body)
        return json_call(self._function(m.group(1)), body[m.end():]) if m else None

    def _name_and_args(self, buf: str) -> Optional[Tuple[str, int]]:
        m = self._head(buf)
        return (self._function(m.group(1)), m.end()) if m else None
