"""An Anthropic Messages request -> the OpenAI chat request the chat pipeline runs (template,
sampling mapping, tool-call and reasoning parsers, constrained decoding for required tools).

The mapping (upstream's, made strict):
- `system` (a string or text blocks, joined by newlines) -> a system message first;
- a user message's `tool_result` blocks -> one `tool` message each (in order, before the rest of
  that message's text, as Anthropic requires them first); `is_error: true` prefixes "Error: ";
- an assistant message's `tool_use` blocks -> its `tool_calls` (arguments as JSON), its
  `thinking` blocks -> its `reasoning_content` (templates that keep reasoning read it);
- `tools` (`input_schema`) -> function tools; `tool_choice` auto/any/tool/none -> "auto" /
  "required" / the named function / "none" (any and tool are constrained by the grammar backend,
  as the OpenAI route does); `disable_parallel_tool_use` -> `parallel_tool_calls: false`;
- `output_config.format` (a JSON schema) -> `response_format` json_schema (constrained decoding);
- `max_tokens`, `stop_sequences`, `temperature`, `top_p`, `top_k` -> the same sampling fields;
- `thinking` -> the chat template's `enable_thinking` / `thinking` switches (the names Qwen3 and
  DeepSeek-V3.1 templates read); the reasoning parser (`--reasoning-parser`) separates the
  thinking from the answer. Enabled thinking on a server without a reasoning parser is refused:
  nothing could tell the thinking from the answer.

Anything this text-only server cannot do is a ValueError (a 400) that names it.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional

from sglang.srt.entrypoints.anthropic.protocol import (
    AnthropicContentBlock,
    AnthropicMessagesRequest,
    AnthropicToolChoice,
    _MessagesCommon,
)
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

MIN_THINKING_BUDGET = 1024  # Anthropic's lower bound for thinking.budget_tokens

_BLOCK_FIELDS = {
    "text": {"text", "citations", "cache_control"},
    "tool_use": {"id", "name", "input", "cache_control"},
    "tool_result": {"tool_use_id", "content", "is_error", "cache_control"},
    "thinking": {"thinking", "signature"},
}
_ALLOWED_IN = {"user": {"text", "tool_result"}, "assistant": {"text", "tool_use", "thinking"}}


def _check_block(block: AnthropicContentBlock, where: str, allowed: set) -> None:
    if block.type not in _BLOCK_FIELDS:
        raise ValueError(f"{where}: content blocks of type '{block.type}' are not supported by this server "
                         f"(it serves text: text, tool_use, tool_result and thinking blocks).")
    if block.type not in allowed:
        raise ValueError(f"{where}: a '{block.type}' block cannot appear here (allowed: {', '.join(sorted(allowed))}).")
    extra = sorted(k for k in block.model_fields_set if k != "type" and k not in _BLOCK_FIELDS[block.type])
    if extra:
        raise ValueError(f"{where}: a '{block.type}' block has no field {', '.join(extra)}.")
    if block.type == "text":
        if block.text is None:
            raise ValueError(f"{where}: a text block needs 'text'.")
        if block.citations:
            raise ValueError(f"{where}: citations are not supported by this server.")
    elif block.type == "tool_use" and (not block.id or not block.name):
        raise ValueError(f"{where}: a tool_use block needs 'id' and 'name'.")
    elif block.type == "tool_result" and not block.tool_use_id:
        raise ValueError(f"{where}: a tool_result block needs 'tool_use_id'.")


def _tool_result_text(block: AnthropicContentBlock, where: str) -> str:
    content = block.content
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    else:
        parts = []
        for i, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text" or not isinstance(part.get("text"), str):
                raise ValueError(f"{where}.content.{i}: tool results of type '{kind}' are not supported by this "
                                 "server (only text).")
            extra = sorted(set(part) - {"type", "text", "cache_control", "citations"})
            if extra:
                raise ValueError(f"{where}.content.{i}: a text block has no field {', '.join(extra)}.")
            parts.append(part["text"])
        text = "\n".join(parts)
    return f"Error: {text}" if block.is_error else text


def system_text(system) -> Optional[str]:
    if system is None or isinstance(system, str):
        return system
    for i, block in enumerate(system):
        _check_block(block, f"system.{i}", {"text"})
    return "\n".join(b.text for b in system)


def chat_messages(request: _MessagesCommon) -> List[Dict[str, Any]]:
    """Anthropic `system` + `messages` -> OpenAI chat messages (see the module docstring)."""
    out: List[Dict[str, Any]] = []
    system = system_text(request.system)
    if system:
        out.append({"role": "system", "content": system})
    for m_i, msg in enumerate(request.messages):
        if isinstance(msg.content, str):
            out.append({"role": msg.role, "content": msg.content})
            continue
        texts, calls, thinking = [], [], []
        for b_i, block in enumerate(msg.content):
            where = f"messages.{m_i}.content.{b_i}"
            _check_block(block, where, _ALLOWED_IN[msg.role])
            if block.type == "text":
                texts.append(block.text)
            elif block.type == "tool_result":
                out.append({"role": "tool", "tool_call_id": block.tool_use_id,
                            "content": _tool_result_text(block, where)})
            elif block.type == "tool_use":
                calls.append({"id": block.id, "type": "function",
                              "function": {"name": block.name, "arguments": json.dumps(block.input or {})}})
            elif block.type == "thinking":
                thinking.append(block.thinking or "")
        if msg.role == "user":
            if texts or not any(b.type == "tool_result" for b in msg.content):
                out.append({"role": "user", "content": "".join(texts)})
            continue
        assistant: Dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
        if calls:
            assistant["tool_calls"] = calls
        if thinking:
            assistant["reasoning_content"] = "".join(thinking)
        out.append(assistant)
    return out


def chat_tools(request: _MessagesCommon) -> Optional[List[Dict[str, Any]]]:
    if not request.tools:
        return None
    tools = []
    for i, tool in enumerate(request.tools):
        if tool.type not in (None, "custom"):
            raise ValueError(f"tools.{i}: tools of type '{tool.type}' are Anthropic's server tools; this server "
                             "runs only client tools (a name, a description and an input_schema).")
        if tool.input_schema is None:
            raise ValueError(f"tools.{i}.input_schema: Field required")
        if tool.input_schema.get("type", "object") != "object":
            raise ValueError(f"tools.{i}.input_schema: the type must be 'object'.")
        function = {"name": tool.name, "parameters": {"type": "object", **tool.input_schema}}
        if tool.description is not None:
            function["description"] = tool.description
        tools.append({"type": "function", "function": function})
    return tools


def chat_tool_choice(choice: Optional[AnthropicToolChoice], tools: Optional[list]) -> Any:
    """tool_choice -> the OpenAI value; None when there are no tools (and the choice allows that)."""
    if choice is None:
        return "auto" if tools else None
    if choice.type != "tool" and choice.name is not None:
        raise ValueError(f"tool_choice: 'name' is only allowed with type 'tool', not '{choice.type}'.")
    if choice.type == "none":
        return "none"
    if choice.type == "auto":
        return "auto" if tools else None
    if not tools:
        raise ValueError(f"tool_choice: type '{choice.type}' needs 'tools'.")
    if choice.type == "any":
        return "required"
    if not choice.name:
        raise ValueError("tool_choice: type 'tool' needs the tool's 'name'.")
    if choice.name not in {t["function"]["name"] for t in tools}:
        raise ValueError(f"tool_choice: tool '{choice.name}' is not in 'tools'.")
    return {"type": "function", "function": {"name": choice.name}}


def thinking_kwargs(request: _MessagesCommon, reasoning_parser: Optional[str],
                    max_tokens: Optional[int]) -> Dict[str, Any]:
    """`thinking` -> the chat template's switches (empty when the request leaves it unset)."""
    thinking = request.thinking
    if thinking is None:
        return {}
    if thinking.type == "disabled":
        if thinking.budget_tokens is not None:
            raise ValueError("thinking.budget_tokens: only allowed when thinking is enabled.")
        return {"enable_thinking": False, "thinking": False}
    if not reasoning_parser:
        raise ValueError("thinking: this server was started without --reasoning-parser, so it cannot tell the "
                         "model's thinking from its answer. Start it with the model's reasoning parser, or "
                         "send the request without 'thinking'.")
    if thinking.type == "enabled":
        budget = thinking.budget_tokens
        if budget is None:
            raise ValueError("thinking.budget_tokens: Field required")
        if budget < MIN_THINKING_BUDGET:
            raise ValueError(f"thinking.budget_tokens: must be at least {MIN_THINKING_BUDGET}.")
        if max_tokens is not None and budget >= max_tokens:
            raise ValueError("thinking.budget_tokens: must be less than max_tokens.")
    elif thinking.budget_tokens is not None:
        raise ValueError("thinking.budget_tokens: not allowed with type 'adaptive'.")
    return {"enable_thinking": True, "thinking": True}


def to_chat_request(request: _MessagesCommon, reasoning_parser: Optional[str]) -> ChatCompletionRequest:
    """The chat request the Anthropic request runs as (count_tokens uses the same prompt)."""
    is_messages = isinstance(request, AnthropicMessagesRequest)
    max_tokens = request.max_tokens if is_messages else None
    tools = chat_tools(request)
    tool_choice = chat_tool_choice(request.tool_choice, tools)
    kwargs = thinking_kwargs(request, reasoning_parser, max_tokens)
    fields: Dict[str, Any] = dict(
        model=request.model, messages=chat_messages(request), tools=tools, tool_choice=tool_choice,
        chat_template_kwargs=kwargs or None, separate_reasoning=True,
        parallel_tool_calls=not (request.tool_choice and request.tool_choice.disable_parallel_tool_use),
    )
    if is_messages:
        config = request.output_config
        if config is not None and config.effort is not None:
            raise ValueError("output_config.effort: not supported by this server (it sets Claude's effort).")
        if config is not None and config.format is not None:
            fields["response_format"] = {"type": "json_schema",
                                         "json_schema": {"name": "output", "schema": config.format.schema_}}
        fields.update(max_tokens=request.max_tokens, stream=request.stream, stop=request.stop_sequences,
                      temperature=request.temperature, top_p=request.top_p,
                      top_k=request.top_k if request.top_k is not None else -1)
    return ChatCompletionRequest(**fields)
