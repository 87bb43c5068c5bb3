"""MiniMax-M2 tool calls, as upstream's `MinimaxM2Detector` ("minimax-m2"):

    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Paris</parameter>
    </invoke>
    <invoke name="...">...</invoke>
    </minimax:tool_call>

One block may hold several invokes; values are typed by the tool's schema; the calls go out
once the block closes.
"""

import re
from typing import List, Optional

from sglang.srt.function_call.marked_call_detector import MarkedCallDetector

_INVOKE = re.compile(r"\s*<invoke name=\"([^\"]+)\">(.*?)</invoke>\s*", re.S)
_PARAMETER = re.compile(r"\s*<parameter name=\"([^\"]+)\">(.*?)</parameter>\s*", re.S)


def parse_invokes(body: str, invoke: re.Pattern, parameter: re.Pattern, typed) -> Optional[List[dict]]:
    """`<invoke name=...><parameter name=...>V</parameter>...</invoke>`... -> calls (None if malformed)."""
    calls, pos = [], 0
    while pos < len(body) and body[pos:].strip():
        m = invoke.match(body, pos)
        if not m:
            return None
        name, inner, args, ppos = m.group(1), m.group(2), {}, 0
        while ppos < len(inner) and inner[ppos:].strip():
            p = parameter.match(inner, ppos)
            if not p:
                return None
            args[p.group(1)] = typed(name, p.group(1), p.group(2).strip("\n"))
            ppos = p.end()
        calls.append({"name": name, "arguments": args})
        pos = m.end()
    return calls or None


class MinimaxM2Detector(MarkedCallDetector):
    bot_token = "<minimax:tool_call>"
    eot_token = "</minimax:tool_call>"

    def _parse_call(self, body: str) -> Optional[List[dict]]:
        return parse_invokes(body, _INVOKE, _PARAMETER, self._typed)
