"""Times sgl-kernel's CPU ops against the torch paths they replace, on the default model's shapes.

    python benchmark/kernels/bench_cpu_ops.py [--threads 2] [--isa avx2]

Linear: sgl_kernel.linear (bf16/fp32 weights read as stored) vs oneDNN on the packed weight (what
layers/linear.py uses otherwise; an fp32 copy for bf16 on CPUs without native bf16 GEMMs) and
F.linear, for 1-16 rows (per shape, so the weights sit in the cache), then one decode step's
linears over 30 layers' distinct weights (from DRAM, as in a real step). The crossover row counts are what layers/cpu_ops.py's
`linear_max_rows` should say. "GB/s" counts the weight bytes read once.
Decode attention: sgl_kernel.decode_attention in place over the pool vs the torch backend's
gather + SDPA, at batch 1-64 over 80-2048 tokens, warm and from memory (30 layers' pools).
Extend attention: sgl_kernel.extend_attention vs the per-request SDPA loop, prompts and a cached
prefix. Also RMSNorm(+residual), SiLU*up, RoPE, the greedy argmax.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "sgl-kernel", "python"))

import sgl_kernel  # noqa: E402

ops = torch.ops.sgl_kernel
# SmolLM2-135M: hidden 576, 9 heads / 3 kv heads of 64, intermediate 1536, vocab 49152
LINEARS = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "lm_head": (49152, 576)}


def bench(fn, min_time=0.3, reps_min=5):
    fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-6)
    reps = max(reps_min, int(min_time / one))
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def packed(w):
    try:
        return w, torch.ops.mkldnn._reorder_linear_weight(w, None)
    except RuntimeError:  # bf16 without native support: layers/linear.py packs the fp32 upcast
        return w.float(), torch.ops.mkldnn._reorder_linear_weight(w.float(), None)


def onednn(x, pw_dtype, pw):
    if pw_dtype == x.dtype:
        return torch.ops.mkldnn._linear_pointwise(x, pw, None, "none", [], "")
    return torch.ops.mkldnn._linear_pointwise(x.float(), pw, None, "none", [], "").to(x.dtype)


def linear_table(dtypes, rows):
    print("\n## Linear (per call, us; model's five shapes summed; GB/s = weight bytes / time)\n")
    print("| dtype | rows | sgl_kernel us | oneDNN packed us | F.linear us | sgl_kernel GB/s | best |")
    print("|---|---|---|---|---|---|---|")
    crossover = {}
    for dtype in dtypes:
        ws = {n: torch.randn(s, dtype=torch.float32).to(dtype) for n, s in LINEARS.items()}
        pws = {n: packed(w) for n, w in ws.items()}
        nbytes = sum(w.numel() * w.element_size() for w in ws.values())
        for m in rows:
            xs = {n: torch.randn(m, s[1]).to(dtype) for n, s in LINEARS.items()}
            t_k = bench(lambda: [ops.linear(xs[n], ws[n], None, None) for n in LINEARS])
            t_o = bench(lambda: [onednn(xs[n], pws[n][0].dtype, pws[n][1]) for n in LINEARS])
            t_f = bench(lambda: [F.linear(xs[n], ws[n]) for n in LINEARS])
            best = min((t_k, "sgl_kernel"), (t_o, "oneDNN"), (t_f, "F.linear"))[1]
            if best == "sgl_kernel":
                crossover[dtype] = m
            print(f"| {str(dtype).split('.')[1]} | {m} | {t_k * 1e6:.0f} | {t_o * 1e6:.0f} | {t_f * 1e6:.0f} | "
                  f"{nbytes / t_k / 1e9:.1f} | {best} |", flush=True)
    print("\nLargest row count where sgl_kernel.linear wins:",
          {str(k).split('.')[1]: v for k, v in crossover.items()})


def decode_sweep_table(dtypes, rows_list=(1,), layers=30):
    """One decode step's linears as the model runs them: `layers` layers' distinct weights and the
    LM head in order (269 MB in bf16), so that the weights come from DRAM as in a real step, not
    from the cache as in the per-shape table above; at each of `rows_list` batch rows. A plain copy
    of the layers' weights is the bandwidth reference."""
    print(f"\n## One decode step's linears, {layers} layers + lm_head, weights cold (ms; GB/s)\n")
    print("| weights | rows | MB | sgl_kernel ms | sgl_kernel GB/s | oneDNN packed ms | copy GB/s (r+w) |")
    print("|---|---|---|---|---|---|---|")
    for dtype in list(dtypes) + ["int8"]:
        int8 = dtype == "int8"
        act = torch.bfloat16 if int8 else dtype

        def make(n, k):
            if int8:
                return torch.randint(-127, 128, (n, k), dtype=torch.int8), torch.rand(n) / 100
            return torch.randn(n, k).to(dtype), None

        shapes = [s for name, s in LINEARS.items() if name != "lm_head"]
        ws = [make(*s) for _ in range(layers) for s in shapes] + [make(*LINEARS["lm_head"])]
        nbytes = sum(w.numel() * w.element_size() for w, _ in ws)
        pws = None if int8 else [packed(w) for w, _ in ws]
        flat = torch.cat([w.reshape(-1) for w, _ in ws[:-1]])
        dst = torch.empty_like(flat)
        copy_gbps = 2 * flat.numel() * flat.element_size() / bench(lambda: dst.copy_(flat)) / 1e9
        name = "int8 (bf16 activations)" if int8 else str(dtype).split(".")[1]
        for rows in rows_list:
            xs = {k: torch.randn(rows, k).to(act) for k in {s[1] for s in LINEARS.values()}}
            t_k = bench(lambda: [ops.linear(xs[w.shape[1]], w, sc, None) for w, sc in ws], min_time=0.5)
            t_o = "-"
            if pws is not None:
                t_o = f"{1e3 * bench(lambda: [onednn(xs[w.shape[1]], p[0].dtype, p[1]) for (w, _), p in zip(ws, pws)]):.1f}"
            print(f"| {name} | {rows} | {nbytes / 1e6:.0f} | {t_k * 1e3:.1f} | {nbytes / t_k / 1e9:.1f} | {t_o} | "
                  f"{copy_gbps:.1f} |", flush=True)


def attention_table(dtypes):
    print("\n## Decode attention (9 q heads / 3 kv heads of 64; per layer call, us)\n")
    print("Warm: one layer's pool, called again and again (in the cache). From memory: 30 layers' pools in")
    print("turn, as in a decode step, contiguous slots per request; GB/s counts the K/V bytes read once.\n")
    print("| dtype | batch | context | sgl_kernel warm us | from memory us | from memory GB/s | torch gather+SDPA us | speed-up (warm) |")
    print("|---|---|---|---|---|---|---|---|")
    for dtype in dtypes:
        for B, L in ((1, 512), (1, 2048), (16, 80), (16, 512), (64, 80), (16, 2048)):
            S = B * L + 1
            pools = [(torch.randn(S, 3, 64).to(dtype), torch.randn(S, 3, 64).to(dtype)) for _ in range(30)]
            k, v = pools[0]
            r2t = torch.randperm(S - 1)[: B * L].view(B, L) + 1
            r2t_contiguous = torch.arange(1, S).view(B, L)
            rows, lens = torch.arange(B), torch.full((B,), L)
            q = torch.randn(B, 9 * 64).to(dtype)

            def torch_path():
                keys = k.index_select(0, r2t.reshape(-1)).view(B, L, 3, 64).transpose(1, 2)
                vals = v.index_select(0, r2t.reshape(-1)).view(B, L, 3, 64).transpose(1, 2)
                return F.scaled_dot_product_attention(q.view(B, 9, 1, 64), keys, vals, scale=0.125, enable_gqa=True)

            t_k = bench(lambda: ops.decode_attention(q, k, v, r2t, rows, lens, None, 0.125, -1, 0.0))
            t_m = bench(lambda: [ops.decode_attention(q, kk, vv, r2t_contiguous, rows, lens, None, 0.125, -1, 0.0)
                                 for kk, vv in pools]) / len(pools)
            t_t = bench(torch_path)
            kv_bytes = 2 * B * L * 3 * 64 * k.element_size()
            print(f"| {str(dtype).split('.')[1]} | {B} | {L} | {t_k * 1e6:.0f} | {t_m * 1e6:.0f} | "
                  f"{kv_bytes / t_m / 1e9:.1f} | {t_t * 1e6:.0f} | {t_t / t_k:.2f}x |", flush=True)
            pools.clear()  # free them before the next shape


def extend_table(dtypes):
    print("\n## Extend attention (9 q heads / 3 kv heads of 64; per layer call, ms)\n")
    print("torch: the backend's fallback, per request SDPA over the cached prefix gathered from the pool")
    print("plus the new tokens; sgl_kernel: extend_attention over the pool, the whole batch in one call.\n")
    print("| dtype | requests x (cached + new tokens) | sgl_kernel ms | torch SDPA loop ms | speed-up |")
    print("|---|---|---|---|---|")
    for dtype in dtypes:
        for B, P, n in ((64, 0, 32), (16, 0, 32), (4, 0, 128), (1, 0, 512), (1, 0, 1024), (16, 1500, 16)):
            S = B * (P + n) + 1
            k = torch.randn(S, 3, 64).to(dtype)
            v = torch.randn(S, 3, 64).to(dtype)
            r2t = torch.arange(1, S).view(B, P + n)
            q = torch.randn(B * n, 9 * 64).to(dtype)
            rows, prefix, extend = torch.arange(B), torch.full((B,), P), torch.full((B,), n)
            qh = q.view(B * n, 9, 64)

            def torch_path():
                out = q.new_empty(B * n, 9, 64)
                for i in range(B):
                    idx = r2t[i]
                    keys = k.index_select(0, idx).transpose(0, 1).unsqueeze(0)
                    vals = v.index_select(0, idx).transpose(0, 1).unsqueeze(0)
                    qi = qh[i * n:(i + 1) * n].transpose(0, 1).unsqueeze(0)
                    mask = torch.arange(P + n)[None, :] <= torch.arange(P, P + n)[:, None]
                    out[i * n:(i + 1) * n] = F.scaled_dot_product_attention(
                        qi, keys, vals, attn_mask=None if P == 0 else mask, is_causal=P == 0, scale=0.125,
                        enable_gqa=True)[0].transpose(0, 1)
                return out

            t_k = bench(lambda: ops.extend_attention(q, k, v, r2t, rows, prefix, extend, None, 0.125, -1, 0.0))
            t_t = bench(torch_path)
            print(f"| {str(dtype).split('.')[1]} | {B} x ({P} + {n}) | {t_k * 1e3:.2f} | {t_t * 1e3:.2f} | "
                  f"{t_t / t_k:.2f}x |", flush=True)


def small_ops_table(dtypes):
    from sglang.srt.layers import cpu_ops, sampler
    from sglang.srt.layers.activation import SiluAndMul
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.layers.rotary_embedding import RotaryEmbedding

    print("\n## Per-layer small ops (per call, us)\n")
    print("| dtype | rows | op | sgl_kernel us | torch us |")
    print("|---|---|---|---|---|")
    for dtype in dtypes:
        norm = RMSNorm(576).to(dtype)
        act = SiluAndMul()
        rope = RotaryEmbedding(64, 64, 8192, 10000.0)
        for m in (1, 16, 64):
            x, r = torch.randn(m, 576).to(dtype), torch.randn(m, 576).to(dtype)
            gu = torch.randn(m, 3072).to(dtype)
            qkv = torch.randn(m, 960).to(dtype)
            q, kk, _ = qkv.split([576, 192, 192], dim=-1)
            pos = torch.randint(0, 8192, (m,))
            cases = {"add+rmsnorm": lambda: norm(x, r), "silu*up": lambda: act(gu),
                     "rope q,k": lambda: rope(pos, q, kk)}
            logits = torch.randn(m, 49152)
            cases["argmax (fp32 logits)"] = lambda: sampler.argmax(logits)
            for name, fn in cases.items():
                t_k = bench(fn)
                with cpu_ops.torch_fallbacks():
                    rope._last = None
                    t_t = bench(fn)
                print(f"| {str(dtype).split('.')[1]} | {m} | {name} | {t_k * 1e6:.1f} | {t_t * 1e6:.1f} |", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--isa", default=None, help="generic|avx2|avx512|avx512bf16|amx (default: the best this CPU runs)")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--sweep-rows", type=int, nargs="+", default=[1], help="batch rows of the decode-step sweep")
    p.add_argument("--only", choices=["linear", "sweep", "attention", "extend", "small"], default=None)
    p.add_argument("--dtypes", nargs="+", choices=["float32", "bfloat16"], default=["float32", "bfloat16"],
                   help="activation/weight dtypes (the sweep adds int8 weights with bf16 activations to either)")
    args = p.parse_args()
    if not sgl_kernel.load():
        sys.exit(f"sgl-kernel is not available: {sgl_kernel.unavailable_reason()}")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.isa:
        sgl_kernel.use_isa(args.isa)
    print(f"# CPU ops: sgl-kernel {sgl_kernel.isa()} kernels, {torch.get_num_threads()} threads, torch CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"load average {os.getloadavg()[0]:.2f}")
    dtypes = [getattr(torch, d) for d in args.dtypes]
    if args.only in (None, "linear"):
        linear_table(dtypes, args.rows)
    if args.only in (None, "sweep"):
        decode_sweep_table(dtypes, args.sweep_rows)
    if args.only in (None, "attention"):
        attention_table(dtypes)
    if args.only in (None, "extend"):
        extend_table(dtypes)
    if args.only in (None, "small"):
        small_ops_table(dtypes)


if __name__ == "__main__":
    main()
