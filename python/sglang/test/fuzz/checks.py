"""What a fuzz case's answer must look like (upstream's response shapes, reference 6.3-6.4).

`check_answer(case, status, body_or_events)` returns a list of violations (empty: fine). Valid
cases must answer 200 with the route's shape: the right number of sequences in order, token
counts within the budget (exactly the budget when EOS is ignored and the sequence ran to
`length`), logprobs when asked and as many as tokens, usage that adds up, identical samples for
a greedy request with n > 1, and streams that end with `data: [DONE]`. Invalid cases
must answer a 4xx with an error message.
"""

from __future__ import annotations

import json
import re
from typing import Any, List

from sglang.test.fuzz.cases import FuzzCase

FINISH_TYPES = {"stop", "length", "abort", "tool_calls"}  # tool_calls: chat with tools


def check_answer(case: FuzzCase, status: int, payload: Any) -> List[str]:
    if not case.valid:
        if not 400 <= status < 500:
            return [f"invalid request answered {status} (expected a 4xx)"]
        return [] if _has_error_message(payload) else [f"4xx without an error message: {str(payload)[:200]}"]
    if status != 200:
        return [f"valid request answered {status}: {str(payload)[:300]}"]
    if case.stream:
        return _check_stream(case, payload)
    try:
        if case.route == "/generate":
            return _check_generate(case, payload)
        if case.route == "/v1/completions":
            return _check_openai(case, payload, chat=False)
        if case.route == "/v1/chat/completions":
            return _check_openai(case, payload, chat=True)
        return _check_tokenize(case, payload)
    except (KeyError, TypeError, IndexError) as e:
        return [f"malformed answer ({type(e).__name__}: {e}): {str(payload)[:300]}"]


def _has_error_message(payload: Any) -> bool:
    if isinstance(payload, str):  # e.g. sglang-router's own 422 text
        return bool(payload.strip())
    if not isinstance(payload, dict):
        return False
    if isinstance(payload.get("error"), dict):
        return bool(payload["error"].get("message"))
    return bool(payload.get("message") or payload.get("detail") or payload.get("error"))


def _tokens_ok(case: FuzzCase, completion: Any, finish: Any, where: str) -> List[str]:
    """`completion`: the sequence's token count (None where the route does not report it per sequence)."""
    out = []
    kind = finish.get("type") if isinstance(finish, dict) else finish
    if kind not in FINISH_TYPES:
        out.append(f"{where}: finish reason {finish!r}")
    if kind == "abort" and case.abort_after is None:
        out.append(f"{where}: aborted without being asked to: {finish!r}")
    if completion is None:
        return out
    if case.max_tokens is not None and completion > case.max_tokens:
        out.append(f"{where}: {completion} tokens > budget {case.max_tokens}")
    if case.ignore_eos and kind == "length" and case.max_tokens is not None and completion != case.max_tokens:
        out.append(f"{where}: finished by length with {completion} of {case.max_tokens} tokens")
    return out


def _tool_calls_ok(case: FuzzCase, choice: dict) -> List[str]:
    """finish "tool_calls" <=> the message holds calls, each naming a given tool with JSON arguments."""
    where = f"choice {choice['index']}"
    calls = choice["message"].get("tool_calls") or []
    if (choice.get("finish_reason") == "tool_calls") != bool(calls):
        return [f"{where}: finish_reason {choice.get('finish_reason')!r} with {len(calls)} tool calls"]
    if calls and case.body.get("tool_choice") in (None, "none"):
        return [f"{where}: tool calls although tool_choice is {case.body.get('tool_choice')!r}"]
    names = {t["function"]["name"] for t in case.body.get("tools") or []}
    out = []
    for call in calls:
        fn = call.get("function") or {}
        if fn.get("name") not in names or not str(call.get("id", "")).startswith("call_"):
            out.append(f"{where}: tool call {call!r}")
            continue
        try:
            json.loads(fn.get("arguments") or "")
        except ValueError:
            out.append(f"{where}: tool call arguments are not JSON: {fn.get('arguments')!r}")
    return out


def _in_grammar(case: FuzzCase, text: Any, finish: Any, where: str) -> List[str]:
    """A constrained answer that the grammar ended ("stop") is in the grammar's language."""
    kind = finish.get("type") if isinstance(finish, dict) else finish
    if case.grammar_regex is None or case.echo or kind != "stop" or not isinstance(text, str):
        return []
    if re.fullmatch(case.grammar_regex, text):
        return []
    return [f"{where}: {text[:120]!r} is not in the grammar's language {case.grammar_regex!r}"]


def _same_samples(case: FuzzCase, texts: List[Any]) -> List[str]:
    """Greedy samples of one prompt are identical (checked when none was cut short)."""
    if case.n <= 1 or not case.greedy or case.abort_after is not None:
        return []
    out = []
    for i in range(0, len(texts), case.n):
        group = texts[i : i + case.n]
        if any(t != group[0] for t in group):
            out.append(f"n={case.n} greedy samples of prompt {i // case.n} differ")
    return out


def _check_generate(case: FuzzCase, body: Any) -> List[str]:
    items = body if case.is_list else [body]
    if case.is_list and not isinstance(body, list):
        return [f"expected a list of {case.num_seqs}, got {type(body).__name__}"]
    if len(items) != case.num_seqs:
        return [f"expected {case.num_seqs} sequences, got {len(items)}"]
    out = []
    for i, item in enumerate(items):
        meta = item["meta_info"]
        out += _tokens_ok(case, meta["completion_tokens"], meta["finish_reason"], f"seq {i}")
        out += _in_grammar(case, item.get("text"), meta["finish_reason"], f"seq {i}")
        if len(item["output_ids"]) != meta["completion_tokens"]:
            out.append(f"seq {i}: {len(item['output_ids'])} output_ids but completion_tokens {meta['completion_tokens']}")
        if case.logprobs and meta["finish_reason"].get("type") != "abort":
            got = len(meta.get("output_token_logprobs") or [])
            if got != meta["completion_tokens"]:
                out.append(f"seq {i}: {got} output logprobs for {meta['completion_tokens']} tokens")
    return out + _same_samples(case, [it["output_ids"] for it in items])


def _check_openai(case: FuzzCase, body: dict, chat: bool) -> List[str]:
    out = []
    want_object = "chat.completion" if chat else "text_completion"
    if body.get("object") != want_object:
        out.append(f"object {body.get('object')!r} != {want_object!r}")
    choices = body["choices"]
    if [c["index"] for c in choices] != list(range(case.num_seqs)):
        out.append(f"choice indices {[c['index'] for c in choices]} != 0..{case.num_seqs - 1}")
    usage = body["usage"]
    if usage["total_tokens"] != usage["prompt_tokens"] + usage["completion_tokens"]:
        out.append(f"usage does not add up: {usage}")
    texts = []
    for c in choices:
        text = c["message"]["content"] if chat else c["text"]
        texts.append(text)
        if chat and c["message"]["role"] != "assistant":
            out.append(f"choice {c['index']}: role {c['message']['role']!r}")
        if chat:
            out += _tool_calls_ok(case, c)
        out += _tokens_ok(case, None, c["finish_reason"], f"choice {c['index']}")
        out += _in_grammar(case, text, c["finish_reason"], f"choice {c['index']}")
        if case.logprobs and c.get("finish_reason") != "abort" and not c.get("logprobs"):
            out.append(f"choice {c['index']}: logprobs missing")
    if case.max_tokens is not None and usage["completion_tokens"] > case.max_tokens * case.num_seqs:
        out.append(f"usage.completion_tokens {usage['completion_tokens']} > {case.num_seqs} x {case.max_tokens}")
    return out + _same_samples(case, texts)


def _check_tokenize(case: FuzzCase, body: dict) -> List[str]:
    if case.route == "/v1/detokenize":
        return [] if isinstance(body.get("text"), (str, list)) else [f"detokenize answer {body}"]
    tokens, count = body.get("tokens"), body.get("count")
    if isinstance(tokens, list) and tokens and isinstance(tokens[0], list):
        return [] if count == [len(t) for t in tokens] else [f"tokenize count {count} != {[len(t) for t in tokens]}"]
    return [] if count == len(tokens or []) else [f"tokenize count {count} != {len(tokens or [])}"]


def _check_stream(case: FuzzCase, events: List[str]) -> List[str]:
    """`events`: the SSE data payloads received (the last is "[DONE]" unless the client hung up)."""
    if case.cut_after is not None:
        return []  # the client hung up; the pools and later requests show whether that was handled
    if not events or events[-1] != "[DONE]":
        return [f"stream did not end with [DONE] (last: {events[-1][:100] if events else None!r})"]
    out, finished = [], set()
    for raw in events[:-1]:
        try:
            chunk = json.loads(raw)
        except ValueError:
            return [f"stream event is not JSON: {raw[:100]!r}"]
        if "error" in chunk:
            return [f"stream error event: {raw[:200]}"]
        if case.route == "/generate":
            meta = chunk["meta_info"]
            idx = chunk.get("index", 0)
            if not 0 <= idx < case.num_seqs:
                out.append(f"stream chunk index {idx} outside 0..{case.num_seqs - 1}")
            if meta.get("finish_reason"):
                finished.add(idx)
                out += _tokens_ok(case, meta["completion_tokens"], meta["finish_reason"], f"seq {idx}")
        else:
            for c in chunk.get("choices", []):
                if not 0 <= c["index"] < case.num_seqs:
                    out.append(f"stream choice index {c['index']} outside 0..{case.num_seqs - 1}")
                if c.get("finish_reason"):
                    finished.add(c["index"])
                    out += _tokens_ok(case, None, c["finish_reason"], f"choice {c['index']}")
    if len(finished) != case.num_seqs:
        out.append(f"stream finished {sorted(finished)} of {case.num_seqs} sequences")
    return out
