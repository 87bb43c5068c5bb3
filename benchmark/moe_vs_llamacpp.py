"""A sparse MoE of realistic proportions against llama.cpp on the same weights: a scaled
Qwen3-MoE with random weights (128 experts, top 8, as Qwen3-30B-A3B; ~1.75B parameters in all and
~0.19B active per token), built once with transformers, then `offline_throughput.py` runs this
engine (experts in `sgl_kernel.fused_experts`) and llama.cpp's `llama-batched-bench` on the GGUF
of the same folder, alternately, at batch 1 and 16.

Issue 55's targets: batch 1 at or above llama.cpp; batch 16 at least 1.5x llama.cpp; batch-1
decode at least 70% of the bandwidth ceiling of the active weights ("decode % of ceiling" in the
table: roofline.py counts a MoE's top-k experts as the weights a batch-1 step reads).

    python benchmark/moe_vs_llamacpp.py                        # ~1.7B bf16; needs ~7 GB to build, peers/setup_peers.sh llamacpp
    python benchmark/moe_vs_llamacpp.py --size small --peers   # a small smoke run of the same script, ours only
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common import cache_dir  # noqa: E402

SIZES = {
    # hidden 1024, 16 layers, 128 experts of 256 (top 8): experts 1.61B, attention 42M, the test
    # tokenizer's 49152-token vocabulary (embedding and LM head 0.1B)
    "full": dict(hidden_size=1024, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
                 num_experts=128, num_experts_per_tok=8, moe_intermediate_size=256, intermediate_size=3072),
    "small": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                  num_experts=32, num_experts_per_tok=4, moe_intermediate_size=128, intermediate_size=768),
}


def build(size: str, dtype: str) -> str:
    path = os.path.join(cache_dir(), f"qwen3-moe-{size}-{dtype}")
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    from sglang.test.tiny_models import make_tiny_model

    print(f"building {path} (random weights, transformers)", flush=True)
    make_tiny_model(path, "qwen3_moe", seed=0, dtype=dtype, initializer_range=0.02, mlp_only_layers=[],
                    max_position_embeddings=4096, **SIZES[size])
    return path


def counts(cfg: dict) -> tuple:
    h, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    attn = h * cfg["num_attention_heads"] * cfg["head_dim"] * 2 + 2 * h * cfg["num_key_value_heads"] * cfg["head_dim"]
    expert = 3 * h * cfg["moe_intermediate_size"]
    experts = cfg.get("num_experts") or cfg["num_local_experts"]  # transformers 5 saves the latter
    total = L * (attn + experts * expert) + 2 * cfg["vocab_size"] * h
    active = L * (attn + cfg["num_experts_per_tok"] * expert) + cfg["vocab_size"] * h
    return total, active


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(SIZES), default="full")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--workloads", nargs="+", default=["1:32:128", "16:32:128"], help="batch:prompt:output")
    ap.add_argument("--peers", nargs="*", default=["llamacpp"], help="offline_throughput.py peers (none: ours alone)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dry-run", action="store_true", help="build the checkpoint, print the command, run nothing")
    args = ap.parse_args()
    path = build(args.size, args.dtype)
    import json

    with open(os.path.join(path, "config.json")) as f:
        total, active = counts(json.load(f))
    print(f"{path}: {total / 1e9:.2f}B parameters, {active / 1e9:.3f}B active per token "
          f"({100 * active / total:.0f}%)", flush=True)
    cmd = [sys.executable, os.path.join(HERE, "offline_throughput.py"), "--configs", f"{path}:{args.dtype}",
           "--workloads", *args.workloads, "--reps", str(args.reps), "--peers", *args.peers]
    print(" ".join(cmd), flush=True)
    return 0 if args.dry_run else subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
