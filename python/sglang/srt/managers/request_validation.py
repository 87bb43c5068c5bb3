"""(Tokenizer/HTTP process.) One sequence of a request -> a `TokenizedGenerateReqInput`, or a
`ValueError` whose text the client gets as a 400.

Everything a client can get wrong is checked here, before the request reaches the scheduler:
token ids outside the vocabulary (they would index past the embedding table), prompts longer
than the context (or truncated with `--allow-auto-truncate`), sampling values, logprob options,
fields whose feature this server does not have, and the PD bootstrap fields a role needs.
"""

from __future__ import annotations

import itertools
import logging
from typing import List, Optional

from sglang.srt.disaggregation.pd_auth import BootstrapHostPolicy
from sglang.srt.managers.io_struct import GenerateReqInput, TokenizedGenerateReqInput
from sglang.srt.managers.request_limits import RequestLimits, clip

logger = logging.getLogger(__name__)

FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # same value as disaggregation.utils (which imports torch)
CUSTOM_LOGIT_PROCESSOR_DISABLED = (
    "The server is not configured to enable custom logit processor. Please set "
    "`--enable-custom-logit-processor` to enable this feature."
)


class RequestValidator:
    def __init__(self, server_args, tokenizer, context_len: int, vocab_size: int,
                 limits: Optional[RequestLimits] = None):
        self.server_args = server_args
        self.limits = limits or RequestLimits.from_env(context_len)
        self.tokenizer = tokenizer
        self.context_len = context_len
        self.vocab_size = vocab_size
        self.disagg_mode = server_args.disaggregation_mode
        self.fake_transfer = server_args.disaggregation_transfer_backend == "fake"
        # PD with the fake backend: rooms are local counters (`next` on a count is atomic, and
        # requests are validated on several worker threads).
        self._fake_bootstrap_rooms = itertools.count()
        # A decode server connects to bootstrap_host: only to the prefill hosts it may reach (SSRF).
        self.bootstrap_hosts = (BootstrapHostPolicy(server_args.host)
                                if self.disagg_mode == "decode" and not self.fake_transfer else None)

    def validate_and_tokenize(self, obj: GenerateReqInput) -> TokenizedGenerateReqInput:
        from sglang.srt.sampling.sampling_params import SamplingParams

        input_ids, text = self._input_ids(obj)
        sp_dict = dict(obj.sampling_params or {})
        input_ids = self._check_lengths(input_ids, sp_dict)
        self.limits.check_stop_strings(sp_dict.get("stop"))
        try:
            sp = SamplingParams(**sp_dict)
        except TypeError as e:  # an unknown key (upstream's own TypeError text) or an unhashable value
            raise ValueError(f"Invalid sampling parameters: {e}") from None
        sp.check_types()
        sp.normalize(self.tokenizer)
        sp.verify(self.vocab_size)
        if obj.custom_logit_processor:
            if not self.server_args.enable_custom_logit_processor:
                raise ValueError(CUSTOM_LOGIT_PROCESSOR_DISABLED)
            if not isinstance(obj.custom_logit_processor, str):
                raise ValueError("custom_logit_processor must be the string CustomLogitProcessor.to_str() returns.")
            from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor

            CustomLogitProcessor.from_str(obj.custom_logit_processor)  # a 400 now, not a failed batch later
        logprob_start_len = -1 if obj.logprob_start_len is None else obj.logprob_start_len
        top_logprobs_num = obj.top_logprobs_num or 0
        if not isinstance(top_logprobs_num, int) or top_logprobs_num < 0:
            raise ValueError(f"top_logprobs_num must be a non-negative integer, got {clip(top_logprobs_num)}.")
        if top_logprobs_num > self.vocab_size:
            raise ValueError(f"top_logprobs_num must be at most the vocabulary size ({self.vocab_size}), "
                             f"got {top_logprobs_num}.")
        if not isinstance(logprob_start_len, int) or logprob_start_len < -1:
            raise ValueError(f"logprob_start_len must be -1 or a non-negative integer, got {clip(logprob_start_len)}.")
        token_ids_logprob = self._token_ids_logprob(obj.token_ids_logprob)
        if obj.return_logprob:
            new_tokens = sp.max_new_tokens if sp.max_new_tokens is not None else self.context_len - len(input_ids)
            self.limits.check_logprob_work(len(input_ids), logprob_start_len, new_tokens, top_logprobs_num,
                                           token_ids_logprob)
        priority = self._priority(obj.priority)
        self._check_bootstrap(obj)
        return TokenizedGenerateReqInput(
            rid=obj.rid,
            input_text=text,
            input_ids=input_ids,
            sampling_params=sp,
            return_logprob=bool(obj.return_logprob),
            logprob_start_len=logprob_start_len,
            top_logprobs_num=top_logprobs_num,
            token_ids_logprob=token_ids_logprob,
            stream=obj.stream,
            bootstrap_host=obj.bootstrap_host,
            bootstrap_port=obj.bootstrap_port,
            bootstrap_room=obj.bootstrap_room,
            priority=priority,
            extra_key=_combine_extra_key(obj.extra_key, obj.cache_salt),
            custom_logit_processor=obj.custom_logit_processor or None,
        )

    # --- prompt ----------------------------------------------------------------------------------
    def _input_ids(self, obj: GenerateReqInput):
        if obj.input_embeds is not None:
            raise ValueError("input_embeds is not supported by this server yet: send text or input_ids.")
        if obj.input_ids is not None:
            ids = list(obj.input_ids)
            bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(
                    f"The input_ids {clip(bad[:8])} contain values outside the vocabulary [0, {self.vocab_size})."
                )
            text = None
        else:
            if self.tokenizer is None:
                raise ValueError(
                    "The engine initialized with skip_tokenizer_init=True cannot accept text prompts. Please "
                    "provide input_ids or re-initialize the engine with skip_tokenizer_init=False."
                )
            text = obj.text
            if not isinstance(text, str):
                raise ValueError(f"text must be a string (or a list of strings), got {type(text).__name__}.")
            if len(text) > self.limits.max_prompt_chars and self.server_args.allow_auto_truncate:
                # Only the head is kept after tokenizing anyway: cut the text first, so a huge
                # prompt is not tokenized whole to be thrown away.
                text = text[: self.limits.max_prompt_chars]
            self.limits.check_prompt_chars(len(text))
            ids = self.tokenizer.encode(text)
        if not ids:
            raise ValueError("The input is empty: at least one token is required.")
        return ids, text

    def _check_lengths(self, input_ids: List[int], sp_dict: dict) -> List[int]:
        n, ctx = len(input_ids), self.context_len
        truncate = self.server_args.allow_auto_truncate
        if n >= ctx:
            if not truncate:
                raise ValueError(f"The input ({n} tokens) is longer than the model's context length ({ctx} tokens).")
            logger.warning(f"The input ({n} tokens) is longer than the model's context length ({ctx} tokens). "
                           "Truncating the input.")
            input_ids = input_ids[: ctx - 1]
            n = len(input_ids)
        max_new = sp_dict.get("max_new_tokens")
        if isinstance(max_new, int) and not isinstance(max_new, bool) and max_new + n >= ctx:
            if truncate:
                logger.warning(f"Requested token count ({n} input + {max_new} new) exceeds the model's context "
                               f"length ({ctx} tokens). Truncating max_new_tokens.")
                sp_dict["max_new_tokens"] = max(0, ctx - n)
            else:
                raise ValueError(
                    f"Requested token count exceeds the model's maximum context length of {ctx} tokens. "
                    f"You requested a total of {max_new + n} tokens: {n} tokens from the input messages and "
                    f"{max_new} tokens for the completion. Please reduce the number of tokens in the input messages "
                    f"or the completion to fit within the limit."
                )
        return input_ids

    def _token_ids_logprob(self, value) -> Optional[List[int]]:
        """Upstream's checks and texts (its newest tokenizer manager)."""
        if value is None or value == []:
            return None
        if not isinstance(value, list) or any(isinstance(t, bool) or not isinstance(t, int) for t in value):
            raise ValueError("token_ids_logprob must be a flat list of integers.")
        for t in value:
            if not 0 <= t < self.vocab_size:
                raise ValueError(
                    f"token_ids_logprob contains out-of-vocabulary token id {t}; valid range is [0, {self.vocab_size})."
                )
        return list(value)

    def _priority(self, priority):
        sa = self.server_args
        if priority is None:
            return sa.default_priority_value
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ValueError(f"priority must be an integer, got {priority!r}.")
        if not sa.enable_priority_scheduling and sa.abort_on_priority_when_disabled:
            raise ValueError("The request sets a priority, but priority scheduling is disabled "
                             "(--abort-on-priority-when-disabled; enable it with --enable-priority-scheduling).")
        return priority

    # --- PD ----------------------------------------------------------------------------------------
    def _check_bootstrap(self, obj: GenerateReqInput) -> None:
        if self.disagg_mode == "null":
            return
        if self.fake_transfer and obj.bootstrap_room is None:
            obj.bootstrap_room = next(self._fake_bootstrap_rooms)
        host, port = obj.bootstrap_host, obj.bootstrap_port
        if host is not None and not isinstance(host, str):
            raise ValueError(f"bootstrap_host must be a string, got {host!r}.")
        if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536):
            raise ValueError(f"bootstrap_port must be a TCP port number, got {port!r}.")
        local = host is None or host == FAKE_BOOTSTRAP_HOST
        if self.disagg_mode == "decode" and host is None and not self.fake_transfer:
            raise ValueError(
                "This is a PD decode server (--disaggregation-mode decode): a request needs bootstrap_host, "
                "bootstrap_port and bootstrap_room to find its prefill server; the router adds them. Send the "
                "request through the router (or set bootstrap_host to 2.2.2.2 to prefill it on this server)."
            )
        if not local and obj.bootstrap_room is None:
            raise ValueError("bootstrap_room is required when bootstrap_host is set (the router adds both).")
        if not local and self.bootstrap_hosts is not None:
            problem = self.bootstrap_hosts.problem(host, port or self.server_args.disaggregation_bootstrap_port)
            if problem is not None:
                raise ValueError(problem)


def _combine_extra_key(extra_key, cache_salt):
    if extra_key is None and cache_salt is None:
        return None
    return f"{extra_key or ''}|{cache_salt or ''}"
