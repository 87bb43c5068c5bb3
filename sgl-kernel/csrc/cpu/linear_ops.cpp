// The linear ops (torch.ops.sgl_kernel.linear, linear_silu_mul, pack_linear_weight) and their
// thread splits (run_linear, run_linear_silu_mul, which the fused decoder layer calls too): weight
// checks, the activations in the form the kernel set reads, panels or rows of outputs per thread.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "ops_common.h"

namespace sglk {

LinearWeights linear_weights(const at::Tensor& w, const c10::optional<at::Tensor>& scale,
                             const c10::optional<at::Tensor>& bias, int64_t K, const char* op) {
    check_cpu(w, op);
    LinearWeights l{&w, WType::BF16_PANELS, {}, {}, w.size(0) * kPanel, K};
    if (w.dim() == 3) {
        const bool f32 = w.scalar_type() == at::kFloat;
        l.wtype = f32 ? WType::F32_PANELS : WType::BF16_PANELS;
        TORCH_CHECK((f32 || w.scalar_type() == at::kBFloat16) && w.is_contiguous() &&
                        w.size(1) == (f32 ? K : (K + 1) / 2) && w.size(2) == (f32 ? kPanel : 2 * kPanel) &&
                        !(scale.has_value() && scale->defined()),
                    op, ": panel weights must be pack_linear_weight's [N / 32, ", (K + 1) / 2, ", 64] bf16 or [N / 32, ",
                    K, ", 32] fp32, got ", w.sizes(), " ", w.scalar_type());
    } else {
        TORCH_CHECK(w.dim() == 2 && w.stride(1) == 1 && w.size(1) == K, op, ": w must be [N, ", K,
                    "] with dense rows, got ", w.sizes());
        l.wtype = wtype_of(w, op);
        l.N = w.size(0);
    }
    if (l.wtype == WType::I8) {
        TORCH_CHECK(scale.has_value() && scale->defined(), op, ": int8 weights need per-row scales");
        l.scale = scale->to(at::kFloat).contiguous();
        TORCH_CHECK(l.scale.numel() == l.N, op, ": int8 weights need ", l.N, " scales");
    }
    if (bias.has_value() && bias->defined()) {
        l.bias = bias->to(at::kFloat).contiguous();
        TORCH_CHECK(l.bias.numel() == l.N, op, ": bias needs ", l.N, " entries");
    }
    return l;
}

// A weight [N, K] (N a multiple of 32) in the panel layout of panels_impl.h: bf16
// [N / 32, ceil(K / 2), 64], panel p, pair q holding w[32p + c, 2q + e] at 2c + e, zero past K;
// fp32 [N / 32, K, 32], panel p, row k holding w[32p + c, k] at c.
at::Tensor pack_linear_weight(const at::Tensor& w) {
    check_cpu(w, "w");
    const bool f32 = w.scalar_type() == at::kFloat;
    TORCH_CHECK(w.dim() == 2 && (f32 || w.scalar_type() == at::kBFloat16) && w.size(0) % kPanel == 0,
                "sgl_kernel.pack_linear_weight: w must be bf16 or fp32 [N, K] with N a multiple of ", kPanel,
                ", got ", w.sizes(), " ", w.scalar_type());
    const at::Tensor wc = w.contiguous();
    const int64_t N = w.size(0), K = w.size(1), pairs = (K + 1) / 2;
    if (f32) {
        at::Tensor out = at::empty({N / kPanel, K, kPanel}, w.options());
        const float* src = wc.data_ptr<float>();
        float* dst = out.data_ptr<float>();
        at::parallel_for(0, N / kPanel, 1, [&](int64_t p0, int64_t p1) {
            for (int64_t p = p0; p < p1; ++p)
                for (int64_t k = 0; k < K; ++k)
                    for (int64_t c = 0; c < kPanel; ++c)
                        dst[(p * K + k) * kPanel + c] = src[(p * kPanel + c) * K + k];
        });
        return out;
    }
    at::Tensor out = at::zeros({N / kPanel, pairs, 2 * kPanel}, w.options());
    const uint16_t* src = reinterpret_cast<const uint16_t*>(wc.data_ptr());
    uint16_t* dst = reinterpret_cast<uint16_t*>(out.data_ptr());
    at::parallel_for(0, N / kPanel, 1, [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p)
            for (int64_t c = 0; c < kPanel; ++c)
                for (int64_t k = 0; k < K; ++k)
                    dst[(p * pairs + k / 2) * 2 * kPanel + 2 * c + (k & 1)] = src[(p * kPanel + c) * K + k];
    });
    return out;
}

namespace {
// x as the kernel set reads it for weights of type wt: bf16 rows in place where it multiplies bf16
// (AVX512-BF16), else fp32 (bf16 -> fp32 is exact: the high half of the fp32 bits), converted into
// `keep` with row stride K. Returns (fp32 rows or nullptr, bf16 rows or nullptr, their row stride).
struct LinearInput {
    const float* xf;
    const bf16_t* xb;
    int64_t ldx;
};

LinearInput linear_input(const Kernels& kt, WType wt, const void* x, DType xt, int64_t M, int64_t K, int64_t ldx,
                         at::Tensor& keep) {
    if (xt == DType::F32) return {static_cast<const float*>(x), nullptr, ldx};
    if (kt.linear_reads_bf16(wt)) return {nullptr, static_cast<const bf16_t*>(x), ldx};
    keep = at::empty({M * K}, at::TensorOptions().dtype(at::kFloat));
    float* dst = keep.data_ptr<float>();
    for (int64_t m = 0; m < M; ++m) {
        const uint16_t* src = static_cast<const uint16_t*>(x) + m * ldx;
        for (int64_t k = 0; k < K; ++k) {
            const uint32_t u = static_cast<uint32_t>(src[k]) << 16;
            std::memcpy(dst + m * K + k, &u, 4);
        }
    }
    return {dst, nullptr, K};
}

void check_panel_activations(const LinearWeights& l, DType xt) {
    const bool f32 = l.wtype == WType::F32_PANELS;
    TORCH_CHECK(xt == (f32 ? DType::F32 : DType::BF16), "sgl_kernel.linear: panel weights multiply ",
                f32 ? "fp32" : "bf16", " activations");
}
}  // namespace

void run_linear(const LinearWeights& l, const void* x, DType xt, int64_t M, int64_t ldx, void* y, DType yt,
                bool round_to_bf16) {
    const int64_t N = l.N, K = l.K;
    const auto& kt = kernels();
    at::Tensor x32;
    round_to_bf16 = round_to_bf16 && xt == DType::BF16 && yt == DType::F32;
    if (is_panels(l.wtype)) {
        check_panel_activations(l, xt);
        const LinearInput in = linear_input(kt, l.wtype, x, xt, M, K, ldx, x32);
        LinearArgs a{in.xf, in.xb, M, K, in.ldx, l.w->data_ptr(), l.w->stride(0), l.wtype,
                     nullptr, l.bias.defined() ? l.bias.data_ptr<float>() : nullptr, y, N, yt};
        a.round_to_bf16 = round_to_bf16;
        // two panels (64 outputs) at least per thread, so small layers stay on one
        at::parallel_for(0, N / kPanel, 2, [&](int64_t p0, int64_t p1) { kt.linear_panels(a, p0, p1); });
        return;
    }
    const LinearInput in = linear_input(kt, l.wtype, x, xt, M, K, ldx, x32);
    LinearArgs a{in.xf, in.xb, M, K, in.ldx, l.w->data_ptr(), l.w->stride(0), l.wtype,
                 l.scale.defined() ? l.scale.data_ptr<float>() : nullptr,
                 l.bias.defined() ? l.bias.data_ptr<float>() : nullptr, y, N, yt};
    a.round_to_bf16 = round_to_bf16;
    // blocks of 24 output rows (whole register tiles on every ISA); a thread takes at least 3,
    // so small layers stay on one
    constexpr int64_t kBlock = 24;
    at::parallel_for(0, (N + kBlock - 1) / kBlock, 3,
                     [&](int64_t b0, int64_t b1) { kt.linear(a, b0 * kBlock, std::min(N, b1 * kBlock)); });
}

void run_linear_silu_mul(const LinearWeights& l, const void* x, DType xt, int64_t M, int64_t ldx, void* y) {
    TORCH_CHECK(l.N % 2 == 0, "sgl_kernel.linear_silu_mul: gate_up must have an even number of rows");
    const int64_t I = l.N / 2;
    if (is_panels(l.wtype) && I % kPanel == 0) {
        check_panel_activations(l, xt);
        at::Tensor x32;
        const LinearInput in = linear_input(kernels(), l.wtype, x, xt, M, l.K, ldx, x32);
        LinearArgs a{in.xf, in.xb, M, l.K, in.ldx, l.w->data_ptr(), l.w->stride(0), l.wtype,
                     nullptr, l.bias.defined() ? l.bias.data_ptr<float>() : nullptr, y, I, xt};
        a.up_offset = I / kPanel;
        const auto& kt = kernels();  // a gate panel is two panels' work: one at least per thread
        at::parallel_for(0, I / kPanel, 1, [&](int64_t p0, int64_t p1) { kt.linear_panels(a, p0, p1); });
        return;
    }
    at::Tensor gu = at::empty({M, 2 * I}, at::TensorOptions().dtype(xt == DType::F32 ? at::kFloat : at::kBFloat16));
    run_linear(l, x, xt, M, ldx, gu.data_ptr(), xt);
    run_silu_and_mul(gu.data_ptr(), y, I, 2 * I, xt, M);
}

namespace {
// The linear ops' shared frame: x [..., K] as rows, w checked, y [..., N / (gated ? 2 : 1)] of
// x's dtype or fp32 (out_f32; round_to_x: rounded to x's dtype first).
at::Tensor linear_op(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& w_scale,
                     const c10::optional<at::Tensor>& bias, bool gated, const char* op, bool out_f32 = false,
                     bool round_to_x = true) {
    at::Tensor x2 = as_rows(x, "x");
    const int64_t M = x2.size(0), K = x2.size(1);
    const DType xt = dtype_of(x, "x");
    const LinearWeights l = linear_weights(w, w_scale, bias, K, op);
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = gated ? l.N / 2 : l.N;
    at::Tensor y = at::empty(shape, out_f32 ? x.options().dtype(at::kFloat) : x.options());
    if (M == 0 || l.N == 0) return y;
    if (gated) run_linear_silu_mul(l, x2.data_ptr(), xt, M, x2.stride(0), y.data_ptr());
    else run_linear(l, x2.data_ptr(), xt, M, x2.stride(0), y.data_ptr(), out_f32 ? DType::F32 : xt, round_to_x);
    return y;
}
}  // namespace

// x @ w.T (* w_scale[:, None] for int8 w) + bias, fp32 accumulation, in x's dtype or out_dtype
// (x's or fp32). An fp32 result for bf16 x is linear(x).float() (round_to_x, in one pass: the panel
// kernels store each sum rounded and widened), or the fp32 sums themselves (an fp32 LM head).
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& w_scale,
                  const c10::optional<at::Tensor>& bias, c10::optional<at::ScalarType> out_dtype, bool round_to_x) {
    const at::ScalarType yt = out_dtype.value_or(x.scalar_type());
    TORCH_CHECK(yt == x.scalar_type() || yt == at::kFloat, "sgl_kernel.linear: out_dtype must be x's dtype or float32, got ",
                yt);
    return linear_op(x, w, w_scale, bias, false, "sgl_kernel.linear", yt != x.scalar_type(), round_to_x);
}

// silu(gate) * up of x @ w.T for a gate_up weight [2I, K] (gate rows first; any form linear
// takes): silu_and_mul(linear(x, w, w_scale, bias)), bit-identical, in one pass over panel weights.
at::Tensor linear_silu_mul(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& w_scale,
                           const c10::optional<at::Tensor>& bias) {
    return linear_op(x, w, w_scale, bias, true, "sgl_kernel.linear_silu_mul");
}

// torch.argmax(linear(x, w, None, bias, float32, round_to_x), dim=-1) for panel weights, without
// storing the products: an all-greedy batch's LM head. Each thread keeps the running argmax of every
// row over its panels, in vector lanes (LinearArgs::argmax_value), and the lanes and threads are
// merged in column order here; the values compared are the ones `linear` would store, so the index
// is torch.argmax's on them (first of the largest, NaN above all). A batch-64 decode step of the
// default model skips writing 12.6 MB of logits and reading them back.
at::Tensor linear_argmax(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                         bool round_to_x) {
    const char* op = "sgl_kernel.linear_argmax";
    at::Tensor x2 = as_rows(x, "x");
    const int64_t M = x2.size(0), K = x2.size(1);
    const DType xt = dtype_of(x, "x");
    const LinearWeights l = linear_weights(w, c10::nullopt, bias, K, op);
    TORCH_CHECK(is_panels(l.wtype), op, ": w must be panel weights (pack_linear_weight)");
    check_panel_activations(l, xt);
    const int64_t panels = l.N / kPanel;
    TORCH_CHECK(panels > 0, op, ": w has no outputs");
    at::Tensor out = at::empty({M}, x.options().dtype(at::kLong));
    if (M == 0) return out;
    const auto& kt = kernels();
    const int64_t lanes = kt.vector_lanes();
    // one range of panels per thread, in column order, two panels at least
    const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), panels / 2));
    at::Tensor best = at::full({chunks, M, lanes}, -std::numeric_limits<float>::infinity(),
                               x.options().dtype(at::kFloat));
    at::Tensor index = at::full({chunks, M, lanes}, -1, x.options().dtype(at::kInt));  // -1: no column yet
    at::Tensor x32;
    const LinearInput in = linear_input(kt, l.wtype, x2.data_ptr(), xt, M, K, x2.stride(0), x32);
    LinearArgs base{in.xf, in.xb, M, K, in.ldx, l.w->data_ptr(), l.w->stride(0), l.wtype,
                    nullptr, l.bias.defined() ? l.bias.data_ptr<float>() : nullptr, nullptr, l.N, DType::F32};
    base.round_to_bf16 = round_to_x && xt == DType::BF16;
    at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
            LinearArgs a = base;
            a.argmax_value = best.data_ptr<float>() + c * M * lanes;
            a.argmax_index = index.data_ptr<int32_t>() + c * M * lanes;
            kt.linear_panels(a, panels * c / chunks, panels * (c + 1) / chunks);
        }
    });
    const float* bv = best.data_ptr<float>();
    const int32_t* bi = index.data_ptr<int32_t>();
    int64_t* o = out.data_ptr<int64_t>();
    for (int64_t m = 0; m < M; ++m) {
        float value = 0.0f;
        int64_t at = -1;
        for (int64_t c = 0; c < chunks; ++c)
            for (int64_t lane = 0; lane < lanes; ++lane) {
                const int64_t e = (c * M + m) * lanes + lane, i = bi[e];
                const float v = bv[e];
                if (i < 0) continue;  // a lane that saw only -inf (or nothing)
                // kernels_impl.h's argmax_better (that one lives in each ISA's namespace)
                const bool vn = v != v, an = value != value;
                const bool better = at < 0 || (vn || an ? vn && (!an || i < at) : v > value || (v == value && i < at));
                if (better) {
                    value = v;
                    at = i;
                }
            }
        o[m] = at < 0 ? 0 : at;  // every output -inf: the first
    }
    return out;
}

}  // namespace sglk
