"""Incremental detokenization: never emits half a UTF-8 character; trims matched stops."""

import pytest

from sglang.srt.managers.detokenizer_manager import IncrementalDetokenizer, trim_matched_stop
from sglang.srt.managers.io_struct import BatchTokenIDOutput
from sglang.test.tiny_models import tiny_tokenizer_dir


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir())


def _msg(rid, ids, finished=None, no_stop_trim=False):
    return BatchTokenIDOutput(
        rids=[rid], finished_reasons=[finished], output_ids=[ids], read_offsets=[0], skip_special_tokens=[True],
        spaces_between_special_tokens=[True], no_stop_trim=[no_stop_trim], stop_strs=[[]], prompt_tokens=[1],
        completion_tokens=[len(ids)], cached_tokens=[0], retraction_counts=[0],
        output_token_logprobs=[None], output_top_logprobs=[None], input_token_logprobs=[None], input_top_logprobs=[None],
    )


def test_streaming_never_splits_utf8(tokenizer):
    text = "Hi 😀 café — 日本語 ok"
    ids = tokenizer.encode(text)
    detok = IncrementalDetokenizer(tokenizer)
    seen = []
    for n in range(1, len(ids) + 1):
        finished = {"type": "length", "length": len(ids)} if n == len(ids) else None
        out = detok.handle(_msg("r", ids[:n], finished))
        s = out.output_strs[0]
        assert "\ufffd" not in s
        if seen:
            assert s.startswith(seen[-1])  # text only grows
        seen.append(s)
    assert seen[-1] == tokenizer.decode(ids, skip_special_tokens=True)
    assert "r" not in detok.states  # state dropped at finish


def test_stop_string_trimmed_unless_no_stop_trim(tokenizer):
    ids = tokenizer.encode("hello world STOP and more")
    reason = {"type": "stop", "matched": "STOP"}
    out = IncrementalDetokenizer(tokenizer).handle(_msg("a", ids, reason))
    assert out.output_strs[0] == "hello world "
    out = IncrementalDetokenizer(tokenizer).handle(_msg("b", ids, reason, no_stop_trim=True))
    assert out.output_strs[0] == "hello world STOP and more"
    assert trim_matched_stop("abc", {"type": "length"}, False) == "abc"


def test_matched_stop_token_not_in_text(tokenizer):
    ids = tokenizer.encode("the end")
    stop_tok = tokenizer.encode(".")[0]
    out = IncrementalDetokenizer(tokenizer).handle(_msg("c", ids + [stop_tok], {"type": "stop", "matched": stop_tok}))
    assert out.output_strs[0] == "the end"
