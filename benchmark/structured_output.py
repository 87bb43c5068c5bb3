"""What a grammar constraint costs a decode step, on the default model (in-process scheduler).

    python benchmark/structured_output.py [--batches 1 16] [--tokens 64] [--dtype bfloat16]

For each batch size it decodes the same prompts unconstrained and under a JSON schema (a list
of short strings, so the constrained output stays long), alternating, best of `--reps`, and
reports output tok/s of the decode phase and the time spent filling + applying the token bitmask
per step (`GrammarManager.vocab_mask_for` + the backend's `apply_vocab_mask`, timed by wrapping
them). Issue 16's target: the mask costs under 10% of a decode step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

from sglang.srt.managers.io_struct import TokenizedGenerateReqInput  # noqa: E402
from sglang.srt.managers.scheduler import Scheduler  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402

SCHEMA = json.dumps({"type": "object", "properties": {"words": {"type": "array", "items": {"type": "string",
                                                                                          "maxLength": 12}}},
                     "required": ["words"]})
PROMPT = "List many English words as JSON: "


class Timer:
    def __init__(self):
        self.seconds = 0.0
        self.calls = 0

    def wrap(self, fn):
        def inner(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.seconds += time.perf_counter() - t0
                self.calls += 1
        return inner


def run(sched, batch, tokens, constrained, timer):
    ids = sched.tokenizer.encode(PROMPT)
    reqs = []
    for i in range(batch):
        sp = SamplingParams(max_new_tokens=tokens, temperature=0.0, ignore_eos=True,
                            **({"json_schema": SCHEMA} if constrained else {}))
        sp.normalize(sched.tokenizer)
        reqs.append(sched.add_request(TokenizedGenerateReqInput(rid=f"r{i}-{time.monotonic_ns()}", input_text=None,
                                                                input_ids=ids + [i % 7 + 10], sampling_params=sp)))
    while any(not r.output_ids for r in reqs):  # grammar compile + prefill
        sched.step()
    timer.seconds, timer.calls = 0.0, 0
    start_tokens = sum(len(r.output_ids) for r in reqs)
    steps, t0 = 0, time.perf_counter()
    while sched.has_work():
        sched.step()
        steps += 1
    dt = time.perf_counter() - t0
    new = sum(len(r.output_ids) for r in reqs) - start_tokens
    return new / dt, dt / max(steps, 1), timer.seconds / max(steps, 1), min(len(r.output_ids) for r in reqs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    print(f"loading the default model ({args.dtype}) ...", flush=True)
    sched = Scheduler(ServerArgs(model_path="default", dtype=args.dtype, skip_server_warmup=True,
                                 constrained_json_max_whitespace_cnt=1))
    gm = sched.grammar_manager
    timer = Timer()
    gm.vocab_mask_for = timer.wrap(gm.vocab_mask_for)
    gm.backend.apply_vocab_mask = timer.wrap(gm.backend.apply_vocab_mask)
    print(f"load average {os.getloadavg()[0]:.2f}; {args.tokens} new tokens; best of {args.reps}")
    print("| batch | free tok/s | json_schema tok/s | ratio | step ms (free / json) | mask ms/step | mask share |")
    print("|---|---|---|---|---|---|---|")
    for batch in args.batches:
        best = {False: None, True: None}
        for _ in range(args.reps):
            for constrained in (False, True):
                res = run(sched, batch, args.tokens, constrained, timer)
                if best[constrained] is None or res[0] > best[constrained][0]:
                    best[constrained] = res
        free, json_ = best[False], best[True]
        print(f"| {batch} | {free[0]:.1f} | {json_[0]:.1f} | {json_[0] / free[0]:.2f}x | {free[1] * 1e3:.1f} / "
              f"{json_[1] * 1e3:.1f} | {json_[2] * 1e3:.2f} | {json_[2] / json_[1] * 100:.1f}% |", flush=True)
        if json_[3] < args.tokens // 2:
            print(f"  (note: a constrained request stopped after {json_[3]} tokens)")
    sched.close()


if __name__ == "__main__":
    main()
