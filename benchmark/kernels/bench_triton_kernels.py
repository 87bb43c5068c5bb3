"""Checks every Triton kernel of this project against its torch reference and times it (CUDA).

    python benchmark/kernels/bench_triton_kernels.py            # on a CUDA machine: full table
    python benchmark/kernels/bench_triton_kernels.py --smoke    # tiny shapes, any machine

On a CUDA machine each kernel is first compared with its plain-torch reference on the
benchmark shape, then timed (median of triton.testing.do_bench), next to torch SDPA (on K/V
already gathered densely, i.e. without paging cost) and flashinfer (paged) for attention when
installed. "GB/s" counts the bytes a kernel must at least move (KV/state read + outputs);
"% copy" relates it to the measured device-to-device copy bandwidth.

Without CUDA the kernels can only run in Triton's interpreter: the script says so and exits 0,
or with --smoke runs every kernel once on tiny shapes against its reference.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import traceback

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

from sglang.srt.layers.attention.triton_ops.decode_attention import decode_attention_fwd, get_num_kv_splits  # noqa: E402
from sglang.srt.layers.attention.triton_ops.extend_attention import extend_attention_fwd  # noqa: E402
from sglang.srt.layers.attention.triton_ops.kv_utils import build_kv_indices, store_kv_cache  # noqa: E402
from sglang.srt.layers.attention.triton_ops.torch_reference import decode_attention_ref, extend_attention_ref  # noqa: E402
from sglang.srt.layers.mamba import torch_ops as mref  # noqa: E402
from sglang.srt.layers.mamba.ops.causal_conv1d import causal_conv1d_fn, causal_conv1d_update  # noqa: E402
from sglang.srt.layers.mamba.ops.selective_state_update import selective_state_update  # noqa: E402
from sglang.srt.layers.mamba.ops.ssd_combined import mamba_chunk_scan_combined  # noqa: E402


# ---------------------------------------------------------------------------------------------
# timing helpers
# ---------------------------------------------------------------------------------------------
def bench_ms(fn) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def copy_bandwidth_gbs(device) -> float:
    x = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.float32, device=device)  # 256 MiB
    y = torch.empty_like(x)
    ms = bench_ms(lambda: y.copy_(x))
    return 2 * x.numel() * 4 / (ms * 1e-3) / 1e9


def max_err(a, b) -> float:
    return float((a.float() - b.float()).abs().max())


class Table:
    def __init__(self, copy_gbs):
        self.copy_gbs = copy_gbs
        self.rows = []

    def add(self, name, shape, err, ok, ours_ms=None, nbytes=None, ref_ms=None, sdpa_ms=None, fi_ms=None):
        gbs = nbytes / (ours_ms * 1e-3) / 1e9 if ours_ms and nbytes else None
        self.rows.append([name, shape, f"{err:.2e}", "ok" if ok else "MISMATCH",
                          _f(ours_ms), _f(ref_ms), _f(sdpa_ms), _f(fi_ms), _f(gbs, 0),
                          _f(100 * gbs / self.copy_gbs, 0) if gbs and self.copy_gbs else "-"])

    def print(self):
        head = ["kernel", "shape", "max err", "check", "triton ms", "torch ref ms", "SDPA ms", "flashinfer ms",
                "GB/s", "% copy"]
        widths = [max(len(str(r[i])) for r in self.rows + [head]) for i in range(len(head))]
        line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"
        print(line(head))
        print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
        for r in self.rows:
            print(line(r))


def _f(v, digits=3):
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    return f"{v:.{digits}f}"


# ---------------------------------------------------------------------------------------------
# problem builders
# ---------------------------------------------------------------------------------------------
def paged_pool(seq_lens, kv_heads, head_dim, dtype, device, page_size=1):
    """Random pool with each request's pages scattered; returns req_to_token, req_pool_indices, k, v."""
    pages = [-(-n // page_size) for n in seq_lens]
    order = torch.randperm(sum(pages) + 1, device=device) + 1
    rows, cursor = [], 0
    for n, k in zip(seq_lens, pages):
        p = order[cursor : cursor + k]
        cursor += k
        rows.append((p[:, None] * page_size + torch.arange(page_size, device=device)).flatten()[:n])
    num_slots = (sum(pages) + 2) * page_size
    req_to_token = torch.zeros((len(seq_lens), max(seq_lens)), dtype=torch.int64, device=device)
    for i, r in enumerate(rows):
        req_to_token[i, : len(r)] = r
    rpi = torch.arange(len(seq_lens), device=device)
    k = torch.randn((num_slots, kv_heads, head_dim), device=device).to(dtype)
    v = torch.randn((num_slots, kv_heads, head_dim), device=device).to(dtype)
    return req_to_token, rpi, k, v


def dense_kv(k_buf, v_buf, kv_indptr, kv_indices, bs, max_len):
    """Gathers each request's K/V into [bs, kv_heads, max_len, d] (+ key padding mask)."""
    kvh, d = k_buf.shape[1], k_buf.shape[2]
    K = torch.zeros((bs, kvh, max_len, d), dtype=k_buf.dtype, device=k_buf.device)
    V = torch.zeros_like(K)
    mask = torch.zeros((bs, max_len), dtype=torch.bool, device=k_buf.device)
    for b in range(bs):
        idx = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])]
        K[b, :, : idx.numel()] = k_buf[idx].transpose(0, 1)
        V[b, :, : idx.numel()] = v_buf[idx].transpose(0, 1)
        mask[b, : idx.numel()] = True
    return K, V, mask


def _try(fn):
    try:
        return fn()
    except Exception as e:  # optional comparisons must not break the table
        print(f"  (skipped: {type(e).__name__}: {str(e).splitlines()[0][:120]})")
        return None


# ---------------------------------------------------------------------------------------------
# cases
# ---------------------------------------------------------------------------------------------
def case_decode(table, dev, dtype, bs, seq, heads, kv_heads, d, timed, window=-1):
    rtt, rpi, kb, vb = paged_pool([seq] * bs, kv_heads, d, dtype, dev)
    lens = torch.full((bs,), seq, device=dev)
    kv_indptr, kv_indices = build_kv_indices(rtt, rpi, lens)
    q = torch.randn((bs, heads, d), device=dev).to(dtype)
    o = torch.full((bs, heads, d), float("nan"), device=dev, dtype=dtype)
    max_splits = 8
    splits = get_num_kv_splits(lens, max_splits, window)
    logits = torch.empty((bs, heads, max_splits, d), dtype=torch.float32, device=dev)
    lse = torch.empty((bs, heads, max_splits), dtype=torch.float32, device=dev)
    scale = d ** -0.5
    run = lambda: decode_attention_fwd(q, kb, vb, o, kv_indptr, kv_indices, logits, lse, splits, max_splits, scale,
                                       sliding_window_size=window)
    run()
    ref = decode_attention_ref(q, kb, vb, kv_indptr, kv_indices, scale, 0.0, window)
    err = max_err(o, ref)
    ok = err < (5e-2 if dtype != torch.float32 else 1e-3) and not torch.isnan(o).any()
    shape = f"bs{bs} kv{seq} h{heads}/{kv_heads} d{d} {str(dtype)[6:]}" + (f" win{window}" if window > 0 else "")
    if not timed:
        table.add("decode_attention", shape, err, ok)
        return ok
    vis = seq if window <= 0 else min(seq, window)
    nbytes = bs * vis * kv_heads * d * 2 * kb.element_size() + 2 * q.numel() * q.element_size()
    ours = bench_ms(run)
    ref_ms = _try(lambda: bench_ms(lambda: decode_attention_ref(q, kb, vb, kv_indptr, kv_indices, scale)))
    K, V, _ = dense_kv(kb, vb, kv_indptr, kv_indices, bs, seq)
    qd = q[:, :, None, :]
    sdpa = _try(lambda: bench_ms(lambda: torch.nn.functional.scaled_dot_product_attention(
        qd, K, V, scale=scale, enable_gqa=heads != kv_heads))) if window <= 0 else None
    fi = _try(lambda: flashinfer_decode_ms(q, kb, vb, kv_indptr, kv_indices, heads, kv_heads, d, scale)) if window <= 0 else None
    table.add("decode_attention", shape, err, ok, ours, nbytes, ref_ms, sdpa, fi)
    return ok


def flashinfer_decode_ms(q, kb, vb, kv_indptr, kv_indices, heads, kv_heads, d, scale):
    import flashinfer

    ws = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=q.device)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    bs = q.shape[0]
    w.plan(kv_indptr.int(), kv_indices.int(), torch.ones(bs, dtype=torch.int32, device=q.device),
           heads, kv_heads, d, 1, data_type=kb.dtype, q_data_type=q.dtype, sm_scale=scale)
    cache = (kb.unsqueeze(1), vb.unsqueeze(1))  # page size 1: [pages, 1, kv_heads, d]
    return bench_ms(lambda: w.run(q, cache))


def case_extend(table, dev, dtype, bs, prefix, ext, heads, kv_heads, d, timed, window=-1):
    rtt, rpi, kb, vb = paged_pool([prefix + ext] * bs, kv_heads, d, dtype, dev)
    pre = torch.full((bs,), prefix, device=dev)
    kv_indptr, kv_indices = build_kv_indices(rtt, rpi, pre)
    qo_indptr = torch.arange(bs + 1, device=dev, dtype=torch.int32) * ext
    T = bs * ext
    q = torch.randn((T, heads, d), device=dev).to(dtype)
    k = torch.randn((T, kv_heads, d), device=dev).to(dtype)
    v = torch.randn((T, kv_heads, d), device=dev).to(dtype)
    o = torch.full((T, heads, d), float("nan"), device=dev, dtype=dtype)
    scale = d ** -0.5
    run = lambda: extend_attention_fwd(q, k, v, o, kb, vb, qo_indptr, kv_indptr, kv_indices, ext, scale,
                                       sliding_window_size=window)
    run()
    ref = extend_attention_ref(q, k, v, kb, vb, qo_indptr, kv_indptr, kv_indices, scale, 0.0, window)
    err = max_err(o, ref)
    ok = err < (5e-2 if dtype != torch.float32 else 1e-3) and not torch.isnan(o).any()
    shape = f"bs{bs} prefix{prefix}+{ext} h{heads}/{kv_heads} d{d} {str(dtype)[6:]}" + (f" win{window}" if window > 0 else "")
    if not timed:
        table.add("extend_attention", shape, err, ok)
        return ok
    es = kb.element_size()
    nbytes = bs * prefix * kv_heads * d * 2 * es + (q.numel() + k.numel() + v.numel() + o.numel()) * es
    ours = bench_ms(run)
    ref_ms = _try(lambda: bench_ms(lambda: extend_attention_ref(q, k, v, kb, vb, qo_indptr, kv_indptr, kv_indices, scale)))
    sdpa = fi = None
    if window <= 0:
        store_kv_cache(kb, vb, rtt[:, prefix:].reshape(-1), k, v)  # whole sequences in the pool
        full_indptr, full_indices = build_kv_indices(rtt, rpi, pre + ext)
        K, V, _ = dense_kv(kb, vb, full_indptr, full_indices, bs, prefix + ext)
        qd = q.view(bs, ext, heads, d).transpose(1, 2)
        qpos = torch.arange(prefix, prefix + ext, device=dev)
        mask = torch.arange(prefix + ext, device=dev)[None, :] <= qpos[:, None]
        sdpa = _try(lambda: bench_ms(lambda: torch.nn.functional.scaled_dot_product_attention(
            qd, K, V, attn_mask=mask, scale=scale, enable_gqa=heads != kv_heads)))
        fi = _try(lambda: flashinfer_extend_ms(q, kb, vb, qo_indptr, full_indptr, full_indices, heads, kv_heads, d, scale))
    table.add("extend_attention", shape, err, ok, ours, nbytes, ref_ms, sdpa, fi)
    return ok


def flashinfer_extend_ms(q, kb, vb, qo_indptr, kv_indptr, kv_indices, heads, kv_heads, d, scale):
    import flashinfer

    ws = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=q.device)
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
    bs = qo_indptr.numel() - 1
    w.plan(qo_indptr.int(), kv_indptr.int(), kv_indices.int(), torch.ones(bs, dtype=torch.int32, device=q.device),
           heads, kv_heads, d, 1, causal=True, sm_scale=scale, q_data_type=q.dtype, kv_data_type=kb.dtype)
    cache = (kb.unsqueeze(1), vb.unsqueeze(1))
    return bench_ms(lambda: w.run(q, cache))


def case_conv_fn(table, dev, dtype, lens, dim, width, timed):
    qsl = torch.tensor([0] + list(torch.cumsum(torch.tensor(lens), 0)), dtype=torch.int32, device=dev)
    T = sum(lens)
    x = torch.randn((T, dim), device=dev).to(dtype).t()
    w = torch.randn((dim, width), device=dev).to(dtype)
    b = torch.randn((dim,), device=dev).to(dtype)
    n = len(lens)
    states = torch.randn((n + 1, dim, width - 1), device=dev).to(dtype)
    idx = torch.arange(n, device=dev, dtype=torch.int32)
    has = torch.ones(n, dtype=torch.bool, device=dev)
    s_ref = states.clone()
    y_ref = mref.causal_conv1d_fn(x, w, b, s_ref, qsl, idx, has, "silu")
    s_tri = states.clone()
    y = causal_conv1d_fn(x, w, b, s_tri, qsl, idx, has, "silu")
    err = max(max_err(y, y_ref), max_err(s_tri, s_ref))
    ok = err < (2e-2 if dtype != torch.float32 else 1e-4)
    shape = f"seqs{n} tok{T} dim{dim} w{width} {str(dtype)[6:]}"
    if not timed:
        table.add("causal_conv1d_fn", shape, err, ok)
        return ok
    ours = bench_ms(lambda: causal_conv1d_fn(x, w, b, s_tri, qsl, idx, has, "silu"))
    ref_ms = bench_ms(lambda: mref.causal_conv1d_fn(x, w, b, s_ref, qsl, idx, has, "silu"))
    table.add("causal_conv1d_fn", shape, err, ok, ours, 2 * x.numel() * x.element_size(), ref_ms)
    return ok


def case_conv_update(table, dev, dtype, batch, dim, width, timed):
    x = torch.randn((batch, dim), device=dev).to(dtype)
    w = torch.randn((dim, width), device=dev).to(dtype)
    b = torch.randn((dim,), device=dev).to(dtype)
    states = torch.randn((batch + 8, dim, width - 1), device=dev).to(dtype)
    idx = torch.randperm(batch + 8, device=dev)[:batch].int()
    s_ref = states.clone()
    y_ref = mref.causal_conv1d_update(x, s_ref, w, b, "silu", idx)
    s_tri = states.clone()
    y = causal_conv1d_update(x, s_tri, w, b, "silu", idx)
    err = max(max_err(y, y_ref), max_err(s_tri, s_ref))
    ok = err < (2e-2 if dtype != torch.float32 else 1e-4)
    shape = f"bs{batch} dim{dim} w{width} {str(dtype)[6:]}"
    if not timed:
        table.add("causal_conv1d_update", shape, err, ok)
        return ok
    ours = bench_ms(lambda: causal_conv1d_update(x, s_tri, w, b, "silu", idx))
    ref_ms = bench_ms(lambda: mref.causal_conv1d_update(x, s_ref, w, b, "silu", idx))
    nbytes = (2 * batch * dim * (width - 1) + 2 * x.numel()) * x.element_size()
    table.add("causal_conv1d_update", shape, err, ok, ours, nbytes, ref_ms)
    return ok


def case_ssu(table, dev, dtype, batch, nheads, hdim, ngroups, dstate, timed):
    x = torch.randn((batch, nheads, hdim), device=dev).to(dtype)
    dt = torch.randn((batch, nheads), device=dev).to(dtype)[..., None].expand(batch, nheads, hdim)
    A = (-torch.rand(nheads, device=dev))[:, None, None].expand(nheads, hdim, dstate)
    B = torch.randn((batch, ngroups, dstate), device=dev).to(dtype)
    C = torch.randn((batch, ngroups, dstate), device=dev).to(dtype)
    D = torch.randn((nheads,), device=dev)[:, None].expand(nheads, hdim)
    dt_bias = torch.randn((nheads,), device=dev)[:, None].expand(nheads, hdim)
    state = torch.randn((batch + 4, nheads, hdim, dstate), device=dev).to(dtype)
    idx = torch.randperm(batch + 4, device=dev)[:batch].int()
    kw = dict(D=D, dt_bias=dt_bias, dt_softplus=True, state_batch_indices=idx)
    s_ref = state.clone()
    y_ref = mref.selective_state_update(s_ref, x, dt, A, B, C, **kw)
    s_tri = state.clone()
    y = selective_state_update(s_tri, x, dt, A, B, C, **kw)
    err = max(max_err(y, y_ref), max_err(s_tri, s_ref))
    ok = err < (5e-2 if dtype != torch.float32 else 1e-3)
    shape = f"bs{batch} h{nheads} p{hdim} g{ngroups} n{dstate} {str(dtype)[6:]}"
    if not timed:
        table.add("selective_state_update", shape, err, ok)
        return ok
    ours = bench_ms(lambda: selective_state_update(s_tri, x, dt, A, B, C, **kw))
    ref_ms = bench_ms(lambda: mref.selective_state_update(s_ref, x, dt, A, B, C, **kw))
    nbytes = 2 * batch * nheads * hdim * dstate * state.element_size()
    table.add("selective_state_update", shape, err, ok, ours, nbytes, ref_ms)
    return ok


def case_ssd(table, dev, dtype, lens, nheads, hdim, ngroups, dstate, chunk, timed):
    T = sum(lens)
    cu = torch.tensor([0] + list(torch.cumsum(torch.tensor(lens), 0)), dtype=torch.int32, device=dev)
    x = torch.randn((T, nheads, hdim), device=dev).to(dtype)
    dt = torch.randn((T, nheads), device=dev).to(dtype)
    A = -torch.rand(nheads, device=dev) - 0.1
    B = torch.randn((T, ngroups, dstate), device=dev).to(dtype)
    C = torch.randn((T, ngroups, dstate), device=dev).to(dtype)
    D = torch.randn(nheads, device=dev)
    dt_bias = torch.randn(nheads, device=dev)
    h0 = torch.randn((len(lens), nheads, hdim, dstate), device=dev)
    kw = dict(D=D, dt_bias=dt_bias, initial_states=h0, cu_seqlens=cu, dt_softplus=True, return_varlen_states=True)
    y_ref, s_ref = mref.mamba_chunk_scan_combined(x, dt, A, B, C, chunk, **kw)
    y, s = mamba_chunk_scan_combined(x, dt, A, B, C, chunk, **kw)
    err = max(max_err(y, y_ref), max_err(s, s_ref) / max(1.0, float(s_ref.abs().max())))
    ok = err < (5e-2 if dtype != torch.float32 else 1e-2)  # fp32 tl.dot may use TF32 on GPUs
    shape = f"seqs{len(lens)} tok{T} h{nheads} p{hdim} g{ngroups} n{dstate} {str(dtype)[6:]}"
    if not timed:
        table.add("mamba_chunk_scan_combined", shape, err, ok)
        return ok
    ours = bench_ms(lambda: mamba_chunk_scan_combined(x, dt, A, B, C, chunk, **kw))
    ref_ms = _try(lambda: bench_ms(lambda: mref.mamba_chunk_scan_combined(x, dt, A, B, C, chunk, **kw)))
    es = x.element_size()
    nbytes = (2 * x.numel() + 2 * B.numel() + dt.numel()) * es + 2 * h0.numel() * 4
    table.add("mamba_chunk_scan_combined", shape, err, ok, ours, nbytes, ref_ms)
    return ok


def run_all(dev, timed: bool, big: bool) -> bool:
    copy_gbs = copy_bandwidth_gbs(dev) if timed else 0.0
    table = Table(copy_gbs)
    dt = torch.float16
    cases = []
    if big:
        for dtype in (torch.float16, torch.bfloat16):
            cases.append(lambda d=dtype: case_decode(table, dev, d, 64, 4096, 32, 8, 128, timed))
        cases += [
            lambda: case_decode(table, dev, dt, 128, 1024, 32, 32, 128, timed),
            lambda: case_decode(table, dev, dt, 8, 32768, 64, 8, 128, timed),
            lambda: case_decode(table, dev, dt, 64, 4096, 32, 8, 128, timed, window=1024),
            lambda: case_extend(table, dev, dt, 8, 1024, 512, 32, 8, 128, timed),
            lambda: case_extend(table, dev, torch.bfloat16, 4, 0, 2048, 32, 8, 128, timed),
            lambda: case_extend(table, dev, dt, 8, 1024, 512, 32, 8, 128, timed, window=256),
            lambda: case_conv_fn(table, dev, dt, [1024] * 8, 8192 + 2 * 8 * 128, 4, timed),
            lambda: case_conv_update(table, dev, dt, 256, 8192 + 2 * 8 * 128, 4, timed),
            lambda: case_ssu(table, dev, dt, 256, 128, 64, 8, 128, timed),
            lambda: case_ssd(table, dev, dt, [1024, 512, 2048, 7], 128, 64, 8, 128, 256, timed),
        ]
    else:  # interpreter smoke: tiny shapes, correctness only
        cases = [
            lambda: case_decode(table, dev, dt, 2, 40, 4, 2, 16, False),
            lambda: case_decode(table, dev, dt, 2, 40, 4, 2, 16, False, window=8),
            lambda: case_extend(table, dev, dt, 2, 9, 17, 4, 2, 16, False),
            lambda: case_conv_fn(table, dev, torch.float32, [5, 3], 16, 4, False),
            lambda: case_conv_update(table, dev, torch.float32, 3, 16, 4, False),
            lambda: case_ssu(table, dev, torch.float32, 3, 2, 8, 1, 16, False),
            lambda: case_ssd(table, dev, torch.float32, [20, 3], 2, 8, 1, 16, 16, False),
        ]
    all_ok = True
    for c in cases:
        try:
            all_ok &= bool(c())
        except Exception:
            traceback.print_exc()
            all_ok = False
    print()
    if timed:
        name = torch.cuda.get_device_name(dev)
        print(f"{datetime.date.today().isoformat()}  {name}  torch {torch.__version__}  "
              f"copy bandwidth {copy_gbs:.0f} GB/s")
    table.print()
    return all_ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, correctness only (works under the interpreter)")
    args = ap.parse_args()
    if torch.cuda.is_available():
        torch.manual_seed(0)
        ok = run_all(torch.device("cuda"), timed=not args.smoke, big=not args.smoke)
        return 0 if ok else 1
    print("CUDA is needed to time the Triton kernels (no CUDA device here); "
          "run with --smoke for an interpreter correctness check on tiny shapes.")
    if args.smoke:
        ok = run_all(torch.device("cpu"), timed=False, big=False)
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
