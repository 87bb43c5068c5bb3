"""Helpers for data-parallel tests (`--dp-size`): each replica's internal state, and the check that
every replica's pools are whole."""

from __future__ import annotations

import time

import requests


def replica_states(url: str) -> list:
    """/server_info's `internal_states`: one per replica, in dp_rank order."""
    return requests.get(url + "/server_info", timeout=30).json()["internal_states"]


def assert_replica_pools_whole(url: str, timeout: float = 20.0) -> list:
    """Every replica idle with all its KV (free or evictable cache) and request slots back."""
    deadline = time.time() + timeout
    while True:
        states = replica_states(url)
        whole = [s["num_running_reqs"] == 0 and s["num_waiting_reqs"] == 0
                 and s["available_kv_tokens"] + s["evictable_kv_tokens"] == s["max_total_num_tokens"]
                 and s["available_req_slots"] == s["req_pool_size"] and s["protected_kv_tokens"] == 0
                 for s in states]
        if all(whole) or time.time() > deadline:
            break
        time.sleep(0.2)
    assert all(whole), states
    return states
