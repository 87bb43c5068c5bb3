"""The limit module and the bounded grammar cache, without a server."""

from concurrent.futures import Future

import pytest

from sglang.srt.constrained.base_grammar_backend import BaseGrammarBackend
from sglang.srt.managers.request_limits import RequestLimits, clip, clip_message, json_depth_exceeds


def test_defaults_and_the_environment():
    d = RequestLimits.from_env(context_len=2048, environ={})
    assert (d.max_top_logprobs, d.max_completion_logprobs, d.max_body_bytes) == (20, 5, 32 << 20)
    assert d.max_prompt_chars == 65536  # max(64 Ki, 16 x context)
    assert RequestLimits.from_env(context_len=128_000, environ={}).max_prompt_chars == 16 * 128_000
    e = RequestLimits.from_env(2048, environ={"SGLANG_MAX_STOP_STRINGS": "3", "SGLANG_MAX_PROMPT_CHARS": "10"})
    assert (e.max_stop_strings, e.max_prompt_chars) == (3, 10)
    for bad in ("0", "-1", "many"):
        with pytest.raises(ValueError, match="SGLANG_MAX_TOP_LOGPROBS must be a positive integer"):
            RequestLimits.from_env(2048, environ={"SGLANG_MAX_TOP_LOGPROBS": bad})


def test_checks_name_the_limit():
    lim = RequestLimits.from_env(2048, environ={})
    with pytest.raises(ValueError, match=r"stop has 129 strings; at most 128 .*SGLANG_MAX_STOP_STRINGS"):
        lim.check_stop_strings(["x"] * 129)
    lim.check_stop_strings(["x"] * 128)
    lim.check_stop_strings("x")
    lim.check_logprob_work(8192, -1, 16, 20, None)  # no prompt logprobs: 16 x 21
    with pytest.raises(ValueError, match=r"8192 prompt, 1 new\) x 49153 tokens each"):
        lim.check_logprob_work(8192, 0, 1, 48152, list(range(1000)))
    with pytest.raises(ValueError, match="token_ids_logprob has 49152 token ids; at most 1024"):
        lim.check_logprob_work(8192, 0, 1, 0, list(range(49152)))
    with pytest.raises(ValueError, match="Expected a value <= 5, but got 6 instead"):
        lim.check_completion_logprobs(6)


def test_json_depth_is_measured_without_recursion():
    deep = 1
    for _ in range(5000):
        deep = {"a": deep}
    assert json_depth_exceeds(deep, 64)
    assert not json_depth_exceeds({"a": [1, {"b": [2]}], "c": list(range(1000))}, 4)
    assert json_depth_exceeds({"a": [1, {"b": [2]}]}, 3)


def test_client_values_are_clipped_in_messages():
    assert len(clip("A" * 5_000_000)) < 200
    assert len(clip(list(range(1_000_000)))) < 200
    assert len(clip_message("B" * 5_000_000)) < 2100


class _CountingBackend(BaseGrammarBackend):
    def __init__(self, entries):
        super().__init__(num_threads=1, cache_entries=entries)
        self.compiled = []

    def compile(self, key):
        self.compiled.append(key)
        return key


def test_the_grammar_cache_keeps_the_most_recently_used():
    b = _CountingBackend(entries=2)
    try:
        for key in [("regex", "a"), ("regex", "b"), ("regex", "a"), ("regex", "c")]:
            fut = b.get_future(key)
            assert isinstance(fut, Future) and fut.result(10) == key
        assert b.cache_size() == 2
        b.get_future(("regex", "a")).result(10)  # still cached: used after b
        assert b.compiled == [("regex", "a"), ("regex", "b"), ("regex", "c")]
        b.get_future(("regex", "b")).result(10)  # evicted: compiled again
        assert b.compiled[-1] == ("regex", "b") and len(b.compiled) == 4
        for i in range(100):
            b.get_future(("regex", str(i))).result(10)
        assert b.cache_size() == 2
    finally:
        b.shutdown()
