"""SamplingParams: upstream defaults, greedy/top-k normalization, exact verify() messages."""

import inspect
import math

import pytest

from sglang.srt.sampling.sampling_params import (
    TOP_K_ALL,
    SamplingParams,
    get_max_seq_length,
)

VOCAB = 100


def test_defaults_are_upstreams():
    sig = inspect.signature(SamplingParams.__init__)
    defaults = {k: p.default for k, p in sig.parameters.items() if k != "self"}
    expected = dict(
        max_new_tokens=128, stop=None, stop_token_ids=None, stop_regex=None, temperature=1.0,
        top_p=1.0, top_k=-1, min_p=0.0, frequency_penalty=0.0, presence_penalty=0.0,
        repetition_penalty=1.0, min_new_tokens=0, n=1, json_schema=None, regex=None, ebnf=None,
        structural_tag=None, ignore_eos=False, skip_special_tokens=True,
        spaces_between_special_tokens=True, no_stop_trim=False, custom_params=None,
        stream_interval=None, logit_bias=None, sampling_seed=None,
    )
    assert defaults == expected
    sp = SamplingParams()
    sp.verify(VOCAB)
    assert sp.top_k == TOP_K_ALL and sp.temperature == 1.0 and sp.stop_token_ids is None


def test_unknown_key_is_rejected_like_upstream():
    with pytest.raises(TypeError) as e:
        SamplingParams.from_dict({"temperature": 0.5, "not_a_param": 1})
    assert str(e.value) == "SamplingParams.__init__() got an unexpected keyword argument 'not_a_param'"
    assert SamplingParams.from_dict({"top_p": 0.5}).top_p == 0.5
    assert SamplingParams.from_dict(None).max_new_tokens == 128


@pytest.mark.parametrize("temperature", [0.0, 0, 1e-7])
def test_zero_temperature_means_greedy(temperature):
    sp = SamplingParams(temperature=temperature, top_k=50)
    assert sp.top_k == 1 and sp.temperature == 1.0 and sp.is_greedy
    sp.verify(VOCAB)


def test_positive_temperature_is_kept():
    sp = SamplingParams(temperature=0.5, top_k=5)
    assert sp.temperature == 0.5 and sp.top_k == 5 and not sp.is_greedy


def test_stop_token_ids_become_a_set():
    assert SamplingParams(stop_token_ids=[3, 3, 4]).stop_token_ids == {3, 4}
    assert SamplingParams(stop_token_ids=[]).stop_token_ids is None


BAD = [
    (dict(temperature=-0.1), "temperature must be a non-negative finite number, got -0.1."),
    (dict(temperature=float("inf")), "temperature must be a non-negative finite number, got inf."),
    (dict(temperature=float("nan")), "temperature must be a non-negative finite number, got nan."),
    (dict(top_p=0.0), "top_p must be in (0, 1], got 0.0."),
    (dict(top_p=1.5), "top_p must be in (0, 1], got 1.5."),
    (dict(min_p=-0.5), "min_p must be in [0, 1], got -0.5."),
    (dict(min_p=1.01), "min_p must be in [0, 1], got 1.01."),
    (dict(top_k=0), "top_k must be -1 (disable) or at least 1, got 0."),
    (dict(top_k=-2), "top_k must be -1 (disable) or at least 1, got -2."),
    (dict(frequency_penalty=2.5), "frequency_penalty must be in [-2, 2], got 2.5."),
    (dict(frequency_penalty=-3), "frequency_penalty must be in [-2, 2], got -3."),
    (dict(presence_penalty=-2.1), "presence_penalty must be in [-2, 2], got -2.1."),
    (dict(repetition_penalty=-0.1), "repetition_penalty must be in [0, 2], got -0.1."),
    (dict(repetition_penalty=2.1), "repetition_penalty must be in [0, 2], got 2.1."),
    (dict(min_new_tokens=-1), "min_new_tokens must be in [0, max_new_tokens], got -1."),
    (dict(max_new_tokens=-1), "max_new_tokens must be at least 0, got -1."),
    (dict(max_new_tokens=4, min_new_tokens=5),
     "min_new_tokens must be in [0, max_new_tokens(4)], got 5."),
    (dict(logit_bias={"100": 1.0}), "logit_bias must has keys in [0, 99], got 100."),
    (dict(logit_bias={"-1": 1.0}), "logit_bias must has keys in [0, 99], got -1."),
    (dict(regex="a+", json_schema="{}"), "Only one of regex, json_schema, or ebnf can be set."),
    (dict(regex="a+", ebnf="root ::= 'a'"), "Only one of regex, json_schema, or ebnf can be set."),
]


@pytest.mark.parametrize("kwargs,message", BAD)
def test_verify_messages(kwargs, message):
    sp = SamplingParams(**kwargs)
    with pytest.raises(ValueError) as e:
        sp.verify(VOCAB)
    assert str(e.value) == message


GOOD = [
    dict(temperature=2.0, top_p=0.01, top_k=1, min_p=1.0),
    dict(frequency_penalty=-2, presence_penalty=2, repetition_penalty=0.0),
    dict(repetition_penalty=2.0, min_new_tokens=5, max_new_tokens=5),
    dict(max_new_tokens=0),
    dict(max_new_tokens=None, min_new_tokens=10),
    dict(logit_bias={"0": -100.0, "99": 5.0}),
    dict(regex="a+", structural_tag="{}"),
]


@pytest.mark.parametrize("kwargs", GOOD)
def test_verify_accepts_boundaries(kwargs):
    SamplingParams(**kwargs).verify(VOCAB)


def test_normalize_without_tokenizer_counts_characters():
    sp = SamplingParams(stop="abc")
    sp.normalize(None)
    assert sp.stop_strs == ["abc"] and sp.stop_str_max_len == 3
    sp = SamplingParams()
    sp.normalize(None)
    assert sp.stop_strs == [] and sp.stop_str_max_len == 0
    assert sp.stop_regex_strs == [] and sp.stop_regex_max_len == 0


def test_normalize_with_tokenizer_counts_tokens():
    from transformers import AutoTokenizer

    from sglang.test.tiny_models import tiny_tokenizer_dir

    tok = AutoTokenizer.from_pretrained(tiny_tokenizer_dir())
    stops = [" Paris", "\n\nThe end of the story"]
    sp = SamplingParams(stop=stops)
    sp.normalize(tok)
    assert sp.stop_strs == stops
    want = max(len(tok.encode(s, add_special_tokens=False)) for s in stops)
    assert sp.stop_str_max_len == want and want < len(stops[1])


def test_normalize_stop_regex():
    sp = SamplingParams(stop_regex=r"ab|c\d{3}")
    sp.normalize(None)
    assert sp.stop_regex_strs == [r"ab|c\d{3}"] and sp.stop_regex_max_len == 4
    sp = SamplingParams(stop_regex=["x", "y+"])
    sp.normalize(None)
    assert sp.stop_regex_max_len == 1 << 30


@pytest.mark.parametrize(
    "pattern,expected",
    [("abc", 3), ("a|bcd", 3), ("(ab){2}", 4), (r"\d{1,5}x?", 6), ("^a$", 1), ("[a-z]", 1),
     ("a*", 1 << 30), ("(?=ab)c", 1)],
)
def test_regex_max_length(pattern, expected):
    assert get_max_seq_length(pattern) == expected


def test_to_dict_roundtrip_is_serializable():
    sp = SamplingParams(stop_token_ids=[5, 2], sampling_seed=7)
    d = sp.to_dict()
    assert d["stop_token_ids"] == [2, 5] and d["sampling_seed"] == 7
    assert math.isclose(d["temperature"], 1.0)
