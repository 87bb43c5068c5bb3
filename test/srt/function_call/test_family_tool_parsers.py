"""The model families' tool-call formats under upstream's `--tool-call-parser` names, on each
format's real markup (the examples of upstream's detectors and of the models' chat templates):
parsed whole and streamed (one character at a time and in random chunks) to the same normal text
and the same calls; arguments typed by the tool's schema where the markup carries text; malformed
markup kept as text; a call cut short by the end of the output; unknown functions dropped; and
the server's choices name every upstream parser, refusing one that is not implemented here by name."""

import json
import random

import pytest

from sglang.srt.function_call import FunctionCallParser
from sglang.srt.server_args import ServerArgs, prepare_server_args
from sglang.srt.server_args.choices import TOOL_CALL_PARSER_CHOICES

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "zip": {"type": "string"},
        "hours": {"type": "array"}}}}},
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
        "q": {"type": "string"}}}}},
]
W = {"city": "São Paulo", "days": 3}
S = {"q": "rain <today>"}
WJ, SJ = json.dumps(W, ensure_ascii=False), json.dumps(S, ensure_ascii=False)
PRE = "Let me check."

# name -> (an output with text before two calls, the normal text, the calls)
FORMATS = {
    "deepseekv3": (f"{PRE}<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{WJ}\n```"
                   f"<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>search\n```json\n{SJ}\n```"
                   "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    "deepseekv31": (f"{PRE}<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{WJ}<｜tool▁call▁end｜>"
                    f"<｜tool▁call▁begin｜>search<｜tool▁sep｜>{SJ}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    "kimi_k2": (f"{PRE}<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
                f"{WJ}<|tool_call_end|><|tool_call_begin|>functions.search:1<|tool_call_argument_begin|>{SJ}"
                "<|tool_call_end|><|tool_calls_section_end|>"),
    "glm45": (f"{PRE}\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>São Paulo</arg_value>\n"
              "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>\n"
              "<tool_call>search\n<arg_key>q</arg_key>\n<arg_value>rain <today></arg_value>\n</tool_call>"),
    "glm47": (f"{PRE}<tool_call>get_weather<arg_key>city</arg_key><arg_value>São Paulo</arg_value><arg_key>days</arg_key>"
              "<arg_value>3</arg_value></tool_call><tool_call>search<arg_key>q</arg_key><arg_value>rain <today>"
              "</arg_value></tool_call>"),
    "qwen3_coder": (f"{PRE}\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo\n</parameter>\n"
                    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=search>\n"
                    "<parameter=q>\nrain <today>\n</parameter>\n</function>\n</tool_call>"),
    "minimax-m2": (f"{PRE}\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">São Paulo"
                   "</parameter>\n<parameter name=\"days\">3</parameter>\n</invoke>\n<invoke name=\"search\">\n"
                   "<parameter name=\"q\">rain <today></parameter>\n</invoke>\n</minimax:tool_call>"),
    "step3": (f"{PRE}<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name=\"get_weather\">"
              "<steptml:parameter name=\"city\">São Paulo</steptml:parameter><steptml:parameter name=\"days\">3"
              "</steptml:parameter></steptml:invoke><｜tool_call_end｜><｜tool_call_begin｜>function<｜tool_sep｜>"
              "<steptml:invoke name=\"search\"><steptml:parameter name=\"q\">rain <today></steptml:parameter>"
              "</steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜>"),
    "interns1": (f"{PRE}<|action_start|><|plugin|>\n{{\"name\": \"get_weather\", \"parameters\": {WJ}}}<|action_end|>"
                 f"<|action_start|><|plugin|>\n{{\"name\": \"search\", \"parameters\": {SJ}}}<|action_end|>"),
    "lfm2": f"{PRE}<|tool_call_start|>[get_weather(city='São Paulo', days=3), search(q='rain <today>')]<|tool_call_end|>",
    "llama4": f"{PRE} [get_weather(city='São Paulo', days=3), search(q='rain <today>')]",
    "gpt-oss": ("<|start|>assistant<|channel|>commentary<|message|>" + PRE + "<|end|>"
                f"<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{WJ}<|call|>"
                f"<|start|>assistant<|channel|>commentary to=functions.search <|constrain|>json<|message|>{SJ}<|call|>"),
}
FORMATS["step3p5"] = FORMATS["qwen3_coder"]
FORMATS["glm"] = FORMATS["glm45"]
# formats whose arguments stream as they are generated (JSON after the name)
STREAMS_ARGUMENTS = {"deepseekv3", "deepseekv31", "kimi_k2", "interns1", "gpt-oss"}


def random_chunks(text, rng):
    cuts = sorted(rng.sample(range(1, len(text)), len(text) // 5))
    return [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]


def parse_stream(name, pieces):
    p = FunctionCallParser(TOOLS, name)
    normal, items = "", []
    for piece in pieces:
        n, c = p.parse_stream_chunk(piece)
        normal += n
        items += c
    n, c = p.parse_stream_end()
    return normal + n, items + c


def merged(items):
    calls = {}
    for it in items:
        if it.name is not None:
            assert it.tool_index not in calls and it.parameters == ""
            calls[it.tool_index] = [it.name, ""]
        else:
            calls[it.tool_index][1] += it.parameters
    return [(n, json.loads(a)) for _, (n, a) in sorted(calls.items())]


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_whole_and_streamed_agree_on_real_markup(name):
    text = FORMATS[name]
    normal, calls = FunctionCallParser(TOOLS, name).parse_non_stream(text)
    assert normal == PRE
    assert [(c.name, json.loads(c.parameters)) for c in calls] == [("get_weather", W), ("search", S)]
    assert [c.tool_index for c in calls] == [0, 1]
    for pieces in (list(text), random_chunks(text, random.Random(name))):
        s_normal, items = parse_stream(name, pieces)
        assert s_normal.strip() == PRE, (name, s_normal)
        assert merged(items) == [("get_weather", W), ("search", S)]
    _, items = parse_stream(name, list(text))
    first_args = [it for it in items if it.tool_index == 0 and it.name is None]
    if name in STREAMS_ARGUMENTS:
        assert len(first_args) > 1, (name, first_args)  # the arguments stream as they are generated


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_no_call_is_all_text(name):
    text = "Paris is sunny <b>today</b> [ok] {\"a\": 1}."
    assert FunctionCallParser(TOOLS, name).parse_non_stream(text) == (text, [])
    normal, items = parse_stream(name, list(text))
    assert normal == text and items == []


MALFORMED = {
    "deepseekv31": f"{PRE}<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather{WJ}<｜tool▁call▁end｜>",
    "kimi_k2": f"{PRE}<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0 {{bad<|tool_call_end|>",
    "glm45": f"{PRE}<tool_call>get weather now\n<arg_key>city</arg_key></tool_call>",
    "qwen3_coder": f"{PRE}<tool_call>\n<function get_weather>\n</tool_call>",
    "minimax-m2": f"{PRE}<minimax:tool_call>\n<invoke>\n</invoke>\n</minimax:tool_call>",
    "step3": f"{PRE}<｜tool_calls_begin｜><｜tool_call_begin｜>python<｜tool_sep｜>x<｜tool_call_end｜>",
    "lfm2": f"{PRE}<|tool_call_start|>[get_weather('Paris')]<|tool_call_end|>",
    "gpt-oss": f"{PRE}<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>[1, 2]<|call|>",
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_markup_stays_text(name):
    text = MALFORMED[name]
    normal, calls = FunctionCallParser(TOOLS, name).parse_non_stream(text)
    assert calls == [] and normal.startswith(PRE) and len(normal) > len(PRE), (name, normal)


@pytest.mark.parametrize("name", ["deepseekv31", "kimi_k2", "glm47", "qwen3_coder", "gpt-oss"])
def test_a_call_cut_by_the_end_of_the_output(name):
    text = FORMATS[name]
    first_end = {"deepseekv31": "<｜tool▁call▁end｜>", "kimi_k2": "<|tool_call_end|>", "glm47": "</tool_call>",
                 "qwen3_coder": "</tool_call>", "gpt-oss": "<|call|>"}[name]
    cut = text[: text.index(first_end)]  # the end marker never came (e.g. it was a stop token)
    normal, calls = FunctionCallParser(TOOLS, name).parse_non_stream(cut)
    assert normal == PRE and [(c.name, json.loads(c.parameters)) for c in calls] == [("get_weather", W)]
    s_normal, items = parse_stream(name, list(cut))
    assert s_normal.strip() == PRE and merged(items) == [("get_weather", W)]
    # cut inside the arguments: no call comes out whole, and nothing is invented
    half = text[: text.index("3")]
    _, calls = FunctionCallParser(TOOLS, name).parse_non_stream(half)
    assert calls == []


def test_markup_values_are_typed_by_the_schema():
    text = ("<tool_call>get_weather\n<arg_key>zip</arg_key>\n<arg_value>75001</arg_value>\n<arg_key>days</arg_key>\n"
            "<arg_value>4</arg_value>\n<arg_key>hours</arg_key>\n<arg_value>[6, 12]</arg_value>\n<arg_key>note</arg_key>\n"
            "<arg_value>{not json</arg_value>\n</tool_call>")
    _, (call,) = FunctionCallParser(TOOLS, "glm45").parse_non_stream(text)
    assert json.loads(call.parameters) == {"zip": "75001", "days": 4, "hours": [6, 12], "note": "{not json"}


def test_unknown_functions_are_dropped():
    text = ("<tool_call>\n<function=launch_rocket>\n<parameter=when>\nnow\n</parameter>\n</function>\n</tool_call>"
            "<tool_call>\n<function=search>\n<parameter=q>\nx\n</parameter>\n</function>\n</tool_call>")
    _, calls = FunctionCallParser(TOOLS, "qwen3_coder").parse_non_stream(text)
    assert [c.name for c in calls] == ["search"]
    _, items = parse_stream("qwen3_coder", list(text))
    assert [n for n, _ in merged(items)] == ["search"]


def test_choices_hold_every_upstream_name_and_unimplemented_ones_fail_by_name():
    assert set(FunctionCallParser.ToolCallParserEnum) <= set(TOOL_CALL_PARSER_CHOICES)
    for name in ("deepseekv3", "deepseekv31", "glm45", "glm47", "gpt-oss", "kimi_k2", "qwen3_coder", "llama4",
                 "mistral", "step3", "lfm2", "interns1", "minimax-m2"):
        assert ServerArgs(model_path="m", tool_call_parser=name).tool_call_parser == name
    with pytest.raises(ValueError, match=r"--tool-call-parser dots: upstream's parser of that name is not implemented"):
        prepare_server_args(["--model-path", "m", "--tool-call-parser", "dots"])
    with pytest.raises(ValueError, match=r"--reasoning-parser telechat4: .*not implemented.*Implemented: deepseek-r1"):
        ServerArgs(model_path="m", reasoning_parser="telechat4")
