"""Offline generation throughput: this project's Engine vs its peers, measured alternately in one run.

Each engine runs as a subprocess in its own venv (peers/worker.py), loaded once per (model, dtype);
every workload is then run by each engine in turn, repetition after repetition, so that a noisy
neighbour hits all of them alike. The engines not running are frozen (SIGSTOP) meanwhile: an idle
engine may spin (upstream SGLang's CPU scheduler loop takes a full core while idle). Prompts are fixed-seed random token ids (a new seed per
repetition, the same for every engine, so that no prefix cache helps); decoding is greedy with
EOS ignored, so every engine produces exactly batch x output tokens. Before a workload's
repetitions every engine runs one unmeasured call of the workload's batch shape (a prefill and one
decode step), so that no repetition pays an engine's first-call costs for that shape (activation
memory faulted in, per-shape caches; before 2026-12-07 the first repetition's TTFT did, ~200 ms of
ours at 64 x 32).

Peers (skipped with a clear line when not installed; see peers/setup_peers.sh):
  ours_torch       this engine with SGLANG_DISABLE_SGL_KERNEL=1 (torch ops instead of sgl-kernel)
  ours_int8        this engine with --quantization w8a16_int8
  hf               HF transformers `generate`, one static left-padded batch (our venv if no own venv)
  vllm             vLLM-CPU 0.32 offline `LLM.generate`
  sglang_upstream  upstream SGLang 0.5.23 Engine with --device cpu
  llamacpp         llama.cpp's llama-batched-bench on a GGUF of the same weights at the config's dtype
  llamacpp_q8_0    the same on a q8_0 GGUF (the peer of ours_int8); GGUFs are converted on first use

Reported per workload and engine: output tokens/s (batch x output tokens / wall time of the whole
generate call, prefill included), TTFT (wall time of the same batch with 1 output token), peak RSS
of the engine's process tree, our ratio to each peer, the share of the roofline decode ceiling
(benchmark/roofline.py) reached, and the TTFT's distance to the compute floor of its prefill
("TTFT % of floor" = least prefill time at the GEMM rate / TTFT: 100% is the ceiling).
"% of ceiling" counts the whole generate call, so a workload whose prompts are longer than its
outputs cannot come near 100% (64:32:16 spends two thirds of its token forwards on prefill);
"decode % of ceiling" takes the decode steps alone: batch x (output - 1) tokens over the call's
time less its TTFT (the same batch's prefill, measured beside it).

    python benchmark/offline_throughput.py                       # defaults: ~5 min (busy machine: ~7)
    python benchmark/offline_throughput.py --configs default:bfloat16 --threads 1
    python benchmark/offline_throughput.py --configs tiny:bfloat16 tiny:float32 --workloads 1:32:128 16:32:128 16:256:16
    python benchmark/offline_throughput.py --configs default:bfloat16 --workloads 16:32:64 --reps 3
    python benchmark/offline_throughput.py --peers hf --configs tiny:float32 --workloads 1:8:8 --reps 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (PEER_NAMES, Worker, cache_dir, machine_line, model_config, print_table, progress,  # noqa: E402
                    resolve_model, synthetic_prompts)

# One config by default: each costs ~1-4 min of engine loading (vLLM-CPU compiles at start), and
# fp32 is the fast dtype on CPUs without AVX-512 bf16 (this machine: AVX2); add default:bfloat16 there.
DEFAULT_CONFIGS = ["default:float32"]
DEFAULT_WORKLOADS = ["1:32:32", "16:32:32", "64:32:16"]


def parse_workload(s: str):
    b, i, o = (int(x) for x in s.split(":"))
    return {"batch": b, "input_len": i, "output_len": o, "name": s}


def start_llamacpp(name: str, path: str, dtype: str, threads) -> list:
    from peers import llamacpp

    why = llamacpp.installed()
    if why:
        print(f"SKIP {PEER_NAMES[name]}: {why}", flush=True)
        return []
    gguf = llamacpp.gguf_for(path, "q8_0" if name == "llamacpp_q8_0" else llamacpp.OUTTYPES[dtype], cache_dir())
    try:
        w = llamacpp.LlamaCppBench(name, gguf, threads or os.cpu_count())
    except RuntimeError as e:  # e.g. its AMX kernels need a permission some VMs do not give
        print(f"SKIP {PEER_NAMES[name]}: {e}", flush=True)
        return []
    print(f"loaded {w.name} {w.version} ({os.path.basename(gguf)}) in {w.load_s:.1f} s", flush=True)
    return [w]


def start_workers(names: List[str], path: str, dtype: str, max_total_tokens: int, threads=None) -> List[Worker]:
    workers = []
    for name in names:
        if name.startswith("llamacpp"):
            workers += start_llamacpp(name, path, dtype, threads)
            continue
        extra = {}
        try:
            env = ({"OMP_NUM_THREADS": str(threads)}
                   if threads and name in ("ours", "ours_torch", "ours_int8", "hf", "sglang_upstream") else None)
            if name == "vllm":  # its default binds one core of a 2-core machine; give it ours
                env = {"VLLM_CPU_OMP_THREADS_BIND": f"0-{(threads or os.cpu_count()) - 1}"}
            w = Worker(name, path, dtype, max_total_tokens=max_total_tokens, extra=extra, env_overrides=env)
            print(f"loaded {w.name} {w.version} in {w.load_s:.1f} s", flush=True)
            workers.append(w)
        except RuntimeError as e:
            print(f"SKIP {PEER_NAMES.get(name, name)}: {e}", flush=True)
    return workers


def run_config(model: str, dtype: str, workloads: List[dict], peers: List[str], args, rates) -> List[list]:
    path = resolve_model(model)
    cfg = model_config(path)
    vocab = cfg["vocab_size"]
    need = max(w["batch"] * (w["input_len"] + w["output_len"]) for w in workloads) + 512
    workers = start_workers(["ours"] + peers, path, dtype, max(need, 4096), args.threads)
    if not workers or workers[0].backend != "ours":
        for w in workers:
            w.close()
        print(f"SKIP config {model}:{dtype}: our engine did not start", flush=True)
        return []
    # Warm-up: first calls pay one-time costs (lazy init, torch.compile, allocator growth). Then
    # every engine waits frozen (Worker.pause) while another one runs.
    for w in workers:
        w.run(synthetic_prompts(2, 16, vocab, seed=999), 4)
        w.pause()
    results: Dict[tuple, Dict[str, List[float]]] = {}
    bar = progress(len(workloads) * args.reps * len(workers), f"{model}:{dtype}")
    for wl in workloads:
        # Each engine's first prefill and decode step of a new batch shape pay one-time costs
        # (activation memory faulted in, per-shape caches): one unmeasured call of the workload's
        # shape with 2 output tokens first (its seeds apart from the measured ones).
        for w in workers:
            w.resume()
            w.run(synthetic_prompts(wl["batch"], wl["input_len"], vocab, seed=10**6 + wl["batch"]), 2)
            w.pause()
        for rep in range(args.reps):
            prompts = synthetic_prompts(wl["batch"], wl["input_len"], vocab, seed=1000 * rep + wl["batch"])
            ttft_prompts = synthetic_prompts(wl["batch"], wl["input_len"], vocab, seed=1000 * rep + 7 + wl["batch"])
            order = workers if rep % 2 == 0 else workers[::-1]  # alternate who goes first
            for w in order:
                r = results.setdefault((wl["name"], w.backend), {"tps": [], "ttft": []})
                w.resume()
                ttft = w.run(ttft_prompts, 1)
                out = w.run(prompts, wl["output_len"])
                w.pause()
                expected = wl["batch"] * wl["output_len"]
                if out["output_tokens"] != expected:
                    print(f"note: {w.name} produced {out['output_tokens']} tokens, expected {expected}", flush=True)
                r["tps"].append(out["output_tokens"] / out["elapsed_s"])
                r["ttft"].append(ttft["elapsed_s"])
                bar.update(1)
                bar.set_postfix_str(f"{wl['name']} {w.backend} {r['tps'][-1]:.0f} tok/s")
    bar.close()
    rss = {w.backend: w.peak_rss_mib() for w in workers}
    names = [w.backend for w in workers]
    for w in workers:
        w.close()

    from roofline import decode_ceiling, model_shape, prefill_floor_s

    shape = model_shape(cfg)
    rows = []
    for wl in workloads:
        ours = statistics.median(results[(wl["name"], "ours")]["tps"])
        decode_tokens = wl["batch"] * (wl["output_len"] - 1)
        ctx = wl["input_len"] + wl["output_len"] // 2
        ceiling = decode_ceiling(shape, rates, dtype, wl["batch"], ctx)["ceiling_tps"] if rates else None
        floor_ms = 1000 * prefill_floor_s(shape, rates, dtype, wl["batch"], wl["input_len"]) if rates else None
        for n in names:
            r = results[(wl["name"], n)]
            tps, ttft = statistics.median(r["tps"]), 1000 * statistics.median(r["ttft"])
            decode_s = wl["batch"] * wl["output_len"] / tps - ttft / 1000
            decode_tps = decode_tokens / decode_s if decode_tokens and decode_s > 0 else None
            rows.append([f"{model}:{dtype}", wl["name"], PEER_NAMES[n], tps, ttft,
                         rss[n], "" if n == "ours" else f"{ours / tps:.2f}x",
                         f"{100 * tps / ceiling:.0f}%" if ceiling else "-",
                         f"{100 * decode_tps / ceiling:.0f}%" if ceiling and decode_tps else "-",
                         f"{100 * floor_ms / ttft:.0f}%" if floor_ms else "-"])
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS,
                    help='MODEL:DTYPE items; MODEL is "default" (SmolLM2-135M-Instruct), "tiny" (4-layer '
                         'hidden-256 vocab-32000 random Llama) or an HF folder; DTYPE float32 or bfloat16')
    ap.add_argument("--workloads", nargs="+", default=DEFAULT_WORKLOADS,
                    help="BATCH:INPUT_LEN:OUTPUT_LEN items (default: %(default)s)")
    ap.add_argument("--peers", nargs="*", default=["hf", "vllm", "sglang_upstream"],
                    help="peers to run beside ours (default: all; missing ones are skipped)")
    ap.add_argument("--reps", type=int, default=1, help="repetitions per workload (median reported)")
    ap.add_argument("--threads", type=int, default=None,
                    help="threads for every engine (OMP_NUM_THREADS for ours, HF and upstream SGLang; "
                         "VLLM_CPU_OMP_THREADS_BIND=0-(N-1) for vLLM-CPU; -t for llama.cpp); default: all cores")
    ap.add_argument("--no-roofline", action="store_true", help="skip the ceiling measurement (~10 s)")
    ap.add_argument("--plot", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "plots", "offline_throughput.png"),
                    help="PNG drawn from the final table (matplotlib: pip install -e '.[bench]'); '' for none")
    args = ap.parse_args()

    t_start = time.time()
    print(f"machine: {machine_line()}", flush=True)
    rates = None
    if not args.no_roofline:
        from roofline import measure

        # The full measurement (GEMMs of 2048): on the AMX kind n = 1024 GEMMs (the quick one) reach
        # 1.0-1.4 TFLOP/s in bf16 against 1.8-2.2 at 2048, which understated the compute ceiling.
        rates = measure(quick=False)
        print(f"roofline: GEMM fp32 {rates['gemm_gflops_float32']:.0f} GFLOP/s, bf16 "
              f"{rates['gemm_gflops_bfloat16']:.0f} GFLOP/s, copy {rates['copy_gbps']:.1f} GB/s", flush=True)
    workloads = [parse_workload(s) for s in args.workloads]
    headers = ["model:dtype", "workload", "engine", "out tok/s", "TTFT ms", "peak RSS MiB", "ours / engine",
               "% of ceiling", "decode % of ceiling", "TTFT % of floor"]
    rows = []
    for item in args.configs:
        model, dtype = item.rsplit(":", 1)
        part = run_config(model, dtype, workloads, args.peers, args, rates)
        if len(args.configs) > 1 and part:  # a partial table as soon as a config is done
            print_table(f"{item} (machine: {machine_line()})", headers, part)
        rows += part
    threads = f"OMP_NUM_THREADS={args.threads}" if args.threads else "default threads"
    print(f"\nmachine at end: {machine_line()}; total {time.time() - t_start:.0f} s")
    title = f"Offline throughput (batch:input:output; greedy, EOS ignored; median of {args.reps}; {threads})"
    print_table(title, headers, rows)
    if args.plot:
        from plots import save_plot

        save_plot("throughput", headers, rows, args.plot, title)


if __name__ == "__main__":
    main()
