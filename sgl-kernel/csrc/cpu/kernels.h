// Raw-pointer CPU kernels, compiled once per instruction set (isa_*.cpp) and picked at run time
// by ops.cpp. Nothing here includes torch: each ISA translation unit is compiled under its own
// `#pragma GCC target`, and sharing inline torch/std code between them could let the linker keep
// an AVX-512 copy of a function that AVX2 code calls.
//
// Threading is the caller's (ops.cpp, linear_ops.cpp: at::parallel_for, torch's intra-op pool);
// every kernel takes the [begin, end) slice of its outermost loop that one thread owns.
#pragma once
#include <cstdint>
#include <type_traits>

namespace sglk {

using bf16_t = uint16_t;
constexpr int64_t kPanel = 32;  // output features per panel of *_PANELS weights

enum class DType : int { F32 = 0, BF16 = 1 };
// BF16_PANELS / F32_PANELS: bf16 / fp32 weights in pack_linear_weight's layouts (panels_impl.h),
// for linear_panels.
enum class WType : int { F32 = 0, BF16 = 1, I8 = 2, BF16_PANELS = 3, F32_PANELS = 4 };
inline bool is_panels(WType t) { return t == WType::BF16_PANELS || t == WType::F32_PANELS; }

struct LinearArgs {
    const float* x;      // [M, K] fp32 activations (row stride ldx), or nullptr
    const bf16_t* xb;    // [M, K] bf16 activations, or nullptr: read instead of x where
                         // linear_reads_bf16(wtype) (same row stride ldx)
    int64_t M, K, ldx;
    const void* w;       // [N, K] weights, row stride ldw, of type wtype (*_PANELS: panels of
    int64_t ldw;         // 32 rows, ldw elements apart)
    WType wtype;
    const float* w_scale;  // [N] per-row dequant scales (I8 only)
    const float* bias;     // [N] or nullptr
    void* y;             // [M, N] output of type ytype (row stride ldy)
    int64_t ldy;
    DType ytype;
    // fp32 y: each output rounded to bf16 first, i.e. the bf16 linear widened to fp32 in the
    // same pass (what linear(x) then .float() stores, without the bf16 round trip).
    bool round_to_bf16 = false;
    // *_PANELS only, > 0: a gated MLP's gate_up, up rows `up_offset` panels after the gate's;
    // y [M, ldy] = silu(x @ gate.T) * (x @ up.T) over the gate panels, each product rounded to
    // ytype first as the unfused linear then silu_and_mul rounds it.
    int64_t up_offset = 0;
    // Greedy sampling (sgl_kernel.linear_argmax; panel weights, fp32 y): y is not stored, each
    // vector of outputs updates its row's running argmax instead, one lane per column mod the
    // vector width, argmax_value / argmax_index [M, vector_lanes()] (torch.argmax's choice: the
    // first of the largest, NaN above all; a lane sees its columns in increasing order).
    float* argmax_value = nullptr;
    int32_t* argmax_index = nullptr;
};

// GGUF (llama.cpp) tensor types, with ggml's enum values (gguf_impl.h has their block layouts).
enum class GgufType : int {
    F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q2_K = 10, Q3_K = 11, Q4_K = 12,
    Q5_K = 13, Q6_K = 14, BF16 = 30
};
// Values per block and bytes per block (0: a type these kernels do not read).
inline int64_t gguf_block_values(GgufType t) {
    switch (t) {
        case GgufType::F32: case GgufType::F16: case GgufType::BF16: return 1;
        case GgufType::Q4_0: case GgufType::Q4_1: case GgufType::Q5_0: case GgufType::Q5_1: case GgufType::Q8_0: return 32;
        case GgufType::Q2_K: case GgufType::Q3_K: case GgufType::Q4_K: case GgufType::Q5_K: case GgufType::Q6_K: return 256;
    }
    return 0;
}
inline int64_t gguf_block_bytes(GgufType t) {
    switch (t) {
        case GgufType::F32: return 4;
        case GgufType::F16: case GgufType::BF16: return 2;
        case GgufType::Q4_0: return 18;
        case GgufType::Q4_1: return 20;
        case GgufType::Q5_0: return 22;
        case GgufType::Q5_1: return 24;
        case GgufType::Q8_0: return 34;
        case GgufType::Q2_K: return 84;
        case GgufType::Q3_K: return 110;
        case GgufType::Q4_K: return 144;
        case GgufType::Q5_K: return 176;
        case GgufType::Q6_K: return 210;
    }
    return 0;
}

// y [M, N] = x @ dequantize(q).T + bias, q [N, ldq bytes] of GGUF blocks (gguf_impl.h).
struct GgufLinearArgs {
    const float* x;      // [M, K] fp32 activations (row stride ldx)
    int64_t M, K, ldx;
    const uint8_t* q;    // [N, ldq] blocks, K values per row
    int64_t ldq;
    GgufType qtype;
    const float* bias;   // [N] or nullptr
    void* y;             // [M, N] of ytype (row stride ldy)
    int64_t ldy;
    DType ytype;
    bool round_to_bf16;  // fp32 y: each output rounded to bf16 first (as LinearArgs)
};

struct NormArgs {
    const void* x;           // [rows, H] (row stride ldx)
    const void* residual;    // [rows, H] or nullptr (row stride ldr)
    const void* weight;      // [H]
    void* out;               // [rows, H] contiguous
    void* residual_out;      // [rows, H] contiguous, or nullptr (= x + residual)
    int64_t H, ldx, ldr;
    float eps;
    DType dtype;
};

struct RopeArgs {
    const void* q;           // [T, hq, head] (row stride ldq)
    const void* k;           // [T, hk, head] (row stride ldk)
    void* q_out;             // [T, hq, head] contiguous
    void* k_out;             // [T, hk, head] contiguous
    int64_t hq, hk, head, rotary_dim, ldq, ldk;
    const int64_t* positions;  // [T]
    const float* cos;        // [max_pos, rotary_dim] (HF layout: cat(freqs, freqs))
    const float* sin;
    DType dtype;
};

struct DecodeAttnArgs {
    const void* q;           // [B, hq, d] (row stride ldq per request)
    const void* k_cache;     // [S, hk, d]
    const void* v_cache;     // [S, hk, dv]
    void* out;               // [B, hq, dv] contiguous
    float* partial;          // [B, hq, n_split, dv + 2] scratch: (m, l, acc[dv])
    const int64_t* req_to_token;  // [R, ld_r2t] (int64) or nullptr
    const int32_t* req_to_token32;  // [R, ld_r2t] (int32) or nullptr
    int64_t ld_r2t;
    const int64_t* req_pool_indices;  // [B]
    const int64_t* seq_lens;          // [B]
    const int64_t* slot_map;  // full -> SWA slot translation, or nullptr
    int64_t B, hq, hk, d, dv, ldq, n_split, split_len;
    int64_t window;          // > 0: only keys with position > seq_len - 1 - window
    float scale, logit_cap;
    DType dtype;
    int64_t kv_per_task = 1;  // kv heads per work item (set by run_decode_attention)
};

// New tokens of a batch of extends over their requests' pool slots (queries rows of q; request r's
// tokens are q rows starts[r] .. starts[r] + extend_lens[r], at positions prefix_lens[r] + t).
struct ExtendAttnArgs {
    const void* q;             // [T, hq, d] (row stride ldq per token)
    const void* k_cache;       // [S, hk, d]
    const void* v_cache;       // [S, hk, dv]
    void* out;                 // [T, hq, dv] contiguous
    const int64_t* req_to_token;    // [R, ld_r2t] (int64) or nullptr
    const int32_t* req_to_token32;  // [R, ld_r2t] (int32) or nullptr
    int64_t ld_r2t;
    const int64_t* rows;         // per request: its req_to_token row,
    const int64_t* prefix_lens;  // its cached prefix,
    const int64_t* extend_lens;  // its new tokens,
    const int64_t* starts;       // and the q row of its first new token
    const int64_t* slot_map;     // full -> SWA slot translation, or nullptr
    const int64_t* tasks;        // [n_tasks, 3]: request, kv head, first lane (lane = t * G + g)
    int64_t hq, hk, d, dv, ldq;
    int64_t window;              // > 0: only keys with position > query position - window
    float scale, logit_cap;
    DType dtype;
};

#define SGLK_DECLARE_KERNELS(ns)                                                          \
    namespace ns {                                                                        \
    void linear(const LinearArgs& a, int64_t n_begin, int64_t n_end);                     \
    bool linear_reads_bf16(WType wtype);                                                  \
    void linear_panels(const LinearArgs& a, int64_t panel_begin, int64_t panel_end);      \
    void rmsnorm(const NormArgs& a, int64_t row_begin, int64_t row_end);                  \
    void silu_and_mul(const void* x, void* out, int64_t d, int64_t ldx, DType dt,         \
                      int64_t row_begin, int64_t row_end);                                \
    void rope(const RopeArgs& a, int64_t t_begin, int64_t t_end);                         \
    void decode_attention_split(const DecodeAttnArgs& a, int64_t task_begin,              \
                                int64_t task_end);                                        \
    void decode_attention_combine(const DecodeAttnArgs& a, int64_t row_begin,             \
                                  int64_t row_end);                                       \
    void extend_attention(const ExtendAttnArgs& a, int64_t task_begin, int64_t task_end); \
    int vector_lanes();                                                                   \
    void argmax_rows(const void* x, int64_t ld, int64_t V, DType dt, int64_t* out,         \
                     int64_t row_begin, int64_t row_end);                                 \
    void gguf_dequantize(GgufType t, const uint8_t* q, int64_t ldq, int64_t K, float* out,  \
                         int64_t row_begin, int64_t row_end);                             \
    void gguf_linear_rows(const GgufLinearArgs& a, float* wbuf, int64_t n_begin,          \
                          int64_t n_end);                                                 \
    void gguf_linear_panels(const GgufLinearArgs& a, float* panel_buf, float* row_buf,    \
                            int64_t p_begin, int64_t p_end);                              \
    }

SGLK_DECLARE_KERNELS(generic)
SGLK_DECLARE_KERNELS(avx2)
SGLK_DECLARE_KERNELS(avx512)
SGLK_DECLARE_KERNELS(avx512bf16)
SGLK_DECLARE_KERNELS(amx)

}  // namespace sglk
