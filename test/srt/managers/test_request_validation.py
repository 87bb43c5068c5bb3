"""The tokenizer-side checks of a request (`RequestValidator`, before anything reaches the
scheduler): context-length limits with and without --allow-auto-truncate, with upstream's texts."""

import pytest

from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.request_validation import RequestValidator
from sglang.srt.server_args import ServerArgs

CONTEXT = 64


def validator(**server_args) -> RequestValidator:
    return RequestValidator(ServerArgs(model_path="unused", **server_args), tokenizer=None,
                            context_len=CONTEXT, vocab_size=1000)


def request(n: int, max_new_tokens: int) -> GenerateReqInput:
    return GenerateReqInput(input_ids=list(range(1, n + 1)), sampling_params={"max_new_tokens": max_new_tokens})


def test_a_prompt_past_the_context_is_refused_or_truncated():
    with pytest.raises(ValueError, match=r"The input \(70 tokens\) is longer than the model's context length \(64 tokens\)"):
        validator().validate_and_tokenize(request(70, 4))
    out = validator(allow_auto_truncate=True).validate_and_tokenize(request(70, 4))
    assert out.input_ids == list(range(1, CONTEXT))  # the head, one slot left for a new token
    assert out.sampling_params.max_new_tokens == 1


def test_max_new_tokens_past_the_context_is_refused_or_cut():
    with pytest.raises(ValueError, match="Requested token count exceeds the model's maximum context length of 64 "
                                         "tokens. You requested a total of 70 tokens: 20 tokens from the input"):
        validator().validate_and_tokenize(request(20, 50))
    out = validator(allow_auto_truncate=True).validate_and_tokenize(request(20, 50))
    assert out.input_ids == list(range(1, 21)) and out.sampling_params.max_new_tokens == CONTEXT - 20
    assert validator().validate_and_tokenize(request(20, 43)).sampling_params.max_new_tokens == 43
