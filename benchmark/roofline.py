"""This machine's roofline: measured GEMM rate (fp32, bf16) and memory copy bandwidth, and the
decode ceilings they imply for a model (default: SmolLM2-135M-Instruct).

Why: a throughput number means little alone. At batch 1 decode must stream every weight once per
token, so tokens/s <= bandwidth / weight bytes; at large batch each token costs ~2 FLOPs per
weight, so tokens/s <= GEMM rate / (2 * params). The other benchmarks print their distance to
these ceilings (`decode_ceiling`).

    python benchmark/roofline.py                 # default model, batches 1 16 64
    python benchmark/roofline.py --model tiny --batches 1 8 64 256
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import machine_line, model_config, print_table, progress, resolve_model  # noqa: E402


def _best_time(fn, reps: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def measure(quick: bool = False, bar=None) -> dict:
    """GEMM rates (GFLOP/s) for fp32 and bf16 and copy bandwidth (GB/s, read + write) with torch's
    default thread count. `quick`: GEMMs of 1024 instead of 2048, a 128 MB copy instead of 512,
    fewer repetitions. On the AMX kind GEMMs of 1024 reach ~0.6x the bf16 rate of 2048's, so the
    ceilings the benchmarks report come from the full measurement (~1.5 s)."""
    import torch

    reps = 3 if quick else 8
    out = {"threads": torch.get_num_threads(), "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    n = 1024 if quick else 2048
    for dtype in (torch.float32, torch.bfloat16):
        a = torch.randn(n, n, dtype=dtype)
        b = torch.randn(n, n, dtype=dtype)
        # F.linear (x @ W^T) is the layout models run; on CPUs without AVX-512 bf16, torch's
        # plain bf16 `mm` of row-major operands is ~10x slower than this.
        t = _best_time(lambda: torch.nn.functional.linear(a, b), reps)
        out[f"gemm_gflops_{str(dtype).split('.')[-1]}"] = 2 * n**3 / t / 1e9
        if bar:
            bar.update(1)
    # Decode-shaped GEMM: a skinny activation times a weight (what batch-16 decode runs).
    w = torch.randn(1536, 576, dtype=torch.bfloat16)
    x = torch.randn(16, 576, dtype=torch.bfloat16)
    t = _best_time(lambda: torch.nn.functional.linear(x, w), reps * 20)
    out["skinny_gemm_gflops_bf16"] = 2 * 16 * 1536 * 576 / t / 1e9
    nbytes = (128 if quick else 512) * 2**20
    src = torch.empty(nbytes // 4, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    t = _best_time(lambda: dst.copy_(src), reps)
    out["copy_gbps"] = 2 * nbytes / t / 1e9
    if bar:
        bar.update(1)
    return out


def model_shape(cfg: dict) -> dict:
    """Parameter counts of the linear layers a decode step streams, and KV bytes per token (for a
    sparse MoE the active ones of a batch-1 step: its top-k experts; a larger batch reads more of
    them, so the MoE ceilings above batch 1 are upper bounds)."""
    h, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    heads = cfg["num_attention_heads"]
    kvh = cfg.get("num_key_value_heads", heads)
    hd = cfg.get("head_dim") or h // heads
    inter, vocab = cfg["intermediate_size"], cfg["vocab_size"]
    attn = h * heads * hd + 2 * h * kvh * hd + heads * hd * h
    linear = L * (attn + 3 * h * inter) + vocab * h  # + lm_head (tied or not, it is read every step)
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") or 0
    if experts:  # a sparse MoE: a batch-1 step reads its top-k experts (and any shared expert) only
        moe_inter = cfg.get("moe_intermediate_size") or inter
        sparse = [i not in (cfg.get("mlp_only_layers") or []) and (i + 1) % (cfg.get("decoder_sparse_step") or 1) == 0
                  for i in range(L)]
        active = cfg["num_experts_per_tok"] * 3 * h * moe_inter + 3 * h * (cfg.get("shared_expert_intermediate_size") or 0)
        linear = sum(attn + (active if s else 3 * h * inter) for s in sparse) + vocab * h
    return {"linear_params": linear, "lm_head_params": vocab * h, "layers": L, "kv_per_token_elems": 2 * L * kvh * hd,
            "q_heads": heads, "head_dim": hd}


def decode_ceiling(shape: dict, rates: dict, dtype: str, batch: int, ctx: int) -> dict:
    """Upper bounds for decode tokens/s at `batch` sequences of `ctx` tokens: from bandwidth
    (weights once per step + each sequence's KV) and from compute (2 FLOPs per weight per token
    plus attention), and the lower (binding) one. A bf16 model's compute bound uses the faster of the
    two GEMM rates: bf16 operands are exact in fp32, so its GEMMs may run on fp32 kernels (ours do
    on CPUs without native bf16), while its weights stream at 2 bytes each."""
    esize = 2 if dtype in ("bfloat16", "float16") else 4
    step_bytes = shape["linear_params"] * esize + batch * ctx * shape["kv_per_token_elems"] * esize
    bw_tps = batch / (step_bytes / (rates["copy_gbps"] * 1e9))
    flops_per_tok = 2 * shape["linear_params"] + 4 * shape["layers"] * ctx * shape["q_heads"] * shape["head_dim"]
    gemm = rates["gemm_gflops_float32"] * 1e9
    if esize == 2:
        gemm = max(gemm, rates["gemm_gflops_bfloat16"] * 1e9)
    compute_tps = gemm / flops_per_tok
    return {"bandwidth_tps": bw_tps, "compute_tps": compute_tps, "ceiling_tps": min(bw_tps, compute_tps)}


def prefill_floor_s(shape: dict, rates: dict, dtype: str, batch: int, prompt_len: int) -> float:
    """Least time to prefill `batch` prompts of `prompt_len` tokens at the GEMM rate: 2 FLOPs per
    layer weight per token, causal attention (2 * L * T^2 * heads * head_dim per prompt), and the
    LM head for each prompt's last token only. The same rate choice as decode_ceiling."""
    layer_params = shape["linear_params"] - shape["lm_head_params"]
    attn = 2 * shape["layers"] * prompt_len ** 2 * shape["q_heads"] * shape["head_dim"]
    flops = batch * (2 * layer_params * prompt_len + attn + 2 * shape["lm_head_params"])
    gemm = rates["gemm_gflops_float32"] * 1e9
    if dtype in ("bfloat16", "float16"):
        gemm = max(gemm, rates["gemm_gflops_bfloat16"] * 1e9)
    return flops / gemm


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default", help='"default" (SmolLM2-135M), "tiny", or an HF folder')
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--context", type=int, default=96, help="mean tokens per sequence during decode")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (a few seconds)")
    args = ap.parse_args()

    bar = progress(3, "roofline")
    rates = measure(args.quick, bar)
    bar.close()
    print(f"machine: {machine_line()}")
    print_table("Measured rates", ["torch threads", "torch CPU capability", "GEMM fp32 GFLOP/s", "GEMM bf16 GFLOP/s",
                                   "skinny GEMM bf16 16x576x1536 GFLOP/s", "copy GB/s (r+w)"],
                [[rates["threads"], rates["cpu_capability"], rates["gemm_gflops_float32"], rates["gemm_gflops_bfloat16"],
                  rates["skinny_gemm_gflops_bf16"], rates["copy_gbps"]]])
    path = resolve_model(args.model)
    shape = model_shape(model_config(path))
    rows = []
    for dtype in ("float32", "bfloat16"):
        for b in args.batches:
            c = decode_ceiling(shape, rates, dtype, b, args.context)
            rows.append([dtype, b, c["bandwidth_tps"], c["compute_tps"], c["ceiling_tps"]])
    print_table(f"Decode ceilings, {args.model} ({shape['linear_params'] / 1e6:.1f}M linear params, "
                f"context {args.context})", ["dtype", "batch", "bandwidth bound tok/s", "compute bound tok/s",
                                             "ceiling tok/s"], rows)


if __name__ == "__main__":
    main()
