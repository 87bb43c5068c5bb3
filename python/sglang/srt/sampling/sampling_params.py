"""Per-request sampling parameters, with upstream SGLang's names, defaults and error messages.

Clients send these as the `sampling_params` dict of `/generate` (and the OpenAI adapters map their
fields onto them), so field names, defaults and the text of every `ValueError` raised by `verify`
are user-visible facts and follow upstream (`python/sglang/srt/sampling/sampling_params.py`).

Life cycle, as upstream: `SamplingParams(**d)` (unknown keys raise Python's own `TypeError`
"SamplingParams.__init__() got an unexpected keyword argument 'x'", exactly what upstream does),
then `normalize(tokenizer)` (stop strings to lists, their token lengths), then
`verify(vocab_size)`. A temperature below `_SAMPLING_EPS` is turned into greedy decoding
(`top_k = 1`, `temperature = 1.0`) already in `__init__`, and `top_k = -1` becomes `TOP_K_ALL`,
so the sampler only ever sees positive top-k values and positive temperatures.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Union

from sglang.srt.sampling.stop_regex import get_max_seq_length, validate_stop_regexes

_SAMPLING_EPS = 1e-6
# "Whole vocabulary": larger than any vocabulary; the sampler clamps it to the logits' width.
TOP_K_ALL = 1 << 30


class SamplingParams:
    """Sampling parameters of one request (upstream's fields and defaults)."""

    def __init__(
        self,
        max_new_tokens: Optional[int] = 128,
        stop: Optional[Union[str, List[str]]] = None,
        stop_token_ids: Optional[List[int]] = None,
        stop_regex: Optional[Union[str, List[str]]] = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        min_p: float = 0.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        repetition_penalty: float = 1.0,
        min_new_tokens: int = 0,
        n: int = 1,
        json_schema: Optional[str] = None,
        regex: Optional[str] = None,
        ebnf: Optional[str] = None,
        structural_tag: Optional[str] = None,
        ignore_eos: bool = False,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
        no_stop_trim: bool = False,
        custom_params: Optional[Dict[str, Any]] = None,
        stream_interval: Optional[int] = None,
        logit_bias: Optional[Dict[str, float]] = None,
        sampling_seed: Optional[int] = None,
    ) -> None:
        self.max_new_tokens = max_new_tokens
        self.stop_strs = stop
        self.stop_token_ids = set(stop_token_ids) if stop_token_ids else None
        self.stop_regex_strs = stop_regex
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.min_p = min_p
        self.frequency_penalty = frequency_penalty
        self.presence_penalty = presence_penalty
        self.repetition_penalty = repetition_penalty
        self.min_new_tokens = min_new_tokens
        self.n = n
        self.json_schema = json_schema
        self.regex = regex
        self.ebnf = ebnf
        self.structural_tag = structural_tag
        self.ignore_eos = ignore_eos
        self.skip_special_tokens = skip_special_tokens
        self.spaces_between_special_tokens = spaces_between_special_tokens
        self.no_stop_trim = no_stop_trim
        self.custom_params = custom_params
        self.stream_interval = stream_interval
        self.logit_bias = logit_bias
        self.sampling_seed = sampling_seed
        # Filled by normalize().
        self.stop_str_max_len = 0
        self.stop_regex_max_len = 0

        # Special cases, as upstream: a (near-)zero temperature means greedy decoding, which the
        # sampler expresses as top_k == 1 with a neutral temperature.
        if _is_number(self.temperature) and 0 <= self.temperature < _SAMPLING_EPS:
            self.temperature = 1.0
            self.top_k = 1
        if self.top_k == -1:
            self.top_k = TOP_K_ALL

    @classmethod
    def from_dict(cls, d: Optional[Dict[str, Any]]) -> "SamplingParams":
        """`SamplingParams(**d)`: an unknown key raises upstream's TypeError unchanged."""
        return cls(**(d or {}))

    @property
    def is_greedy(self) -> bool:
        return self.top_k <= 1

    def check_types(self) -> None:
        """Rejects values of the wrong JSON type (a raw `/generate` dict can hold anything) before
        `normalize` and `verify` compute with them; ValueError with the field's name."""
        for name in ("max_new_tokens", "sampling_seed", "stream_interval"):
            v = getattr(self, name)
            if v is not None and not _is_int(v):
                raise ValueError(f"{name} must be an integer, got {v!r}.")
        for name in ("min_new_tokens", "top_k", "n"):
            if not _is_int(getattr(self, name)):
                raise ValueError(f"{name} must be an integer, got {getattr(self, name)!r}.")
        for name in ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty"):
            if not _is_number(getattr(self, name)):
                raise ValueError(f"{name} must be a number, got {getattr(self, name)!r}.")
        for name in ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a boolean, got {getattr(self, name)!r}.")
        for name, value in (("stop", self.stop_strs), ("stop_regex", self.stop_regex_strs)):
            if value is not None and not isinstance(value, str) and not (
                isinstance(value, list) and all(isinstance(x, str) for x in value)
            ):
                raise ValueError(f"{name} must be a string or a list of strings, got {value!r}.")
        if self.stop_token_ids is not None and not all(_is_int(t) for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be a list of integers, got {sorted(map(repr, self.stop_token_ids))}.")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict) or not all(_is_number(v) for v in self.logit_bias.values()):
                raise ValueError(f"logit_bias must map token ids to numbers, got {self.logit_bias!r}.")
            for key in self.logit_bias:
                try:
                    int(key)
                except (TypeError, ValueError):
                    raise ValueError(f"logit_bias keys must be token ids, got {key!r}.") from None
        if self.custom_params is not None and not isinstance(self.custom_params, dict):
            raise ValueError(f"custom_params must be an object, got {self.custom_params!r}.")
        # RE2 syntax, pattern count and length (sampling/stop_regex.py): a 400 here, never a stall later.
        validate_stop_regexes([self.stop_regex_strs] if isinstance(self.stop_regex_strs, str) else self.stop_regex_strs)

    def verify(self, vocab_size: int) -> None:
        """Rejects out-of-range values with upstream's messages (ValueError)."""
        t = self.temperature
        if not _is_number(t) or not math.isfinite(t) or t < 0.0:
            raise ValueError(f"temperature must be a non-negative finite number, got {t}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}.")
        if self.top_k < 1:
            raise ValueError(f"top_k must be -1 (disable) or at least 1, got {self.top_k}.")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise ValueError(
                f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}."
            )
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise ValueError(
                f"presence_penalty must be in [-2, 2], got {self.presence_penalty}."
            )
        if not 0.0 <= self.repetition_penalty <= 2.0:
            raise ValueError(
                f"repetition_penalty must be in [0, 2], got {self.repetition_penalty}."
            )
        if not 0 <= self.min_new_tokens:
            raise ValueError(
                f"min_new_tokens must be in [0, max_new_tokens], got {self.min_new_tokens}."
            )
        if self.max_new_tokens is not None:
            if self.max_new_tokens < 0:
                raise ValueError(
                    f"max_new_tokens must be at least 0, got {self.max_new_tokens}."
                )
            if not self.min_new_tokens <= self.max_new_tokens:
                raise ValueError(
                    f"min_new_tokens must be in [0, max_new_tokens({self.max_new_tokens})], "
                    f"got {self.min_new_tokens}."
                )
        if self.logit_bias is not None:
            for token_id in self.logit_bias:
                if not 0 <= int(token_id) < vocab_size:
                    raise ValueError(
                        f"logit_bias must has keys in [0, {vocab_size - 1}], got {token_id}."
                    )
        grammars = [self.json_schema, self.regex, self.ebnf]  # mutually exclusive
        if sum(g is not None for g in grammars) > 1:
            raise ValueError("Only one of regex, json_schema, or ebnf can be set.")

    def normalize(self, tokenizer) -> None:
        """Stop strings/regexes to lists and the longest of them in tokens (upstream semantics).

        `stop_str_max_len` bounds how many trailing tokens the detokenizer must re-decode to
        spot a stop string; without a tokenizer it falls back to the length in characters.
        """
        if self.stop_strs is None:
            self.stop_strs = []
            self.stop_str_max_len = 0
        else:
            if isinstance(self.stop_strs, str):
                self.stop_strs = [self.stop_strs]
            max_len = 0
            for stop_str in self.stop_strs:
                if tokenizer is not None:
                    ids = tokenizer.encode(stop_str, add_special_tokens=False)
                    max_len = max(max_len, len(ids))
                else:
                    max_len = max(max_len, len(stop_str))
            self.stop_str_max_len = max_len

        if self.stop_regex_strs is None:
            self.stop_regex_strs = []
            self.stop_regex_max_len = 0
        else:
            if isinstance(self.stop_regex_strs, str):
                self.stop_regex_strs = [self.stop_regex_strs]
            self.stop_regex_max_len = max(
                (get_max_seq_length(r) for r in self.stop_regex_strs), default=0
            )

    def to_dict(self) -> Dict[str, Any]:
        """Current attribute values (after normalization), for logging and server info."""
        return {k: (sorted(v) if isinstance(v, set) else v) for k, v in vars(self).items()}

    def __repr__(self) -> str:
        return f"SamplingParams({self.to_dict()})"


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
