"""(Tokenizer/HTTP process, and the scheduler for the grammar cache.) The limits on what one
request may ask for, read from the environment in this one place.

Why: every input the server accepts has a cost that grows with its size (tokenizing a prompt,
rendering a template, matching stop strings, building prompt-logprob tuples, keeping compiled
grammars). Without a bound, one request can stall the HTTP event loop or exhaust the memory of
the scheduler for everyone. Each limit is checked as early as it can be (the body size before
anything is parsed, the prompt's characters before it is tokenized), with a 400 (413 for the
body) that names the limit and the variable that raises it.

Upstream SGLang has none of these variables; where OpenAI documents a bound (top_logprobs <= 20,
completions logprobs <= 5) the default is OpenAI's, with OpenAI's message. The other defaults are
far above what a legitimate request needs.
"""

from __future__ import annotations

import dataclasses
import os
import reprlib
from typing import Any, List, Mapping, Optional, Sequence

MIB = 1 << 20
# Characters per token that a prompt may have on average before it is refused without being
# tokenized (real text averages 3-5; runs of spaces or digits merged into one token stay far below).
PROMPT_CHARS_PER_TOKEN = 16
MIN_PROMPT_CHARS = 1 << 16
# Error messages never carry more than this many characters of the client's input back.
MAX_ERROR_MESSAGE_CHARS = 2000

# name -> (env variable, default); None = derived from the model's context length.
_ENV = {
    "max_body_bytes": ("SGLANG_MAX_REQUEST_BODY_BYTES", 32 * MIB),
    "max_json_depth": ("SGLANG_MAX_JSON_DEPTH", 64),
    "max_prompt_chars": ("SGLANG_MAX_PROMPT_CHARS", None),
    "max_top_logprobs": ("SGLANG_MAX_TOP_LOGPROBS", 20),
    "max_completion_logprobs": ("SGLANG_MAX_COMPLETION_LOGPROBS", 5),
    "max_token_ids_logprob": ("SGLANG_MAX_TOKEN_IDS_LOGPROB", 1024),
    "max_logprob_entries": ("SGLANG_MAX_LOGPROB_ENTRIES", 1 << 20),
    "max_stop_strings": ("SGLANG_MAX_STOP_STRINGS", 128),
    "max_stop_string_chars": ("SGLANG_MAX_STOP_STRING_CHARS", 1024),
    "max_sequences": ("SGLANG_MAX_SEQUENCES_PER_REQUEST", 1024),
    "max_tokenize_batch": ("SGLANG_MAX_TOKENIZE_BATCH", 1024),
    "grammar_cache_entries": ("SGLANG_GRAMMAR_CACHE_SIZE", 1024),
    "cpu_worker_threads": ("SGLANG_CPU_WORKER_THREADS", 4),
}


def _env_int(name: str, default: Optional[int], environ: Mapping[str, str]) -> Optional[int]:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be a positive integer, got {raw!r}.") from None
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, got {raw!r}.")
    return value


def env_limit(field: str, environ: Optional[Mapping[str, str]] = None) -> int:
    """One limit that does not depend on the model (e.g. the grammar cache size in the scheduler)."""
    name, default = _ENV[field]
    return _env_int(name, default, os.environ if environ is None else environ)


def env_name(field: str) -> str:
    return _ENV[field][0]


_clip_repr = reprlib.Repr()
_clip_repr.maxstring = 120
_clip_repr.maxother = 120
_clip_repr.maxlist = _clip_repr.maxtuple = _clip_repr.maxdict = _clip_repr.maxset = 8
_clip_repr.maxlevel = 3


def clip(value: Any) -> str:
    """A short repr of a client's value for an error message (a 5 MB field stays a few dozen bytes)."""
    return _clip_repr.repr(value)


def clip_message(message: str) -> str:
    if len(message) <= MAX_ERROR_MESSAGE_CHARS:
        return message
    return message[:MAX_ERROR_MESSAGE_CHARS] + f"... [{len(message) - MAX_ERROR_MESSAGE_CHARS} more characters]"


@dataclasses.dataclass(frozen=True)
class RequestLimits:
    max_body_bytes: int
    max_json_depth: int
    max_prompt_chars: int
    max_top_logprobs: int
    max_completion_logprobs: int
    max_token_ids_logprob: int
    max_logprob_entries: int
    max_stop_strings: int
    max_stop_string_chars: int
    max_sequences: int
    max_tokenize_batch: int
    grammar_cache_entries: int
    cpu_worker_threads: int

    @classmethod
    def from_env(cls, context_len: int, environ: Optional[Mapping[str, str]] = None) -> "RequestLimits":
        environ = os.environ if environ is None else environ
        values = {field: _env_int(name, default, environ) for field, (name, default) in _ENV.items()}
        if values["max_prompt_chars"] is None:
            values["max_prompt_chars"] = max(MIN_PROMPT_CHARS, PROMPT_CHARS_PER_TOKEN * int(context_len))
        return cls(**values)

    # --- checks (each raises ValueError: the client gets it as a 400) -----------------------------
    def check_prompt_chars(self, n_chars: int, what: str = "The prompt") -> None:
        if n_chars > self.max_prompt_chars:
            raise ValueError(
                f"{what} has {n_chars} characters; at most {self.max_prompt_chars} are accepted before "
                f"tokenization ({env_name('max_prompt_chars')})."
            )

    def check_messages_chars(self, contents: Sequence[Any]) -> None:
        """Chat messages: their text is counted before the template renders it."""
        total = 0
        for c in contents:
            if isinstance(c, str):
                total += len(c)
            elif isinstance(c, list):
                total += sum(len(getattr(p, "text", None) or "") for p in c)
        self.check_prompt_chars(total, "The messages' content")

    def check_top_logprobs(self, value: Optional[int]) -> None:
        """Chat `top_logprobs` (OpenAI's bound and text)."""
        _check_openai_bound("top_logprobs", value, self.max_top_logprobs)

    def check_completion_logprobs(self, value: Optional[int]) -> None:
        """Completions `logprobs` (OpenAI's bound and text)."""
        _check_openai_bound("logprobs", value, self.max_completion_logprobs)

    def check_stop_strings(self, stop: Any) -> None:
        """Before the stop strings are tokenized (each one is, to size the detokenizer's window)."""
        if stop is None:
            return
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list):
            return  # SamplingParams.check_types gives the type error
        if len(stops) > self.max_stop_strings:
            raise ValueError(f"stop has {len(stops)} strings; at most {self.max_stop_strings} are accepted "
                             f"({env_name('max_stop_strings')}).")
        for s in stops:
            if isinstance(s, str) and len(s) > self.max_stop_string_chars:
                raise ValueError(f"A stop string has {len(s)} characters; at most {self.max_stop_string_chars} "
                                 f"are accepted ({env_name('max_stop_string_chars')}).")

    def check_logprob_work(self, prompt_len: int, logprob_start_len: int, max_new_tokens: int,
                           top_logprobs_num: int, token_ids_logprob: Optional[List[int]]) -> None:
        """Logprobs cost positions x (1 + top k + token ids) entries, built in the scheduler and
        sent back; an 8k-token prompt from position 0 with 49,152 token ids would be ~4e8."""
        n_ids = len(token_ids_logprob or ())
        if n_ids > self.max_token_ids_logprob:
            raise ValueError(f"token_ids_logprob has {n_ids} token ids; at most {self.max_token_ids_logprob} "
                             f"are accepted ({env_name('max_token_ids_logprob')}).")
        prompt_rows = max(0, prompt_len - logprob_start_len) if logprob_start_len >= 0 else 0
        positions = prompt_rows + max(0, max_new_tokens)
        per_position = 1 + top_logprobs_num + n_ids
        entries = positions * per_position
        if entries > self.max_logprob_entries:
            raise ValueError(
                f"The request asks for logprobs at {positions} positions ({prompt_rows} prompt, {max_new_tokens} "
                f"new) x {per_position} tokens each = {entries} entries; at most {self.max_logprob_entries} are "
                f"served ({env_name('max_logprob_entries')}). Ask for fewer top logprobs or token_ids_logprob, "
                "a later logprob_start_len or fewer new tokens."
            )

    def check_sequences(self, batch_size: int, n: int) -> None:
        total = batch_size * n
        if total > self.max_sequences:
            raise ValueError(
                f"The request expands to {total} sequences ({batch_size} prompt(s) x n={n}); at most "
                f"{self.max_sequences} are served in one request ({env_name('max_sequences')})."
            )

    def check_tokenize_batch(self, size: int) -> None:
        if size > self.max_tokenize_batch:
            raise ValueError(f"The request has {size} prompts; at most {self.max_tokenize_batch} are tokenized in "
                             f"one request ({env_name('max_tokenize_batch')}).")


def json_depth_exceeds(value: Any, limit: int) -> bool:
    """Whether `value` (parsed JSON) nests deeper than `limit` containers. Iterative: a deep
    document must not hit Python's recursion limit here (it did later, when pickled)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(v, dict):
            stack.extend((x, depth + 1) for x in v.values() if isinstance(x, (dict, list)))
        elif isinstance(v, list):
            stack.extend((x, depth + 1) for x in v if isinstance(x, (dict, list)))
    return False


def nesting_upper_bound(raw: bytes) -> int:
    """A cheap bound on a JSON document's depth: it cannot nest deeper than it has brackets."""
    return raw.count(b"[") + raw.count(b"{")


def _check_openai_bound(name: str, value: Optional[int], maximum: int) -> None:
    """An integer field in [0, maximum], refused in OpenAI's words."""
    if value is not None and value > maximum:
        raise ValueError(f"Invalid '{name}': integer above maximum value. Expected a value <= {maximum}, "
                         f"but got {value} instead.")
    if value is not None and value < 0:
        raise ValueError(f"Invalid '{name}': integer below minimum value. Expected a value >= 0, "
                         f"but got {value} instead.")
