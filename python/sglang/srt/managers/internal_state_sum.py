"""The whole server's internal state from its data-parallel replicas' (`--dp-size`): what
`/metrics`, the web page and `/server_info`'s `internal_states_total` show.

Counts and sizes add up (requests, free and total KV tokens, request slots, retractions, forward
counts); ratios and rates are averaged; a value that is not a number is kept when the replicas
agree (the PD mode, a backend name) and listed per replica when they do not. `dp_rank` and
`pid` are dropped and `dp_size` says how many states were summed.
"""

from __future__ import annotations

from typing import Any, Dict, List

# Which replica it is: meaningless summed.
PER_REPLICA = frozenset({"dp_rank", "pid"})
# Per-replica ratios and rates: a mean means something, a sum does not.
AVERAGED = frozenset({"new_token_ratio", "kv_transfer_speed_gb_s", "kv_transfer_latency_ms", "last_gen_throughput"})


def sum_internal_states(states: List[Dict[str, Any]]) -> Dict[str, Any]:
    out = _merge([{k: v for k, v in s.items() if k not in PER_REPLICA} for s in states])
    out["dp_size"] = len(states)
    return out


def _merge(dicts: List[Dict[str, Any]]) -> Dict[str, Any]:
    keys: List[str] = []
    for d in dicts:
        keys += [k for k in d if k not in keys]
    return {k: _combine(k, [d.get(k) for d in dicts]) for k in keys}


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _combine(key: str, values: List[Any]) -> Any:
    present = [v for v in values if v is not None]
    if not present:
        return None
    if all(isinstance(v, dict) for v in present):
        return _merge(present)
    if all(_is_number(v) for v in present):
        return sum(present) / len(present) if key in AVERAGED else sum(present)
    if all(v == present[0] for v in present):
        return present[0]
    return values
