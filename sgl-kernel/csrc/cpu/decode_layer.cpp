// torch.ops.sgl_kernel.decode_layer: one Llama-family decoder layer (Llama, Qwen2's qkv bias,
// Qwen3's per-head q/k norms) for a decode batch, in one call. It runs the same kernels, with the
// same thread splits, as the per-op path of the model code
//
//     h, r = add_rmsnorm(hidden, residual, input_norm)   (rmsnorm(hidden), r = hidden: first layer)
//     q, k, v = split(linear(h, qkv)); q, k = q_norm(q), k_norm(k)  (Qwen3)
//     q, k = rotary_embedding(positions, q, k); k_cache[loc], v_cache[loc] = k, v
//     o = linear(decode_attention(q, k_cache, v_cache, ...), o_proj)
//     h, r = add_rmsnorm(o, r, post_norm)
//     return linear(linear_silu_mul(h, gate_up), down), r      (= silu_and_mul(linear(h, gate_up)))
//
// so its result is bit-identical to that path (test/srt/layers/test_fused_decode.py), without
// ~25 Python-level calls, their temporaries and dtype round trips per layer: at batch 1 those
// cost about as much as the attention and MLP kernels together. The RoPE'd k goes straight to
// its cache slot (fused RoPE + KV write).
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstring>

#include "ops_common.h"

namespace sglk {
namespace {

// y [M, N] (dense, dtype dt) = x [M, K] (dense, dtype dt) @ w.T
void linear_into(const LinearWeights& l, const void* x, int64_t M, DType dt, void* y) {
    run_linear(l, x, dt, M, l.K, y, dt);
}

void check_norm_weight(const at::Tensor& w, int64_t H, const at::Tensor& x, const char* what) {
    TORCH_CHECK(w.scalar_type() == x.scalar_type() && w.is_contiguous() && w.numel() == H,
                "sgl_kernel.decode_layer: ", what, " must be a dense [", H, "] tensor of hidden's dtype");
}

// The tensors a layer writes besides its results, [B, ...] of hidden's dtype: kept by
// decode_layers across its layers (one allocation each per step instead of one per layer).
struct LayerScratch {
    at::Tensor h, qkv_out, q_rot, attn, act, o_out, res_mid;
    bool fits(int64_t B, int64_t H, int64_t qkv_n, int64_t q_n, int64_t I) const {
        return h.defined() && h.size(0) == B && h.size(1) == H && qkv_out.size(1) == qkv_n && q_rot.size(1) == q_n &&
               act.size(1) == I;
    }
    void make(const at::TensorOptions& opt, int64_t B, int64_t H, int64_t qkv_n, int64_t q_n, int64_t I) {
        h = at::empty({B, H}, opt), qkv_out = at::empty({B, qkv_n}, opt), q_rot = at::empty({B, q_n}, opt);
        attn = at::empty({B, q_n}, opt), act = at::empty({B, I}, opt), o_out = at::empty({B, H}, opt);
        res_mid = at::empty({B, H}, opt);
    }
};

// One layer (decode_layer's arguments). `scratch`: reused when its shapes fit, else (re)made.
// `into`: where the results go (hidden's shape, dense; the inputs are read before they are
// written, so they may be the inputs themselves), or undefined for new tensors.
std::tuple<at::Tensor, at::Tensor> decode_layer_impl(
    LayerScratch& scratch, const at::Tensor& into_out, const at::Tensor& into_res,
    const at::Tensor& hidden, const c10::optional<at::Tensor>& residual, const at::Tensor& input_norm,
    const at::Tensor& post_norm, double eps, const at::Tensor& qkv_w, const c10::optional<at::Tensor>& qkv_scale,
    const c10::optional<at::Tensor>& qkv_bias, const at::Tensor& o_w, const c10::optional<at::Tensor>& o_scale,
    const c10::optional<at::Tensor>& o_bias, const at::Tensor& gate_up_w,
    const c10::optional<at::Tensor>& gate_up_scale, const c10::optional<at::Tensor>& gate_up_bias,
    const at::Tensor& down_w, const c10::optional<at::Tensor>& down_scale,
    const c10::optional<at::Tensor>& down_bias, const c10::optional<at::Tensor>& q_norm,
    const c10::optional<at::Tensor>& k_norm, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
    const at::Tensor& positions, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& k_cache,
    const at::Tensor& v_cache, const at::Tensor& out_cache_loc, const at::Tensor& req_to_token,
    const at::Tensor& req_pool_indices, const at::Tensor& seq_lens, double scale, int64_t window,
    double logit_cap) {
    check_cpu(hidden, "hidden");
    const DType dt = dtype_of(hidden, "hidden");
    TORCH_CHECK(hidden.dim() == 2 && hidden.is_contiguous(), "sgl_kernel.decode_layer: hidden must be a dense [B, H]");
    const int64_t B = hidden.size(0), H = hidden.size(1);
    const int64_t hq = num_heads, hk = num_kv_heads, d = head_dim;
    TORCH_CHECK(hq > 0 && hk > 0 && d > 0 && hq % hk == 0 && hq / hk <= 64 && (hq / hk) * d <= 8192 && d <= 512,
                "sgl_kernel.decode_layer: bad head counts");
    const int64_t qkv_n = (hq + 2 * hk) * d;
    if (residual.has_value() && residual->defined())
        TORCH_CHECK(residual->scalar_type() == hidden.scalar_type() && residual->is_contiguous() &&
                        residual->sizes() == hidden.sizes(),
                    "sgl_kernel.decode_layer: residual must match hidden");
    check_norm_weight(input_norm, H, hidden, "input_norm");
    check_norm_weight(post_norm, H, hidden, "post_norm");
    const bool qk_norm = q_norm.has_value() && q_norm->defined();
    TORCH_CHECK(qk_norm == (k_norm.has_value() && k_norm->defined()), "sgl_kernel.decode_layer: q_norm and k_norm go together");
    if (qk_norm) {
        check_norm_weight(*q_norm, d, hidden, "q_norm");
        check_norm_weight(*k_norm, d, hidden, "k_norm");
    }
    const LinearWeights qkv = linear_weights(qkv_w, qkv_scale, qkv_bias, H, "sgl_kernel.decode_layer: qkv");
    TORCH_CHECK(qkv.N == qkv_n, "sgl_kernel.decode_layer: qkv has ", qkv.N, " rows, heads say ", qkv_n);
    const LinearWeights o = linear_weights(o_w, o_scale, o_bias, hq * d, "sgl_kernel.decode_layer: o_proj");
    TORCH_CHECK(o.N == H, "sgl_kernel.decode_layer: o_proj must give ", H, " features");
    const LinearWeights gate_up = linear_weights(gate_up_w, gate_up_scale, gate_up_bias, H, "sgl_kernel.decode_layer: gate_up");
    TORCH_CHECK(gate_up.N % 2 == 0, "sgl_kernel.decode_layer: gate_up must be [2I, H]");
    const int64_t I = gate_up.N / 2;
    const LinearWeights down = linear_weights(down_w, down_scale, down_bias, I, "sgl_kernel.decode_layer: down");
    TORCH_CHECK(down.N == H, "sgl_kernel.decode_layer: down must give ", H, " features");

    // KV pool and batch metadata (as sgl_kernel.decode_attention checks them)
    TORCH_CHECK(k_cache.scalar_type() == hidden.scalar_type() && v_cache.scalar_type() == hidden.scalar_type() &&
                    k_cache.dim() == 3 && v_cache.dim() == 3 && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                    k_cache.size(1) == hk && k_cache.size(2) == d && v_cache.size(1) == hk &&
                    v_cache.size(2) == d && v_cache.size(0) == k_cache.size(0),
                "sgl_kernel.decode_layer: caches must be dense [slots, kv_heads, head_dim] of hidden's dtype");
    const int64_t S = k_cache.size(0);
    TORCH_CHECK(req_to_token.dim() == 2 && req_to_token.stride(1) == 1 &&
                    (req_to_token.scalar_type() == at::kLong || req_to_token.scalar_type() == at::kInt),
                "sgl_kernel.decode_layer: req_to_token must be int32/int64 [R, L]");
    at::Tensor rows = req_pool_indices.to(at::kLong).contiguous();
    at::Tensor lens = seq_lens.to(at::kLong).contiguous();
    at::Tensor loc = out_cache_loc.to(at::kLong).contiguous();
    at::Tensor pos = positions.to(at::kLong).contiguous();
    TORCH_CHECK(rows.numel() == B && lens.numel() == B && loc.numel() == B && pos.numel() == B,
                "sgl_kernel.decode_layer: one row, length, cache slot and position per request");
    TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.is_contiguous() &&
                    sin.is_contiguous() && cos.dim() == 2 && cos.sizes() == sin.sizes() && cos.size(1) % 2 == 0 &&
                    cos.size(1) <= d,
                "sgl_kernel.decode_layer: cos/sin must be dense fp32 [max_pos, rotary_dim <= head_dim]");
    const int64_t* rp = rows.data_ptr<int64_t>();
    const int64_t* lp = lens.data_ptr<int64_t>();
    const int64_t* cp = loc.data_ptr<int64_t>();
    const int64_t* pp = pos.data_ptr<int64_t>();
    const int64_t longest = longest_visible(req_to_token, rp, lp, B, window, "sgl_kernel.decode_layer");
    for (int64_t b = 0; b < B; ++b) {
        TORCH_CHECK(cp[b] >= 0 && cp[b] < S, "sgl_kernel.decode_layer: cache slot ", cp[b], " outside the pool");
        TORCH_CHECK(pp[b] >= 0 && pp[b] < cos.size(0), "sgl_kernel.decode_layer: position ", pp[b],
                    " outside the table of ", cos.size(0));
    }

    const at::TensorOptions opt = hidden.options();
    at::Tensor out = into_out.defined() ? into_out : at::empty({B, H}, opt);
    at::Tensor r_out = into_res.defined() ? into_res : at::empty({B, H}, opt);
    if (B == 0) return {out, residual.has_value() && residual->defined() ? r_out : hidden};
    if (!scratch.fits(B, H, qkv_n, hq * d, I)) scratch.make(opt, B, H, qkv_n, hq * d, I);
    const at::Tensor &h = scratch.h, &qkv_out = scratch.qkv_out, &q_rot = scratch.q_rot, &attn = scratch.attn;
    const at::Tensor &act = scratch.act, &o_out = scratch.o_out;
    // the residual stream after the input norm's add (the first layer's: hidden itself)
    const at::Tensor res_out = residual.has_value() && residual->defined() ? scratch.res_mid : hidden;
    const size_t esz = hidden.element_size();
    auto row = [&](const at::Tensor& t, int64_t r, int64_t col) {  // &t[r, col] of a dense 2-D tensor
        return static_cast<char*>(t.data_ptr()) + (r * t.size(1) + col) * esz;
    };

    // 1. input norm (with the residual add from the second layer on)
    {
        const bool add = residual.has_value() && residual->defined();
        NormArgs a{hidden.data_ptr(), add ? residual->data_ptr() : nullptr, input_norm.data_ptr(), h.data_ptr(),
                   add ? res_out.data_ptr() : nullptr, H, H, H, static_cast<float>(eps), dt};
        run_rmsnorm(a, B);
    }
    // 2. qkv, Qwen3's per-head norms, RoPE with k written to its cache slot, v copied to its slot
    linear_into(qkv, h.data_ptr(), B, dt, qkv_out.data_ptr());
    at::Tensor q_src = qkv_out, k_src = qkv_out;
    int64_t q_col = 0, k_col = hq * d;
    if (qk_norm) {
        q_src = at::empty({B, hq * d}, opt);
        k_src = at::empty({B, hk * d}, opt);
        q_col = k_col = 0;
        for (int64_t b = 0; b < B; ++b) {
            NormArgs qa{row(qkv_out, b, 0), nullptr, q_norm->data_ptr(), row(q_src, b, 0), nullptr, d, d, 0,
                        static_cast<float>(eps), dt};
            run_rmsnorm(qa, hq);
            NormArgs ka{row(qkv_out, b, hq * d), nullptr, k_norm->data_ptr(), row(k_src, b, 0), nullptr, d, d, 0,
                        static_cast<float>(eps), dt};
            run_rmsnorm(ka, hk);
        }
    }
    const int64_t ldq = q_src.size(1), ldk = k_src.size(1);
    const auto& kt = kernels();
    at::parallel_for(0, B, 8, [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
            RopeArgs a{row(q_src, b, q_col), row(k_src, b, k_col), row(q_rot, b, 0),
                       static_cast<char*>(k_cache.data_ptr()) + cp[b] * hk * d * esz, hq, hk, d, cos.size(1),
                       ldq, ldk, pp + b, cos.data_ptr<float>(), sin.data_ptr<float>(), dt};
            kt.rope(a, 0, 1);
            std::memcpy(static_cast<char*>(v_cache.data_ptr()) + cp[b] * hk * d * esz,
                        row(qkv_out, b, (hq + hk) * d), hk * d * esz);
        }
    });
    // 3. attention over the pool, o_proj
    DecodeAttnArgs aa{q_rot.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), attn.data_ptr(), nullptr,
                      req_to_token.scalar_type() == at::kLong ? req_to_token.data_ptr<int64_t>() : nullptr,
                      req_to_token.scalar_type() == at::kInt ? req_to_token.data_ptr<int32_t>() : nullptr,
                      req_to_token.stride(0), rp, lp, nullptr, B, hq, hk, d, d, hq * d, 0, 0, window,
                      static_cast<float>(scale), static_cast<float>(logit_cap), dt};
    run_decode_attention(aa, longest);
    linear_into(o, attn.data_ptr(), B, dt, o_out.data_ptr());
    // 4. post-attention norm with the residual add, MLP
    {
        NormArgs a{o_out.data_ptr(), res_out.data_ptr(), post_norm.data_ptr(), h.data_ptr(), r_out.data_ptr(), H, H, H,
                   static_cast<float>(eps), dt};
        run_rmsnorm(a, B);
    }
    run_linear_silu_mul(gate_up, h.data_ptr(), dt, B, H, act.data_ptr());
    linear_into(down, act.data_ptr(), B, dt, out.data_ptr());
    return {out, r_out};
}

// torch.ops.sgl_kernel.decode_layer: decode_layer_impl with scratch of its own and new result
// tensors (the op's signature is the impl's without those three parameters).
template <typename Impl> struct OwnScratch;
template <typename R, typename... A>
struct OwnScratch<R (*)(LayerScratch&, const at::Tensor&, const at::Tensor&, A...)> {
    static R op(A... args) {
        LayerScratch scratch;
        return decode_layer_impl(scratch, at::Tensor(), at::Tensor(), args...);
    }
};
constexpr auto decode_layer = &OwnScratch<decltype(&decode_layer_impl)>::op;

}  // namespace

// torch.ops.sgl_kernel.decode_layers: decode_layer for every layer of a model in one call (layer
// i's tensors and scalars at index i of each list), so that a decode step calls the op once
// instead of once per layer from Python; bit-identical to calling decode_layer layer by layer.
std::tuple<at::Tensor, at::Tensor> decode_layers(
    const at::Tensor& hidden, at::TensorList input_norm, at::TensorList post_norm, at::ArrayRef<double> eps,
    at::TensorList qkv_w, const c10::List<c10::optional<at::Tensor>>& qkv_scale,
    const c10::List<c10::optional<at::Tensor>>& qkv_bias, at::TensorList o_w,
    const c10::List<c10::optional<at::Tensor>>& o_scale, const c10::List<c10::optional<at::Tensor>>& o_bias,
    at::TensorList gate_up_w, const c10::List<c10::optional<at::Tensor>>& gate_up_scale,
    const c10::List<c10::optional<at::Tensor>>& gate_up_bias, at::TensorList down_w,
    const c10::List<c10::optional<at::Tensor>>& down_scale, const c10::List<c10::optional<at::Tensor>>& down_bias,
    const c10::List<c10::optional<at::Tensor>>& q_norm, const c10::List<c10::optional<at::Tensor>>& k_norm,
    int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, const at::Tensor& positions, const at::Tensor& cos,
    const at::Tensor& sin, at::TensorList k_cache, at::TensorList v_cache, const at::Tensor& out_cache_loc,
    const at::Tensor& req_to_token, const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
    at::ArrayRef<double> scale, at::IntArrayRef window, at::ArrayRef<double> logit_cap) {
    const size_t L = input_norm.size();
    for (size_t n : {post_norm.size(), eps.size(), qkv_w.size(), qkv_scale.size(), qkv_bias.size(), o_w.size(),
                     o_scale.size(), o_bias.size(), gate_up_w.size(), gate_up_scale.size(), gate_up_bias.size(),
                     down_w.size(), down_scale.size(), down_bias.size(), q_norm.size(), k_norm.size(), k_cache.size(),
                     v_cache.size(), scale.size(), window.size(), logit_cap.size()})
        TORCH_CHECK(n == L, "sgl_kernel.decode_layers: every per-layer list needs ", L, " entries, one has ", n);
    TORCH_CHECK(L > 0, "sgl_kernel.decode_layers: no layers");
    // Layer i > 0 writes its results over its inputs (layer i - 1's results, read before they are
    // written); layer 0 into new tensors (hidden is the caller's).
    LayerScratch scratch;
    std::tuple<at::Tensor, at::Tensor> hr{hidden, at::Tensor()};
    for (size_t i = 0; i < L; ++i) {
        const at::Tensor r = std::get<1>(hr), x = std::get<0>(hr);
        const bool in_place = i > 0 && x.size(0) > 0;  // (no rows: layer 0 returns hidden itself)
        hr = decode_layer_impl(scratch, in_place ? x : at::Tensor(), in_place ? r : at::Tensor(),
                          x, i == 0 ? c10::optional<at::Tensor>() : c10::optional<at::Tensor>(r),
                          input_norm[i], post_norm[i], eps[i], qkv_w[i], qkv_scale.get(i), qkv_bias.get(i), o_w[i],
                          o_scale.get(i), o_bias.get(i), gate_up_w[i], gate_up_scale.get(i), gate_up_bias.get(i),
                          down_w[i], down_scale.get(i), down_bias.get(i), q_norm.get(i), k_norm.get(i), num_heads,
                          num_kv_heads, head_dim, positions, cos, sin, k_cache[i], v_cache[i], out_cache_loc,
                          req_to_token, req_pool_indices, seq_lens, scale[i], window[i], logit_cap[i]);
    }
    return hr;
}

}  // namespace sglk

TORCH_LIBRARY_FRAGMENT(sgl_kernel, m) {
    m.def("decode_layers(Tensor hidden, Tensor[] input_norm, Tensor[] post_norm, float[] eps, "
          "Tensor[] qkv_w, Tensor?[] qkv_scale, Tensor?[] qkv_bias, Tensor[] o_w, Tensor?[] o_scale, Tensor?[] o_bias, "
          "Tensor[] gate_up_w, Tensor?[] gate_up_scale, Tensor?[] gate_up_bias, Tensor[] down_w, Tensor?[] down_scale, "
          "Tensor?[] down_bias, Tensor?[] q_norm, Tensor?[] k_norm, int num_heads, int num_kv_heads, int head_dim, "
          "Tensor positions, Tensor cos, Tensor sin, Tensor(a!)[] k_cache, Tensor(b!)[] v_cache, Tensor out_cache_loc, "
          "Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, float[] scale, int[] window, "
          "float[] logit_cap) -> (Tensor, Tensor)");
    m.def("decode_layer(Tensor hidden, Tensor? residual, Tensor input_norm, Tensor post_norm, float eps, "
          "Tensor qkv_w, Tensor? qkv_scale, Tensor? qkv_bias, Tensor o_w, Tensor? o_scale, Tensor? o_bias, "
          "Tensor gate_up_w, Tensor? gate_up_scale, Tensor? gate_up_bias, Tensor down_w, Tensor? down_scale, "
          "Tensor? down_bias, Tensor? q_norm, Tensor? k_norm, int num_heads, int num_kv_heads, int head_dim, "
          "Tensor positions, Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor out_cache_loc, "
          "Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, float scale, int window, "
          "float logit_cap) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(sgl_kernel, CPU, m) {
    m.impl("decode_layer", sglk::decode_layer);
    m.impl("decode_layers", &sglk::decode_layers);
}
