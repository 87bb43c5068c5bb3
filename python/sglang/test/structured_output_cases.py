"""What the structured-output and tool-call server tests send and how they judge the answers,
shared by the plain-server tests and the PD-through-the-router tests (the same contract holds in
every role). Expectations are the API's contract: a json_schema answer validates against the
schema, a regex answer fullmatches, an EBNF answer is in the grammar's language, a tool call names
a given function and its arguments validate against that function's parameters."""

from __future__ import annotations

import json
import re

import jsonschema

CITY_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 40},
                   "population": {"type": "integer", "minimum": 0, "maximum": 100000000}},
    "required": ["name", "population"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Give the name and population of the capital of France as JSON."}]
CITY_REGEX = r'\{"name": "[\w ]{1,20}", "population": [\d]{1,9}\}'
EBNF_CAPITAL = 'root ::= "The capital of France is " ("Paris" | "Lyon" | "Nice") "."'

# kind -> (request fields for chat.completions.create, the answer is in the language)
KINDS = {
    "json_schema": ({"response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY_SCHEMA}}},
                    lambda t: jsonschema.validate(json.loads(t), CITY_SCHEMA) is None),
    "json_object": ({"response_format": {"type": "json_object"},
                     "messages": [{"role": "user", "content": "What is the capital of France? Answer in JSON."}]},
                    lambda t: isinstance(json.loads(t), dict)),
    "regex": ({"extra_body": {"regex": CITY_REGEX}}, lambda t: re.fullmatch(CITY_REGEX, t) is not None),
    "ebnf": ({"extra_body": {"ebnf": EBNF_CAPITAL}},
             lambda t: re.fullmatch(r"The capital of France is (Paris|Lyon|Nice)\.", t) is not None),
}

WEATHER_PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30},
                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                      "parameters": WEATHER_PARAMS}},
    {"type": "function", "function": {"name": "get_time", "description": "Local time in a city",
                                      "parameters": {"type": "object",
                                                     "properties": {"city": {"type": "string", "maxLength": 30}},
                                                     "required": ["city"], "additionalProperties": False}}},
]
WEATHER_ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# The default model is small: this EBNF makes it write a call in the qwen25 format, which
# tool_choice "auto" must parse (with --tool-call-parser qwen25).
QWEN_CALL_EBNF = ('root ::= "Let me check. <tool_call>\\n{\\"name\\": \\"get_weather\\", \\"arguments\\": '
                  '{\\"city\\": \\"" ("Paris" | "Rome") "\\", \\"unit\\": \\"celsius\\"}}\\n</tool_call>"')


def check_call(name: str, arguments: str) -> None:
    """A call of one of TOOLS whose arguments validate against its parameters."""
    params = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    assert name in params, name
    jsonschema.validate(json.loads(arguments), params[name])


def collect_stream(stream) -> dict:
    """Per choice index: content, reasoning, tool calls assembled from deltas (with their arguments
    fragments: a call's first delta has its id, name and arguments "", the next ones only
    arguments, as OpenAI streams them; asserted here), finish reason."""
    out = {}
    for ev in stream:
        for c in ev.choices:
            st = out.setdefault(c.index, {"content": "", "reasoning": "", "calls": {}, "finish": None})
            d = c.delta
            st["content"] += d.content or ""
            st["reasoning"] += getattr(d, "reasoning_content", None) or ""
            for tc in d.tool_calls or []:
                if tc.index not in st["calls"]:
                    assert tc.id and tc.type == "function" and tc.function.name and tc.function.arguments == "", tc
                else:
                    assert tc.id is None and tc.function.name is None and tc.function.arguments, tc
                call = st["calls"].setdefault(tc.index, {"id": tc.id, "name": tc.function.name, "arguments": "",
                                                         "fragments": 0})
                if tc.function.arguments:
                    call["arguments"] += tc.function.arguments
                    call["fragments"] += 1
            if c.finish_reason:
                st["finish"] = c.finish_reason
    return out
