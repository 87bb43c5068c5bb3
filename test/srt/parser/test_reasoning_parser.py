"""The reasoning parser (sglang.srt.parser.reasoning_parser), no model: deepseek-r1 / qwen3-thinking
start inside the reasoning, qwen3 only with a leading <think>; one-shot results, the same outputs
streamed in 1/4-character chunks, a missing </think>, and an unknown parser name."""

import pytest

from sglang.srt.parser.reasoning_parser import ReasoningParser

# (parser name, force_reasoning, output, expected reasoning, expected normal text)
CASES = [
    ("deepseek-r1", None, "<think>\nLet me think: 6*7.\n</think>\n\nThe answer is 42.", "Let me think: 6*7.",
     "The answer is 42."),
    ("deepseek-r1", None, "Let me think </ think> <b>.</think>The answer.", "Let me think </ think> <b>.",
     "The answer."),
    ("deepseek-r1", None, "No end tag: still <thinking>", "No end tag: still <thinking>", ""),
    ("deepseek-r1", None, "</think>Only an answer.", "", "Only an answer."),
    ("qwen3-thinking", None, "Thinking...\n</think>\n\nDone.", "Thinking...", "Done."),
    ("qwen3", None, "<think>\nhmm\n</think>\n\nHello <think> </think>!", "hmm", "Hello <think> </think>!"),
    ("qwen3", None, "<think>cut short", "cut short", ""),
    ("qwen3", None, "Plain answer, x < y </think> z", "", "Plain answer, x < y </think> z"),
    ("qwen3", None, " <thi", "", " <thi"),
    ("qwen3", True, "forced</think> ok", "forced", "ok"),
    ("qwen3", False, "<think>a</think>b", "a", "b"),
]


def stream(parser, text, size):
    reasoning, normal = [], []
    chunks = [text[i:i + size] for i in range(0, len(text), size)]
    for r, n in [parser.parse_stream_chunk(c) for c in chunks] + [parser.finish()]:
        reasoning.append(r)
        normal.append(n)
    return "".join(reasoning), "".join(normal)


@pytest.mark.parametrize("name,force,text,reasoning,normal", CASES)
def test_non_stream(name, force, text, reasoning, normal):
    assert ReasoningParser(name, force_reasoning=force).parse_non_stream(text) == (reasoning, normal)


@pytest.mark.parametrize("stream_reasoning", [True, False])
@pytest.mark.parametrize("size", [1, 4])
@pytest.mark.parametrize("name,force,text,reasoning,normal", CASES)
def test_stream_matches_non_stream(name, force, text, reasoning, normal, size, stream_reasoning):
    parser = ReasoningParser(name, stream_reasoning=stream_reasoning, force_reasoning=force)
    got_reasoning, got_normal = stream(parser, text, size)
    assert got_reasoning.strip() == reasoning
    assert got_normal.lstrip() == normal.lstrip()


def test_reasoning_streams_holding_only_a_partial_end_tag():
    parser = ReasoningParser("deepseek-r1")
    assert parser.parse_stream_chunk("Step one") == ("Step one", "")
    assert parser.parse_stream_chunk(", two </thi") == (", two ", "")
    assert parser.parse_stream_chunk("nk>\n\nAnswer") == ("", "\n\nAnswer")
    assert parser.parse_stream_chunk(" </think> more") == ("", " </think> more")
    assert parser.finish() == ("", "")


def test_qwen3_waits_only_while_the_start_could_be_think():
    parser = ReasoningParser("qwen3")
    assert parser.parse_stream_chunk("<th") == ("", "")
    assert parser.parse_stream_chunk("ink>why") == ("why", "")
    parser = ReasoningParser("qwen3")
    assert parser.parse_stream_chunk("<b") == ("", "<b")
    assert parser.parse_stream_chunk("ye") == ("", "ye")


def test_no_stream_reasoning_gives_the_reasoning_in_one_piece():
    parser = ReasoningParser("qwen3", stream_reasoning=False)
    assert parser.parse_stream_chunk("<think>a") == ("", "")
    assert parser.parse_stream_chunk("b</th") == ("", "")
    assert parser.parse_stream_chunk("ink>c") == ("ab", "c")
    parser = ReasoningParser("deepseek-r1", stream_reasoning=False)
    assert parser.parse_stream_chunk("cut ") == ("", "")
    assert parser.finish() == ("cut ", "")


def test_unknown_model_type():
    with pytest.raises(ValueError, match="Unsupported model type: nope"):
        ReasoningParser("nope")
    assert set(ReasoningParser.DetectorMap) >= {"deepseek-r1", "qwen3", "qwen3-thinking"}
