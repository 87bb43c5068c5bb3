"""Tool-call parsing for the OpenAI chat API, as upstream's `function_call_parser.py`.

`FunctionCallParser(tools, tool_call_parser)` picks a detector by the `--tool-call-parser` name
(upstream's `ToolCallParserEnum` names, for the formats implemented here) and separates a
model's output into normal text and tool calls, in one go or streamed chunk by chunk. With no
tools every text is normal text, as upstream.

For `tool_choice="required"` or a named function upstream constrains the output with a JSON
schema instead (when the detector has no structural tag): `get_json_schema_constraint` builds
it and `parse_required_tool_calls` turns the constrained output back into calls;
`RequiredCallParser` streams those calls while the output is generated (name first, then the
arguments as they become stable, as upstream streams them).
"""

import json
from typing import Any, Dict, List, Optional, Tuple, Type

from sglang.srt.function_call.base_format_detector import BaseFormatDetector, tool_function, tool_names
from sglang.srt.function_call.core_types import ToolCallItem
from sglang.srt.function_call.json_stream import JsonCallStreamer, skip_ws
from sglang.srt.function_call.deepseek_detectors import DeepSeekV3Detector, DeepSeekV31Detector
from sglang.srt.function_call.glm4_moe_detector import Glm4MoeDetector, Glm47MoeDetector
from sglang.srt.function_call.gpt_oss_detector import GptOssDetector
from sglang.srt.function_call.internlm_detector import InternlmDetector
from sglang.srt.function_call.kimik2_detector import KimiK2Detector
from sglang.srt.function_call.lfm2_detector import Lfm2Detector
from sglang.srt.function_call.llama32_detector import Llama32Detector
from sglang.srt.function_call.minimax_m2 import MinimaxM2Detector
from sglang.srt.function_call.mistral_detector import MistralDetector
from sglang.srt.function_call.pythonic_detector import PythonicDetector
from sglang.srt.function_call.qwen25_detector import Qwen25Detector
from sglang.srt.function_call.qwen3_coder_detector import Qwen3CoderDetector
from sglang.srt.function_call.step3_detector import Step3Detector

EMPTY_PARAMETERS = {"type": "object", "properties": {}}


class FunctionCallParser:
    """Separates normal text from tool calls with the detector of one tool-call format."""

    ToolCallParserEnum: Dict[str, Type[BaseFormatDetector]] = {
        "deepseekv3": DeepSeekV3Detector,
        "deepseekv31": DeepSeekV31Detector,
        "glm": Glm4MoeDetector,
        "glm45": Glm4MoeDetector,
        "glm47": Glm47MoeDetector,
        "gpt-oss": GptOssDetector,
        "hermes": Qwen25Detector,
        "interns1": InternlmDetector,
        "kimi_k2": KimiK2Detector,
        "lfm2": Lfm2Detector,
        "llama3": Llama32Detector,
        "llama4": PythonicDetector,
        "minimax-m2": MinimaxM2Detector,
        "mistral": MistralDetector,
        "pythonic": PythonicDetector,
        "qwen": Qwen25Detector,
        "qwen25": Qwen25Detector,
        "qwen3_coder": Qwen3CoderDetector,
        "step3": Step3Detector,
        "step3p5": Qwen3CoderDetector,
    }

    def __init__(self, tools: list, tool_call_parser: str):
        detector_class = self.ToolCallParserEnum.get(tool_call_parser)
        if detector_class is None:
            raise ValueError(
                f"Unsupported tool_call_parser: {tool_call_parser!r}; "
                f"valid choices: {', '.join(sorted(self.ToolCallParserEnum))}"
            )
        self.detector = detector_class()
        self.tools = list(tools or [])

    def has_tool_call(self, text: str) -> bool:
        """Whether `text` holds this format's tool-call marker (never, without tools)."""
        return bool(self.tools) and self.detector.has_tool_call(text)

    def parse_non_stream(self, full_text: str) -> Tuple[str, List[ToolCallItem]]:
        """A whole output -> (normal text, one item per call with its whole arguments JSON)."""
        if not self.tools:
            return full_text, []
        result = self.detector.detect_and_parse(full_text, self.tools)
        if result.calls or self.detector.has_tool_call(full_text):
            return result.normal_text, result.calls
        return full_text, []

    def parse_stream_chunk(self, chunk_text: str) -> Tuple[str, List[ToolCallItem]]:
        """The next chunk of a stream -> (normal text to show now, tool-call items completed)."""
        if not self.tools:
            return chunk_text, []
        result = self.detector.parse_streaming_increment(chunk_text, self.tools)
        return result.normal_text, result.calls

    def parse_stream_end(self) -> Tuple[str, List[ToolCallItem]]:
        """The stream ended: what the detector still held back (text, or a last call)."""
        if not self.tools:
            return "", []
        result = self.detector.finish(self.tools)
        return result.normal_text, result.calls


def _named_function(tool_choice: Any) -> Optional[str]:
    """The function name of a named tool_choice `{"type": "function", "function": {"name": N}}`."""
    if hasattr(tool_choice, "model_dump"):
        tool_choice = tool_choice.model_dump()
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name")
        if isinstance(name, str) and name:
            return name
    return None


def _tool_schema(function: dict) -> dict:
    return {
        "type": "object",
        "properties": {
            "name": {"type": "string", "enum": [function["name"]]},
            "parameters": function.get("parameters") or EMPTY_PARAMETERS,
        },
        "required": ["name", "parameters"],
    }


def _tool_schema_defs(functions: List[dict]) -> dict:
    """The `$defs` of all the tools' parameters, merged; one name with two schemas is refused
    (upstream's `_get_tool_schema_defs`, message included)."""
    merged: Dict[str, Any] = {}
    for function in functions:
        for name, schema in ((function.get("parameters") or {}).get("$defs") or {}).items():
            if name in merged and merged[name] != schema:
                raise ValueError(f"Tool definition '{name}' has multiple schemas, which is not supported.")
            merged[name] = schema
    return merged


def get_json_schema_constraint(tools: list, tool_choice: Any, parallel_tool_calls: bool = True) -> Optional[dict]:
    """The JSON schema that constrains the output for `tool_choice`: "required" -> a non-empty
    array of `{"name", "parameters"}` objects, one `anyOf` branch per tool (at most one item when
    `parallel_tool_calls` is False); a named function -> that function's parameters schema;
    "auto" / "none" / None, or a named function not among `tools` -> None."""
    functions = [tool_function(t) for t in tools or ()]
    if tool_choice == "required":
        schema = {
            "type": "array",
            "minItems": 1,
            "items": {"type": "object", "anyOf": [_tool_schema(f) for f in functions if f.get("name")]},
        }
        if not parallel_tool_calls:
            schema["maxItems"] = 1
        defs = _tool_schema_defs(functions)
        if defs:  # the tools' `$ref: "#/$defs/..."` resolve against this root (upstream hoists them)
            schema["$defs"] = defs
        return schema
    name = _named_function(tool_choice)
    if name is not None:
        for function in functions:
            if function.get("name") == name:
                return function.get("parameters") or dict(EMPTY_PARAMETERS)
    return None


def parse_required_tool_calls(text: str, tool_choice: Any) -> List[ToolCallItem]:
    """Output generated under `get_json_schema_constraint(tools, tool_choice)` -> its calls:
    "required": one item per array element; a named function: one item with the output object
    as its arguments. Raises ValueError when the text is not of that shape."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ValueError(f"tool-call output is not valid JSON ({e}): {text[:200]!r}") from None
    if tool_choice == "required":
        if not isinstance(value, list) or not all(
            isinstance(c, dict) and isinstance(c.get("name"), str) for c in value
        ):
            raise ValueError(f'tool-call output is not a JSON array of {{"name", "parameters"}} objects: {text[:200]!r}')
        return [
            ToolCallItem(tool_index=i, name=c["name"], parameters=json.dumps(c.get("parameters", {}), ensure_ascii=False))
            for i, c in enumerate(value)
        ]
    name = _named_function(tool_choice)
    if name is None:
        raise ValueError(f"tool_choice {tool_choice!r} is neither 'required' nor a named function")
    if not isinstance(value, dict):
        raise ValueError(f"arguments of {name!r} are not a JSON object: {text[:200]!r}")
    return [ToolCallItem(tool_index=0, name=name, parameters=json.dumps(value, ensure_ascii=False))]


class RequiredCallParser:
    """Streams the calls of an output generated under `get_json_schema_constraint(tools,
    tool_choice)`: for "required" a JSON array of `{"name", "parameters"}` objects, for a named
    function its arguments object (the name is known before the first token). Each call's name
    goes out once known, then its arguments as they become stable (`json_stream`); the end
    completes them from `parse_required_tool_calls`, so the fragments add up to exactly the
    arguments a one-shot parse gives."""

    def __init__(self, tools: list, tool_choice: Any):
        self.tool_choice = tool_choice
        self.named = None if tool_choice == "required" else _named_function(tool_choice)
        self.names = tool_names(tools)
        self._text = ""
        self._stream = JsonCallStreamer()

    def parse_stream_chunk(self, chunk_text: str) -> List[ToolCallItem]:
        """The next chunk of the output -> the tool-call items (names, argument fragments) it adds."""
        self._text += chunk_text
        start = skip_ws(self._text, 0)
        if start >= len(self._text):
            return []
        if self.named is None and self._text[start] != "[":
            return []
        return self._stream.advance(self._text, start, self.names, name=self.named)

    def parse_stream_end(self) -> Tuple[str, List[ToolCallItem]]:
        """The output ended -> (text to give as content, the calls' last items). An output that is
        not a whole call (cut by max_tokens) is content, as in the one-shot path, unless a call of
        it has already gone out."""
        try:
            calls = parse_required_tool_calls(self._text, self.tool_choice)
        except ValueError:
            return ("", []) if self._stream.abandon(self._text) else (self._text, [])
        return "", self._stream.finish([(c.name, c.parameters) for c in calls], self.names)
