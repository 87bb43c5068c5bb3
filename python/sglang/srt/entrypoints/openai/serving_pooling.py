"""The routes that score or embed instead of generating, as upstream SGLang shapes them:

- `POST /v1/embeddings` (OpenAI's; `--is-embedding`): one pooled vector per input, `dimensions`
  (matryoshka models only, upstream's checks) and `encoding_format` "float" or "base64" (little-
  endian float32, as OpenAI; upstream always answers floats);
- `POST /encode` (native): `{"text" | "input_ids"}` -> `{"embedding", "meta_info"}` (a list for
  a batch);
- `POST /v1/rerank` (`--is-embedding` with a `*ForSequenceClassification` model): each
  (query, document) pair is tokenized as a text pair and scored by the model's class logit;
  the answer is a bare list sorted by score, best first (`top_n`, `return_documents`);
- `POST /v1/score`: label-token probabilities after `query + item` (`managers/scoring.py`).

Errors are upstream's 400 ErrorResponse; on the wrong kind of server (a generation server asked
for embeddings, or the reverse) the message says which flag to use.
"""

from __future__ import annotations

import base64
import heapq
import math
import struct
from typing import Any, List, Optional

from fastapi import Request
from fastapi.responses import Response

from sglang.srt.entrypoints.openai.protocol import UsageInfo
from sglang.srt.entrypoints.openai.protocol_pooling import (
    EmbeddingObject,
    EmbeddingRequest,
    EmbeddingResponse,
    RerankResponse,
    ScoringRequest,
    ScoringResponse,
    V1RerankReqInput,
)
from sglang.srt.entrypoints.openai.serving_base import ServingContext, create_error_response, error_from_exception
from sglang.srt.managers.io_struct import NOT_EMBEDDING_MODEL, EmbeddingReqInput
from sglang.srt.managers.scoring import run_to_completion, score_request



async def _run(ctx: ServingContext, coro_fn):
    """Runs a handler body with upstream's error mapping: ValueError -> 400, dead engine -> 503,
    anything else -> 500 with the reason."""
    dead = ctx.dead_reason()
    if dead:
        return create_error_response(dead, err_type="ServiceUnavailable", status_code=503)
    try:
        return await coro_fn()
    except Exception as e:  # noqa: BLE001 - mapped to a status, never a crashed route
        return error_from_exception(e)


def _json_response(model) -> Response:
    return Response(content=model.model_dump_json(), media_type="application/json")


# ----------------------------------------------------------------------------- embeddings


def validate_embedding_input(value: Any) -> Optional[str]:
    """Upstream's checks of `input` (the message of the first failure, or None)."""
    if value is None or (isinstance(value, (str, list)) and len(value) == 0):
        return "Input cannot be empty"
    if isinstance(value, str):
        return "Input cannot be empty or whitespace only" if not value.strip() else None
    if all(isinstance(v, str) for v in value):
        for i, v in enumerate(value):
            if not v.strip():
                return f"Input at index {i} cannot be empty or whitespace only"
        return None
    if isinstance(value[0], int):
        if not all(isinstance(v, int) for v in value):
            return "All items in input list must be integers"
        for i, v in enumerate(value):
            if v < 0:
                return f"Token ID at index {i} must be non-negative"
        return None
    if isinstance(value[0], list):
        for i, ids in enumerate(value):
            if not isinstance(ids, list):
                return f"Input at index {i} must be a list"
            if not ids:
                return f"Input at index {i} cannot be empty"
            if not all(isinstance(t, int) for t in ids):
                return f"Input at index {i} must contain only integers"
            if any(t < 0 for t in ids):
                return f"Input at index {i} contains negative token IDs"
        return None
    return "All items in input list must be strings"


def check_dimensions(dimensions: Optional[int], info: dict) -> None:
    """Upstream's matryoshka checks (ValueError -> 400)."""
    if dimensions is None:
        return
    model_path = info.get("model_path")
    if not info.get("is_matryoshka"):
        raise ValueError(f"Model '{model_path}' does not support matryoshka representation, changing output "
                         f"dimensions will lead to poor results.")
    if dimensions < 1:
        raise ValueError("Requested dimensions must be greater than 0")
    allowed = info.get("matryoshka_dimensions")
    if allowed and dimensions not in allowed:
        raise ValueError(f"Model '{model_path}' only supports {allowed} matryoshka dimensions, using other output "
                         f"dimensions will lead to poor results.")
    if dimensions > info["embedding_dim"]:
        raise ValueError(f"Provided dimensions are greater than max embedding dimension: {info['embedding_dim']}")


def shape_embedding(vec: List[float], dimensions: Optional[int], normalize: bool, encoding_format: str):
    """Truncates to `dimensions` (renormalised when the model normalises: the same as pooling,
    truncating, then normalising) and encodes as floats or base64 float32."""
    if dimensions is not None and dimensions < len(vec):
        vec = vec[:dimensions]
        if normalize:
            norm = math.sqrt(sum(x * x for x in vec)) or 1.0
            vec = [x / norm for x in vec]
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode("ascii")
    return vec


async def create_embedding(ctx: ServingContext, request: EmbeddingRequest, raw_request):
    error = validate_embedding_input(request.input)
    if error:
        return create_error_response(error)
    if request.encoding_format not in ("float", "base64"):
        return create_error_response(f"encoding_format must be 'float' or 'base64', got {request.encoding_format!r}.")

    async def body():
        info = ctx.scheduler_info
        if not ctx.server_args.is_embedding:
            raise ValueError(NOT_EMBEDDING_MODEL)  # before any embedding-specific check
        check_dimensions(request.dimensions, info)
        value = request.input
        if isinstance(value, str) or all(isinstance(v, str) for v in value):
            obj = EmbeddingReqInput(text=value, rid=request.rid, priority=request.priority)
        else:
            obj = EmbeddingReqInput(input_ids=value, rid=request.rid, priority=request.priority)
        outputs = await run_to_completion(ctx.tokenizer_manager, obj, raw_request)
        normalize = bool(info.get("embedding_normalize", True))
        data = [EmbeddingObject(embedding=shape_embedding(o["embedding"], request.dimensions, normalize,
                                                          request.encoding_format), index=i)
                for i, o in enumerate(outputs)]
        prompt_tokens = sum(o["meta_info"]["prompt_tokens"] for o in outputs)
        usage = UsageInfo(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens)
        return _json_response(EmbeddingResponse(data=data, model=ctx.server_args.model_path, usage=usage))

    return await _run(ctx, body)


# ----------------------------------------------------------------------------- rerank


def validate_rerank(request: V1RerankReqInput) -> Optional[str]:
    if not request.query:
        return "Query cannot be empty"
    if not request.query.strip():
        return "Query cannot be empty or whitespace only"
    if not request.documents:
        return "Documents cannot be empty"
    for doc in request.documents:
        if not doc:
            return "Each document must be a non-empty string"
        if not doc.strip():
            return "Each document cannot be empty or whitespace only"
    return None


def rank(scores: List[float], documents: List[str], top_n: Optional[int], return_documents: bool,
         metas: Optional[List[dict]] = None) -> List[RerankResponse]:
    """Best first; `top_n` keeps that many (all when it exceeds the count)."""
    items = [RerankResponse(score=s, document=documents[i] if return_documents else None, index=i,
                            meta_info=metas[i] if metas else None) for i, s in enumerate(scores)]
    if top_n is not None:
        return heapq.nlargest(top_n, items, key=lambda r: r.score)
    return sorted(items, key=lambda r: r.score, reverse=True)


async def rerank(ctx: ServingContext, request: V1RerankReqInput, raw_request):
    error = validate_rerank(request)
    if error:
        return create_error_response(error)

    async def body():
        tm = ctx.tokenizer_manager
        if ctx.server_args.is_embedding and not ctx.scheduler_info.get("is_classifier"):
            raise ValueError("/v1/rerank needs a cross-encoder: a *ForSequenceClassification model served with "
                             "--is-embedding (this embedding model has no classification head).")
        if tm.tokenizer is None:
            raise ValueError("/v1/rerank tokenizes (query, document) pairs: the server needs its tokenizer "
                             "(no --skip-tokenizer-init).")
        pairs = [tm.tokenizer(request.query, doc)["input_ids"] for doc in request.documents]
        outputs = await run_to_completion(ctx.tokenizer_manager, EmbeddingReqInput(input_ids=pairs), raw_request)
        scores = []
        for i, out in enumerate(outputs):
            vec = out.get("embedding") or []
            if not vec or not isinstance(vec[0], (int, float)):
                raise ValueError(f"Invalid embedding score for rerank at index {i}: {vec!r}")
            scores.append(float(vec[0]))
        ranked = rank(scores, request.documents, request.top_n, request.return_documents,
                      [o["meta_info"] for o in outputs])
        content = [r.model_dump(exclude_none=True) if r.document is None else r.model_dump() for r in ranked]
        import orjson

        return Response(content=orjson.dumps(content), media_type="application/json")

    return await _run(ctx, body)


# ----------------------------------------------------------------------------- score


async def score(ctx: ServingContext, request: ScoringRequest, raw_request):
    async def body():
        result = await score_request(ctx.tokenizer_manager, request.query, request.items, request.label_token_ids,
                                     request.apply_softmax, request.item_first, raw_request)
        usage = UsageInfo(prompt_tokens=result.prompt_tokens, total_tokens=result.prompt_tokens)
        return _json_response(ScoringResponse(scores=result.scores, model=request.model, usage=usage))

    return await _run(ctx, body)


# ----------------------------------------------------------------------------- native /encode


async def encode(ctx: ServingContext, obj: EmbeddingReqInput, raw_request):
    """`/encode`: the engine's outputs as they are (a dict, or a list for a batch)."""
    import orjson

    async def body():
        outputs = await run_to_completion(ctx.tokenizer_manager, obj, raw_request)
        single = obj.is_single
        return Response(content=orjson.dumps(outputs[0] if single else outputs), media_type="application/json")

    return await _run(ctx, body)


def add_pooling_routes(app, ctx: ServingContext, parse_body) -> None:
    """Registers the four routes on `app`; `parse_body(request, model)` parses a JSON body."""
    from pydantic import TypeAdapter

    encode_adapter = TypeAdapter(EmbeddingReqInput)

    @app.post("/v1/embeddings")
    async def openai_v1_embeddings(raw_request: Request):
        return await create_embedding(ctx, await parse_body(raw_request, EmbeddingRequest), raw_request)

    @app.api_route("/v1/rerank", methods=["POST", "PUT"])
    async def v1_rerank(raw_request: Request):
        return await rerank(ctx, await parse_body(raw_request, V1RerankReqInput), raw_request)

    @app.post("/v1/score")
    async def v1_score(raw_request: Request):
        return await score(ctx, await parse_body(raw_request, ScoringRequest), raw_request)

    @app.api_route("/encode", methods=["POST", "PUT"])
    async def encode_request(raw_request: Request):
        return await encode(ctx, await parse_body(raw_request, encode_adapter), raw_request)
