"""`stop_regex`: checked on RE2 (linear time in the text), only over the output's tail.

Why: with Python's backtracking `re`, a pattern such as `(a+)+b` over an output of forced "a"s
takes time exponential in the output's length, and the scheduler runs the check after every
token, so one request froze generation for every client. RE2 (`google-re2`, `import re2`) has no
backtracking: a search costs time linear in the text. It does not support backreferences or
lookaround; such a pattern is refused at validation with RE2's own reason (HTTP 400).

Limits, each refused with a 400 that names it (env variables, read per request):
  * `SGLANG_STOP_REGEX_MAX_COUNT` (default 16): patterns per request;
  * `SGLANG_STOP_REGEX_MAX_LENGTH` (default 1024): characters per pattern. This also bounds how
    deeply a pattern can nest (a 5,000-deep pattern used to end in a RecursionError, a 500).

Tail window: generation stops at the first match, and the check runs after every token, so a new
match must end in the newest text; everything before it was already searched. Each step searches
only the decoded text of the last `window_tokens` tokens:
  * a pattern whose longest match is bounded (`a{10}`, `stop|end`, `b.{0,300}b`) gets exactly
    that length, up to `4 * SGLANG_STOP_REGEX_MAX_LENGTH` characters;
  * an unbounded one (`a.*b`, `\\d+`) gets `max(4 * len(pattern), 256)` characters, so a match
    longer than that (the part a `*` or `+` repeats being longer) is not seen;
plus 2 tokens (as upstream: a token decodes to at least one character, and the first token of a
decoded window may render differently). When the window does not reach the output's start, the
search starts at its second character, so `^` and `\\A` never match at a cut in the middle of
the output (`\\b` sees the character before). Cost per step: one decode of at most
`4 * SGLANG_STOP_REGEX_MAX_LENGTH + 2` tokens and one linear search per pattern.

RE2's syntax is Perl's minus the features above; `\\d`, `\\w`, `\\s` and `\\b` are ASCII-only there.
"""

from __future__ import annotations

import functools
import os
import re
import re._constants as _sre_constants
import re._parser as _sre_parser
from typing import Callable, List, Optional, Sequence

import re2

DEFAULT_MAX_COUNT = 16
DEFAULT_MAX_LENGTH = 1024
UNBOUNDED_WINDOW_MIN_CHARS = 256
UNBOUNDED_WINDOW_PER_PATTERN_CHAR = 4
WINDOW_EXTRA_TOKENS = 2
# Length counted for an unbounded regex repetition (`*`, `+`, `{n,}`), as upstream's MAX_LEN.
REGEX_UNBOUNDED_LEN = 1 << 30


def max_count() -> int:
    return int(os.environ.get("SGLANG_STOP_REGEX_MAX_COUNT", DEFAULT_MAX_COUNT))


def max_length() -> int:
    return int(os.environ.get("SGLANG_STOP_REGEX_MAX_LENGTH", DEFAULT_MAX_LENGTH))


def _options() -> "re2.Options":
    opts = re2.Options()
    opts.log_errors = False  # a client's bad pattern is its 400, not a line on the server's stderr
    return opts


@functools.lru_cache(maxsize=512)
def compile_stop_regex(pattern: str):
    """The compiled RE2 pattern (cached: every request with this pattern shares it); raises
    ValueError with RE2's reason when RE2 cannot compile it."""
    try:
        return re2.compile(pattern, _options())
    except re2.error as e:
        reason = e.args[0].decode("utf-8", "replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        raise ValueError(
            f"Invalid stop_regex {_shown(pattern)}: {reason}. stop_regex runs on RE2 (linear time), "
            "which has no backreferences or lookaround."
        ) from None


def validate_stop_regexes(patterns: Optional[Sequence[str]]) -> None:
    """Count, length and RE2 syntax of a request's stop regexes (ValueError -> HTTP 400)."""
    if not patterns:
        return
    if len(patterns) > max_count():
        raise ValueError(f"stop_regex has {len(patterns)} patterns; at most {max_count()} are allowed "
                         "(SGLANG_STOP_REGEX_MAX_COUNT).")
    for pattern in patterns:
        if len(pattern) > max_length():
            raise ValueError(f"stop_regex pattern is {len(pattern)} characters long; at most {max_length()} "
                             "are allowed (SGLANG_STOP_REGEX_MAX_LENGTH).")
    for pattern in patterns:
        compile_stop_regex(pattern)


def window_chars(pattern: str) -> int:
    """Characters of output text a match of `pattern` is looked for in (see the module doc).

    The longest match is read with Python's parser, whose syntax differs from RE2's in corners
    (RE2 reads `a{,3}` as literal text): no shorter than the pattern itself, which covers a
    literal reading, and unbounded where Python cannot parse it."""
    longest = max(get_max_seq_length(pattern), len(pattern))
    if longest < REGEX_UNBOUNDED_LEN:
        return min(longest, UNBOUNDED_WINDOW_PER_PATTERN_CHAR * max_length())
    return max(UNBOUNDED_WINDOW_PER_PATTERN_CHAR * len(pattern), UNBOUNDED_WINDOW_MIN_CHARS)


class StopRegexMatcher:
    """A request's stop regexes, compiled once, checked on the tail of its output."""

    def __init__(self, patterns: Sequence[str]):
        self.patterns: List[tuple] = [(p, compile_stop_regex(p)) for p in patterns]
        self.window_tokens = max((window_chars(p) for p in patterns), default=0) + WINDOW_EXTRA_TOKENS

    def first_match(self, output_ids: Sequence[int], decode: Callable[[Sequence[int]], str]) -> Optional[str]:
        """The first pattern (in the request's order) found in the output's tail, or None."""
        n = min(self.window_tokens, len(output_ids))
        text = decode(output_ids[len(output_ids) - n:])
        start = 1 if n < len(output_ids) else 0  # a cut mid-output is not the start of the text
        for pattern, compiled in self.patterns:
            if compiled.search(text, start) is not None:
                return pattern
        return None


def get_max_seq_length(regex_str: str) -> int:
    """Longest string (in characters) a regex can match; unbounded repeats count as 2**30.

    Used, like upstream, to know how much trailing text must be kept to match a stop regex. A
    pattern Python's parser refuses (RE2-only syntax such as `\\pL`) or nests too deeply for its
    recursion counts as unbounded: the caller must never fail on a pattern RE2 accepted.
    """
    try:
        return _max_len(_sre_parser.parse(regex_str))
    except (re.error, RecursionError, OverflowError, ValueError):
        return REGEX_UNBOUNDED_LEN


def _max_len(subpattern) -> int:
    c = _sre_constants
    total = 0
    for op, value in subpattern:
        if op in (c.LITERAL, c.NOT_LITERAL, c.IN, c.ANY):
            total += 1
        elif op == c.SUBPATTERN:
            total += _max_len(value[-1])
        elif op == c.BRANCH:
            total += max((_max_len(b) for b in value[1]), default=0)
        elif op in (c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", None)):
            _, hi, inner = value
            total += REGEX_UNBOUNDED_LEN if hi == c.MAXREPEAT else hi * _max_len(inner)
        elif op in (c.ASSERT, c.ASSERT_NOT, c.AT):
            continue
        elif op == c.GROUPREF_EXISTS:
            _, yes, no = value
            total += max(_max_len(yes), _max_len(no) if no else 0)
        elif op == getattr(c, "ATOMIC_GROUP", None):
            total += _max_len(value)
        else:  # GROUPREF and anything exotic: no static bound.
            total += REGEX_UNBOUNDED_LEN
    return min(total, REGEX_UNBOUNDED_LEN)


def _shown(pattern: str, limit: int = 80) -> str:
    return repr(pattern) if len(pattern) <= limit else repr(pattern[:limit]) + "..."
