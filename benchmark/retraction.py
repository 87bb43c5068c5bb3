"""Decode retraction under memory pressure: recompute (plain server) vs PD-decode KV backups.

The same workload (N requests, fixed-seed random prompts, greedy, EOS ignored) runs through
`sglang.srt.managers.scheduler.Scheduler` in-process with a KV pool too small for all requests to
finish decoding together, so the scheduler retracts requests:
  - unpressured: plain server, pool large enough (reference: no retraction; its outputs are the truth)
  - recompute:   plain server; a retracted request goes back to the waiting queue and its prompt and
                 decoded tokens are prefilled again (counted in `num_recomputed_tokens`)
  - cpu_tensor:  PD decode server (`fake` transfer backend: the prompt KV is computed locally); a
                 retracted request's KV is copied to a per-request CPU tensor and restored on resume
  - host_pool:   PD decode server; the KV goes to a reserved, page-aligned host pool
Modes alternate within each repetition. Printed side by side: output tokens/s, retractions,
recomputed tokens and their ratio to the prompt tokens, and whether the greedy outputs equal the
unpressured run's.

    python benchmark/retraction.py                       # tiny Llama, 32 requests, < 2 min
    python benchmark/retraction.py --model default --num-requests 16 --max-total-tokens 1536
    python benchmark/retraction.py --model tiny-nemotron_h   # hybrid SSM rows (tiny-falcon_h1 too)

For hybrid SSM models `host_pool` runs with --enable-mamba-host-pool-backup (the Mamba state goes to
the host state pool). "backup ms / req" and "restore ms" time the store's copies per retraction;
"bytes / backup" is the KV of the backed-up tokens plus, for hybrids, one Mamba state slot.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import machine_line, model_config, print_table, progress, resolve_model, synthetic_prompts  # noqa: E402

MODES = ["unpressured", "recompute", "cpu_tensor", "host_pool"]


def build_scheduler(mode: str, path: str, args):
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.server_args import ServerArgs

    need = args.num_requests * (args.input_len + args.output_len) + 1024
    kw = dict(model_path=path, dtype=args.dtype, page_size=args.page_size, chunked_prefill_size=512,
              max_running_requests=args.num_requests, num_reserved_decode_tokens=args.reserved_decode_tokens,
              max_total_tokens=need if mode == "unpressured" else args.max_total_tokens, log_level="error")
    if mode in ("cpu_tensor", "host_pool"):
        kw.update(disaggregation_mode="decode", disaggregation_transfer_backend="fake",
                  disaggregation_decode_retraction_backup=mode, enable_mamba_host_pool_backup=True)
    sched = Scheduler(ServerArgs(**kw))
    store = sched.memory.retraction_store
    if store is not None:  # time the backup / restore copies and count their bytes
        store.timing = {"backup_s": 0.0, "restore_s": 0.0, "backups": 0, "restores": 0, "bytes": 0}
        backup, restore = store.backup, store.restore
        mamba = sched.memory.mamba_pool

        def timed_backup(indices, mamba_slot=None):
            t0 = time.perf_counter()
            out = backup(indices, mamba_slot)
            store.timing["backup_s"] += time.perf_counter() - t0
            store.timing["backups"] += 1
            store.timing["bytes"] += int(indices.numel()) * store.device_pool.bytes_per_token() + (
                mamba.bytes_per_slot() if mamba is not None and mamba_slot is not None else 0)
            return out

        def timed_restore(b, indices, mamba_slot=None):
            t0 = time.perf_counter()
            restore(b, indices, mamba_slot)
            store.timing["restore_s"] += time.perf_counter() - t0
            store.timing["restores"] += 1

        store.backup, store.restore = timed_backup, timed_restore
    return sched


def run_once(sched, prompts, output_len: int, tag: str):
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    retracted0, recomputed0 = sched.num_retracted_total, sched.num_recomputed_tokens
    t = time.perf_counter()
    reqs = []
    for i, p in enumerate(prompts):
        sp = SamplingParams(max_new_tokens=output_len, temperature=0.0, ignore_eos=True)
        sp.normalize(None)
        reqs.append(sched.add_request(TokenizedGenerateReqInput(rid=f"{tag}-{i}", input_text=None, input_ids=p,
                                                                sampling_params=sp)))
    steps = 0
    while sched.has_work():
        sched.step()
        steps += 1
        if steps > 100000:
            raise RuntimeError("scheduler did not finish")
    elapsed = time.perf_counter() - t
    aborted = sum(1 for r in reqs if r.finished_reason.to_json().get("type") == "abort")
    return {
        "elapsed": elapsed,
        "output_tokens": sum(len(r.output_ids) for r in reqs),
        "retracted": sched.num_retracted_total - retracted0,
        "recomputed": sched.num_recomputed_tokens - recomputed0,
        "aborted": aborted,
        "outputs": [list(r.output_ids) for r in reqs],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", help='"tiny" (4-layer random Llama), "default" or an HF folder')
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--max-total-tokens", type=int, default=2048,
                    help="KV pool of the pressured modes (all requests need N x (input + output))")
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--reserved-decode-tokens", type=int, default=16)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--modes", nargs="+", default=MODES, choices=MODES)
    ap.add_argument("--plot", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "plots", "retraction_latest.png"),
                    help="PNG drawn from the final table (matplotlib: pip install -e '.[bench]'); '' for none")
    args = ap.parse_args()

    print(f"machine: {machine_line()}", flush=True)
    path = resolve_model(args.model)
    vocab = model_config(path)["vocab_size"]
    scheds = {}
    for mode in args.modes:
        scheds[mode] = build_scheduler(mode, path, args)
        sa = scheds[mode].server_args
        print(f"{mode}: KV pool {scheds[mode].memory.init_free_kv} tokens, backup "
              f"{getattr(sa, 'disaggregation_decode_retraction_backup', None) if mode != 'recompute' else None}",
              flush=True)
    for mode, s in scheds.items():  # warm-up
        run_once(s, synthetic_prompts(2, 8, vocab, seed=5), 4, f"warm-{mode}")

    res = {m: [] for m in args.modes}
    bar = progress(args.reps * len(args.modes), "retraction")
    for rep in range(args.reps):
        prompts = synthetic_prompts(args.num_requests, args.input_len, vocab, seed=100 + rep)
        order = args.modes if rep % 2 == 0 else args.modes[::-1]
        outs = {}
        for mode in order:
            r = run_once(scheds[mode], prompts, args.output_len, f"r{rep}-{mode}")
            outs[mode] = r.pop("outputs")
            r["same_as_ref"] = None
            res[mode].append(r)
            bar.update(1)
            bar.set_postfix_str(f"{mode} {r['output_tokens'] / r['elapsed']:.0f} tok/s")
        if "unpressured" in outs:
            for mode in outs:
                res[mode][-1]["same_as_ref"] = outs[mode] == outs["unpressured"]
    bar.close()

    prompt_tokens = args.num_requests * args.input_len
    rows = []
    base = statistics.median(r["output_tokens"] / r["elapsed"] for r in res[args.modes[0]])
    for mode in args.modes:
        rs = res[mode]
        tps = statistics.median(r["output_tokens"] / r["elapsed"] for r in rs)
        recomputed = statistics.median(r["recomputed"] for r in rs)
        same = {r["same_as_ref"] for r in rs}
        timing = getattr(scheds[mode].memory.retraction_store, "timing", None)
        if timing and timing["backups"]:
            cost = [f"{timing['backup_s'] / timing['backups'] * 1e3:.2f}",
                    f"{timing['restore_s'] / max(timing['restores'], 1) * 1e3:.2f}",
                    f"{timing['bytes'] / timing['backups'] / 1024:.0f} KiB"]
        else:
            cost = ["-", "-", "-"]
        rows.append([mode, scheds[mode].memory.init_free_kv, tps, f"{tps / base:.2f}x",
                     statistics.median(r["retracted"] for r in rs), int(recomputed),
                     f"{recomputed / prompt_tokens:.2f}", statistics.median(r["aborted"] for r in rs),
                     "-" if same == {None} else ("yes" if same == {True} else "NO"), *cost])
    print(f"\nmachine at end: {machine_line()}")
    title = (f"Retraction under decode memory pressure ({args.model}:{args.dtype}, {args.num_requests} reqs x "
             f"{args.input_len} in / {args.output_len} out, page {args.page_size}; median of {args.reps})")
    headers = ["mode", "KV pool tokens", "out tok/s", f"vs {args.modes[0]}", "retractions",
               "recomputed tokens", "recomputed / prompt tokens", "aborted", "outputs == unpressured",
               "backup ms / req", "restore ms", "bytes / backup"]
    print_table(title, headers, rows)
    if args.plot:
        from plots import save_plot

        save_plot("retraction", headers, rows, args.plot, title)


if __name__ == "__main__":
    main()
