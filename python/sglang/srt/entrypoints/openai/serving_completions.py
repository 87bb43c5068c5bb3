"""`POST /v1/completions`: the legacy OpenAI text-completion API on the TokenizerManager.

Prompts may be a string, a list of strings (a batch), a list of token ids or a list of such
lists; `n` samples per prompt come back as choices `prompt_index * n + k`, as upstream.
"""

from __future__ import annotations

import time
from typing import List, Optional

from sglang.srt.entrypoints.openai.protocol import (
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
    CompletionResponseStreamChoice,
    CompletionStreamResponse,
)
from sglang.srt.entrypoints.openai.serving_base import (
    passthrough_fields,
    OpenAIServingBase,
    build_sampling_params,
    completion_logprobs,
    finish_fields,
    streaming_usage,
    usage_from_outputs,
)
from sglang.srt.managers.io_struct import GenerateReqInput


def _is_text_prompt(prompt) -> bool:
    return isinstance(prompt, str) or (isinstance(prompt, list) and len(prompt) > 0 and isinstance(prompt[0], str))


class OpenAIServingCompletion(OpenAIServingBase):
    def _validate(self, request: CompletionRequest) -> Optional[str]:
        prompt = request.prompt
        if not prompt or (isinstance(prompt, list) and all(not p for p in prompt)):
            return "Prompt cannot be empty"
        if request.n < 1:
            return f"n must be at least 1, got {request.n}."
        try:
            self.limits.check_completion_logprobs(request.logprobs)
        except ValueError as e:
            return str(e)
        return None

    def _convert(self, request: CompletionRequest) -> GenerateReqInput:
        prompt = request.prompt
        text, input_ids = (prompt, None) if _is_text_prompt(prompt) else (None, prompt)
        want_logprobs = request.logprobs is not None
        return GenerateReqInput(
            text=text,
            input_ids=input_ids,
            sampling_params=build_sampling_params(request, request.max_tokens, self.ctx.model_sampling_defaults),
            return_logprob=want_logprobs,
            top_logprobs_num=request.logprobs or 0,
            logprob_start_len=0 if (want_logprobs and request.echo) else -1,
            return_text_in_logprobs=True,
            **passthrough_fields(request),
        )

    # --- echo ---------------------------------------------------------------------------------
    def _prompt_texts(self, request: CompletionRequest) -> List[str]:
        prompt = request.prompt
        if isinstance(prompt, str):
            return [prompt]
        if _is_text_prompt(prompt):
            return list(prompt)
        tok = self.ctx.tokenizer_manager.tokenizer
        batches = prompt if isinstance(prompt[0], list) else [prompt]
        return [tok.decode(ids) if tok is not None else "" for ids in batches]

    def _logprobs(self, request: CompletionRequest, meta: dict, first_chunk: bool, n_prev: int):
        with_input = request.echo and first_chunk
        return completion_logprobs(
            meta.get("input_token_logprobs") if with_input else None,
            meta.get("output_token_logprobs", [])[n_prev:],
            meta.get("input_top_logprobs") if with_input else None,
            meta.get("output_top_logprobs", [])[n_prev:],
        )

    # --- whole response -----------------------------------------------------------------------
    def _build_response(self, request: CompletionRequest, outputs: List[dict]) -> CompletionResponse:
        prompts = self._prompt_texts(request) if request.echo else None
        choices = []
        for i, out in enumerate(outputs):
            text = out.get("text", "")
            if prompts is not None:
                text = prompts[i // request.n] + text
            logprobs = None
            if request.logprobs is not None:
                logprobs = self._logprobs(request, out["meta_info"], True, 0)
            reason, matched = finish_fields(out["meta_info"])
            choices.append(CompletionResponseChoice(index=i, text=text, logprobs=logprobs, finish_reason=reason,
                                                    matched_stop=matched))
        return CompletionResponse(
            id=outputs[0]["meta_info"]["id"],
            model=request.model or self.ctx.served_model_name,
            choices=choices,
            usage=usage_from_outputs(outputs, request.n, self.ctx.enable_cache_report),
        )

    # --- streaming ----------------------------------------------------------------------------
    async def _stream_chunks(self, request: CompletionRequest, outputs):
        created = int(time.time())
        model = request.model or self.ctx.served_model_name
        prompts = self._prompt_texts(request) if request.echo else None
        sent_text, n_prev, prompt_tokens, completion_tokens, cached_tokens = {}, {}, {}, {}, {}
        response_id = None
        async for out in outputs:
            index = out.get("index", 0)
            meta = out["meta_info"]
            response_id = response_id or meta["id"]
            prompt_tokens[index] = meta["prompt_tokens"]
            completion_tokens[index] = meta["completion_tokens"]
            cached_tokens[index] = meta.get("cached_tokens", 0)
            first_chunk = index not in sent_text
            already = sent_text.get(index, "")
            full = out.get("text", "")
            delta = full[len(already):]
            sent_text[index] = full
            if first_chunk and prompts is not None:
                delta = prompts[index // request.n] + delta
            logprobs = None
            if request.logprobs is not None:
                logprobs = self._logprobs(request, meta, first_chunk, n_prev.get(index, 0))
                n_prev[index] = len(meta.get("output_token_logprobs", []))
            reason, matched = finish_fields(meta)
            if not delta and reason is None and logprobs is None and not first_chunk:
                continue
            continuous = request.stream_options is not None and request.stream_options.continuous_usage_stats
            chunk = CompletionStreamResponse(
                id=response_id, created=created, model=model,
                usage=streaming_usage(prompt_tokens, completion_tokens, cached_tokens, request.n, self.ctx.enable_cache_report) if continuous else None,
                choices=[CompletionResponseStreamChoice(index=index, text=delta, logprobs=logprobs,
                                                        finish_reason=reason, matched_stop=matched)],
            )
            yield f"data: {chunk.model_dump_json()}\n\n"
        if request.stream_options and request.stream_options.include_usage and response_id is not None:
            usage = streaming_usage(prompt_tokens, completion_tokens, cached_tokens, request.n, self.ctx.enable_cache_report)
            chunk = CompletionStreamResponse(id=response_id, created=created, model=model, choices=[], usage=usage)
            yield f"data: {chunk.model_dump_json()}\n\n"
