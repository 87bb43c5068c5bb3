"""The OpenAI request models and mapping helpers, without a server: unknown/router fields are
accepted, sampling fields map onto real `SamplingParams`, aborts map to the right status."""

from __future__ import annotations

import json

import pytest

from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from sglang.srt.entrypoints.openai.serving_base import (
    abort_error,
    build_sampling_params,
    completion_logprobs,
    load_model_sampling_defaults,
    usage_from_outputs,
    structured_output_params,
)
from sglang.srt.sampling.sampling_params import SamplingParams

MSGS = [{"role": "user", "content": "Hi"}]


def test_router_and_unknown_fields_are_accepted():
    req = ChatCompletionRequest.model_validate({
        "messages": MSGS, "model": None, "max_completion_tokens": 7, "logprobs": False, "no_stop_trim": True,
        "ignore_eos": True, "continue_final_message": False, "skip_special_tokens": False, "separate_reasoning": True,
        "stream_reasoning": True, "return_hidden_states": False, "bootstrap_host": "10.0.0.1", "bootstrap_port": 8998,
        "bootstrap_room": 2**62, "brand_new_field": [1, 2]})
    assert req.max_completion_tokens == 7 and req.ignore_eos and req.bootstrap_room == 2**62
    comp = CompletionRequest.model_validate({"prompt": "x", "echo": False, "bootstrap_room": None, "whatever": 1})
    assert comp.max_tokens == 16  # OpenAI's default for completions


def test_sampling_mapping_builds_real_sampling_params():
    req = ChatCompletionRequest.model_validate({
        "messages": MSGS, "temperature": 0.5, "top_p": 0.9, "seed": 42, "stop": "END", "frequency_penalty": 0.3,
        "presence_penalty": -0.2, "top_k": 7, "min_p": 0.05, "repetition_penalty": 1.2, "min_tokens": 2,
        "ignore_eos": True, "no_stop_trim": True, "skip_special_tokens": False, "n": 3})
    params = build_sampling_params(req, 11, {})
    assert params["sampling_seed"] == 42 and params["max_new_tokens"] == 11 and params["min_new_tokens"] == 2
    sp = SamplingParams(**params)  # every key is a real SamplingParams field
    assert (sp.temperature, sp.top_p, sp.top_k, sp.min_p) == (0.5, 0.9, 7, 0.05)
    assert sp.stop_strs == "END" and sp.n == 3 and sp.ignore_eos and sp.no_stop_trim


def test_model_defaults_fill_unset_fields(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_p": 0.95, "top_k": 20}))
    defaults = load_model_sampling_defaults(str(tmp_path))
    assert defaults == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    unset = build_sampling_params(ChatCompletionRequest(messages=MSGS), None, defaults)
    assert (unset["temperature"], unset["top_p"], unset["top_k"]) == (0.6, 0.95, 20)
    assert "max_new_tokens" not in unset
    explicit = build_sampling_params(ChatCompletionRequest(messages=MSGS, temperature=0, top_k=3), None, defaults)
    assert (explicit["temperature"], explicit["top_k"]) == (0, 3)
    assert load_model_sampling_defaults(str(tmp_path / "missing")) == {}


def _out(reason, prompt=3, completion=2, cached=1):
    return {"text": "", "meta_info": {"finish_reason": reason, "prompt_tokens": prompt, "completion_tokens": completion,
                                      "cached_tokens": cached}}


@pytest.mark.parametrize("status,expected", [(400, 400), (500, 500), (503, 503), (499, None), (None, None)])
def test_abort_status_mapping(status, expected):
    err = abort_error([_out({"type": "length", "length": 2}),
                       _out({"type": "abort", "message": "why", "status_code": status})])
    assert (err.status_code if err else None) == expected
    if err:
        assert err.message == "why"


def test_usage_counts_each_prompt_once_per_n():
    outs = [_out(None, prompt=5, completion=c, cached=2) for c in (1, 2, 3, 4)]
    u = usage_from_outputs(outs, n=2, report_cached=True)
    assert (u.prompt_tokens, u.completion_tokens, u.total_tokens) == (10, 10, 20)
    assert u.prompt_tokens_details == {"cached_tokens": 4}
    # Without --enable-cache-report upstream leaves prompt_tokens_details out.
    assert usage_from_outputs(outs, n=2).prompt_tokens_details is None


def test_structured_output_mapping():
    """response_format -> sampling_params as upstream: json_schema's schema, json_object -> any object."""
    assert structured_output_params(ChatCompletionRequest(messages=MSGS, response_format={"type": "text"})) == {}
    assert structured_output_params(ChatCompletionRequest(messages=MSGS, response_format={"type": "json_object"})) == {
        "json_schema": '{"type": "object"}'}
    got = structured_output_params(ChatCompletionRequest(messages=MSGS, response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}, "strict": True}}))
    assert got == {"json_schema": '{"type": "integer"}'}
    assert structured_output_params(CompletionRequest(prompt="x", regex="a+")) == {"regex": "a+"}
    tag = structured_output_params(ChatCompletionRequest(messages=MSGS, response_format={
        "type": "structural_tag", "structures": [{"begin": "<f>", "schema": {}, "end": "</f>"}], "triggers": ["<f>"]}))
    assert json.loads(tag["structural_tag"])["triggers"] == ["<f>"]
    for bad, words in [({"type": "json_schema", "json_schema": {"name": "x"}}, "json_schema.schema"),
                       ({"type": "yaml"}, "response_format type must be")]:
        with pytest.raises(ValueError, match=words):
            structured_output_params(ChatCompletionRequest(messages=MSGS, response_format=bad))
    with pytest.raises(ValueError, match="Only one of"):
        structured_output_params(ChatCompletionRequest(messages=MSGS, regex="a", response_format={"type": "json_object"}))


def test_completion_logprobs_shape():
    lp = completion_logprobs([[None, 1, "<s>"], [-0.5, 7, "a"]], [[-0.1, 9, "b"]], [None, None],
                             [[[-0.1, 9, "b"], [-2.5, 4, "c"]]])
    assert lp.tokens == ["<s>", "a", "b"] and lp.token_logprobs == [None, -0.5, -0.1]
    assert lp.top_logprobs == [None, None, {"b": -0.1, "c": -2.5}]
    assert lp.text_offset == [-1, -1, -1]
