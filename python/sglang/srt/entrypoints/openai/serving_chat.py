"""`POST /v1/chat/completions`: messages are rendered with the tokenizer's chat template
(`apply_chat_template(..., add_generation_prompt=True)`) and run as token ids through the one
TokenizerManager path.

The template's text already holds the special tokens it wants (BOS, role markers), so it is
tokenized with `add_special_tokens=False`, the same ids `apply_chat_template(tokenize=True)`
gives. Streams follow upstream: a first chunk with `role: assistant`, content deltas, one
chunk per choice with its finish_reason, and, with `stream_options.include_usage`, a last chunk
with no choices and the usage.
"""

from __future__ import annotations

import time
from typing import Dict, List, Optional

from sglang.srt.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
    ChatMessage,
    DeltaMessage,
)
from sglang.srt.entrypoints.openai.serving_base import (
    passthrough_fields,
    OpenAIServingBase,
    build_sampling_params,
    chat_logprobs,
    finish_fields,
    streaming_usage,
    usage_from_outputs,
)
from sglang.srt.entrypoints.openai.chat_output import (
    ChoiceOutput,
    chat_finish_reason,
    dump_tool_calls_for_template,
    tool_json_schema,
)
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.parser.parser_selection import resolve_parsers


UNTRUSTED_CHAT_TEMPLATE = (
    "Chat template is passed with request, but --trust-request-chat-template is not set. "
    "Refused request with untrusted chat template."
)


class OpenAIServingChat(OpenAIServingBase):
    def __init__(self, ctx):
        super().__init__(ctx)
        self._chat_template = _load_chat_template_file(ctx.server_args.chat_template)
        from sglang.srt.model_loader.default_model import resolve_model_path

        self.tool_call_parser, self.reasoning_parser = resolve_parsers(
            ctx.server_args, resolve_model_path(ctx.server_args.model_path, ctx.server_args.load_format))

    def _output(self, request) -> ChoiceOutput:
        return ChoiceOutput(request, self.tool_call_parser, self.reasoning_parser)

    def _validate(self, request: ChatCompletionRequest) -> Optional[str]:
        if not request.messages:
            return "Messages cannot be empty"
        if request.n < 1:
            return f"n must be at least 1, got {request.n}."
        if self.ctx.tokenizer_manager.tokenizer is None:
            return "The chat API needs the tokenizer; the server runs with --skip-tokenizer-init."
        error = _validate_tools(request)
        if error:
            return error
        try:
            self.limits.check_top_logprobs(request.top_logprobs)
        except ValueError as e:
            return str(e)
        # Upstream's check (and text, missing space included), against --context-length or the model's.
        max_output_tokens = request.max_completion_tokens or request.max_tokens
        context_len = self.ctx.server_args.context_length or self.ctx.context_len
        if max_output_tokens and max_output_tokens > context_len and not self.ctx.server_args.allow_auto_truncate:
            return (f"max_completion_tokens is too large: {max_output_tokens}."
                    f"This model supports at most {context_len} completion tokens.")
        return None

    # --- request -> token ids ------------------------------------------------------------------
    def _messages(self, request: ChatCompletionRequest) -> List[Dict]:
        msgs = []
        for m in request.messages:
            content = m.content
            if isinstance(content, list):
                texts = []
                for part in content:
                    if part.type != "text":
                        raise ValueError(f"Content of type '{part.type}' is not supported by this server yet: only text.")
                    texts.append(part.text or "")
                content = "".join(texts)
            d = {"role": m.role, "content": content if content is not None else ""}
            for key in ("name", "tool_calls", "tool_call_id", "reasoning_content"):
                value = getattr(m, key)
                if value is not None:
                    d[key] = value
            msgs.append(d)
        dump_tool_calls_for_template(msgs)
        return msgs

    def prompt_ids(self, request) -> List[int]:
        """Token ids of `request.messages` rendered with the chat template (also for /v1/tokenize).
        Runs on a worker thread (`run_cpu`); the messages are measured before they are rendered."""
        tok = self.ctx.tokenizer_manager.tokenizer
        kwargs = dict(request.chat_template_kwargs or {})
        if kwargs.get("chat_template") is not None and not self.ctx.server_args.trust_request_chat_template:
            # A template is code: a nested loop in one stalls the server (Jinja's sandbox bounds
            # what it can reach, not how long it runs).
            raise ValueError(UNTRUSTED_CHAT_TEMPLATE)
        self.limits.check_messages_chars([m.content for m in request.messages])
        msgs = self._messages(request)
        add_generation_prompt = True
        if request.continue_final_message and msgs and msgs[-1]["role"] == "assistant":
            add_generation_prompt = False
            kwargs["continue_final_message"] = True
        if request.tools and request.tool_choice != "none":
            kwargs["tools"] = request.tools
        if self._chat_template is not None:
            kwargs["chat_template"] = self._chat_template
        try:
            text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs)
        except ValueError:
            raise
        except Exception as e:  # template errors (jinja) are the client's messages' fault
            raise ValueError(f"Failed to apply the chat template: {e}") from None
        return tok.encode(text, add_special_tokens=False)

    def _convert(self, request: ChatCompletionRequest) -> GenerateReqInput:
        max_tokens = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
        sampling_params = build_sampling_params(request, max_tokens, self.ctx.model_sampling_defaults)
        schema = tool_json_schema(request)
        if schema is not None:  # tool_choice required / named: the output is the call (upstream)
            if any(k in sampling_params for k in ("regex", "json_schema", "ebnf", "structural_tag")):
                raise ValueError("tool_choice 'required' or a named function cannot be combined with "
                                 "response_format, regex, json_schema, ebnf or structural_tag.")
            sampling_params["json_schema"] = schema
        return GenerateReqInput(
            input_ids=self.prompt_ids(request),
            sampling_params=sampling_params,
            return_logprob=request.logprobs,
            top_logprobs_num=request.top_logprobs or 0,
            return_text_in_logprobs=True,
            **passthrough_fields(request),
        )

    # --- whole response -----------------------------------------------------------------------
    def _build_response(self, request: ChatCompletionRequest, outputs: List[dict]) -> ChatCompletionResponse:
        choices = []
        for i, out in enumerate(outputs):
            meta = out["meta_info"]
            logprobs = None
            if request.logprobs:
                logprobs = chat_logprobs(meta.get("output_token_logprobs", []), meta.get("output_top_logprobs", []))
            proc = self._output(request)
            content, reasoning, tool_calls = proc.whole(out.get("text", ""))
            reason, matched = chat_finish_reason(*finish_fields(meta), proc.has_tool_calls)
            message = ChatMessage(role="assistant", content=content if content or not tool_calls else None,
                                  reasoning_content=reasoning, tool_calls=tool_calls or None)
            choices.append(ChatCompletionResponseChoice(
                index=i, message=message, logprobs=logprobs, finish_reason=reason, matched_stop=matched))
        return ChatCompletionResponse(
            id=outputs[0]["meta_info"]["id"],
            model=request.model or self.ctx.served_model_name,
            choices=choices,
            usage=usage_from_outputs(outputs, request.n, self.ctx.enable_cache_report),
        )

    # --- streaming ----------------------------------------------------------------------------
    async def _stream_chunks(self, request: ChatCompletionRequest, outputs):
        created = int(time.time())
        model = request.model or self.ctx.served_model_name
        sent_text, n_prev, finished, procs = {}, {}, {}, {}
        prompt_tokens, completion_tokens, cached_tokens = {}, {}, {}
        response_id = None

        continuous = bool(request.stream_options and request.stream_options.continuous_usage_stats)

        def chunk(index, delta, reason=None, matched=None, logprobs=None):
            usage = streaming_usage(prompt_tokens, completion_tokens, cached_tokens, request.n, self.ctx.enable_cache_report) if continuous else None
            c = ChatCompletionStreamResponse(
                id=response_id, created=created, model=model, usage=usage,
                choices=[ChatCompletionResponseStreamChoice(index=index, delta=delta, logprobs=logprobs,
                                                            finish_reason=reason, matched_stop=matched)])
            return f"data: {c.model_dump_json()}\n\n"

        async for out in outputs:
            index = out.get("index", 0)
            meta = out["meta_info"]
            response_id = response_id or meta["id"]
            prompt_tokens[index] = meta["prompt_tokens"]
            completion_tokens[index] = meta["completion_tokens"]
            cached_tokens[index] = meta.get("cached_tokens", 0)
            if index not in sent_text:
                sent_text[index] = ""
                procs[index] = self._output(request)
                yield chunk(index, DeltaMessage(role="assistant", content=""))
            logprobs = None
            if request.logprobs:
                start = n_prev.get(index, 0)
                logprobs = chat_logprobs(meta.get("output_token_logprobs", [])[start:],
                                         meta.get("output_top_logprobs", [])[start:])
                n_prev[index] = len(meta.get("output_token_logprobs", []))
            full = out.get("text", "")
            delta = full[len(sent_text[index]):]
            sent_text[index] = full
            pieces = procs[index].delta(delta) if delta else []
            if not pieces and logprobs is not None and logprobs.content:
                pieces = [{"content": ""}]
            for j, piece in enumerate(pieces):
                yield chunk(index, DeltaMessage(**piece), logprobs=logprobs if j == 0 else None)
            reason, matched = finish_fields(meta)
            if reason is not None:
                finished[index] = (reason, matched)
                for piece in procs[index].end():
                    yield chunk(index, DeltaMessage(**piece))
        for index, (reason, matched) in sorted(finished.items()):
            reason, matched = chat_finish_reason(reason, matched, procs[index].has_tool_calls)
            yield chunk(index, DeltaMessage(), reason=reason, matched=matched)
        if request.stream_options and request.stream_options.include_usage and response_id is not None:
            usage = streaming_usage(prompt_tokens, completion_tokens, cached_tokens, request.n, self.ctx.enable_cache_report)
            c = ChatCompletionStreamResponse(id=response_id, created=created, model=model, choices=[], usage=usage)
            yield f"data: {c.model_dump_json()}\n\n"


def _validate_tools(request: ChatCompletionRequest) -> Optional[str]:
    """Upstream's tool and tool_choice checks (and texts)."""
    for i, tool in enumerate(request.tools or []):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            return f"tools.{i}.function.name: Field required"  # upstream's Function model requires it
    choice = request.tool_choice
    if isinstance(choice, str):
        if choice.lower() not in ("none", "auto", "required"):
            return f"tool_choice must be 'none', 'auto', 'required' or a named function, got {choice!r}."
        if choice.lower() == "required" and not request.tools:
            return "Tools cannot be empty if tool choice is set to required."
    elif isinstance(choice, dict):
        if not request.tools:
            return "Tools cannot be empty if tool choice is set to a specific tool."
        name = (choice.get("function") or {}).get("name") if isinstance(choice.get("function"), dict) else None
        names = {(t.get("function") or {}).get("name") for t in request.tools if isinstance(t, dict)}
        if name not in names:
            return f"Tool '{name}' not found in tools list."
    return None


def _load_chat_template_file(path: Optional[str]) -> Optional[str]:
    """`--chat-template FILE` overrides the tokenizer's template (a Jinja file)."""
    if not path:
        return None
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        raise ValueError(f"--chat-template {path!r}: only a Jinja template file is supported.") from None
