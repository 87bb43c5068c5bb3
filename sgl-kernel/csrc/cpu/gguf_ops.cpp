// The GGUF ops (torch.ops.sgl_kernel.gguf_linear, gguf_dequantize): checks, the activations as
// fp32 rows, and the thread split of gguf_impl.h's kernels (rows of outputs for few activation
// rows, panels of 32 outputs for many).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "ops_common.h"

namespace sglk {
namespace {

// Activation rows up to which the row kernel runs; beyond, the panel path (gguf_impl.h). Measured
// on the default model's MLP shape (docs/gguf.md): the panel path pays a transpose of each
// dequantized panel (~2x the row kernel at 1-8 rows) and wins from ~32 rows (3x at 128).
constexpr int64_t kRowKernelMaxRows = 16;

GgufType gguf_type_of(int64_t t, const char* op) {
    const GgufType g = static_cast<GgufType>(t);
    TORCH_CHECK(t >= 0 && t < 64 && gguf_block_values(g) > 0, op, ": GGUF tensor type ", t,
                " is not supported (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K-Q6_K are)");
    return g;
}

// q [rows, bytes] uint8 holding K values per row of type g.
void check_blocks(const at::Tensor& q, GgufType g, int64_t K, const char* op) {
    check_cpu(q, op);
    const int64_t bv = gguf_block_values(g), bb = gguf_block_bytes(g);
    TORCH_CHECK(q.scalar_type() == at::kByte && q.dim() == 2 && q.stride(1) == 1, op,
                ": q must be uint8 [rows, bytes] with dense rows, got ", q.sizes(), " ", q.scalar_type());
    TORCH_CHECK(K > 0 && K % bv == 0 && q.size(1) == K / bv * bb, op, ": ", K, " values of type ",
                static_cast<int>(g), " take ", K / bv * bb, " bytes per row (K a multiple of ", bv, "), q has ",
                q.size(1));
}

}  // namespace

at::Tensor gguf_dequantize(const at::Tensor& q, int64_t qtype, int64_t K) {
    const char* op = "sgl_kernel.gguf_dequantize";
    const GgufType g = gguf_type_of(qtype, op);
    check_blocks(q, g, K, op);
    at::Tensor out = at::empty({q.size(0), K}, q.options().dtype(at::kFloat));
    const auto& kt = kernels();
    const uint8_t* src = q.data_ptr<uint8_t>();
    float* dst = out.data_ptr<float>();
    const int64_t ldq = q.stride(0);
    at::parallel_for(0, q.size(0), 16, [&](int64_t r0, int64_t r1) { kt.gguf_dequantize(g, src, ldq, K, dst, r0, r1); });
    return out;
}

// x @ dequantize(q, qtype, K).T + bias with fp32 accumulation, in x's dtype or out_dtype (fp32);
// an fp32 result of bf16 x is rounded to bf16 first unless round_to_x is false (as `linear`).
// row_kernel_max_rows: activation rows up to which the row kernel runs (-1: the built-in choice;
// tests force each path with it).
at::Tensor gguf_linear(const at::Tensor& x, const at::Tensor& q, int64_t qtype, int64_t K,
                       const c10::optional<at::Tensor>& bias, c10::optional<at::ScalarType> out_dtype,
                       bool round_to_x, int64_t row_kernel_max_rows) {
    const char* op = "sgl_kernel.gguf_linear";
    const GgufType g = gguf_type_of(qtype, op);
    check_blocks(q, g, K, op);
    at::Tensor x2 = as_rows(x, "x");
    const DType xt = dtype_of(x, "x");
    TORCH_CHECK(x2.size(1) == K, op, ": x has ", x2.size(1), " features, the weight ", K);
    const at::ScalarType yst = out_dtype.value_or(x.scalar_type());
    TORCH_CHECK(yst == x.scalar_type() || yst == at::kFloat, op, ": out_dtype must be x's dtype or float32");
    const int64_t M = x2.size(0), N = q.size(0);
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = N;
    at::Tensor y = at::empty(shape, x.options().dtype(yst));
    if (M == 0 || N == 0) return y;
    at::Tensor xf = xt == DType::F32 ? x2 : x2.to(at::kFloat);  // bf16 -> fp32 is exact
    at::Tensor b;
    if (bias.has_value() && bias->defined()) {
        b = bias->to(at::kFloat).contiguous();
        TORCH_CHECK(b.numel() == N, op, ": bias needs ", N, " entries");
    }
    GgufLinearArgs a{xf.data_ptr<float>(), M, K, xf.stride(0), q.data_ptr<uint8_t>(), q.stride(0), g,
                     b.defined() ? b.data_ptr<float>() : nullptr, y.data_ptr(), N,
                     yst == at::kFloat ? DType::F32 : DType::BF16, round_to_x && xt == DType::BF16 && yst == at::kFloat};
    const auto& kt = kernels();
    const int64_t max_rows = row_kernel_max_rows < 0 ? kRowKernelMaxRows : row_kernel_max_rows;
    if (M <= max_rows || N % kPanel != 0) {
        // 8 outputs at least per thread, so small layers stay on one
        at::parallel_for(0, N, 8, [&](int64_t n0, int64_t n1) {
            std::vector<float> wbuf(K);
            kt.gguf_linear_rows(a, wbuf.data(), n0, n1);
        });
        return y;
    }
    at::parallel_for(0, N / kPanel, 1, [&](int64_t p0, int64_t p1) {
        std::vector<float> panel(K * kPanel), row(K);
        kt.gguf_linear_panels(a, panel.data(), row.data(), p0, p1);
    });
    return y;
}

}  // namespace sglk
