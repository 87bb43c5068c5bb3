"""Result types shared by the tool-call detectors.

Mirrors upstream `sglang.srt.function_call.core_types`: a `ToolCallItem` is one piece of a tool
call (its name, or a fragment of its JSON arguments) and a `StreamingParseResult` is what one
parse step returns: the normal (user-visible) text plus the tool-call items it produced.
"""

from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class ToolCallItem:
    """One tool-call piece. `tool_index` counts the calls of one output (0, 1, 2, ...);
    `parameters` is a JSON text fragment of the call's arguments (the whole JSON when parsed
    in one go)."""

    tool_index: int
    name: Optional[str] = None
    parameters: str = ""


@dataclass
class StreamingParseResult:
    """The normal text and the tool-call items of one parse step."""

    normal_text: str = ""
    calls: List[ToolCallItem] = field(default_factory=list)
