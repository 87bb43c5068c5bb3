"""The model families' reasoning formats under upstream's `--reasoning-parser` names, on each
format's real markup: one-shot and streamed (one character at a time) give the same reasoning and
answer; an output cut inside the reasoning is all reasoning; forced formats start inside it;
DeepSeek-V3.1 reasons only when the request asks for thinking; Kimi-K2's tool section ends the
reasoning and stays in the text; gpt-oss's final-channel markers are not text."""

import pytest

from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
from sglang.srt.parser.reasoning_parser import ReasoningParser
from sglang.srt.server_args.choices import REASONING_PARSER_CHOICES

# name -> (output, reasoning, answer)
CASES = {
    "deepseek-r1": ("Let me think.</think>Paris.", "Let me think.", "Paris."),
    "step3": ("Let me think.</think>\n\nParis.", "Let me think.", "Paris."),
    "step3p5": ("<think>Let me think.</think>Paris.", "Let me think.", "Paris."),
    "qwen3": ("<think>\nLet me think.\n</think>\n\nParis.", "Let me think.", "Paris."),
    "glm45": ("<think>Let me think.</think>Paris.", "Let me think.", "Paris."),
    "interns1": ("<think>Let me think.</think>Paris.", "Let me think.", "Paris."),
    "minimax": ("Let me think.</think>\nParis.", "Let me think.", "Paris."),
    "kimi": ("◁think▷Let me think.◁/think▷Paris.", "Let me think.", "Paris."),
    "kimi_k2": ("<think>Let me think.</think>Paris.", "Let me think.", "Paris."),
    "mistral": ("[THINK]Let me think.[/THINK]Paris.", "Let me think.", "Paris."),
    "gpt-oss": ("<|channel|>analysis<|message|>Let me think.<|end|><|start|>assistant<|channel|>final<|message|>"
                "Paris.<|return|>", "Let me think.", "Paris."),
}


def stream(name, text, **kw):
    p = ReasoningParser(name, **kw)
    out = [p.parse_stream_chunk(ch) for ch in text] + [p.finish()]
    return "".join(r for r, _ in out), "".join(n for _, n in out)


@pytest.mark.parametrize("name", sorted(CASES))
def test_one_shot_and_streamed(name):
    text, reasoning, answer = CASES[name]
    assert ReasoningParser(name).parse_non_stream(text) == (reasoning, answer)
    s_reasoning, s_answer = stream(name, text)
    assert s_reasoning.strip() == reasoning and s_answer.strip() == answer
    s_reasoning, s_answer = stream(name, text, stream_reasoning=False)
    assert s_reasoning.strip() == reasoning and s_answer.strip() == answer


@pytest.mark.parametrize("name", ["deepseek-r1", "step3", "minimax", "qwen3", "kimi", "mistral", "gpt-oss"])
def test_cut_inside_the_reasoning_is_all_reasoning(name):
    text, reasoning, _ = CASES[name]
    cut = text[: text.index("think.") + 3]
    r, n = ReasoningParser(name).parse_non_stream(cut)
    assert n == "" and reasoning.startswith(r) and r
    s_r, s_n = stream(name, cut)
    assert s_n == "" and s_r.strip() == r


@pytest.mark.parametrize("name", ["qwen3", "glm45", "kimi", "mistral", "gpt-oss", "deepseek-v3"])
def test_unforced_formats_without_reasoning_are_answer_only(name):
    assert ReasoningParser(name).parse_non_stream("Paris.") == ("", "Paris.")
    assert stream(name, "Paris.") == ("", "Paris.")


def test_deepseek_v3_reasons_when_the_request_asks_for_thinking():
    def request(kwargs):
        return ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], chat_template_kwargs=kwargs)

    text = "Let me think.</think>Paris."
    assert ReasoningParser("deepseek-v3", request=request({"thinking": True})).parse_non_stream(text) == (
        "Let me think.", "Paris.")
    assert ReasoningParser("deepseek-v3", request=request({"thinking": False})).parse_non_stream(text) == ("", text)


def test_kimi_k2_tool_section_ends_the_reasoning():
    text = "<think>I should call it.<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
    expected = ("I should call it.", "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0")
    assert ReasoningParser("kimi_k2").parse_non_stream(text) == expected
    r, n = stream("kimi_k2", text)
    assert (r.strip(), n) == expected


def test_minimax_append_think_gives_the_text_back_with_its_think():
    text = "Let me think.</think>Paris."
    assert ReasoningParser("minimax-append-think").parse_non_stream(text) == ("", "<think>" + text)
    assert stream("minimax-append-think", text) == ("", "<think>" + text)


def test_gpt_oss_answer_without_analysis_and_tool_call_text_kept():
    text = "<|start|>assistant<|channel|>final<|message|>Paris.<|return|>"
    assert ReasoningParser("gpt-oss").parse_non_stream(text) == ("", "Paris.")
    assert stream("gpt-oss", text) == ("", "Paris.")
    call = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>"
    r, n = stream("gpt-oss", "<|channel|>analysis<|message|>hm<|end|><|start|>assistant" + call)
    assert r == "hm" and n == "<|start|>assistant" + call  # for the gpt-oss tool-call parser


def test_every_name_is_a_choice():
    assert set(ReasoningParser.DetectorMap) <= set(REASONING_PARSER_CHOICES)
