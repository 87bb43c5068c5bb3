// torch.ops.sgl_kernel.*: shape/dtype checks, the ISA choice and the thread split (torch's
// intra-op pool, so torch.set_num_threads and the process's core binding apply) around the
// raw kernels of kernels.h. Each op documents the torch expression it computes; the Python
// side (sglang.srt.layers.cpu_ops) falls back to that expression when the library is absent.
#include <limits>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <algorithm>
#include <vector>

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "ops_common.h"

namespace sglk {
namespace {

#define SGLK_TABLE(ns) \
    Kernels { #ns, &ns::linear, &ns::linear_reads_bf16, &ns::linear_panels, &ns::rmsnorm, &ns::silu_and_mul, &ns::rope, \
              &ns::decode_attention_split, &ns::decode_attention_combine, &ns::extend_attention, \
              &ns::vector_lanes, &ns::argmax_rows, &ns::gguf_dequantize, &ns::gguf_linear_rows, \
              &ns::gguf_linear_panels }

bool cpu_has_avx512() {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("fma");
}

bool cpu_has_avx2() {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

bool cpu_has_avx512bf16() {
    __builtin_cpu_init();
    return cpu_has_avx512() && __builtin_cpu_supports("avx512bf16");
}

// AMX-TILE and AMX-BF16 (CPUID 7.0 EDX bits 24 and 22), and the tile state, which Linux hands a
// process only on request (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA; refused on kernels
// before 5.16 and where the hypervisor hides it). Asked once; the grant covers every thread.
bool cpu_has_amx() {
    static const bool ok = [] {
        unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
        if (!cpu_has_avx512bf16() || !__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
        if (!((edx >> 24) & 1u) || !((edx >> 22) & 1u)) return false;
        constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
        return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
    }();
    return ok;
}

bool cpu_runs(const std::string& isa) {
    return isa == "generic" || (isa == "avx2" && cpu_has_avx2()) || (isa == "avx512" && cpu_has_avx512()) ||
           (isa == "avx512bf16" && cpu_has_avx512bf16()) || (isa == "amx" && cpu_has_amx());
}

Kernels table(const std::string& isa) {
    if (isa == "amx") return SGLK_TABLE(amx);
    if (isa == "avx512bf16") return SGLK_TABLE(avx512bf16);
    if (isa == "avx512") return SGLK_TABLE(avx512);
    if (isa == "avx2") return SGLK_TABLE(avx2);
    return SGLK_TABLE(generic);
}

// The best kernels this CPU runs; SGL_KERNEL_ISA=generic|avx2|avx512|avx512bf16|amx asks for another one
// (ignored when the CPU lacks it).
std::string initial_isa() {
    const char* want = std::getenv("SGL_KERNEL_ISA");
    if (want && cpu_runs(want)) return want;
    return cpu_has_amx()          ? "amx"
           : cpu_has_avx512bf16() ? "avx512bf16"
           : cpu_has_avx512()     ? "avx512"
           : cpu_has_avx2()       ? "avx2"
                                  : "generic";
}

}  // namespace

Kernels& kernels() {
    static Kernels k = table(initial_isa());
    return k;
}

DType dtype_of(const at::Tensor& t, const char* what) {
    if (t.scalar_type() == at::kFloat) return DType::F32;
    if (t.scalar_type() == at::kBFloat16) return DType::BF16;
    TORCH_CHECK(false, "sgl_kernel: ", what, " must be float32 or bfloat16, got ", t.scalar_type());
}

void check_cpu(const at::Tensor& t, const char* what) {
    TORCH_CHECK(t.device().is_cpu(), "sgl_kernel: ", what, " must be a CPU tensor");
}

WType wtype_of(const at::Tensor& w, const char* what) {
    if (w.scalar_type() == at::kFloat) return WType::F32;
    if (w.scalar_type() == at::kBFloat16) return WType::BF16;
    if (w.scalar_type() == at::kChar) return WType::I8;
    TORCH_CHECK(false, "sgl_kernel: ", what, " must be float32, bfloat16 or int8, got ", w.scalar_type());
}

// Rows of a tensor viewed as [rows, last]: the last dim must be dense, the others collapse.
at::Tensor as_rows(const at::Tensor& t, const char* what) {
    check_cpu(t, what);
    TORCH_CHECK(t.dim() >= 1 && t.stride(-1) == 1, "sgl_kernel: ", what, " needs a contiguous last dim");
    if (t.dim() == 2) return t;
    return t.reshape({-1, t.size(-1)});
}

int64_t longest_visible(const at::Tensor& req_to_token, const int64_t* rows, const int64_t* lens, int64_t B,
                        int64_t window, const char* op) {
    int64_t longest = 0;
    for (int64_t b = 0; b < B; ++b) {
        TORCH_CHECK(lens[b] >= 1 && lens[b] <= req_to_token.size(1) && rows[b] >= 0 && rows[b] < req_to_token.size(0),
                    op, ": request ", b, " has length ", lens[b], " / row ", rows[b], " outside req_to_token");
        longest = std::max(longest, window > 0 ? std::min(lens[b], window) : lens[b]);
    }
    return longest;
}

// ---- thread splits ------------------------------------------------------------------------------
void run_rmsnorm(const NormArgs& a, int64_t rows) {
    const auto& kt = kernels();
    at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(a.H, 1)),
                     [&](int64_t r0, int64_t r1) { kt.rmsnorm(a, r0, r1); });
}

void run_silu_and_mul(const void* x, void* out, int64_t d, int64_t ldx, DType dt, int64_t rows) {
    const auto& kt = kernels();
    at::parallel_for(0, rows, std::max<int64_t>(1, 8192 / std::max<int64_t>(d, 1)),
                     [&](int64_t r0, int64_t r1) { kt.silu_and_mul(x, out, d, ldx, dt, r0, r1); });
}

void run_rope(const RopeArgs& a, int64_t T) {
    const auto& kt = kernels();
    at::parallel_for(0, T, 8, [&](int64_t t0, int64_t t1) { kt.rope(a, t0, t1); });
}

void run_decode_attention(DecodeAttnArgs a, int64_t longest) {
    // Split long contexts so that every thread has work even at batch 1 (split-K).
    // A work item takes as many kv heads as its scratch holds (all of them for most models), so a
    // thread reads each slot's K/V rows for those heads in one go.
    const int64_t threads = at::get_num_threads();
    const int64_t G = a.hq / a.hk;
    a.kv_per_task = std::max<int64_t>(1, std::min<int64_t>({a.hk, 8192 / (G * std::max(a.d, a.dv)), 256 / G}));
    const int64_t items = a.B * ((a.hk + a.kv_per_task - 1) / a.kv_per_task);
    int64_t n_split = std::max<int64_t>(1, std::min<int64_t>((4 * threads + items - 1) / items, (longest + 255) / 256));
    int64_t split_len = (longest + n_split - 1) / n_split;
    split_len = (split_len + 31) / 32 * 32;
    n_split = (longest + split_len - 1) / split_len;
    a.n_split = n_split;
    a.split_len = split_len;
    const auto& kt = kernels();
    if (n_split == 1) {  // the split kernel normalises into out itself
        a.partial = nullptr;
        at::parallel_for(0, items, 1, [&](int64_t t0, int64_t t1) { kt.decode_split(a, t0, t1); });
        return;
    }
    at::Tensor partial = at::empty({a.B * a.hq * n_split * (a.dv + 2)}, at::TensorOptions().dtype(at::kFloat));
    a.partial = partial.data_ptr<float>();
    at::parallel_for(0, items * n_split, 1, [&](int64_t t0, int64_t t1) { kt.decode_split(a, t0, t1); });
    at::parallel_for(0, a.B * a.hq, 16, [&](int64_t r0, int64_t r1) { kt.decode_combine(a, r0, r1); });
}

namespace {
std::tuple<at::Tensor, at::Tensor> norm_impl(const at::Tensor& x, const at::Tensor* residual,
                                             const at::Tensor& weight, double eps) {
    at::Tensor x2 = as_rows(x, "x");
    const DType dt = dtype_of(x, "x");
    TORCH_CHECK(weight.scalar_type() == x.scalar_type() && weight.is_contiguous() &&
                    weight.numel() == x2.size(1),
                "sgl_kernel.rmsnorm: weight must be a dense [H] tensor of x's dtype");
    at::Tensor r2;
    if (residual) {
        r2 = as_rows(*residual, "residual");
        TORCH_CHECK(residual->scalar_type() == x.scalar_type() && r2.sizes() == x2.sizes(),
                    "sgl_kernel.add_rmsnorm: residual must match x");
    }
    at::Tensor out = at::empty(x.sizes(), x.options());
    at::Tensor res_out = residual ? at::empty(x.sizes(), x.options()) : at::Tensor();
    const int64_t rows = x2.size(0), H = x2.size(1);
    NormArgs a{x2.data_ptr(), residual ? r2.data_ptr() : nullptr, weight.data_ptr(), out.data_ptr(),
               residual ? res_out.data_ptr() : nullptr, H, x2.stride(0), residual ? r2.stride(0) : 0,
               static_cast<float>(eps), dt};
    run_rmsnorm(a, rows);
    return {out, res_out};
}
}  // namespace

// weight * rms_norm(x) with HF's rounding (statistics in fp32).
at::Tensor rmsnorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
    return std::get<0>(norm_impl(x, nullptr, weight, eps));
}

// (rmsnorm(x + residual), x + residual); the sum is rounded to x's dtype first, as torch does.
std::tuple<at::Tensor, at::Tensor> add_rmsnorm(const at::Tensor& x, const at::Tensor& residual,
                                               const at::Tensor& weight, double eps) {
    return norm_impl(x, &residual, weight, eps);
}

// silu(x[..., :d]) * x[..., d:] for x [..., 2d].
at::Tensor silu_and_mul(const at::Tensor& x) {
    at::Tensor x2 = as_rows(x, "x");
    const DType dt = dtype_of(x, "x");
    TORCH_CHECK(x2.size(1) % 2 == 0, "sgl_kernel.silu_and_mul: last dim must be even");
    const int64_t d = x2.size(1) / 2, rows = x2.size(0);
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = d;
    at::Tensor out = at::empty(shape, x.options());
    run_silu_and_mul(x2.data_ptr(), out.data_ptr(), d, x2.stride(0), dt, rows);
    return out;
}

// (q, k) rotated: q, k [T, heads * head_size] (rows may be strided views), HF rotate_half rope with
// the cos/sin rows of `positions` from fp32 tables [max_pos, rotary_dim]; dims past rotary_dim kept.
std::tuple<at::Tensor, at::Tensor> rotary_embedding(const at::Tensor& positions, const at::Tensor& q,
                                                    const at::Tensor& k, int64_t head_size,
                                                    const at::Tensor& cos, const at::Tensor& sin) {
    check_cpu(q, "q");
    check_cpu(k, "k");
    const DType dt = dtype_of(q, "q");
    TORCH_CHECK(k.scalar_type() == q.scalar_type(), "sgl_kernel.rotary_embedding: q and k dtypes differ");
    TORCH_CHECK(q.dim() == 2 && k.dim() == 2 && q.stride(1) == 1 && k.stride(1) == 1,
                "sgl_kernel.rotary_embedding: q and k must be [T, heads * head_size] with dense rows");
    TORCH_CHECK(positions.scalar_type() == at::kLong && positions.is_contiguous() &&
                    positions.numel() == q.size(0) && k.size(0) == q.size(0),
                "sgl_kernel.rotary_embedding: positions must be a dense int64 [T]");
    TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.is_contiguous() &&
                    sin.is_contiguous() && cos.dim() == 2 && cos.sizes() == sin.sizes(),
                "sgl_kernel.rotary_embedding: cos/sin must be dense fp32 [max_pos, rotary_dim]");
    const int64_t rd = cos.size(1);
    TORCH_CHECK(rd % 2 == 0 && rd <= head_size && rd <= 512 && q.size(1) % head_size == 0 && k.size(1) % head_size == 0,
                "sgl_kernel.rotary_embedding: bad head_size/rotary_dim (rotary_dim up to 512)");
    const int64_t T = q.size(0);
    at::Tensor q_out = at::empty(q.sizes(), q.options()), k_out = at::empty(k.sizes(), k.options());
    if (T == 0) return {q_out, k_out};
    const int64_t* pos = positions.data_ptr<int64_t>();
    const int64_t max_pos = cos.size(0);
    for (int64_t t = 0; t < T; ++t)
        TORCH_CHECK(pos[t] >= 0 && pos[t] < max_pos, "sgl_kernel.rotary_embedding: position ", pos[t],
                    " outside the table of ", max_pos);
    RopeArgs a{q.data_ptr(), k.data_ptr(), q_out.data_ptr(), k_out.data_ptr(), q.size(1) / head_size, k.size(1) / head_size, head_size, rd,
               q.stride(0), k.stride(0), pos, cos.data_ptr<float>(), sin.data_ptr<float>(), dt};
    run_rope(a, T);
    return {q_out, k_out};
}

// k_cache[loc[t]] = k[t], v_cache[loc[t]] = v[t]: T new tokens' rows into the pool's slots (rows of
// k and v may be strided views, e.g. of a fused qkv projection; slots distinct, as the pool's are). index_copy_'s scatter without its
// per-row iterator: 512 tokens of the default model into both caches 52 -> 9 us.
void store_kv_(at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& loc, const at::Tensor& k,
               const at::Tensor& v) {
    const char* op = "sgl_kernel.store_kv_";
    check_cpu(k_cache, "k_cache");
    check_cpu(v_cache, "v_cache");
    check_cpu(k, "k");
    check_cpu(v, "v");
    check_cpu(loc, "loc");
    TORCH_CHECK(loc.scalar_type() == at::kLong || loc.scalar_type() == at::kInt, op, ": loc must be int64 or int32");
    TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.dim() >= 2 && v_cache.dim() >= 2 &&
                    k_cache.size(0) == v_cache.size(0),
                op, ": caches must be dense [slots, ...] with one slot count");
    TORCH_CHECK(k.scalar_type() == k_cache.scalar_type() && v.scalar_type() == v_cache.scalar_type(), op,
                ": k and v must have their cache's dtype");
    const int64_t S = k_cache.size(0), T = loc.numel();
    const int64_t kw = S ? k_cache.numel() / S : 0, vw = S ? v_cache.numel() / S : 0;  // elements a slot
    TORCH_CHECK(k.numel() == T * kw && v.numel() == T * vw, op, ": k and v must hold one cache row per slot in loc");
    if (T == 0) return;
    const at::Tensor k2 = k.reshape({T, kw}), v2 = v.reshape({T, vw});
    TORCH_CHECK(k2.stride(1) == 1 && v2.stride(1) == 1, op, ": k and v need dense rows");
    const at::Tensor l = loc.to(at::kLong).contiguous();
    const int64_t* lp = l.data_ptr<int64_t>();
    for (int64_t t = 0; t < T; ++t)
        TORCH_CHECK(lp[t] >= 0 && lp[t] < S, op, ": slot ", lp[t], " outside the ", S, "-slot cache");
    const int64_t ek = k2.element_size(), ev = v2.element_size();
    char *kc = static_cast<char*>(k_cache.data_ptr()), *vc = static_cast<char*>(v_cache.data_ptr());
    const char *ks = static_cast<const char*>(k2.data_ptr()), *vs = static_cast<const char*>(v2.data_ptr());
    at::parallel_for(0, T, 64, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
            std::memcpy(kc + lp[t] * kw * ek, ks + t * k2.stride(0) * ek, kw * ek);
            std::memcpy(vc + lp[t] * vw * ev, vs + t * v2.stride(0) * ev, vw * ev);
        }
    });
}

namespace {
// What the paged attention ops check alike: q [rows, hq * d] of fp32/bf16 with dense rows, dense
// [slots, kv_heads, dim] caches of q's dtype, head dims 1-512, hq a multiple of the kv heads, and
// an int32/int64 req_to_token [R, L]. `op` names the caller in errors.
struct PagedShape { DType dt; int64_t hq, hk, d, dv; };

PagedShape check_paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                 const at::Tensor& req_to_token, const char* op) {
    check_cpu(q, "q");
    const DType dt = dtype_of(q, "q");
    TORCH_CHECK(k_cache.scalar_type() == q.scalar_type() && v_cache.scalar_type() == q.scalar_type(), op,
                ": q and the KV cache must have one dtype");
    TORCH_CHECK(k_cache.dim() == 3 && v_cache.dim() == 3 && k_cache.is_contiguous() && v_cache.is_contiguous(), op,
                ": caches must be dense [slots, kv_heads, dim]");
    const int64_t hk = k_cache.size(1), d = k_cache.size(2), dv = v_cache.size(2);
    TORCH_CHECK(hk > 0 && d > 0 && dv > 0, op, ": empty cache dimensions");
    TORCH_CHECK(d <= 512 && dv <= 512, op, ": head dims above 512");
    TORCH_CHECK(q.dim() == 2 && q.stride(1) == 1 && q.size(1) % d == 0, op, ": q must be [rows, hq * d]");
    const int64_t hq = q.size(1) / d;
    TORCH_CHECK(hq % hk == 0, op, ": query heads must be a multiple of kv heads");
    TORCH_CHECK(req_to_token.dim() == 2 && req_to_token.stride(1) == 1 &&
                    (req_to_token.scalar_type() == at::kLong || req_to_token.scalar_type() == at::kInt),
                op, ": req_to_token must be int32/int64 [R, L]");
    return {dt, hq, hk, d, dv};
}
}  // namespace

// One query per request over its KV slots req_to_token[req_pool_indices[b], :seq_lens[b]]
// (the last `window` only when window > 0; through slot_map when given), softmax(scale * q.k)
// (with logit_cap * tanh(s / logit_cap) when logit_cap > 0) times V. q [B, hq * d] -> [B, hq * dv].
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                            const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                            const at::Tensor& seq_lens, const c10::optional<at::Tensor>& slot_map,
                            double scale, int64_t window, double logit_cap) {
    const PagedShape ps = check_paged_attention(q, k_cache, v_cache, req_to_token, "sgl_kernel.decode_attention");
    const DType dt = ps.dt;
    const int64_t hk = ps.hk, d = ps.d, dv = ps.dv, hq = ps.hq, G = hq / hk, B = q.size(0);
    TORCH_CHECK(G <= 64 && G * d <= 8192 && G * dv <= 8192, "sgl_kernel.decode_attention: head group too large");
    at::Tensor rows = req_pool_indices.to(at::kLong).contiguous();
    at::Tensor lens = seq_lens.to(at::kLong).contiguous();
    TORCH_CHECK(rows.numel() == B && lens.numel() == B, "sgl_kernel.decode_attention: one row and length per query");
    at::Tensor smap;
    if (slot_map.has_value() && slot_map->defined()) smap = slot_map->to(at::kLong).contiguous();
    const int64_t* lp = lens.data_ptr<int64_t>();
    const int64_t* rp = rows.data_ptr<int64_t>();
    const int64_t longest = longest_visible(req_to_token, rp, lp, B, window, "sgl_kernel.decode_attention");
    at::Tensor out = at::empty({B, hq * dv}, q.options());
    if (B == 0) return out;
    DecodeAttnArgs a{q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(), nullptr,
                     req_to_token.scalar_type() == at::kLong ? req_to_token.data_ptr<int64_t>() : nullptr,
                     req_to_token.scalar_type() == at::kInt ? req_to_token.data_ptr<int32_t>() : nullptr,
                     req_to_token.stride(0), rp, lp, smap.defined() ? smap.data_ptr<int64_t>() : nullptr,
                     B, hq, hk, d, dv, q.stride(0), 0, 0, window,
                     static_cast<float>(scale), static_cast<float>(logit_cap), dt};
    run_decode_attention(a, longest);
    return out;
}

// Extend attention in place over the pool: the new tokens of R requests (q rows, request after
// request) attend causally to their request's slots req_to_token[rows[r], :prefix_lens[r] + t + 1]
// (the last `window` only when window > 0; through slot_map when given), i.e. what the torch
// backend computes with SDPA after gathering the cached prefix. The new tokens' K/V must already
// be in the pool. q [T, hq * d] -> [T, hq * dv].
at::Tensor extend_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                            const at::Tensor& req_to_token, const at::Tensor& rows, const at::Tensor& prefix_lens,
                            const at::Tensor& extend_lens, const c10::optional<at::Tensor>& slot_map, double scale,
                            int64_t window, double logit_cap) {
    const char* op = "sgl_kernel.extend_attention";
    const PagedShape ps = check_paged_attention(q, k_cache, v_cache, req_to_token, op);
    const DType dt = ps.dt;
    const int64_t hk = ps.hk, d = ps.d, dv = ps.dv, hq = ps.hq, T = q.size(0);
    at::Tensor rw = rows.to(at::kLong).contiguous(), pl = prefix_lens.to(at::kLong).contiguous(),
               el = extend_lens.to(at::kLong).contiguous();
    const int64_t R = rw.numel();
    TORCH_CHECK(pl.numel() == R && el.numel() == R, op, ": one row, prefix and extend length per request");
    const int64_t *rp = rw.data_ptr<int64_t>(), *pp = pl.data_ptr<int64_t>(), *ep = el.data_ptr<int64_t>();
    std::vector<int64_t> starts(R);
    int64_t total = 0;
    for (int64_t r = 0; r < R; ++r) {
        TORCH_CHECK(ep[r] >= 0 && pp[r] >= 0 && pp[r] + ep[r] <= req_to_token.size(1) && rp[r] >= 0 &&
                        rp[r] < req_to_token.size(0),
                    op, ": request ", r, " (row ", rp[r], ", ", pp[r], " + ", ep[r], " tokens) is outside req_to_token");
        starts[r] = total;
        total += ep[r];
    }
    TORCH_CHECK(total == T, op, ": the extend lengths add up to ", total, ", q has ", T, " rows");
    at::Tensor smap;
    if (slot_map.has_value() && slot_map->defined()) smap = slot_map->to(at::kLong).contiguous();
    at::Tensor out = at::empty({T, hq * dv}, q.options());
    if (T == 0) return out;
    const auto& kt = kernels();
    const int64_t G = hq / hk, VL = kt.vector_lanes();
    // Work items (request, kv head, first lane) in that order, so that the items reading the same
    // keys run one after another on one thread (a request's K/V rows stay in L1/L2; dealt out by
    // cost instead, the time per request of 32 new tokens grew ~40% from 16 to 64 requests);
    // each thread takes one contiguous run, the runs cut where the keys scored so far reach its share.
    std::vector<int64_t> tasks, cost_before;
    int64_t cost_total = 0;
    for (int64_t r = 0; r < R; ++r)
        for (int64_t kh = 0; kh < hk; ++kh)
            for (int64_t lane0 = 0; lane0 < ep[r] * G; lane0 += VL) {
                const int64_t t_lo = lane0 / G, t_hi = std::min(ep[r] * G, lane0 + VL) / G;
                const int64_t hi = pp[r] + t_hi, lo = window > 0 ? std::max<int64_t>(0, pp[r] + t_lo + 1 - window) : 0;
                tasks.insert(tasks.end(), {r, kh, lane0});
                cost_before.push_back(cost_total);
                cost_total += hi - lo + 1;
            }
    const int64_t N = static_cast<int64_t>(cost_before.size());
    const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), N));
    std::vector<int64_t> bounds(threads + 1, N);
    for (int64_t th = 0; th < threads; ++th)  // the first item whose cost starts at or past th's share
        bounds[th] = std::lower_bound(cost_before.begin(), cost_before.end(), cost_total * th / threads) - cost_before.begin();
    ExtendAttnArgs a{q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(),
                     req_to_token.scalar_type() == at::kLong ? req_to_token.data_ptr<int64_t>() : nullptr,
                     req_to_token.scalar_type() == at::kInt ? req_to_token.data_ptr<int32_t>() : nullptr,
                     req_to_token.stride(0), rp, pp, ep, starts.data(), smap.defined() ? smap.data_ptr<int64_t>() : nullptr,
                     tasks.data(), hq, hk, d, dv, q.stride(0), window, static_cast<float>(scale),
                     static_cast<float>(logit_cap), dt};
    at::parallel_for(0, threads, 1, [&](int64_t b0, int64_t b1) {
        for (int64_t th = b0; th < b1; ++th) kt.extend_attention(a, bounds[th], bounds[th + 1]);
    });
    return out;
}

// torch.argmax(x, dim=-1) of a [B, V] fp32/bf16 tensor with dense rows, as int64 [B] (the same
// index: first of the largest value, NaN above all); rows split over the threads.
at::Tensor argmax(const at::Tensor& x) {
    check_cpu(x, "x");
    const DType dt = dtype_of(x, "x");
    TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.size(1) > 0, "sgl_kernel.argmax: x must be [B, V > 0] with dense rows");
    const int64_t B = x.size(0), V = x.size(1);
    at::Tensor out = at::empty({B}, x.options().dtype(at::kLong));
    const auto& kt = kernels();
    int64_t* o = out.data_ptr<int64_t>();
    at::parallel_for(0, B, 1, [&](int64_t r0, int64_t r1) { kt.argmax_rows(x.data_ptr(), x.stride(0), V, dt, o, r0, r1); });
    return out;
}

std::string isa() { return kernels().name; }

// Grammar-constrained sampling: in place, logits[b, t] = -inf where bit t of bitmask[b] is 0
// (xgrammar's packed int32 layout: word t / 32, bit t % 32), for t < vocab_size. Rows are mostly
// all-allowed or all-banned words, so whole words take a fast path; no ISA-specific code needed.
void apply_token_bitmask_(at::Tensor& logits, const at::Tensor& bitmask, int64_t vocab_size) {
    check_cpu(logits, "logits");
    check_cpu(bitmask, "bitmask");
    TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.is_contiguous(),
                "sgl_kernel: logits must be a contiguous float32 [B, V] tensor");
    TORCH_CHECK(bitmask.dim() == 2 && bitmask.scalar_type() == at::kInt && bitmask.is_contiguous() &&
                    bitmask.size(0) == logits.size(0),
                "sgl_kernel: bitmask must be a contiguous int32 [B, ceil(V / 32)] tensor");
    const int64_t rows = logits.size(0), width = logits.size(1);
    const int64_t vocab = std::min<int64_t>(std::min<int64_t>(vocab_size, width), bitmask.size(1) * 32);
    const int64_t words = (vocab + 31) / 32;
    float* out = logits.data_ptr<float>();
    const uint32_t* bits = reinterpret_cast<const uint32_t*>(bitmask.data_ptr<int32_t>());
    const float neg = -std::numeric_limits<float>::infinity();
    at::parallel_for(0, rows, 1, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            float* row = out + r * width;
            const uint32_t* m = bits + r * bitmask.size(1);
            for (int64_t w = 0; w < words; ++w) {
                const uint32_t word = m[w];
                if (word == 0xFFFFFFFFu) continue;
                const int64_t base = w * 32, n = std::min<int64_t>(32, vocab - base);
                if (word == 0) {
                    for (int64_t j = 0; j < n; ++j) row[base + j] = neg;
                    continue;
                }
                float* dst = row + base;
                if (n == 32) {  // branchless select: the compiler vectorizes it
                    for (int j = 0; j < 32; ++j) dst[j] = ((word >> j) & 1u) ? dst[j] : neg;
                } else {
                    for (int64_t j = 0; j < n; ++j) dst[j] = ((word >> j) & 1u) ? dst[j] : neg;
                }
            }
        }
    });
}

// Switches the kernel set (tests and benchmarks compare them); returns the one now in use.
std::string use_isa(const std::string& name) {
    TORCH_CHECK(name == "generic" || name == "avx2" || name == "avx512" || name == "avx512bf16" || name == "amx",
                "sgl_kernel: unknown ISA ", name);
    TORCH_CHECK(cpu_runs(name), "sgl_kernel: this CPU cannot run the ", name, " kernels");
    kernels() = table(name);
    return kernels().name;
}

bool cpu_supports(const std::string& name) { return cpu_runs(name); }

}  // namespace sglk

TORCH_LIBRARY(sgl_kernel, m) {
    m.def("isa() -> str", &sglk::isa);
    m.def("use_isa(str name) -> str", &sglk::use_isa);
    m.def("cpu_supports(str name) -> bool", &sglk::cpu_supports);
    m.def("linear(Tensor x, Tensor w, Tensor? w_scale, Tensor? bias, ScalarType? out_dtype=None, "
          "bool round_to_x=True) -> Tensor");
    m.def("linear_silu_mul(Tensor x, Tensor w, Tensor? w_scale, Tensor? bias) -> Tensor");
    m.def("linear_argmax(Tensor x, Tensor w, Tensor? bias, bool round_to_x=True) -> Tensor");
    m.def("pack_linear_weight(Tensor w) -> Tensor");
    m.def("gguf_linear(Tensor x, Tensor q, int qtype, int K, Tensor? bias, ScalarType? out_dtype=None, "
          "bool round_to_x=True, int row_kernel_max_rows=-1) -> Tensor");
    m.def("gguf_dequantize(Tensor q, int qtype, int K) -> Tensor");
    m.def("rmsnorm(Tensor x, Tensor weight, float eps) -> Tensor");
    m.def("add_rmsnorm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)");
    m.def("silu_and_mul(Tensor x) -> Tensor");
    m.def("rotary_embedding(Tensor positions, Tensor q, Tensor k, int head_size, Tensor cos, Tensor sin) "
          "-> (Tensor, Tensor)");
    m.def("decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor req_to_token, "
          "Tensor req_pool_indices, Tensor seq_lens, Tensor? slot_map, float scale, int window, "
          "float logit_cap) -> Tensor");
    m.def("extend_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor req_to_token, Tensor rows, "
          "Tensor prefix_lens, Tensor extend_lens, Tensor? slot_map, float scale, int window, float logit_cap) -> Tensor");
    m.def("argmax(Tensor x) -> Tensor");
    m.def("store_kv_(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor loc, Tensor k, Tensor v) -> ()");
    m.def("apply_token_bitmask_(Tensor(a!) logits, Tensor bitmask, int vocab_size) -> ()");
}

TORCH_LIBRARY_IMPL(sgl_kernel, CPU, m) {
    m.impl("linear", &sglk::linear);
    m.impl("linear_silu_mul", &sglk::linear_silu_mul);
    m.impl("linear_argmax", &sglk::linear_argmax);
    m.impl("pack_linear_weight", &sglk::pack_linear_weight);
    m.impl("gguf_linear", &sglk::gguf_linear);
    m.impl("gguf_dequantize", &sglk::gguf_dequantize);
    m.impl("rmsnorm", &sglk::rmsnorm);
    m.impl("add_rmsnorm", &sglk::add_rmsnorm);
    m.impl("silu_and_mul", &sglk::silu_and_mul);
    m.impl("rotary_embedding", &sglk::rotary_embedding);
    m.impl("decode_attention", &sglk::decode_attention);
    m.impl("extend_attention", &sglk::extend_attention);
    m.impl("argmax", &sglk::argmax);
    m.impl("store_kv_", &sglk::store_kv_);
    m.impl("apply_token_bitmask_", &sglk::apply_token_bitmask_);
}
