"""`/v1/tokenize` and `/v1/detokenize` (also without the `/v1` prefix): the server's own
tokenizer, so clients can count tokens exactly as the server does.

Both are plain functions the route runs on a worker thread (`run_cpu`); a batch is bounded by
SGLANG_MAX_TOKENIZE_BATCH and each prompt by SGLANG_MAX_PROMPT_CHARS before anything is encoded,
and token ids are checked against the vocabulary before anything is decoded."""

from __future__ import annotations

from sglang.srt.entrypoints.openai.protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from sglang.srt.entrypoints.openai.serving_base import ServingContext, create_error_response


def tokenize(ctx: ServingContext, request: TokenizeRequest, chat=None):
    """`chat`: the chat handler, whose template renders `messages` exactly as a chat request would."""
    tm = ctx.tokenizer_manager
    tok = tm.tokenizer
    if tok is None:
        return create_error_response("Tokenization needs the tokenizer; the server runs with --skip-tokenizer-init.")
    try:
        if request.messages is not None:
            ids = chat.prompt_ids(request)
            return TokenizeResponse(tokens=ids, count=len(ids), max_model_len=ctx.context_len)
        prompts = [request.prompt] if isinstance(request.prompt, str) else request.prompt
        tm.limits.check_tokenize_batch(len(prompts))
        for p in prompts:
            tm.limits.check_prompt_chars(len(p))
    except ValueError as e:
        return create_error_response(str(e))
    if isinstance(request.prompt, str):
        ids = tok.encode(request.prompt, add_special_tokens=request.add_special_tokens)
        return TokenizeResponse(tokens=ids, count=len(ids), max_model_len=ctx.context_len)
    batch = [tok.encode(p, add_special_tokens=request.add_special_tokens) for p in prompts]
    return TokenizeResponse(tokens=batch, count=[len(x) for x in batch], max_model_len=ctx.context_len)


def detokenize(ctx: ServingContext, request: DetokenizeRequest):
    tm = ctx.tokenizer_manager
    tok = tm.tokenizer
    if tok is None:
        return create_error_response("Detokenization needs the tokenizer; the server runs with --skip-tokenizer-init.")
    tokens = request.tokens
    nested = bool(tokens) and isinstance(tokens[0], list)
    batch = tokens if nested else [tokens]
    try:
        tm.limits.check_tokenize_batch(len(batch))
    except ValueError as e:
        return create_error_response(str(e))
    vocab = tm.vocab_size
    for ids in batch:
        for t in ids:
            if not 0 <= t < vocab:
                return create_error_response(f"Invalid token ids: {t} is outside the vocabulary [0, {vocab}).")
    try:
        texts = [tok.decode(ids, skip_special_tokens=request.skip_special_tokens) for ids in batch]
    except (OverflowError, TypeError, ValueError) as e:
        return create_error_response(f"Invalid token ids: {e}")
    return DetokenizeResponse(text=texts if nested else texts[0])
