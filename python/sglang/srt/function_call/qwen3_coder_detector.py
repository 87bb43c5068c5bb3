"""Qwen3-Coder tool calls (also Step-3.5's), as upstream's `Qwen3CoderDetector` ("qwen3_coder",
"step3p5"):

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

A value loses the one newline after its opening tag and the one before its closing tag, and is
typed by the tool's schema; it must be closed (`</parameter>`, or the next `<parameter=`), so a
call cut inside a value is no call; a call goes out whole once `</tool_call>` closes it.
"""

import re
from typing import List, Optional

from sglang.srt.function_call.marked_call_detector import MarkedCallDetector

_FUNCTION = re.compile(r"\s*<function=([^>\s]+)>(.*?)(?:</function>|\Z)\s*", re.S)
_PARAMETER = re.compile(r"\s*<parameter=([^>]+)>(.*?)(?:</parameter>|(?=<parameter=))\s*", re.S)


def _value_text(raw: str) -> str:
    if raw.startswith("\n"):
        raw = raw[1:]
    if raw.endswith("\n"):
        raw = raw[:-1]
    return raw


class Qwen3CoderDetector(MarkedCallDetector):
    bot_token = "<tool_call>"
    eot_token = "</tool_call>"

    def _parse_call(self, body: str) -> Optional[List[dict]]:
        calls, pos = [], 0
        while pos < len(body) and body[pos:].strip():
            m = _FUNCTION.match(body, pos)
            if not m:
                return None
            name, inner, args, ppos = m.group(1), m.group(2), {}, 0
            while ppos < len(inner) and inner[ppos:].strip():
                p = _PARAMETER.match(inner, ppos)
                if not p:
                    return None
                key = p.group(1).strip()
                args[key] = self._typed(name, key, _value_text(p.group(2)))
                ppos = p.end()
            calls.append({"name": name, "arguments": args})
            pos = m.end()
        return calls or None
