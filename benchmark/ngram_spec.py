"""NGRAM speculative decoding vs plain decoding, at batch 1 and 16, on two workloads:
  - copy: copy-heavy prompts (edit a given piece of code, extract from a given document, repeat a
    text): the answer repeats much of the prompt, so drafts are accepted;
  - fresh: open-ended prompts with nothing to copy: measures what drafting costs when it misses
    (adaptive drafting: steps with no draft are plain decode steps).
Both engines (`sglang.Engine`, same model) stay up; each repetition runs the plain engine and the
speculative one back to back, alternating which goes first, so drift on a shared machine hits
both alike. Greedy, fixed max_new_tokens, EOS ignored (every run emits the same token count).
Printed: output tokens/s (median over repetitions) of each, the speed-up, the accept length
(tokens per verify step, meta_info `spec_accept_length`) and whether the outputs were identical.

    python benchmark/ngram_spec.py                         # default model, 3 repetitions
    python benchmark/ngram_spec.py --reps 5 --max-new-tokens 128 --num-draft-tokens 8
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import machine_line, print_table, resolve_model  # noqa: E402

CODE = '''def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item["price"] * item["quantity"]
    tax = subtotal * tax_rate
    return subtotal + tax


def cheapest(items):
    best = None
    for item in items:
        if best is None or item["price"] < best["price"]:
            best = item
    return best
'''
DOC = ("Invoice 2024-117. Customer: Harbour Light Supplies, 14 Quay Street, Portree. Items: 12 brass lamp "
       "fittings at 4.20 each, 3 spools of tarred twine at 7.95 each, 1 logbook bound in leather at 18.00. "
       "Delivery by sea freight on the 3rd of March; payment due within 30 days to account 40-11-92 114077.")
COPY_PROMPTS = [
    f"Rename the variable `items` to `products` everywhere in this code and output the full code:\n\n{CODE}",
    f"Add type hints to every function of this code and output the full code:\n\n{CODE}",
    f"Copy this invoice exactly, then list its items one per line:\n\n{DOC}",
    f"Rewrite this invoice with each sentence on its own line, keeping every word:\n\n{DOC}",
]
FRESH_PROMPTS = [
    "Write a short story about a fox who learns to sail.",
    "Explain why the sky is blue to a ten-year-old.",
    "Give five ideas for a rainy weekend.",
    "Describe the taste of a lemon to someone who has never had one.",
]


def chat(tokenizer, text: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)


def run(engine, prompts, params):
    start = time.perf_counter()
    outs = engine.generate(prompts, params)
    secs = time.perf_counter() - start
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    accept = [o["meta_info"].get("spec_accept_length") for o in outs]
    accept = [a for a in accept if a is not None]
    return tokens / secs, (statistics.mean(accept) if accept else None), [o["output_ids"] for o in outs]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--num-draft-tokens", type=int, default=8)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    args = ap.parse_args()

    import sglang
    from transformers import AutoTokenizer

    path = resolve_model(args.model)
    common = dict(model_path=path, max_running_requests=48)
    plain = sglang.Engine(**common)
    spec = sglang.Engine(**common, speculative_algorithm="NGRAM", speculative_num_draft_tokens=args.num_draft_tokens)
    tok = AutoTokenizer.from_pretrained(path)
    params = {"temperature": 0, "max_new_tokens": args.max_new_tokens, "ignore_eos": True}
    workloads = {"copy": [chat(tok, p) for p in COPY_PROMPTS], "fresh": [chat(tok, p) for p in FRESH_PROMPTS]}
    for engine in (plain, spec):  # warm-up (first-forward costs, kernel choices)
        engine.generate(workloads["copy"][:1], {**params, "max_new_tokens": 8})

    rows = []
    try:
        for name, base in workloads.items():
            for bs in args.batch_sizes:
                prompts = [base[i % len(base)] for i in range(bs)]
                speeds = {"plain": [], "spec": []}
                accepts, identical = [], True
                for rep in range(args.reps):
                    order = [("plain", plain), ("spec", spec)]
                    if rep % 2:
                        order.reverse()
                    outs = {}
                    for label, engine in order:
                        tps, acc, ids = run(engine, prompts, params)
                        speeds[label].append(tps)
                        outs[label] = ids
                        if label == "spec" and acc is not None:
                            accepts.append(acc)
                    identical &= outs["plain"] == outs["spec"]
                p, s = statistics.median(speeds["plain"]), statistics.median(speeds["spec"])
                rows.append([name, bs, p, s, s / p, statistics.mean(accepts) if accepts else None,
                             "yes" if identical else "NO"])
                print(f"{name} batch {bs}: plain {p:.1f} tok/s, NGRAM {s:.1f} tok/s", flush=True)
    finally:
        plain.shutdown()
        spec.shutdown()
    print(machine_line())
    print_table(f"NGRAM speculative vs plain decoding ({args.model}, {args.max_new_tokens} new tokens, "
                f"--speculative-num-draft-tokens {args.num_draft_tokens}, median of {args.reps})",
                ["workload", "batch", "plain tok/s", "NGRAM tok/s", "speed-up", "accept length", "same output"],
                rows)


if __name__ == "__main__":
    main()
