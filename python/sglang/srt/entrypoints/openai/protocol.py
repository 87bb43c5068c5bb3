"""Pydantic models of the OpenAI-compatible API (`/v1/completions`, `/v1/chat/completions`,
`/v1/models`), with upstream SGLang's field names, defaults and response shapes.

Why every request model ignores unknown fields: the SGLang router (and other OpenAI clients)
add fields of their own (`bootstrap_*`, `return_hidden_states`, `separate_reasoning`, ...).
Upstream's models are plain pydantic models, which ignore what they do not declare; a model
that rejected unknown fields would break the router. Fields this server cannot honour yet
(structured output) are declared so that the serving layer can reject them with a clear 400
instead of silently ignoring them.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Lenient(BaseModel):
    """Base of request models: unknown fields are accepted and ignored (as upstream)."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())


# ----------------------------------------------------------------------------- shared pieces


class ErrorResponse(BaseModel):
    object: str = "error"
    message: str
    type: str
    param: Optional[str] = None
    code: int


class StreamOptions(_Lenient):
    include_usage: Optional[bool] = False
    continuous_usage_stats: Optional[bool] = False


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: Optional[int] = 0
    prompt_tokens_details: Optional[Dict[str, int]] = None
    reasoning_tokens: Optional[int] = 0


class ResponseFormat(BaseModel):
    """`text`, `json_object`, `json_schema` ({name, schema, strict}) or `structural_tag`
    (its `structures` / `triggers` are kept as extra fields)."""

    model_config = ConfigDict(extra="allow", protected_namespaces=())
    type: str = "text"
    json_schema: Optional[Dict[str, Any]] = None


class ModelCard(BaseModel):
    id: str
    object: str = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "sglang"
    root: Optional[str] = None
    parent: Optional[str] = None
    max_model_len: Optional[int] = None


class ModelList(BaseModel):
    object: str = "list"
    data: List[ModelCard] = Field(default_factory=list)


class _SamplingExtensions(_Lenient):
    """SGLang's sampling extensions shared by completions and chat requests."""

    top_k: int = -1
    min_p: float = 0.0
    min_tokens: int = 0
    repetition_penalty: float = 1.0
    stop_token_ids: Optional[List[int]] = None
    stop_regex: Optional[Union[str, List[str]]] = None
    no_stop_trim: bool = False
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    custom_params: Optional[Dict[str, Any]] = None
    # A CustomLogitProcessor.to_str() (--enable-custom-logit-processor; the admin key, as on /generate).
    custom_logit_processor: Optional[str] = None
    logit_bias: Optional[Dict[str, float]] = None
    # Structured output (SGLang extensions beside response_format).
    regex: Optional[str] = None
    json_schema: Optional[str] = None
    ebnf: Optional[str] = None
    structural_tag: Optional[str] = None
    response_format: Optional[ResponseFormat] = None
    # Request routing / bookkeeping.
    rid: Optional[Union[List[str], str]] = None
    priority: Optional[int] = None
    extra_key: Optional[Union[List[str], str]] = None
    cache_salt: Optional[Union[List[str], str]] = None
    # PD disaggregation fields the router adds.
    bootstrap_host: Optional[Union[List[str], str]] = None
    bootstrap_port: Optional[Union[List[Optional[int]], int]] = None
    bootstrap_room: Optional[Union[List[int], int]] = None
    bootstrap_pair_key: Optional[str] = None
    return_hidden_states: bool = False
    user: Optional[str] = None


# ----------------------------------------------------------------------------- completions


class CompletionRequest(_SamplingExtensions):
    model: Optional[str] = None
    prompt: Union[List[int], List[List[int]], str, List[str]]
    best_of: Optional[int] = None
    echo: bool = False
    frequency_penalty: float = 0.0
    logprobs: Optional[int] = None
    max_tokens: int = 16
    n: int = 1
    presence_penalty: float = 0.0
    seed: Optional[int] = None
    stop: Optional[Union[str, List[str]]] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    suffix: Optional[str] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None


class LogProbs(BaseModel):
    text_offset: List[int] = Field(default_factory=list)
    token_logprobs: List[Optional[float]] = Field(default_factory=list)
    tokens: List[str] = Field(default_factory=list)
    top_logprobs: List[Optional[Dict[str, float]]] = Field(default_factory=list)


class CompletionResponseChoice(BaseModel):
    index: int
    text: str
    logprobs: Optional[LogProbs] = None
    finish_reason: Optional[Literal["stop", "length", "content_filter", "abort"]] = None
    matched_stop: Union[None, int, str] = None
    hidden_states: Optional[object] = None


class CompletionResponse(BaseModel):
    id: str
    object: str = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: List[CompletionResponseChoice]
    usage: UsageInfo
    metadata: Optional[Dict[str, Any]] = None


class CompletionResponseStreamChoice(BaseModel):
    index: int
    text: str
    logprobs: Optional[LogProbs] = None
    finish_reason: Optional[Literal["stop", "length", "content_filter", "abort"]] = None
    matched_stop: Union[None, int, str] = None


class CompletionStreamResponse(BaseModel):
    id: str
    object: str = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: List[CompletionResponseStreamChoice]
    usage: Optional[UsageInfo] = None


# ----------------------------------------------------------------------------- chat


class ChatCompletionMessageContentPart(_Lenient):
    type: str
    text: Optional[str] = None


class ChatCompletionMessage(_Lenient):
    role: str
    content: Optional[Union[str, List[ChatCompletionMessageContentPart]]] = None
    name: Optional[str] = None
    tool_calls: Optional[List[Dict[str, Any]]] = None
    tool_call_id: Optional[str] = None
    reasoning_content: Optional[str] = None


class ChatCompletionRequest(_SamplingExtensions):
    messages: List[ChatCompletionMessage]
    model: Optional[str] = None
    frequency_penalty: float = 0.0
    logprobs: bool = False
    top_logprobs: Optional[int] = None
    max_tokens: Optional[int] = None
    max_completion_tokens: Optional[int] = None
    n: int = 1
    presence_penalty: float = 0.0
    seed: Optional[int] = None
    stop: Optional[Union[str, List[str]]] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    tools: Optional[List[Dict[str, Any]]] = None
    tool_choice: Optional[Union[str, Dict[str, Any]]] = None
    parallel_tool_calls: bool = True
    # SGLang extensions (the router forwards these; the last three are accepted and unused).
    continue_final_message: bool = False
    chat_template_kwargs: Optional[Dict[str, Any]] = None
    separate_reasoning: bool = True
    stream_reasoning: bool = True

    @field_validator("messages")
    @classmethod
    def _messages_not_empty(cls, v):
        if not v:
            raise ValueError("Messages cannot be empty")
        return v


class ChatMessage(BaseModel):
    role: Optional[str] = None
    content: Optional[str] = None
    reasoning_content: Optional[str] = None
    tool_calls: Optional[List[Dict[str, Any]]] = None


class TopLogprob(BaseModel):
    token: str
    bytes: List[int]
    logprob: float


class ChatCompletionTokenLogprob(BaseModel):
    token: str
    bytes: List[int]
    logprob: float
    top_logprobs: List[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: List[ChatCompletionTokenLogprob]


class ChatCompletionResponseChoice(BaseModel):
    index: int
    message: ChatMessage
    logprobs: Optional[ChoiceLogprobs] = None
    finish_reason: Optional[Literal["stop", "length", "tool_calls", "content_filter", "function_call", "abort"]] = None
    matched_stop: Union[None, int, str] = None
    hidden_states: Optional[object] = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: str = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: List[ChatCompletionResponseChoice]
    usage: UsageInfo
    metadata: Optional[Dict[str, Any]] = None


class DeltaMessage(BaseModel):
    role: Optional[str] = None
    content: Optional[str] = None
    reasoning_content: Optional[str] = None
    tool_calls: Optional[List[Dict[str, Any]]] = None


class ChatCompletionResponseStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: Optional[ChoiceLogprobs] = None
    finish_reason: Optional[Literal["stop", "length", "tool_calls", "content_filter", "function_call", "abort"]] = None
    matched_stop: Union[None, int, str] = None


class ChatCompletionStreamResponse(BaseModel):
    id: str
    object: str = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: List[ChatCompletionResponseStreamChoice]
    usage: Optional[UsageInfo] = None


# ----------------------------------------------------------------------------- tokenize


class TokenizeRequest(_Lenient):
    """A prompt, or chat `messages` rendered with the chat template first (upstream's newest shape)."""

    model: Optional[str] = None
    prompt: Optional[Union[str, List[str]]] = None
    messages: Optional[List["ChatCompletionMessage"]] = None
    tools: Optional[List[Dict[str, Any]]] = None
    tool_choice: Optional[Union[str, Dict[str, Any]]] = None
    continue_final_message: bool = False
    chat_template_kwargs: Optional[Dict[str, Any]] = None
    add_special_tokens: bool = True

    @model_validator(mode="after")
    def _prompt_or_messages(self):
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("Exactly one of 'prompt' or 'messages' must be provided.")
        return self


class TokenizeResponse(BaseModel):
    tokens: Union[List[int], List[List[int]]]
    count: Union[int, List[int]]
    max_model_len: int


class DetokenizeRequest(_Lenient):
    model: Optional[str] = None
    tokens: Union[List[int], List[List[int]]]
    skip_special_tokens: bool = True


class DetokenizeResponse(BaseModel):
    text: Union[str, List[str]]
