"""Where the engine's decode time goes: the scheduler driven in-process, profiled.

Builds `Scheduler` for a model (default: SmolLM2-135M-Instruct), prefills a batch, then profiles
decode steps with cProfile (Python: scheduler loop, batch building, sampling) and torch.profiler
(operators: GEMMs, attention, small-tensor ops), and prints the split of a decode step into the
model forward and everything around it, plus the top entries of both profiles.

    python benchmark/profile_decode.py                          # default model, bf16, batch 16
    python benchmark/profile_decode.py --dtype float32 --batch 1 --steps 16
    python benchmark/profile_decode.py --prefill 4 --batch 16 --input-len 16 --prefix-len 1500
    python benchmark/profile_decode.py --batch 16 --ab-rows 0 64   # oneDNN vs sgl_kernel.linear, alternating
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import machine_line, model_config, print_table, resolve_model, synthetic_prompts  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--steps", type=int, default=24, help="decode steps profiled")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--attention-backend", default=None)
    ap.add_argument("--prefill", type=int, default=0, metavar="N",
                    help="instead: time N whole prefills of the batch (median), after --prefix-len cached tokens")
    ap.add_argument("--prefix-len", type=int, default=0, help="with --prefill: a cached prefix every prompt shares")
    ap.add_argument("--ab-rows", type=int, nargs=2, default=None, metavar=("A", "B"),
                    help="instead: median decode step with sgl_kernel.linear up to A rows vs up to B rows "
                         "(oneDNN beyond), the two alternating in one process, --rounds times")
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()

    import torch

    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.utils.host_memory import keep_freed_memory

    print(f"machine: {machine_line()}; torch threads {torch.get_num_threads()}", flush=True)
    path = resolve_model(args.model)
    kw = dict(model_path=path, dtype=args.dtype, max_total_tokens=16384, log_level="error")
    if args.attention_backend:
        kw["attention_backend"] = args.attention_backend
    sched = Scheduler(ServerArgs(**kw))
    print(keep_freed_memory(), flush=True)  # as the scheduler process does, after loading
    print(f"attention backend: {sched.server_args.attention_backend}", flush=True)
    vocab = model_config(path)["vocab_size"]
    total = 3 * args.steps + 8 if not args.ab_rows else 2 * args.rounds * (args.steps + 2) + 8

    def submit(seed):
        for i, p in enumerate(synthetic_prompts(args.batch, args.input_len, vocab, seed)):
            sp = SamplingParams(max_new_tokens=total, temperature=0.0, ignore_eos=True)
            sp.normalize(None)
            sched.add_request(TokenizedGenerateReqInput(rid=f"p{seed}-{i}", input_text=None, input_ids=p,
                                                        sampling_params=sp))

    if args.prefill:
        return time_prefills(sched, args, vocab)

    submit(1)
    while sched.waiting_queue or sched.chunked_req:  # prefill
        sched.step()
    for _ in range(4):  # warm-up decode
        sched.step()
    if args.ab_rows:
        return time_ab_rows(sched, args)

    # 1) Wall split: model forward vs the rest of a step.
    runner = sched.model_runner
    fwd_time = [0.0]
    orig_forward = runner.forward

    def timed_forward(fb):
        t = time.perf_counter()
        out = orig_forward(fb)
        fwd_time[0] += time.perf_counter() - t
        return out

    runner.forward = timed_forward
    t = time.perf_counter()
    for _ in range(args.steps):
        sched.step()
    wall = time.perf_counter() - t
    runner.forward = orig_forward
    print_table(f"Decode step split ({args.model}:{args.dtype}, batch {args.batch}, {args.steps} steps)",
                ["ms / step", "model forward ms", "outside forward ms", "forward share", "tok/s"],
                [[1000 * wall / args.steps, 1000 * fwd_time[0] / args.steps,
                  1000 * (wall - fwd_time[0]) / args.steps, f"{100 * fwd_time[0] / wall:.0f}%",
                  args.batch * args.steps / wall]])

    # 2) Python profile of whole steps.
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.steps):
        sched.step()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(args.top)
    print("\n### cProfile, sorted by own time\n```")
    print("\n".join(s.getvalue().splitlines()[:args.top + 12]))
    print("```")

    # 3) Operator profile of whole steps.
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as tp:
        for _ in range(args.steps):
            sched.step()
    print("\n### torch.profiler, sorted by self CPU time\n```")
    print(tp.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))
    print("```")


def time_ab_rows(sched, args) -> None:
    """Median ms per decode step with the small-M kernel up to A rows and up to B rows, alternating
    (the host's load drifts by tens of percent between separate runs)."""
    import statistics

    import torch

    from sglang.srt.layers import cpu_ops

    dtype = getattr(torch, args.dtype)
    times = {rows: [] for rows in args.ab_rows}
    for _ in range(args.rounds):
        for rows in args.ab_rows:
            cpu_ops.set_linear_max_rows(dtype, rows)
            for _ in range(2):
                sched.step()
            t = time.perf_counter()
            for _ in range(args.steps):
                sched.step()
            times[rows].append(1000 * (time.perf_counter() - t) / args.steps)
    a, b = (statistics.median(times[r]) for r in args.ab_rows)
    print_table(f"Decode step, sgl_kernel.linear up to A vs B rows ({args.model}:{args.dtype}, batch {args.batch}, "
                f"{args.rounds} rounds of {args.steps} steps, alternating)",
                ["rows", "median ms / step", "all rounds", "A / B"],
                [[r, statistics.median(times[r]), " ".join(f"{t:.1f}" for t in times[r]),
                  f"{a / b:.2f}" if r == args.ab_rows[0] else ""] for r in args.ab_rows])


def time_prefills(sched, args, vocab) -> None:
    """Median wall time of whole prefills (1 output token), each on fresh prompts: with
    --prefix-len, every prompt of a round starts with the same prefix, prefilled (and so cached)
    by one request just before the timed batch."""
    import statistics

    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    def run(prompts, tag) -> float:
        for i, p in enumerate(prompts):
            sp = SamplingParams(max_new_tokens=1, temperature=0.0, ignore_eos=True)
            sp.normalize(None)
            sched.add_request(TokenizedGenerateReqInput(rid=f"{tag}-{i}", input_text=None, input_ids=p,
                                                        sampling_params=sp))
        t = time.perf_counter()
        while sched.waiting_queue or sched.chunked_req:
            sched.step()
        elapsed = time.perf_counter() - t
        for _ in range(2):  # the finished requests leave
            sched.step()
        return elapsed

    times = []
    for r in range(args.prefill + 1):  # round 0 warms up
        prefix = synthetic_prompts(1, args.prefix_len, vocab, 100 + r)[0] if args.prefix_len else []
        if prefix:
            run([prefix], f"prefix{r}")
        tails = synthetic_prompts(args.batch, args.input_len, vocab, 200 + r)
        times.append(run([prefix + t for t in tails], f"batch{r}"))
    t = statistics.median(times[1:])
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as tp:  # one more round, for where its time goes
        run([p + t for p, t in zip([prefix] * args.batch, synthetic_prompts(args.batch, args.input_len, vocab, 999))],
            "profiled")
    print("\n### torch.profiler of one more prefill, sorted by self CPU time\n```")
    print(tp.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))
    print("```")
    print_table(f"Whole prefills ({args.model}:{args.dtype}, {args.batch} x ({args.prefix_len} cached + "
                f"{args.input_len} new tokens), median of {args.prefill})",
                ["ms", "new tokens/s", "runs ms"],
                [[1000 * t, args.batch * args.input_len / t, " ".join(f"{1000 * x:.0f}" for x in times[1:])]])


if __name__ == "__main__":
    main()
