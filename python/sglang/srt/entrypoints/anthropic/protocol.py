"""Pydantic models of Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`),
with the field names of Anthropic's public API and upstream SGLang's class names.

Why the request models refuse unknown fields (unlike the OpenAI models, which ignore them): every
field here either does what Anthropic's does or is refused with a 400 that names it, so a client
never believes a setting took effect when it did not. Fields that are accepted but change nothing
on this server are the ones whose effect already holds here: `cache_control` (the radix cache
reuses every shared prefix on its own), `metadata.user_id` (an opaque id for the client's own
abuse tracking), `service_tier` and `speed: "standard"` (one tier, one speed). Content that a text-only server cannot take
(images, documents, server tools, redacted thinking) is refused by the request conversion with a
message that says so.
"""

from __future__ import annotations

from typing import Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


# ----------------------------------------------------------------------------- errors

# HTTP status -> Anthropic's error type (https://docs.anthropic.com/en/api/errors).
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
               503: "overloaded_error", 529: "overloaded_error"}


def error_body(message: str, status_code: int = 400) -> dict:
    """Anthropic's error shape: {"type": "error", "error": {"type": ..., "message": ...}}."""
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status_code, "api_error"), "message": message}}


# ----------------------------------------------------------------------------- request pieces


class AnthropicContentBlock(_Strict):
    """One content block of a request message (or of `system`). Which fields a block may carry
    depends on its `type`; `request_conversion` checks that, so the error names the block."""

    type: str
    text: Optional[str] = None
    citations: Optional[List[Any]] = None
    # tool_use
    id: Optional[str] = None
    name: Optional[str] = None
    input: Optional[Dict[str, Any]] = None
    # tool_result
    tool_use_id: Optional[str] = None
    content: Optional[Union[str, List[Dict[str, Any]]]] = None
    is_error: Optional[bool] = None
    # thinking
    thinking: Optional[str] = None
    signature: Optional[str] = None
    # other kinds (image, document, redacted_thinking, ...) are refused by name in the conversion
    source: Optional[Dict[str, Any]] = None
    data: Optional[str] = None
    cache_control: Optional[Dict[str, Any]] = None


class AnthropicMessage(_Strict):
    role: Literal["user", "assistant"]
    content: Union[str, List[AnthropicContentBlock]]


class AnthropicTool(_Strict):
    """A client tool (`type` absent or "custom"). Anthropic's server tools (web search, code
    execution, ...) run on Anthropic's side and are refused by the conversion."""

    name: str
    input_schema: Optional[Dict[str, Any]] = None
    description: Optional[str] = None
    type: Optional[str] = None
    cache_control: Optional[Dict[str, Any]] = None


class AnthropicToolChoice(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: Optional[str] = None
    disable_parallel_tool_use: Optional[bool] = None


class AnthropicThinkingParam(_Strict):
    """`enabled` (with `budget_tokens`, Anthropic's bounds: at least 1024 and below max_tokens),
    `disabled`, or `adaptive` (enabled, the model decides how long). `display: "omitted"` sends
    thinking blocks with empty text; "summarized" (the default) sends the thinking as generated
    (this server has no summarizer: the whole thinking is its own summary)."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: Optional[int] = None
    display: Optional[Literal["summarized", "omitted"]] = None


class AnthropicJsonFormat(_Strict):
    type: Literal["json_schema"]
    schema_: Dict[str, Any] = Field(alias="schema")


class AnthropicOutputConfig(_Strict):
    """Structured output: `format` constrains the answer to the JSON schema (the grammar backend,
    as `response_format` on the OpenAI route). `effort` is Claude's and refused when set."""

    format: Optional[AnthropicJsonFormat] = None
    effort: Optional[str] = None


class AnthropicMetadata(_Strict):
    user_id: Optional[str] = None


class _MessagesCommon(_Strict):
    model: str
    messages: List[AnthropicMessage]
    system: Optional[Union[str, List[AnthropicContentBlock]]] = None
    tools: Optional[List[AnthropicTool]] = None
    tool_choice: Optional[AnthropicToolChoice] = None
    thinking: Optional[AnthropicThinkingParam] = None

    @field_validator("messages")
    @classmethod
    def _not_empty(cls, v):
        if not v:
            raise ValueError("messages: at least one message is required")
        return v


class AnthropicMessagesRequest(_MessagesCommon):
    max_tokens: int
    stop_sequences: Optional[List[str]] = None
    stream: bool = False
    temperature: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    top_p: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    top_k: Optional[int] = Field(default=None, ge=1)
    metadata: Optional[AnthropicMetadata] = None
    service_tier: Optional[Literal["auto", "standard_only"]] = None
    speed: Optional[Literal["standard"]] = None
    cache_control: Optional[Dict[str, Any]] = None  # automatic prompt caching: the radix cache does it
    output_config: Optional[AnthropicOutputConfig] = None

    @field_validator("max_tokens")
    @classmethod
    def _positive(cls, v):
        if v < 1:
            raise ValueError("max_tokens: must be at least 1")
        return v


class AnthropicCountTokensRequest(_MessagesCommon):
    """What /v1/messages/count_tokens counts: the prompt the same request would run with."""


# ----------------------------------------------------------------------------- responses


class AnthropicUsage(BaseModel):
    """Anthropic's split: `input_tokens` are the prompt tokens not read from the cache;
    `cache_read_input_tokens` those the radix cache already held (the three add up to the prompt)."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class AnthropicMessagesResponse(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    content: List[Dict[str, Any]]
    model: str
    stop_reason: Optional[Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]] = None
    stop_sequence: Optional[str] = None
    usage: AnthropicUsage


class AnthropicCountTokensResponse(BaseModel):
    input_tokens: int
