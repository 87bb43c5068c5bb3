"""Mistral tool calls, as upstream's `MistralDetector`.

Format: `[TOOL_CALLS]` then a JSON array of calls (a single object is accepted too):
    [TOOL_CALLS] [{"name": "func1", "arguments": {...}}, {"name": "func2", "arguments": {...}}]
Text before it is normal text; several `[TOOL_CALLS]` blocks are each parsed. The newer
`[TOOL_CALLS]name[ARGS]{...}` form (Mistral tokenizer v11) is not handled: it stays text.
"""

from sglang.srt.function_call.base_format_detector import (
    BaseFormatDetector,
    RegionResult,
    json_value_end,
    load_calls,
    skip_ws,
)


class MistralDetector(BaseFormatDetector):
    bot_token = "[TOOL_CALLS]"

    def _parse_region(self, buf: str, final: bool) -> RegionResult:
        i = skip_ws(buf, len(self.bot_token))
        if i == len(buf):
            return None
        if buf[i] not in "[{":
            return i, None
        end = json_value_end(buf, i)
        if end < 0:
            return None
        return end, load_calls(buf[i:end])
