"""Tool-call parsing (sglang.srt.function_call), no model: each detector one-shot (one call, two
calls, text before, unknown function dropped, malformed JSON kept as text), the same outputs
streamed in 1/3/7-character chunks give the same text and calls (except a malformed JSON call
whose name already went out: see test_tool_call_streaming.py), plain text with `<`/`[` streams
through unchanged, and the JSON-schema path for tool_choice required/named."""

import json

import pytest

from sglang.srt.function_call import (
    FunctionCallParser,
    ToolCallItem,
    get_json_schema_constraint,
    parse_required_tool_calls,
)

WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER_PARAMS}},
    {"type": "function", "function": {"name": "search"}},
]
W = {"city": "Paris", "days": 3}
S = {"q": "café [1]", "tags": ["a", "b"], "exact": True, "n": None}


def calls_of(items):
    return [(c.name, json.loads(c.parameters)) for c in items]


# parser -> case -> (output, expected normal text, expected calls as (name, arguments))
CASES = {
    "qwen25": {
        "single": ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>',
                   "", [("get_weather", W)]),
        "two": ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>\n'
                '<tool_call>\n{"name": "search", "parameters": {"q": "café [1]", "tags": ["a", "b"], "exact": true, '
                '"n": null}}\n</tool_call>', "", [("get_weather", W), ("search", S)]),
        "text_before": ('Let me check <that>.\n\n<tool_call>\n{"name": "get_weather", "arguments": '
                        '{"city": "Paris", "days": 3}}\n</tool_call>', "Let me check <that>.", [("get_weather", W)]),
        "unknown": ('<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>\n<tool_call>\n'
                    '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>',
                    "", [("get_weather", W)]),
        "malformed": ('Hi <tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>',
                      'Hi <tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>', []),
    },
    "llama3": {
        "single": ('{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}', "", [("get_weather", W)]),
        "two": ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}; '
                '{"name": "search", "arguments": {"q": "café [1]", "tags": ["a", "b"], "exact": true, "n": null}}',
                "", [("get_weather", W), ("search", S)]),
        "text_before": ('I will look {it} up.<|python_tag|>{"name": "get_weather", "parameters": '
                        '{"city": "Paris", "days": 3}}', "I will look {it} up.", [("get_weather", W)]),
        "unknown": ('{"name": "nope", "parameters": {}};{"name": "get_weather", "parameters": {"city": "Paris", '
                    '"days": 3}}', "", [("get_weather", W)]),
        "malformed": ('<|python_tag|>{"name": "get_weather", "parameters": {"city" "Paris"}}',
                      '<|python_tag|>{"name": "get_weather", "parameters": {"city" "Paris"}}', []),
        "json_answer": ('{"answer": 42}', '{"answer": 42}', []),
    },
    "pythonic": {
        "single": ('[get_weather(city="Paris", days=3)]', "", [("get_weather", W)]),
        "two": ("<|python_start|>[get_weather(city='Paris', days=3), search(q='café [1]', tags=('a', 'b'), "
                "exact=True, n=None)]<|python_end|>", "", [("get_weather", W), ("search", S)]),
        "text_before": ('Checking [now]: [get_weather(city="Paris", days=3)]', "Checking [now]:",
                        [("get_weather", W)]),
        "unknown": ('[nope(x=1), get_weather(city="Paris", days=3)]', "", [("get_weather", W)]),
        "malformed": ('See [get_weather(city=Paris, days=3)] and [len(x)].',
                      'See [get_weather(city=Paris, days=3)] and [len(x)].', []),
    },
    "mistral": {
        "single": ('[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}]',
                   "", [("get_weather", W)]),
        "two": ('[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}, {"name": '
                '"search", "arguments": {"q": "café [1]", "tags": ["a", "b"], "exact": true, "n": null}}]',
                "", [("get_weather", W), ("search", S)]),
        "text_before": ('Sure [ok].[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", '
                        '"days": 3}}]', "Sure [ok].", [("get_weather", W)]),
        "unknown": ('[TOOL_CALLS] [{"name": "nope", "arguments": {}}, {"name": "get_weather", "arguments": '
                    '{"city": "Paris", "days": 3}}]', "", [("get_weather", W)]),
        "malformed": ('[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris",}}]',
                      '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris",}}]', []),
    },
}
ALL_CASES = [(p, c) for p in CASES for c in CASES[p]]
# A stream sends a JSON call's name before its arguments are known to be well-formed (upstream
# does too), so only pythonic (sent whole) can still give a malformed call back as text.
STREAM_CASES = [(p, c) for p, c in ALL_CASES if c != "malformed" or p == "pythonic"]


def stream(parser, text, size):
    """Feed `text` in chunks; check the item protocol; -> (normal text, [(name, arguments JSON)])."""
    normal, calls = [], {}
    chunks = [text[i:i + size] for i in range(0, len(text), size)]
    results = [parser.parse_stream_chunk(c) for c in chunks] + [parser.parse_stream_end()]
    for text_part, items in results:
        normal.append(text_part)
        for item in items:
            if item.name is not None:
                assert item.parameters == "" and item.tool_index == len(calls)
                calls[item.tool_index] = [item.name, ""]
            else:
                calls[item.tool_index][1] += item.parameters
    return "".join(normal), [tuple(calls[i]) for i in sorted(calls)]


@pytest.mark.parametrize("parser_name,case", ALL_CASES)
def test_non_stream(parser_name, case):
    text, normal, expected = CASES[parser_name][case]
    got_normal, got_calls = FunctionCallParser(TOOLS, parser_name).parse_non_stream(text)
    assert got_normal == normal
    assert calls_of(got_calls) == expected
    assert [c.tool_index for c in got_calls] == list(range(len(expected)))
    for c in got_calls:  # the arguments JSON is exactly upstream's json.dumps
        assert c.parameters == json.dumps(json.loads(c.parameters), ensure_ascii=False)


@pytest.mark.parametrize("size", [1, 3, 7])
@pytest.mark.parametrize("parser_name,case", STREAM_CASES)
def test_stream_matches_non_stream(parser_name, case, size):
    text = CASES[parser_name][case][0]
    normal, calls = FunctionCallParser(TOOLS, parser_name).parse_non_stream(text)
    got_normal, got_calls = stream(FunctionCallParser(TOOLS, parser_name), text, size)
    assert got_normal.strip() == normal
    assert got_calls == [(c.name, c.parameters) for c in calls]


@pytest.mark.parametrize("parser_name", sorted(CASES))
@pytest.mark.parametrize("size", [1, 3, 7])
def test_plain_text_with_brackets_streams_unchanged(parser_name, size):
    text = "Use a < b, x[0] and [see note] or <b>bold</b>; f(x) = {y}. [TOOL] <|python|> done."
    parser = FunctionCallParser(TOOLS, parser_name)
    chunks = [text[i:i + size] for i in range(0, len(text), size)]
    out = [parser.parse_stream_chunk(c) for c in chunks]
    assert "".join(t for t, _ in out) == text  # all given out before the stream even ends
    assert not any(calls for _, calls in out)
    assert parser.parse_stream_end() == ("", [])
    assert FunctionCallParser(TOOLS, parser_name).parse_non_stream(text) == (text, [])


@pytest.mark.parametrize("parser_name,start", [("qwen25", "<tool_call>"), ("llama3", "<|python_tag|>"),
                                               ("mistral", "[TOOL_CALLS]"), ("pythonic", "[get_weather(")])
def test_text_streams_at_once_holding_only_a_possible_start(parser_name, start):
    parser = FunctionCallParser(TOOLS, parser_name)
    assert parser.parse_stream_chunk("Hello there") == ("Hello there", [])
    assert parser.parse_stream_chunk(" " + start[:3]) == (" ", [])
    assert parser.parse_stream_chunk("!") == (start[:3] + "!", [])
    # a partial start left at the end of the stream is text
    assert parser.parse_stream_chunk(" " + start[:2]) == (" ", [])
    assert parser.parse_stream_end() == (start[:2], [])


def test_unclosed_call_at_stream_end():
    # qwen: a last block whose </tool_call> never came is still parsed when its JSON is whole
    parser = FunctionCallParser(TOOLS, "qwen25")
    text = 'x <tool_call>\n{"name": "search", "arguments": {"q": "a"}}\n'
    normal, calls = stream(parser, text, 5)
    assert normal == "x " and calls == [("search", '{"q": "a"}')]
    # an incomplete JSON call whose name is not complete yet is given back as text
    parser = FunctionCallParser(TOOLS, "mistral")
    assert parser.parse_stream_chunk('[TOOL_CALLS] [{"name": "sea') == ("", [])
    assert parser.parse_stream_end() == ('[TOOL_CALLS] [{"name": "sea', [])
    # once the name went out, the call stays started (its arguments cut short)
    parser = FunctionCallParser(TOOLS, "mistral")
    assert parser.parse_stream_chunk('[TOOL_CALLS] [{"name": "search", "arguments": {"q"') == (
        "", [ToolCallItem(tool_index=0, name="search", parameters=""), ToolCallItem(tool_index=0, parameters='{"q"')])
    assert parser.parse_stream_end() == ("", [])


def test_text_after_calls_and_empty_arguments():
    text = '<tool_call>\n{"name": "search"}\n</tool_call>\n\nDone.'
    normal, calls = FunctionCallParser(TOOLS, "qwen").parse_non_stream(text)
    assert normal == "Done." and calls == [ToolCallItem(tool_index=0, name="search", parameters="{}")]
    assert stream(FunctionCallParser(TOOLS, "qwen"), text, 4) == ("Done.", [("search", "{}")])


def test_parser_names_and_no_tools():
    for name in ("qwen25", "qwen", "hermes", "llama3", "pythonic", "mistral"):
        assert name in FunctionCallParser.ToolCallParserEnum
    with pytest.raises(ValueError, match="valid choices: .*qwen25"):
        FunctionCallParser(TOOLS, "nonsense")
    text = CASES["qwen25"]["single"][0]
    parser = FunctionCallParser([], "qwen25")
    assert not parser.has_tool_call(text)
    assert parser.parse_non_stream(text) == (text, [])
    assert parser.parse_stream_chunk(text) == (text, [])
    assert FunctionCallParser(TOOLS, "qwen25").has_tool_call(text)
    assert not FunctionCallParser(TOOLS, "qwen25").has_tool_call("no call")


def test_json_schema_constraint():
    required = get_json_schema_constraint(TOOLS, "required")
    assert required == {
        "type": "array",
        "minItems": 1,
        "items": {"type": "object", "anyOf": [
            {"type": "object", "properties": {"name": {"type": "string", "enum": ["get_weather"]},
                                              "parameters": WEATHER_PARAMS}, "required": ["name", "parameters"]},
            {"type": "object", "properties": {"name": {"type": "string", "enum": ["search"]},
                                              "parameters": {"type": "object", "properties": {}}},
             "required": ["name", "parameters"]},
        ]},
    }
    assert get_json_schema_constraint(TOOLS, "required", parallel_tool_calls=False)["maxItems"] == 1
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert get_json_schema_constraint(TOOLS, named) == WEATHER_PARAMS
    assert get_json_schema_constraint(TOOLS, {"type": "function", "function": {"name": "search"}}) == {
        "type": "object", "properties": {}}
    for choice in ("auto", "none", None, {"type": "function", "function": {"name": "missing"}}):
        assert get_json_schema_constraint(TOOLS, choice) is None


def test_parse_required_tool_calls_round_trip():
    out = json.dumps([{"name": "get_weather", "parameters": W}, {"name": "search", "parameters": S}])
    calls = parse_required_tool_calls(out, "required")
    assert [c.tool_index for c in calls] == [0, 1]
    assert [(c.name, c.parameters) for c in calls] == [
        ("get_weather", json.dumps(W, ensure_ascii=False)), ("search", json.dumps(S, ensure_ascii=False))]
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert parse_required_tool_calls(' {"city": "Paris",\n "days": 3} ', named) == [
        ToolCallItem(tool_index=0, name="get_weather", parameters=json.dumps(W))]
    for text, choice in [("[{", "required"), ('{"name": "x"}', "required"), ('[{"parameters": {}}]', "required"),
                         ("[1]", named), ("nope", named), ("{}", "auto")]:
        with pytest.raises(ValueError):
            parse_required_tool_calls(text, choice)


def test_required_schema_hoists_the_tools_defs_and_refuses_conflicting_ones():
    """Upstream's rule: the tools' `$defs` move to the root of the `required` schema (their `$ref`s
    resolve there, and the grammar backend compiles it); one name defined twice differently is a
    ValueError (a 400) with upstream's message."""
    import jsonschema
    import xgrammar

    loc = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    params = {"type": "object", "properties": {"loc": {"$ref": "#/$defs/Loc"}}, "required": ["loc"],
              "$defs": {"Loc": loc}}
    tools = [{"type": "function", "function": {"name": "a", "parameters": params}},
             {"type": "function", "function": {"name": "b", "parameters": params}}]
    schema = get_json_schema_constraint(tools, "required")
    assert schema["$defs"] == {"Loc": loc}
    xgrammar.Grammar.from_json_schema(json.dumps(schema))
    jsonschema.validate([{"name": "b", "parameters": {"loc": {"city": "Oslo"}}}], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "a", "parameters": {"loc": {"town": "Oslo"}}}], schema)
    other = {**params, "$defs": {"Loc": {"type": "string"}}}
    with pytest.raises(ValueError, match="Tool definition 'Loc' has multiple schemas, which is not supported."):
        get_json_schema_constraint(tools + [{"type": "function", "function": {"name": "c", "parameters": other}}],
                                   "required")
