"""`/v1/tokenize` and `/v1/detokenize` (also without the `/v1` prefix): the server's own
tokenizer, so clients can count tokens exactly as the server does."""

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
    tok = ctx.tokenizer_manager.tokenizer
    if tok is None:
        return create_error_response("Tokenization needs the tokenizer; the server runs with --skip-tokenizer-init.")
    if request.messages is not None:
        try:
            ids = chat.prompt_ids(request)
        except ValueError as e:
            return create_error_response(str(e))
        return TokenizeResponse(tokens=ids, count=len(ids), max_model_len=ctx.context_len)
    if isinstance(request.prompt, str):
        ids = tok.encode(request.prompt, add_special_tokens=request.add_special_tokens)
        return TokenizeResponse(tokens=ids, count=len(ids), max_model_len=ctx.context_len)
    batch = [tok.encode(p, add_special_tokens=request.add_special_tokens) for p in request.prompt]
    return TokenizeResponse(tokens=batch, count=[len(x) for x in batch], max_model_len=ctx.context_len)


def detokenize(ctx: ServingContext, request: DetokenizeRequest):
    tok = ctx.tokenizer_manager.tokenizer
    if tok is None:
        return create_error_response("Detokenization needs the tokenizer; the server runs with --skip-tokenizer-init.")
    tokens = request.tokens
    if tokens and isinstance(tokens[0], list):
        return DetokenizeResponse(text=[tok.decode(t, skip_special_tokens=request.skip_special_tokens) for t in tokens])
    try:
        return DetokenizeResponse(text=tok.decode(tokens, skip_special_tokens=request.skip_special_tokens))
    except (OverflowError, TypeError, ValueError) as e:
        return create_error_response(f"Invalid token ids: {e}")
