"""Mistral tool calls, as upstream's `MistralDetector`.

Format: `[TOOL_CALLS]` then a JSON array of calls (a single object is accepted too):
    [TOOL_CALLS] [{"name": "func1", "arguments": {...}}, {"name": "func2", "arguments": {...}}]
Text before it is normal text; several `[TOOL_CALLS]` blocks are each parsed. The newer
`[TOOL_CALLS]name[ARGS]{...}` form (Mistral tokenizer v11) is not handled: it stays text.
"""

from sglang.srt.function_call.base_format_detector import BaseFormatDetector, RegionResult


class MistralDetector(BaseFormatDetector):
    bot_token = "[TOOL_CALLS]"

    def _parse_region(self, buf: str, final: bool) -> RegionResult:
        return self._parse_json_region(buf, "[{")
