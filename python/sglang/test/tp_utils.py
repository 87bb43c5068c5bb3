"""Helpers for the tensor-parallel tests (test/srt/parallel/): the references a TP server's
greedy tokens are checked against, and the pids of its ranks (read from the log)."""

from __future__ import annotations

import re
import time
from typing import Dict, List

GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
# Prompts of several lengths (longer than a 16-token chunk: chunked prefill sends prefix slots).
PROMPT_LENGTHS = (5, 23, 40, 9)


def prompts(seed: int = 3) -> List[List[int]]:
    from sglang.test.scheduler_utils import random_prompts

    return random_prompts(PROMPT_LENGTHS, seed=seed)


def hf_tokens(model_dir: str, prompt_ids: List[List[int]], max_new_tokens: int = GREEDY["max_new_tokens"]):
    from sglang.test.hf_reference import hf_greedy, load_hf_model

    model = load_hf_model(model_dir)
    return [hf_greedy(model, p, max_new_tokens) for p in prompt_ids]


def tp1_tokens(model_dir: str, prompt_ids: List[List[int]], max_new_tokens: int = GREEDY["max_new_tokens"]):
    """The same engine in one process (tp=1): an in-process scheduler, no server."""
    from sglang.test.scheduler_utils import make_scheduler, run_to_completion, submit

    sched = make_scheduler(model_dir, max_total_tokens=4096)
    reqs = [submit(sched, f"r{i}", p, max_new_tokens) for i, p in enumerate(prompt_ids)]
    run_to_completion(sched)
    return [list(req.output_ids) for req in reqs]


def rank_pids(log_text: str) -> Dict[int, int]:
    """{TP rank: pid} from the ranks' "joined the group" lines."""
    return {int(r): int(p) for r, p in re.findall(r"TP rank (\d+) of \d+ \(pid (\d+)\) joined the group", log_text)}


def wait_for(predicate, timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
