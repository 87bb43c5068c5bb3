"""Tool-call parsing (upstream `sglang.srt.function_call`): see `function_call_parser`."""

from sglang.srt.function_call.core_types import StreamingParseResult, ToolCallItem
from sglang.srt.function_call.function_call_parser import (
    FunctionCallParser,
    RequiredCallParser,
    get_json_schema_constraint,
    parse_required_tool_calls,
)

__all__ = [
    "FunctionCallParser",
    "RequiredCallParser",
    "StreamingParseResult",
    "ToolCallItem",
    "get_json_schema_constraint",
    "parse_required_tool_calls",
]
