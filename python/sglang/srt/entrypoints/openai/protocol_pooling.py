"""Pydantic models of the routes that score or embed instead of generating (`/v1/score`,
`/v1/rerank`, `/v1/embeddings`), with upstream SGLang's field names, defaults and shapes."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Union

from pydantic import BaseModel, field_validator

from sglang.srt.entrypoints.openai.protocol import UsageInfo, _Lenient

DEFAULT_MODEL_NAME = "default"


class ScoringRequest(_Lenient):
    query: Optional[Union[str, List[int]]] = None  # text or token ids
    items: Optional[Union[str, List[str], List[List[int]]]] = None
    label_token_ids: Optional[List[int]] = None  # the tokens whose probabilities are the scores
    apply_softmax: bool = False
    item_first: bool = False
    model: str = DEFAULT_MODEL_NAME


class ScoringResponse(BaseModel):
    scores: List[List[float]]  # per item, in the order of label_token_ids
    model: str
    usage: Optional[UsageInfo] = None
    object: str = "scoring"


class V1RerankReqInput(_Lenient):
    query: str
    documents: List[str]
    instruct: Optional[str] = None
    top_n: Optional[int] = None
    return_documents: bool = True

    @field_validator("top_n")
    @classmethod
    def _top_n_positive(cls, v):
        if v is not None and v < 1:
            raise ValueError("parameter top_n should be larger than 0.")
        return v


class RerankResponse(BaseModel):
    score: float
    document: Optional[str] = None
    index: int
    meta_info: Optional[Dict[str, Any]] = None


EmbeddingInput = Union[List[int], List[List[int]], str, List[str]]


class EmbeddingRequest(_Lenient):
    input: EmbeddingInput
    model: str = DEFAULT_MODEL_NAME
    encoding_format: str = "float"
    dimensions: Optional[int] = None
    user: Optional[str] = None
    rid: Optional[Union[List[str], str]] = None
    priority: Optional[int] = None


class EmbeddingObject(BaseModel):
    embedding: Union[List[float], str]  # a base64 string with encoding_format "base64"
    index: int
    object: str = "embedding"


class EmbeddingResponse(BaseModel):
    data: List[EmbeddingObject]
    model: str
    object: str = "list"
    usage: Optional[UsageInfo] = None
