"""GLM-4.5 / GLM-4.6 ("glm45", "glm") and GLM-4.7 ("glm47") tool calls, as upstream's
`Glm4MoeDetector` / `Glm47MoeDetector`:

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    <arg_key>days</arg_key>
    <arg_value>3</arg_value>
    </tool_call>

(GLM-4.7 writes the same without the newlines.) Values are typed by the tool's schema
(`marked_call_detector.typed_argument`); a call goes out whole once `</tool_call>` closes it.
"""

import re
from typing import List, Optional

from sglang.srt.function_call.marked_call_detector import MarkedCallDetector

_PAIR = re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>\s*", re.S)
_NAME = re.compile(r"[^\s<>{}\[\]\"']+")


class Glm4MoeDetector(MarkedCallDetector):
    bot_token = "<tool_call>"
    eot_token = "</tool_call>"

    def _parse_call(self, body: str) -> Optional[List[dict]]:
        head, _, _ = body.partition("<arg_key>")
        name = head.strip()
        if not _NAME.fullmatch(name):
            return None
        rest, args = body[len(head):], {}
        pos = 0
        while pos < len(rest):
            m = _PAIR.match(rest, pos)
            if not m:
                return None if rest[pos:].strip() else [{"name": name, "arguments": args}]
            args[m.group(1).strip()] = self._typed(name, m.group(1).strip(), m.group(2))
            pos = m.end()
        return [{"name": name, "arguments": args}]


class Glm47MoeDetector(Glm4MoeDetector):
    """GLM-4.7: the same markup, written without newlines between its parts."""
