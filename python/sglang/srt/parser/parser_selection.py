"""`--tool-call-parser auto` / `--reasoning-parser auto`: the parser of the model's architecture
(read from its config.json), shared by the HTTP server (parsing) and the scheduler (grammars that
start after the reasoning section)."""

from __future__ import annotations

import json
import os
from typing import Dict, Optional, Tuple

AUTO_TOOL_PARSERS = {"Qwen2": "qwen25", "Qwen3": "qwen25", "Llama": "llama3", "Mistral": "mistral",
                     "Glm4Moe": "glm45", "GptOss": "gpt-oss", "MiniMaxM2": "minimax-m2"}
AUTO_REASONING_PARSERS = {"Qwen3": "qwen3", "DeepseekV3": "deepseek-r1", "Glm4Moe": "glm45", "GptOss": "gpt-oss"}


def resolve_auto_parser(name: Optional[str], model_path: Optional[str], table: Dict[str, str]) -> Optional[str]:
    """`auto` -> the parser of the model's architecture (None when none fits); others unchanged."""
    if name != "auto":
        return name
    try:
        with open(os.path.join(model_path or "", "config.json")) as f:
            archs = json.load(f).get("architectures") or []
    except (OSError, ValueError):
        return None
    for arch in archs:
        for prefix, parser in table.items():
            if arch.startswith(prefix):
                return parser
    return None


def resolve_parsers(server_args, model_path: Optional[str]) -> Tuple[Optional[str], Optional[str]]:
    """(tool-call parser, reasoning parser) names for this server."""
    return (resolve_auto_parser(server_args.tool_call_parser, model_path, AUTO_TOOL_PARSERS),
            resolve_auto_parser(server_args.reasoning_parser, model_path, AUTO_REASONING_PARSERS))


def reasoning_markers(reasoning_parser: Optional[str]) -> Optional[Tuple[str, str, bool]]:
    """(think start, think end, forced) of a reasoning parser, or None."""
    if not reasoning_parser:
        return None
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    d = ReasoningParser(reasoning_parser).detector
    return d.think_start_token, d.think_end_token, bool(d.force_reasoning)
