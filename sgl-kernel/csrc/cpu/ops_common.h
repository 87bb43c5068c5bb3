// What ops.cpp and decode_layer.cpp share: the kernel table of the ISA in use, argument checks,
// and how each kernel's work is split over torch's intra-op threads (one place, so that an op
// and the fused decoder layer split, and therefore round, alike).
#pragma once
#include <ATen/ATen.h>

#include "kernels.h"

namespace sglk {

struct Kernels {
    const char* name;
    decltype(&generic::linear) linear;
    decltype(&generic::linear_reads_bf16) linear_reads_bf16;
    decltype(&generic::linear_panels) linear_panels;
    decltype(&generic::rmsnorm) rmsnorm;
    decltype(&generic::silu_and_mul) silu_and_mul;
    decltype(&generic::rope) rope;
    decltype(&generic::decode_attention_split) decode_split;
    decltype(&generic::decode_attention_combine) decode_combine;
    decltype(&generic::extend_attention) extend_attention;
    decltype(&generic::vector_lanes) vector_lanes;
    decltype(&generic::argmax_rows) argmax_rows;
    decltype(&generic::gguf_dequantize) gguf_dequantize;
    decltype(&generic::gguf_linear_rows) gguf_linear_rows;
    decltype(&generic::gguf_linear_panels) gguf_linear_panels;
};

Kernels& kernels();  // the set this CPU runs (or the one use_isa chose)

DType dtype_of(const at::Tensor& t, const char* what);   // F32 / BF16, else an error
WType wtype_of(const at::Tensor& w, const char* what);   // F32 / BF16 / I8, else an error
void check_cpu(const at::Tensor& t, const char* what);
at::Tensor as_rows(const at::Tensor& t, const char* what);  // [rows, last], last dim dense

// Each decode request's KV row and length must lie inside req_to_token (`op` names the caller in
// the error); returns the longest context a query attends to (the last `window` keys if > 0).
int64_t longest_visible(const at::Tensor& req_to_token, const int64_t* rows, const int64_t* lens, int64_t B,
                        int64_t window, const char* op);

// A linear layer's weight [N, K] (fp32, bf16, or int8 with per-row scales; or packed in panels by
// pack_linear_weight: bf16 [N / 32, ceil(K / 2), 64], fp32 [N / 32, K, 32]) and bias, checked, the
// scales and bias as the fp32 the kernel reads. `op` names the caller in errors. (linear_ops.cpp)
struct LinearWeights {
    const at::Tensor* w;
    WType wtype;
    at::Tensor scale, bias;  // fp32 or undefined
    int64_t N, K;            // output and input features
};
at::Tensor pack_linear_weight(const at::Tensor& w);
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& w_scale,
                  const c10::optional<at::Tensor>& bias, c10::optional<at::ScalarType> out_dtype, bool round_to_x);
at::Tensor linear_silu_mul(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& w_scale,
                           const c10::optional<at::Tensor>& bias);
at::Tensor linear_argmax(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                         bool round_to_x);
// GGUF blocks (gguf_ops.cpp): y = x @ dequantize(q).T + bias, and the dequantized rows.
at::Tensor gguf_linear(const at::Tensor& x, const at::Tensor& q, int64_t qtype, int64_t K,
                       const c10::optional<at::Tensor>& bias, c10::optional<at::ScalarType> out_dtype,
                       bool round_to_x, int64_t row_kernel_max_rows);
at::Tensor gguf_dequantize(const at::Tensor& q, int64_t qtype, int64_t K);
LinearWeights linear_weights(const at::Tensor& w, const c10::optional<at::Tensor>& scale,
                             const c10::optional<at::Tensor>& bias, int64_t K, const char* op);

// The thread splits. `a` is complete except for the fields each launcher documents.
// y [M, N] (dtype yt, dense) = x @ w.T (* scale) + bias for x [M, K] of dtype xt (rows of stride
// ldx); bf16 x is read as it is where the kernels multiply bf16 pairs (AVX512-BF16), else copied
// to fp32 first (exactly). Panel weights need x of their dtype and split by panels of 32 outputs.
// round_to_bf16 (bf16 x, fp32 y only): each output rounded to bf16 before it is widened.
void run_linear(const LinearWeights& l, const void* x, DType xt, int64_t M, int64_t ldx, void* y, DType yt,
                bool round_to_bf16 = false);
// silu(x @ gate.T) * (x @ up.T) into y [M, N / 2] (dtype xt) for a gate_up weight (gate rows
// first): panel weights in one pass that never stores the products, else run_linear into a
// temporary and run_silu_and_mul; both round alike, so the results are bit-identical.
void run_linear_silu_mul(const LinearWeights& l, const void* x, DType xt, int64_t M, int64_t ldx, void* y);
void run_rmsnorm(const NormArgs& a, int64_t rows);
void run_silu_and_mul(const void* x, void* out, int64_t d, int64_t ldx, DType dt, int64_t rows);
void run_rope(const RopeArgs& a, int64_t T);
// Picks the split of the longest visible context (`longest` keys) over the threads, allocates
// the scratch (a.partial, a.n_split, a.split_len are filled here) and runs both phases.
void run_decode_attention(DecodeAttnArgs a, int64_t longest);

}  // namespace sglk
