"""Qwen 2.5 / Qwen 3 (and Hermes) tool calls, as upstream's `Qwen25Detector`.

Format: each call is wrapped in its own block, possibly after some text:
    <tool_call>\n{"name": "func1", "arguments": {...}}\n</tool_call>\n<tool_call>\n...
The JSON may say "parameters" instead of "arguments". A stray `</tool_call>` is removed from the
normal text (as upstream). Unlike upstream, a block whose JSON does not parse is given back as
normal text instead of vanishing, and a last block left open when the output ends is still
parsed if its JSON is complete.
"""

from sglang.srt.function_call.base_format_detector import BaseFormatDetector, RegionResult, load_calls


class Qwen25Detector(BaseFormatDetector):
    bot_token = "<tool_call>"
    eot_token = "</tool_call>"
    drop_tokens = ("</tool_call>",)

    def _parse_region(self, buf: str, final: bool) -> RegionResult:
        end = buf.find(self.eot_token, len(self.bot_token))
        if end < 0:
            if not final:
                return None
            return len(buf), load_calls(buf[len(self.bot_token) :])
        return end + len(self.eot_token), load_calls(buf[len(self.bot_token) : end])
