"""Streamed tool calls are incremental, as upstream SGLang / OpenAI stream them: per call a first
`delta.tool_calls` item with `index`, an `id` starting with `call_`, `type`, `function.name` and
`function.arguments: ""`, then items with only `index` and `function.arguments` fragments as the
arguments are generated. The fragments concatenate to exactly the arguments JSON of the one-shot
parse of the same output. Checked on the real parsers and the real per-choice output processing
(`ChoiceOutput`), with outputs fed a few characters at a time: the `auto` path of each JSON format,
the `required` / named path (grammar-constrained JSON), and the JSON normalizer underneath
(`stable_json_prefix`) on random values in random layouts."""

import json
import logging
import random

import pytest

from sglang.srt.entrypoints.openai.chat_output import ChoiceOutput
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
from sglang.srt.function_call import FunctionCallParser
from sglang.srt.function_call.json_stream import StablePrefix, json_value_end, stable_json_prefix

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "search"}},
]
WEATHER = {"city": "São Paulo", "days": 3, "unit": "celsius", "hours": [6, 12.5, 18], "alerts": None}
SEARCH = {"q": 'café "quoted" \\ \n😀', "tags": ["a", "b"], "exact": True, "nested": {"k": [], "o": {}}}
CALL_W = '{"name": "get_weather", "arguments": %s}' % json.dumps(WEATHER, ensure_ascii=False)
CALL_S = '{"name": "search", "parameters": %s}' % json.dumps(SEARCH)  # \u escapes in the text
PREFIX = "Let me look that up [now]."

# parser -> an output with text before two calls of several fields each
OUTPUTS = {
    "qwen25": f"{PREFIX}\n<tool_call>\n{CALL_W}\n</tool_call>\n<tool_call>\n{CALL_S}\n</tool_call>",
    "llama3": f"{PREFIX}<|python_tag|>{CALL_W}; {CALL_S}",
    "mistral": f"{PREFIX}[TOOL_CALLS] [{CALL_W}, {CALL_S}]",
}


def chunks(text, size):
    return [text[i:i + size] for i in range(0, len(text), size)]


def choice(tool_choice="auto", parser="qwen25"):
    request = ChatCompletionRequest(model="default", messages=[{"role": "user", "content": "hi"}], tools=TOOLS,
                                    tool_choice=tool_choice)
    return ChoiceOutput(request, parser, None)


def run_stream(proc, text, size, text_after_calls=False):
    """Feed `text` through `proc` -> (content, the tool_calls delta items in order)."""
    content, items = [], []
    for delta in [d for piece in chunks(text, size) for d in proc.delta(piece)] + proc.end():
        assert set(delta) <= {"content", "tool_calls"}
        assert text_after_calls or "content" not in delta or not items, "text arrived after a call began"
        content.append(delta.get("content", ""))
        items += delta.get("tool_calls", [])
    return "".join(content), items


def assemble(items):
    """Check the per-call item protocol; -> {index: (id, name, [argument fragments])}."""
    calls = {}
    for item in items:
        index = item["index"]
        if index not in calls:
            assert index == len(calls), "calls start in index order"
            assert set(item) == {"index", "id", "type", "function"} and item["type"] == "function"
            assert item["id"].startswith("call_") and len(item["id"]) > len("call_")
            assert item["function"]["arguments"] == "" and item["function"]["name"]
            calls[index] = (item["id"], item["function"]["name"], [])
        else:
            assert index == len(calls) - 1, "a call's fragments all come before the next call starts"
            assert set(item) == {"index", "function"} and set(item["function"]) == {"arguments"}
            assert item["function"]["arguments"]
            calls[index][2].append(item["function"]["arguments"])
    return calls


def check_against_one_shot(text, calls, one_shot_calls):
    assert [name for _, name, _ in calls.values()] == [c["function"]["name"] for c in one_shot_calls]
    assert len({call_id for call_id, _, _ in calls.values()}) == len(calls)
    for (_, _, fragments), whole in zip(calls.values(), one_shot_calls):
        assert "".join(fragments) == whole["function"]["arguments"]
        json.loads(whole["function"]["arguments"])


@pytest.mark.parametrize("size", [1, 3, 5])
@pytest.mark.parametrize("parser", sorted(OUTPUTS))
def test_auto_calls_stream_name_then_argument_fragments(parser, size):
    text = OUTPUTS[parser]
    content, reasoning, one_shot = choice(parser=parser).whole(text)
    assert content == PREFIX and reasoning is None
    assert [json.loads(c["function"]["arguments"]) for c in one_shot] == [WEATHER, SEARCH]
    streamed_content, items = run_stream(choice(parser=parser), text, size)
    assert streamed_content.strip() == PREFIX
    calls = assemble(items)
    check_against_one_shot(text, calls, one_shot)
    for _, _, fragments in calls.values():
        assert len(fragments) > 3, fragments  # several fields: the arguments arrive piece by piece


def test_text_before_a_call_streams_before_the_call_ends():
    proc = choice()
    out = proc.delta("Checking the weather.")
    assert out == [{"content": "Checking the weather."}]
    out = proc.delta(' <tool_call>\n{"name": "get_weather", "arguments": {"city": "Par')
    assert out[0] == {"content": " "}
    assert out[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": ""}
    assert out[2] == {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Par'}}]}
    assert proc.delta('is", "days": 2') == [{"tool_calls": [{"index": 0, "function": {"arguments": 'is", "days": '}}]}]
    assert proc.delta("}}\n</tool_call>") == [{"tool_calls": [{"index": 0, "function": {"arguments": "2}"}}]}]
    assert proc.end() == [] and proc.has_tool_calls


def test_a_call_is_complete_once_its_object_closes():
    # the arguments' closing brace goes out with the call object's own, before the next call or the
    # end; a call whose first arguments key is empty takes the one-shot's choice (the later key)
    proc = choice(parser="mistral")
    deltas = [d for piece in chunks('[TOOL_CALLS] [{"name": "search", "parameters": {"q": 1}', 4)
              for d in proc.delta(piece)]
    assert "".join(i["function"]["arguments"] for d in deltas for i in d["tool_calls"]) == '{"q": 1'
    assert [d["tool_calls"][0]["function"] for d in proc.delta("}")] == [{"arguments": "}"}]
    proc = choice(parser="mistral")
    deltas = [d for piece in chunks('[TOOL_CALLS] [{"name": "search", "parameters": {}, "arguments": {"q": 2}}', 3)
              for d in proc.delta(piece)]
    assert "".join(i["function"]["arguments"] for d in deltas for i in d["tool_calls"]) == '{"q": 2}'
    assert proc.end() == []  # nothing was left for the end of the output


@pytest.mark.parametrize("size", [1, 4])
def test_required_calls_stream_as_generated(size):
    # what the grammar lets a model write: any whitespace between the JSON tokens
    text = ('[\n  {"name":"get_weather" , "parameters" :{"city":"S\\u00e3o Paulo","days":3,"unit":"celsius",'
            '"hours":[ 6,12.50 ,18],"alerts":null}},{"name": "search", "parameters": %s}\n]' % json.dumps(SEARCH))
    content, _, one_shot = choice("required").whole(text)
    assert content == "" and [json.loads(c["function"]["arguments"]) for c in one_shot] == [WEATHER, SEARCH]
    streamed_content, items = run_stream(choice("required"), text, size)
    assert streamed_content == ""
    calls = assemble(items)
    check_against_one_shot(text, calls, one_shot)
    assert all(len(fragments) > 3 for _, _, fragments in calls.values())


@pytest.mark.parametrize("size", [1, 4])
def test_named_call_streams_as_generated(size):
    named = {"type": "function", "function": {"name": "get_weather"}}
    text = ' {"city": "Oslo",\n "days": 10, "unit": "celsius"} '
    _, _, one_shot = choice(named).whole(text)
    proc = choice(named)
    assert proc.delta(" ") == []  # the name goes out with the first token of the output
    first = [item for delta in proc.delta(text[1:3]) for item in delta["tool_calls"]]
    assert first[0]["function"] == {"name": "get_weather", "arguments": ""}
    streamed_content, items = run_stream(proc, text[3:], size)
    calls = assemble(first + items)
    assert streamed_content == "" and len(calls[0][2]) > 3
    check_against_one_shot(text, calls, one_shot)


def test_constrained_output_cut_short():
    # nothing of a call went out yet: the text is the content, as in the one-shot path
    proc = choice("required")
    assert proc.delta('[{"na') == []
    assert proc.end() == [{"content": '[{"na'}] and not proc.has_tool_calls
    # a call went out: its arguments stay partial (finish_reason "length" tells the client)
    proc = choice("required")
    content, items = run_stream(proc, '[{"name": "search", "parameters": {"q": "abc', 3)
    calls = assemble(items)
    assert content == "" and calls[0][1] == "search" and "".join(calls[0][2]) == '{"q": "abc'


def test_detector_fragments_add_up_for_every_format():
    # the detector level: the same protocol without the serving layer, fragments per call
    for parser, text in OUTPUTS.items():
        _, whole = FunctionCallParser(TOOLS, parser).parse_non_stream(text)
        stream = FunctionCallParser(TOOLS, parser)
        items = [i for c in chunks(text, 2) for i in stream.parse_stream_chunk(c)[1]]
        items += stream.parse_stream_end()[1]
        for call in whole:
            mine = [i for i in items if i.tool_index == call.tool_index]
            assert mine[0].name == call.name and mine[0].parameters == ""
            assert all(i.name is None for i in mine[1:]) and len(mine) > 4
            assert "".join(i.parameters for i in mine[1:]) == call.parameters


def test_pythonic_calls_go_out_whole_as_upstream():
    text = 'Sure. [get_weather(city="Oslo", days=2), search(q="x")]'
    parser = FunctionCallParser(TOOLS, "pythonic")
    items = [i for c in chunks(text, 3) for i in parser.parse_stream_chunk(c)[1]] + parser.parse_stream_end()[1]
    assert [(i.tool_index, i.name, i.parameters) for i in items] == [
        (0, "get_weather", ""), (0, None, '{"city": "Oslo", "days": 2}'), (1, "search", ""), (1, None, '{"q": "x"}')]


def test_malformed_call_after_its_name_went_out(caplog):
    text = 'Hi <tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", }}\n</tool_call> bye'
    assert FunctionCallParser(TOOLS, "qwen25").parse_non_stream(text) == (text, [])  # one-shot: text
    with caplog.at_level(logging.WARNING):
        content, items = run_stream(choice(), text, 4, text_after_calls=True)
    calls = assemble(items)  # a stream cannot take the call back: it stays, the region is dropped
    assert content == "Hi bye" and calls[0][1] == "get_weather"
    assert "".join(calls[0][2]) == '{"city": "Oslo", '
    assert "turned out malformed" in caplog.text


def test_unknown_function_is_not_streamed():
    text = '<tool_call>\n{"name": "nope", "arguments": {"a": 1}}\n</tool_call><tool_call>\n' + CALL_W + "\n</tool_call>"
    calls = assemble(run_stream(choice(), text, 2)[1])
    assert [(index, name) for index, (_, name, _) in calls.items()] == [(0, "get_weather")]
    assert json.loads("".join(calls[0][2])) == WEATHER


KEY_ENDS = ["", "é", '"']


def _random_value(rng, depth=0):
    kind = rng.randrange(8 if depth < 3 else 5)
    if kind == 0:
        return rng.choice([0, -7, 12345678901234567890, 3.25, -0.5, 1e-7, 2.5e20, 10.0])
    if kind == 1:
        return rng.choice([True, False, None])
    if kind in (2, 3, 4):
        alphabet = 'ab "\\/\n\t\x01é中😀\u2028'
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(8)))
    if kind == 5:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {f"k{i}{rng.choice(KEY_ENDS)}": _random_value(rng, depth + 1) for i in range(rng.randrange(4))}


def _random_layout(rng, value):
    """`value` as a model might write it: ASCII-escaped or not, compact or spread out."""
    text = json.dumps(value, ensure_ascii=rng.random() < 0.5,
                      separators=rng.choice([(",", ":"), (", ", ": "), (" ,\n ", " :  ")]),
                      indent=rng.choice([None, None, 2]))
    return rng.choice(["", " ", "\n"]) + text + rng.choice(["", " ", "\n"])


def test_stable_json_prefix_never_changes_and_ends_normalized():
    # read afresh at every length, and resumed chunk by chunk (as a stream reads it): the same
    rng = random.Random(16)
    for _ in range(300):
        value = {"v": _random_value(rng)}
        text = _random_layout(rng, value) + "tail"
        final = json.dumps(json.loads(text[:-4]), ensure_ascii=False)
        start = len(text) - len(text.lstrip())
        assert json_value_end(text, start) == len(text[:-4].rstrip())
        resumed, size, previous = StablePrefix(start), rng.randrange(1, 6), ""
        for n in range(start + 1, len(text) + 1):
            prefix, complete = stable_json_prefix(text[:n], start)
            assert final.startswith(prefix) and prefix.startswith(previous), (text[:n], prefix, final)
            assert complete == (prefix == final)
            if n % size == 0 or n == len(text):
                assert resumed.update(text[:n]) == (prefix, complete)
            previous = prefix
        assert stable_json_prefix(text, start) == (final, True)


def test_stable_json_prefix_holds_what_may_still_change():
    assert stable_json_prefix('{"n": 12', 0) == ('{"n": ', False)  # 12 may become 120 or 12.5
    assert stable_json_prefix('{"n": 12 ', 0) == ('{"n": 12', False)
    assert stable_json_prefix('{"n": 1.50}', 0) == ('{"n": 1.5}', True)
    assert stable_json_prefix('{"s": "a\\', 0) == ('{"s": "a', False)  # an escape cut short
    assert stable_json_prefix('{"s": "\\ud83d', 0) == ('{"s": "', False)  # half a surrogate pair
    assert stable_json_prefix('{"s": "\\ud83d\\ude00', 0) == ('{"s": "😀', False)
    assert stable_json_prefix('{"a": tru', 0) == ('{"a": ', False)
    assert stable_json_prefix('{"a": [1,]}', 0) == ('{"a": [1, ', False)  # malformed: stops there
