"""Seeded random requests over the whole API surface, each with the answer it must get.

`CaseGenerator(target, seed).make(i)` returns a `FuzzCase`: a route, a JSON body (or raw bytes),
whether it is valid, and what a valid answer must look like (how many sequences, the token
budget, whether logprobs must be there). Valid cases cover every request shape the API allows
(n > 1, batches, batch x n, streams, logprobs / echo / top_logprobs / token_ids_logprob, stop
strings and regexes, max_tokens and max_completion_tokens, long outputs, 1-token prompts,
prompts near the context limit); invalid ones change exactly one thing into something upstream
refuses with a 400 (and say what, for the report).

Expectations come from upstream's documented behaviour (reference section 6), not from this
server's code: e.g. a batch of B prompts with n samples answers B * n sequences in prompt-major
order, and greedy samples of one prompt are identical. Seeded samples are not required to be
identical: a seed fixes the draws, but the logits' last bits depend on the batch a sample runs in
(kernel choice by row count, chunking, prefix hits), and on a tiny random model's near-flat
distribution that flips draws (OpenAI documents seeded sampling as best effort).
"""

from __future__ import annotations

import dataclasses
import json
import random
from typing import Any, List, Optional

WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "then", "it", "ran", "away", "far", "hello", "world", "Paris",
         "1", "2", "3", ",", ".", "!", "\n", "é", "日本", "🙂"]


TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 999}}, "required": ["x"]}}},
         # sglang-router 0.3.2 refuses a function without `parameters` (its own 400)
         {"type": "function", "function": {"name": "g", "description": "no arguments",
                                           "parameters": {"type": "object", "properties": {}}}}]

# (sampling key, spec, a regex of the grammar's language) for valid constrained cases.
GRAMMARS = [
    ("regex", r"(yes|no)(, [0-9]{1,3}){0,3}", r"(yes|no)(, [0-9]{1,3}){0,3}"),
    ("ebnf", 'root ::= ("cat" | "dog") (" " [a-z])*', r"(cat|dog)( [a-z])*"),
    ("json_schema", '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], '
                    '"additionalProperties": false}', r'\{\s*"a"\s*:\s*-?[0-9]+\s*\}'),
]


@dataclasses.dataclass
class FuzzTarget:
    """What the front end in front of the servers accepts (a plain server accepts everything)."""

    url: str
    vocab_size: int
    context_len: int
    # sglang-router 0.3.2 in front (observed): it refuses /generate text batches and token-id
    # prompts on /v1/completions itself (422); it forwards only the /generate sampling keys it
    # knows (stop_regex, logit_bias and unknown keys are dropped, so they cannot be refused),
    # drops stop_regex and rid on chat, and does not forward /v1/tokenize.
    behind_sglang_router: bool = False
    tokenize_routes: bool = True  # /v1/tokenize, /v1/detokenize (load balancers do not forward them)
    abort_urls: List[str] = dataclasses.field(default_factory=list)  # where /abort_request goes
    pd: bool = False
    # Caps the "near the context limit" prompts (soaks on slow machines: an 8k-token prefill on two
    # shared cores takes ~40 s); None: up to the context limit.
    max_prompt_tokens: Optional[int] = None


@dataclasses.dataclass
class FuzzCase:
    index: int
    route: str
    body: Any  # a dict sent as JSON, or bytes sent as is
    valid: bool
    what: str  # one-line description (invalid: what was broken)
    stream: bool = False
    num_seqs: int = 1  # sequences the answer must hold (prompts x n)
    is_list: bool = False  # /generate answers a list (batch or n > 1)
    max_tokens: Optional[int] = None
    ignore_eos: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    echo: bool = False
    greedy: bool = False
    n: int = 1
    cut_after: Optional[int] = None  # streams: the client hangs up after this many events
    abort_after: Optional[float] = None  # seconds after sending, /abort_request this rid
    rid: Optional[str] = None
    # Structured output: the answer's text must fullmatch this when the grammar ended it ("stop").
    grammar_regex: Optional[str] = None


class CaseGenerator:
    def __init__(self, target: FuzzTarget, seed: int = 0, invalid_share: float = 0.3):
        self.t = target
        self.rng = random.Random(seed)
        self.invalid_share = invalid_share

    # --- pieces ---------------------------------------------------------------------------------
    def _text(self, words: Optional[int] = None) -> str:
        r = self.rng
        return " ".join(r.choice(WORDS) for _ in range(words or r.randint(1, 12)))

    def _ids(self, n: Optional[int] = None) -> List[int]:
        r = self.rng
        if n is None:
            n = r.choice([1, 1, 2, 3, 5, 8, 13, 21, 34])
        return [r.randrange(self.t.vocab_size) for _ in range(n)]

    def _budget(self) -> int:
        r = self.rng.random()
        if r < 0.05:
            return 0
        if r < 0.12:
            return self.rng.randint(64, 160)  # a long output
        return self.rng.randint(1, 16)

    def _sampling(self, case: FuzzCase) -> dict:
        """Native sampling params; OpenAI builders rename what they need."""
        r = self.rng
        sp: dict = {}
        if r.random() < 0.5:
            sp["temperature"] = 0.0
            case.greedy = True
        else:
            sp["temperature"] = round(r.uniform(0.1, 1.5), 3)
            if r.random() < 0.5:
                sp["top_p"] = round(r.uniform(0.05, 1.0), 3)
            if r.random() < 0.4:
                sp["top_k"] = r.choice([-1, 1, 5, 40])
            if r.random() < 0.3:
                sp["min_p"] = round(r.uniform(0.0, 0.3), 3)
            if r.random() < 0.4:
                sp["sampling_seed"] = r.randrange(1 << 20)
        if r.random() < 0.2:
            sp["frequency_penalty"] = round(r.uniform(-2, 2), 2)
        if r.random() < 0.2:
            sp["presence_penalty"] = round(r.uniform(-2, 2), 2)
        if r.random() < 0.2:
            sp["repetition_penalty"] = round(r.uniform(0.5, 2.0), 2)
        if r.random() < 0.25:
            sp["stop"] = r.sample(WORDS, r.randint(1, 3)) if r.random() < 0.5 else r.choice(WORDS)
        if r.random() < 0.15:
            sp["stop_token_ids"] = [r.randrange(self.t.vocab_size) for _ in range(2)]
        if r.random() < 0.15:
            sp["stop_regex"] = r.choice([r"\d", r"[A-Z][a-z]+", r"\s\s", r"(cat|dog)"])
        if r.random() < 0.5:
            sp["ignore_eos"] = True
            case.ignore_eos = True
        if r.random() < 0.1:
            sp["min_new_tokens"] = 1
        if r.random() < 0.1:
            sp["skip_special_tokens"] = False
        if r.random() < 0.1:
            sp["no_stop_trim"] = True
        if r.random() < 0.12:
            self._constrain(case, sp)
        return sp

    def _constrain(self, case: FuzzCase, sp: dict) -> None:
        """A grammar constraint (the native key; OpenAI builders may turn json into response_format).
        Stop conditions that would cut the grammar's text short are dropped."""
        kind, spec, pattern = self.rng.choice(GRAMMARS)
        for key in ("stop", "stop_token_ids", "stop_regex", "min_new_tokens", "ignore_eos", "skip_special_tokens",
                    "no_stop_trim"):
            sp.pop(key, None)
        case.ignore_eos = False
        sp[kind] = spec
        case.grammar_regex = pattern

    # --- one case ---------------------------------------------------------------------------------
    def make(self, index: int) -> FuzzCase:
        r = self.rng
        routes = ["generate"] * 4 + ["completions"] * 3 + ["chat"] * 3
        if self.t.tokenize_routes:
            routes += ["tokenize"]
        route = r.choice(routes)
        case = getattr(self, f"_{route}")(index)
        if case.valid and r.random() < 0.3:
            case.rid = f"fz{index}-{r.randrange(1 << 30):x}"
            if isinstance(case.body, dict) and route in ("generate", "completions", "chat"):
                case.body["rid"] = case.rid
                if self.t.abort_urls and r.random() < 0.3:
                    case.abort_after = round(r.uniform(0.0, 0.4), 3)
        if case.valid and case.stream and r.random() < 0.3:
            case.cut_after = r.randint(1, 3)
        if r.random() < self.invalid_share:
            return self._break(case)
        return case

    def _generate(self, index: int) -> FuzzCase:
        r = self.rng
        case = FuzzCase(index, "/generate", {}, True, "generate")
        batch = r.random() < 0.3
        size = r.randint(1, 3) if batch else 1
        use_text = r.random() < 0.5 and (not batch or not self.t.behind_sglang_router)
        if use_text:
            case.body["text"] = [self._text() for _ in range(size)] if batch else self._text()
        else:
            case.body["input_ids"] = [self._ids() for _ in range(size)] if batch else self._long_or_short_ids()
        sp = self._sampling(case)
        budget = self._budget()
        sp["max_new_tokens"] = budget
        if budget == 0:
            sp.pop("min_new_tokens", None)  # min_new_tokens <= max_new_tokens
        case.max_tokens = budget
        n = r.choice([1, 1, 1, 2, 3])
        if n > 1:
            sp["n"] = n
        case.n = n
        case.body["sampling_params"] = sp
        case.num_seqs = size * n
        case.is_list = batch or n > 1
        if r.random() < 0.3:
            case.logprobs = True
            case.body["return_logprob"] = True
            case.top_logprobs = r.choice([0, 0, 2, 5])
            if case.top_logprobs:
                case.body["top_logprobs_num"] = case.top_logprobs
            if r.random() < 0.3:
                case.body["logprob_start_len"] = 0
            if r.random() < 0.3:
                case.body["token_ids_logprob"] = [r.randrange(self.t.vocab_size) for _ in range(2)]
            case.body["return_text_in_logprobs"] = r.random() < 0.5
        if r.random() < 0.3:
            case.stream = True
            case.body["stream"] = True
        case.what = f"generate batch={size} n={n} stream={case.stream} logprob={case.logprobs} budget={budget}"
        return case

    def _long_or_short_ids(self) -> List[int]:
        if self.rng.random() < 0.05:  # near the context limit (room left for the output budget)
            n = self.t.context_len - 170 - self.rng.randint(0, 8)
            return self._ids(n if self.t.max_prompt_tokens is None else min(n, self.t.max_prompt_tokens))
        return self._ids()

    def _openai_sampling(self, case: FuzzCase, chat: bool) -> dict:
        sp = self._sampling(case)
        body = {}
        rename = {"sampling_seed": "seed", "min_new_tokens": "min_tokens"}
        for k, v in sp.items():
            body[rename.get(k, k)] = v
        if "json_schema" in body and self.rng.random() < 0.6:  # the OpenAI way to ask for it
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "answer", "schema": json.loads(body.pop("json_schema"))}}
        budget = max(self._budget(), 1)
        key = "max_completion_tokens" if chat and self.rng.random() < 0.5 else "max_tokens"
        body[key] = budget
        case.max_tokens = budget
        n = self.rng.choice([1, 1, 2, 3])
        body["n"] = n
        case.n = n
        return body

    def _completions(self, index: int) -> FuzzCase:
        r = self.rng
        case = FuzzCase(index, "/v1/completions", {"model": "default"}, True, "completions")
        kind = r.choice(["text", "texts"] if self.t.behind_sglang_router else ["text", "texts", "ids", "id_batch"])
        prompts = {"text": lambda: self._text(), "texts": lambda: [self._text() for _ in range(r.randint(1, 3))],
                   "ids": lambda: self._ids(), "id_batch": lambda: [self._ids() for _ in range(r.randint(1, 3))]}
        case.body["prompt"] = prompts[kind]()
        size = len(case.body["prompt"]) if kind in ("texts", "id_batch") else 1
        case.body.update(self._openai_sampling(case, chat=False))
        if r.random() < 0.3:
            case.logprobs = True
            case.top_logprobs = r.choice([0, 1, 3])
            case.body["logprobs"] = case.top_logprobs
            case.echo = r.random() < 0.4
            case.body["echo"] = case.echo
        if r.random() < 0.3:
            case.stream = True
            case.body["stream"] = True
            if r.random() < 0.5:
                case.body["stream_options"] = {"include_usage": True}
        case.num_seqs = size * case.n
        case.what = f"completions {kind} x{size} n={case.n} stream={case.stream} logprobs={case.logprobs}"
        return case

    def _chat(self, index: int) -> FuzzCase:
        r = self.rng
        messages = []
        if r.random() < 0.3:
            messages.append({"role": "system", "content": self._text()})
        for turn in range(r.randint(1, 3)):
            messages.append({"role": "user", "content": self._text()})
            if turn < 2 and r.random() < 0.3:
                messages.append({"role": "assistant", "content": self._text()})
        if messages[-1]["role"] != "user":
            messages.append({"role": "user", "content": [{"type": "text", "text": self._text()}]})
        case = FuzzCase(index, "/v1/chat/completions", {"model": "default", "messages": messages}, True, "chat")
        case.body.update(self._openai_sampling(case, chat=True))
        if r.random() < 0.3:
            case.logprobs = True
            case.body["logprobs"] = True
            case.top_logprobs = r.choice([0, 2])
            if case.top_logprobs:
                case.body["top_logprobs"] = case.top_logprobs
        if r.random() < 0.15:
            case.body["tools"] = [dict(t) for t in TOOLS]
            case.body["tool_choice"] = r.choice(["none", "auto", "required", {"type": "function", "function": {"name": "f"}}])
            if case.body["tool_choice"] not in ("none", "auto"):  # the server constrains the output to the call
                for key in ("regex", "ebnf", "json_schema", "response_format", "stop", "stop_token_ids", "stop_regex",
                            "ignore_eos", "min_tokens", "skip_special_tokens", "no_stop_trim"):
                    case.body.pop(key, None)
                case.ignore_eos, case.grammar_regex = False, None
        if r.random() < 0.3:
            case.stream = True
            case.body["stream"] = True
            if r.random() < 0.5:
                case.body["stream_options"] = {"include_usage": True}
        case.num_seqs = case.n
        case.what = f"chat turns={len(messages)} n={case.n} stream={case.stream} logprobs={case.logprobs}"
        return case

    def _tokenize(self, index: int) -> FuzzCase:
        r = self.rng
        if r.random() < 0.5:
            body = {"prompt": self._text() if r.random() < 0.7 else [self._text(), self._text()]}
            return FuzzCase(index, "/v1/tokenize", body, True, "tokenize prompt")
        if r.random() < 0.5:
            body = {"messages": [{"role": "user", "content": self._text()}]}
            return FuzzCase(index, "/v1/tokenize", body, True, "tokenize messages")
        return FuzzCase(index, "/v1/detokenize", {"tokens": self._ids()}, True, "detokenize")

    # --- invalid ----------------------------------------------------------------------------------
    def _break(self, case: FuzzCase) -> FuzzCase:
        """Exactly one thing upstream refuses with a 400."""
        r = self.rng
        body = case.body
        route = case.route
        if route == "/generate":
            sp = body.setdefault("sampling_params", {})
            options = [
                ("temperature -1", lambda: sp.__setitem__("temperature", -1.0)),
                ("temperature as text", lambda: sp.__setitem__("temperature", "hot")),
                ("top_p 0", lambda: sp.__setitem__("top_p", 0.0)),
                ("top_k 0", lambda: sp.update(top_k=0, temperature=0.7)),  # greedy would override top_k
                ("min_p 2", lambda: sp.__setitem__("min_p", 2.0)),
                ("frequency_penalty 3", lambda: sp.__setitem__("frequency_penalty", 3.0)),
                ("max_new_tokens -1", lambda: sp.__setitem__("max_new_tokens", -1)),
                ("max_new_tokens beyond the context", lambda: sp.__setitem__("max_new_tokens", self.t.context_len * 4)),
                ("n 0", lambda: sp.__setitem__("n", 0)),
                ("unknown sampling key", lambda: sp.__setitem__("not_a_param", 1)),
                ("bad stop_regex", lambda: sp.__setitem__("stop_regex", "(")),
                ("logit_bias key not a token id", lambda: sp.__setitem__("logit_bias", {"abc": 1.0})),
                ("logit_bias id out of vocabulary", lambda: sp.__setitem__("logit_bias", {str(self.t.vocab_size + 7): 1.0})),
                ("json_schema that is not JSON", lambda: sp.__setitem__("json_schema", '{"type": obj')),
                ("regex that does not compile", lambda: sp.__setitem__("regex", "(unclosed")),
                ("ebnf with an undefined rule", lambda: sp.__setitem__("ebnf", "root ::= nowhere")),
                ("two constraints", lambda: sp.update(regex="a+", ebnf='root ::= "a"')),
                ("input id out of vocabulary", lambda: self._set_prompt(body, {"input_ids": [1, self.t.vocab_size + 3]})),
                ("negative input id", lambda: self._set_prompt(body, {"input_ids": [-1, 2]})),
                ("empty input_ids", lambda: self._set_prompt(body, {"input_ids": []})),
                ("prompt longer than the context", lambda: self._set_prompt(body, {"input_ids": self._ids(self.t.context_len + 5)})),
                ("token_ids_logprob [-1]", lambda: body.update(return_logprob=True, token_ids_logprob=[-1])),
                ("token_ids_logprob [2000000000]", lambda: body.update(return_logprob=True, token_ids_logprob=[2000000000])),
                ("token_ids_logprob nested", lambda: self._nested_token_ids(body)),
                ("both text and input_ids", lambda: body.update(text="a", input_ids=[1, 2])),
                ("custom_logit_processor", lambda: body.update(custom_logit_processor="{}")),
            ]
        elif route == "/v1/completions":
            options = [
                ("temperature -1", lambda: body.__setitem__("temperature", -1.0)),
                ("top_p 1.5", lambda: body.__setitem__("top_p", 1.5)),
                ("n 0", lambda: body.__setitem__("n", 0)),
                ("empty prompt", lambda: body.__setitem__("prompt", "")),
                ("max_tokens beyond the context", lambda: body.__setitem__("max_tokens", self.t.context_len * 4)),
                ("prompt longer than the context", lambda: body.__setitem__("prompt", self._ids(self.t.context_len + 5))),
                ("prompt id out of vocabulary", lambda: body.__setitem__("prompt", [1, self.t.vocab_size + 9])),
                ("response_format of an unknown type", lambda: body.__setitem__("response_format", {"type": "yaml"})),
                ("regex that does not compile", lambda: body.__setitem__("regex", "[a-")),
                ("prompt of wrong type", lambda: body.__setitem__("prompt", {"x": 1})),
            ]
        elif route == "/v1/chat/completions":
            options = [
                ("empty messages", lambda: body.__setitem__("messages", [])),
                ("messages not a list", lambda: body.__setitem__("messages", "hello")),
                ("temperature -1", lambda: body.__setitem__("temperature", -1.0)),
                ("max_tokens beyond the context", lambda: self._chat_budget(body, self.t.context_len * 4)),
                ("tool_choice required without tools", lambda: (body.pop("tools", None),
                                                                 body.__setitem__("tool_choice", "required"))),
                ("named tool not in tools", lambda: body.update(
                    tools=[{"type": "function", "function": {"name": "f"}}],
                    tool_choice={"type": "function", "function": {"name": "g"}})),
                ("response_format json_schema without a schema", lambda: body.__setitem__(
                    "response_format", {"type": "json_schema", "json_schema": {"name": "x"}})),
                ("response_format json_schema with an invalid schema", lambda: body.__setitem__(
                    "response_format", {"type": "json_schema",
                                        "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}})),
                ("n 0", lambda: body.__setitem__("n", 0)),
            ]
        else:
            options = [("tokenize without prompt or messages", lambda: body.clear())]
        if self.t.behind_sglang_router and route == "/generate":  # the router drops these fields
            dropped = ("unknown sampling key", "bad stop_regex", "logit_bias key not a token id",
                       "logit_bias id out of vocabulary")
            options = [o for o in options if o[0] not in dropped]
        options += [("invalid JSON", None), ("body is not an object", None)]
        what, apply = r.choice(options)
        if what == "invalid JSON":
            case.body = b'{"text": "abc", '
        elif what == "body is not an object":
            case.body = [1, 2, 3]
        else:
            apply()
        case.valid = False
        case.what = f"{route}: {what}"
        case.cut_after = None
        case.abort_after = None
        return case

    @staticmethod
    def _chat_budget(body: dict, value: int) -> None:
        body.pop("max_completion_tokens", None)  # it would take precedence over max_tokens
        body["max_tokens"] = value

    @staticmethod
    def _set_prompt(body: dict, prompt: dict) -> None:
        body.pop("text", None)
        body.pop("input_ids", None)
        body.update(prompt)

    def _nested_token_ids(self, body: dict) -> None:
        self._set_prompt(body, {"input_ids": self._ids(3)})
        body.update(return_logprob=True, token_ids_logprob=[[1, 2]])
