"""stop_regex runs on RE2 over the output's tail (sampling/stop_regex.py).

Issue 51, finding 2: `(a+)+b` on Python's backtracking `re`, searched over the whole output after
every token, with a `logit_bias` forcing "a": a 1-token chat beside it took 0.5, 4.1, 7.1, then
12.2 s, and the request never ended. Finding 9: a 5,000-deep pattern was a 500 with a traceback.
The unit tests run without a server; the server tests (marked) use the shared plain server.
"""

import time

import pytest
import requests

from sglang.srt.sampling import stop_regex
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.sampling.stop_regex import StopRegexMatcher, validate_stop_regexes
from sglang.test.security_probe import Bystander, assert_server_whole, error_message

# SmolLM2's tokenizer (the tiny models'): token 81 decodes to "a".
TOKEN_A = 81
DEEP = "(" * 5000 + "a" + ")" * 5000


def _chars(ids):  # a "tokenizer" whose tokens are single characters
    return "".join(chr(i) for i in ids)


def _first_stop(pattern: str, text: str):
    """Checks after every token, as the scheduler does: (token count at the first match, pattern)."""
    m = StopRegexMatcher([pattern])
    ids = []
    for ch in text:
        ids.append(ord(ch))
        hit = m.first_match(ids, _chars)
        if hit is not None:
            return len(ids), hit
    return None


# --- unit: the matcher ------------------------------------------------------------------------


def test_catastrophic_pattern_is_linear_per_step():
    m = StopRegexMatcher(["(a+)+b"])
    assert m.window_tokens == stop_regex.UNBOUNDED_WINDOW_MIN_CHARS + stop_regex.WINDOW_EXTRA_TOKENS
    ids = [ord("a")] * 20000
    t0 = time.perf_counter()
    for n in range(19000, 20000):  # 1,000 steps on an output of ~20k "a"s
        assert m.first_match(ids[:n], _chars) is None
    assert time.perf_counter() - t0 < 5  # ~0.1 s here; Python's re would not finish step 40
    assert m.first_match(ids + [ord("b")], _chars) == "(a+)+b"


@pytest.mark.parametrize("pattern,text,at", [
    ("a{10}", "xy" + "a" * 20, 12),  # bounded, spanning 10 tokens
    ("(aa)+a{29}", "a" * 40, 31),  # unbounded, spanning 31 tokens
    ("b[^b]*b", "b" + "c" * 200 + "b" + "c" * 5, 202),  # unbounded, within the 256-char window
    ("^ab", "abc", 2),  # the window reaches the start: ^ is the output's start
    ("stop|end", "x" * 500 + "the end", 507),
])
def test_a_match_that_spans_many_tokens_stops_at_its_last_token(pattern, text, at):
    assert _first_stop(pattern, text) == (at, pattern)


def test_caret_never_matches_where_the_window_cuts_the_output():
    m = StopRegexMatcher(["^xy"])  # window: 3 chars + 2 tokens
    ids = [ord(c) for c in "y" * 6 + "xyabc"]
    assert m.window_tokens == 5 and _chars(ids[-5:]).startswith("xy")
    assert m.first_match(ids, _chars) is None
    assert _first_stop("^xy", "y" * 6 + "xyabc") is None


def test_a_match_longer_than_the_window_of_an_unbounded_pattern_is_not_seen():
    # The documented limit: `b.*b` looks at 256 characters (+2 tokens) back, no further.
    assert _first_stop("b.*b", "b" + "c" * 300 + "b") is None
    assert _first_stop("b.{0,300}b", "b" + "c" * 300 + "b") == (302, "b.{0,300}b")  # bounded: exact


# --- unit: validation -------------------------------------------------------------------------


@pytest.mark.parametrize("pattern,reason", [
    (r"(a)\1", "invalid escape sequence"),  # backreference
    ("(?=a)b", "invalid perl operator"),  # lookahead
    ("(?<!a)b", "invalid perl operator"),  # lookbehind
    ("(", "missing )"),
    ("a{1001}", "invalid repetition size"),
])
def test_patterns_re2_cannot_run_are_refused_with_its_reason(pattern, reason):
    with pytest.raises(ValueError) as e:
        SamplingParams(stop_regex=pattern).check_types()
    assert str(e.value).startswith("Invalid stop_regex ") and reason in str(e.value) and "RE2" in str(e.value)


def test_length_and_count_caps(monkeypatch):
    with pytest.raises(ValueError, match="SGLANG_STOP_REGEX_MAX_LENGTH"):
        validate_stop_regexes(["a" * 1025])
    validate_stop_regexes(["a" * 1024])
    with pytest.raises(ValueError, match="SGLANG_STOP_REGEX_MAX_COUNT"):
        validate_stop_regexes(["a"] * 17)
    validate_stop_regexes(["a"] * 16)
    with pytest.raises(ValueError, match="SGLANG_STOP_REGEX_MAX_LENGTH"):
        validate_stop_regexes([DEEP])
    monkeypatch.setenv("SGLANG_STOP_REGEX_MAX_COUNT", "2")
    with pytest.raises(ValueError, match="at most 2 are allowed"):
        validate_stop_regexes(["a"] * 3)


def test_deep_nesting_allowed_by_a_raised_cap_never_raises_outside_validation(monkeypatch):
    # Python's parser (used for the longest match) recurses per group: past its limit the pattern
    # counts as unbounded instead of raising RecursionError (the old 500).
    monkeypatch.setenv("SGLANG_STOP_REGEX_MAX_LENGTH", "20000")
    sp = SamplingParams(stop_regex=DEEP)
    sp.check_types()
    sp.normalize(None)
    assert sp.stop_regex_max_len == stop_regex.REGEX_UNBOUNDED_LEN
    assert _first_stop(DEEP, "xxa") == (3, DEEP)


# --- server -----------------------------------------------------------------------------------


def _generate(url, pattern, max_new_tokens=64, **extra):
    body = {"text": "hi", "sampling_params": {"stop_regex": pattern, "logit_bias": {str(TOKEN_A): 100.0},
                                             "max_new_tokens": max_new_tokens, "temperature": 0, **extra}}
    return requests.post(url + "/generate", json=body, timeout=60)


@pytest.mark.server
def test_catastrophic_stop_regex_does_not_freeze_the_server(plain_server):
    url = plain_server["url"]
    with Bystander(url) as b:
        t0 = time.perf_counter()
        r = _generate(url, "(a+)+b", max_new_tokens=64)
        took = time.perf_counter() - t0
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["output_ids"] == [TOKEN_A] * 64 and out["text"] == "a" * 64
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 64}
    assert took < 30
    b.assert_responsive()
    assert_server_whole(url)


@pytest.mark.server
@pytest.mark.parametrize("pattern,tokens", [("a{10}", 10), ("(aa)+a{29}", 31)])
def test_a_match_spanning_several_tokens_stops_generation(plain_server, pattern, tokens):
    r = _generate(plain_server["url"], pattern)
    assert r.status_code == 200, r.text
    meta = r.json()["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": pattern}
    assert meta["completion_tokens"] == tokens


@pytest.mark.server
def test_stop_regex_on_chat_reports_stop(plain_server):
    url = plain_server["url"]
    r = requests.post(url + "/v1/chat/completions", timeout=60, json={
        "model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64, "temperature": 0,
        "logit_bias": {str(TOKEN_A): 100}, "stop_regex": "a{12}"})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["matched_stop"] == "a{12}"
    assert r.json()["usage"]["completion_tokens"] == 12


@pytest.mark.server
def test_bad_patterns_are_400s_and_the_server_stays_whole(plain_server):
    url = plain_server["url"]
    cases = [
        (r"(a)\1", "invalid escape sequence"),
        ("(?=a)b", "invalid perl operator"),
        ("a" * 5000, "SGLANG_STOP_REGEX_MAX_LENGTH"),
        (DEEP, "SGLANG_STOP_REGEX_MAX_LENGTH"),
        (["a"] * 100, "SGLANG_STOP_REGEX_MAX_COUNT"),
    ]
    with Bystander(url) as b:
        answers = [(_generate(url, p), want) for p, want in cases]
        chat = requests.post(url + "/v1/chat/completions", timeout=60, json={
            "model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "stop_regex": DEEP})
    for r, want in answers:
        assert r.status_code == 400, r.text[:300]
        assert want in error_message(r) and "stop_regex" in error_message(r)
        assert "Traceback" not in r.text and len(r.text) < 2000
    assert chat.status_code == 400 and "SGLANG_STOP_REGEX_MAX_LENGTH" in error_message(chat)
    b.assert_responsive()
    assert_server_whole(url)
