"""(Tokenizer/HTTP process.) One request -> one entry per (prompt, sample).

A `GenerateReqInput` may carry a batch of prompts and `n > 1` samples per prompt; the scheduler
only ever sees single sequences. This module expands a request into `batch_size * n` entries,
ordered prompt-major (entry `j = i * n + k` is sample `k` of prompt `i`, which is also the order of
OpenAI `choices`), and gives each entry its own rid and PD bootstrap fields.

Why the bootstrap rule matters: in PD disaggregation the same JSON goes to a prefill and a decode
server, and each sequence needs a bootstrap room that *both* agree on. The router does not know
about `n` and sends, depending on the route (observed with sglang-router 0.3.2 and its MiniLB):
one int (completions, `/generate` with one prompt, MiniLB everywhere), a list with one room per
prompt (batches), or a list with one room per sample (chat with `n > 1`). Both servers apply
the same deterministic rule:

* a list of length `batch_size * n`: entry `j` takes `rooms[j]`;
* a list of length `batch_size` (with `n > 1`): sample `k` of prompt `i` takes `rooms[i] + k`;
* one int `R` (or a list of length 1): entry `j` takes `R + j` (upstream's rule for one prompt);

all modulo 2**63. Any other length, or two entries of one request landing on the same room, is a
400 on both sides (the error names the lengths). `bootstrap_host`/`bootstrap_port` are picked
the same way (a scalar or a 1-list is shared by all entries).
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Optional

from sglang.srt.managers.io_struct import GenerateReqInput, new_rid
from sglang.srt.managers.request_limits import RequestLimits, clip

ROOM_MODULUS = 1 << 63


class RequestExpansionError(ValueError):
    """The request's shape cannot be served; the message is returned to the client as a 400."""


def parallel_sample_num(sampling_params: Any) -> int:
    """`n` of the request: the same for every prompt of a batch (upstream's rule)."""
    if isinstance(sampling_params, list):
        values = [(sp or {}).get("n", 1) if isinstance(sp, dict) else 1 for sp in sampling_params] or [1]
        if any(v != values[0] for v in values):
            raise RequestExpansionError("The parallel_sample_num should be the same for all samples in sample params.")
        n = values[0]
    elif isinstance(sampling_params, dict):
        n = sampling_params.get("n", 1)
    else:
        n = 1
    if n is None:
        n = 1
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise RequestExpansionError(f"n must be a positive integer, got {clip(n)}.")
    return n


def _per_entry(value: Any, name: str, batch_size: int, n: int, is_single: bool) -> List[Any]:
    """A per-prompt field (scalar, one per prompt, or one per sequence) -> one value per entry."""
    total = batch_size * n
    if not isinstance(value, list):
        return [value] * total
    if len(value) == total:
        return list(value)
    if len(value) == batch_size and not is_single:
        return [value[j // n] for j in range(total)]
    if len(value) == 1:
        return [value[0]] * total
    raise RequestExpansionError(
        f"{name} has {len(value)} entries, but the request has {batch_size} prompt(s) x n={n}: "
        f"give one value, one per prompt ({batch_size}) or one per sequence ({total})."
    )


def _rooms(value: Any, batch_size: int, n: int) -> List[Optional[int]]:
    total = batch_size * n
    if value is None:
        return [None] * total

    def as_room(x) -> int:
        if isinstance(x, bool) or not isinstance(x, int):
            raise RequestExpansionError(f"bootstrap_room must be an integer (or a list of integers), got {clip(x)}.")
        return x

    if not isinstance(value, list):
        base = as_room(value)
        return [(base + j) % ROOM_MODULUS for j in range(total)]
    if len(value) == total:
        return [as_room(x) % ROOM_MODULUS for x in value]
    if len(value) == batch_size:
        return [(as_room(value[j // n]) + j % n) % ROOM_MODULUS for j in range(total)]
    if len(value) == 1:
        base = as_room(value[0])
        return [(base + j) % ROOM_MODULUS for j in range(total)]
    raise RequestExpansionError(
        f"bootstrap_room has {len(value)} entries, but the request has {batch_size} prompt(s) x n={n}: "
        f"give one room, one per prompt ({batch_size}) or one per sequence ({total})."
    )


def _rids(rid: Any, batch_size: int, n: int, is_single: bool) -> List[str]:
    total = batch_size * n
    if rid is None:
        return [new_rid() for _ in range(total)]
    if isinstance(rid, str):
        return [rid] if total == 1 else [f"{rid}_{j}" for j in range(total)]
    if isinstance(rid, list) and all(isinstance(r, str) for r in rid):
        if len(rid) != batch_size or (is_single and len(rid) != 1):
            raise RequestExpansionError("The specified rids length mismatch with the batch_size for batch processing.")
        if n == 1:
            return list(rid)
        return [f"{rid[j // n]}_{j % n}" for j in range(total)]
    raise RequestExpansionError("The rid should be a string or a list of strings.")


def _sampling(sp: Any, batch_size: int, n: int, is_single: bool) -> List[dict]:
    if sp is None:
        per_prompt = [{}] * batch_size
    elif isinstance(sp, dict):
        per_prompt = [sp] * batch_size
    elif isinstance(sp, list):
        if is_single:
            per_prompt = [sp[0] if sp else {}]
        elif len(sp) == batch_size:
            per_prompt = sp
        elif len(sp) == 1:
            per_prompt = sp * batch_size
        else:
            raise RequestExpansionError(
                f"sampling_params has {len(sp)} entries, but the request has {batch_size} prompts."
            )
    else:
        raise RequestExpansionError("sampling_params should be a dict or a list of dicts.")
    out = []
    for j in range(batch_size * n):
        d = per_prompt[j // n]
        if d is not None and not isinstance(d, dict):
            raise RequestExpansionError("sampling_params should be a dict or a list of dicts.")
        d = dict(d or {})
        d.pop("n", None)
        out.append(d)
    return out


def expand_request(obj: GenerateReqInput, limits: Optional[RequestLimits] = None) -> List[GenerateReqInput]:
    """`obj` (normalized: `is_single`/`batch_size` set) -> one single-sequence request per entry.
    One request may not fan out without bound (n=100000 would queue 100000 sequences)."""
    n = parallel_sample_num(obj.sampling_params)
    b, single = obj.batch_size, obj.is_single
    try:
        (limits or RequestLimits.from_env(context_len=0)).check_sequences(b, n)
    except ValueError as e:
        raise RequestExpansionError(str(e)) from None
    total = b * n
    prompts_text = [obj.text] if single else obj.text
    prompts_ids = [obj.input_ids] if single else obj.input_ids
    rids = _rids(obj.rid, b, n, single)
    sps = _sampling(obj.sampling_params, b, n, single)
    hosts = _per_entry(obj.bootstrap_host, "bootstrap_host", b, n, single)
    ports = _per_entry(obj.bootstrap_port, "bootstrap_port", b, n, single)
    rooms = _rooms(obj.bootstrap_room, b, n)
    seen = [r for r in rooms if r is not None]
    if len(set(seen)) != len(seen):
        raise RequestExpansionError(
            "Every sequence of a request needs its own bootstrap_room, but the rooms given for "
            f"{b} prompt(s) x n={n} collide; give one room per sequence."
        )
    per = {
        name: _per_entry(getattr(obj, name), name, b, n, single)
        for name in ("return_logprob", "logprob_start_len", "top_logprobs_num", "extra_key", "cache_salt",
                     "custom_logit_processor")
    }
    token_ids_logprob = obj.token_ids_logprob
    if (not single and isinstance(token_ids_logprob, list) and token_ids_logprob
            and isinstance(token_ids_logprob[0], list)):  # one list per prompt (a single prompt's must be flat)
        tids = _per_entry(token_ids_logprob, "token_ids_logprob", b, n, single)
    else:
        tids = [token_ids_logprob] * total
    entries = []
    for j in range(total):
        i = j // n
        entries.append(dataclasses.replace(
            obj,
            text=prompts_text[i] if obj.text is not None else None,
            input_ids=prompts_ids[i] if obj.input_ids is not None else None,
            sampling_params=sps[j],
            rid=rids[j],
            bootstrap_host=hosts[j],
            bootstrap_port=ports[j],
            bootstrap_room=rooms[j],
            token_ids_logprob=tids[j],
            is_single=True,
            batch_size=1,
            **{name: values[j] for name, values in per.items()},
        ))
    return entries
