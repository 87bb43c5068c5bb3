// torch.ops.sgl_kernel.fused_experts: a sparse MoE layer's routed experts in one call, over the
// linear kernels of the ISA in use (kernels.h), after the routing (done in torch):
//
//   y[t] = sum_k topk_weights[t, k] * down_e(silu(gate_e(x_t)) * up_e(x_t)),  e = topk_ids[t, k]
//
// with every expert's [gate; up] rows in w13[e] ([2I, H], gate first) and its down in w2[e]
// ([H, I]). The (token, choice) pairs are sorted by expert (a counting sort, stable), the rows of
// x gathered in that order, and each phase (gate_up + SiLU-and-mul, then down) runs as one
// parallel loop over (expert, block of outputs) work items, so a decode step with a few rows per
// expert still spreads every expert's weights over all threads. Each expert's products are
// rounded to x's dtype as the linear op rounds them (HF's per-expert F.linear), and a token's k
// weighted products are added in increasing expert order, each rounded to x's dtype, as HF adds them.
//
// Weights, either form for each of w13 and w2:
//   - stacked panels: [E, N / 32, ...], each expert as pack_linear_weight packs a linear weight
//     (bf16 [E, N / 32, ceil(K / 2), 64] or fp32 [E, N / 32, K, 32]); w13 then runs the gated
//     panel kernel (gate and up sums of a panel in one pass, never stored);
//   - plain rows [E, N, K]: fp32, bf16, or int8 with per-row scales [E, N] (w13_scale, w2_scale).
// Experts that get no rows cost nothing; ids outside [0, E) are an error.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "ops_common.h"

namespace sglk {
namespace {

constexpr int64_t kRowBlock = 24;  // output features per work item on plain weights (linear's tiles)

// One stack of expert weights: per-expert LinearWeights (the tensors they point to kept in `views`).
struct ExpertStack {
    std::vector<at::Tensor> views;
    std::vector<LinearWeights> experts;
    bool panels = false;
    int64_t N = 0;
};

ExpertStack expert_stack(const at::Tensor& w, const c10::optional<at::Tensor>& scale, int64_t K, const char* what) {
    check_cpu(w, what);
    TORCH_CHECK(w.dim() == 3 || w.dim() == 4, "sgl_kernel.fused_experts: ", what,
                " must be [E, N, K] rows or [E, N / 32, ...] panels, got ", w.sizes());
    ExpertStack s;
    s.panels = w.dim() == 4;
    const int64_t E = w.size(0);
    s.views.reserve(E);
    s.experts.reserve(E);
    for (int64_t e = 0; e < E; ++e) {
        s.views.push_back(w.select(0, e));
        c10::optional<at::Tensor> se;
        if (scale.has_value() && scale->defined()) se = scale->select(0, e);
        s.experts.push_back(linear_weights(s.views.back(), se, c10::nullopt, K, "sgl_kernel.fused_experts"));
    }
    s.N = s.experts.empty() ? 0 : s.experts[0].N;
    return s;
}

// Rows of dtype xt as the kernel set reads them for weights of type wt: in place, or widened to
// fp32 into `keep` (bf16 -> fp32 is exact).
struct Rows {
    const float* xf;
    const bf16_t* xb;
};
Rows rows_for(const Kernels& kt, WType wt, const void* x, DType xt, int64_t M, int64_t K, at::Tensor& keep) {
    if (xt == DType::F32) return {static_cast<const float*>(x), nullptr};
    if (kt.linear_reads_bf16(wt)) return {nullptr, static_cast<const bf16_t*>(x)};
    keep = at::empty({M, K}, at::TensorOptions().dtype(at::kFloat));
    float* dst = keep.data_ptr<float>();
    const uint16_t* src = static_cast<const uint16_t*>(x);
    at::parallel_for(0, M * K, 1 << 14, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
            const uint32_t u = static_cast<uint32_t>(src[i]) << 16;
            std::memcpy(dst + i, &u, 4);
        }
    });
    return {dst, nullptr};
}

float widen_bf16(uint16_t h) {
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    float v;
    std::memcpy(&v, &u, 4);
    return v;
}

uint16_t bf16_bits(float v) {  // round to nearest even, as torch's bf16 cast (NaN stays NaN)
    uint32_t u;
    std::memcpy(&u, &v, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
    return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float round_bf16(float v) { return widen_bf16(bf16_bits(v)); }

struct Item {
    int64_t expert, begin, end;  // outputs [begin, end): panels, or feature rows on plain weights
};

// y rows [offset_e, offset_e + count_e) = the expert's linear of the same rows of x, for every
// expert with rows; `gated`: w13 panels with the SiLU-and-mul fused (y has N / 2 columns).
void run_experts(const ExpertStack& s, const Rows& in, int64_t K, const std::vector<int64_t>& offsets, void* y,
                 int64_t ldy, DType yt, bool gated) {
    const auto& kt = kernels();
    const int64_t E = static_cast<int64_t>(s.experts.size());
    const int64_t units = s.panels ? s.N / kPanel / (gated ? 2 : 1) : (s.N + kRowBlock - 1) / kRowBlock;
    // items of one panel (two for plain 32-output panels) or one row block each: enough to keep
    // every thread busy at decode sizes, where an expert has one or two rows
    const int64_t step = s.panels && !gated ? 2 : 1;
    std::vector<Item> items;
    for (int64_t e = 0; e < E; ++e) {
        if (offsets[e + 1] == offsets[e]) continue;
        for (int64_t u = 0; u < units; u += step) items.push_back({e, u, std::min(units, u + step)});
    }
    const size_t ysize = yt == DType::F32 ? 4 : 2;
    at::parallel_for(0, static_cast<int64_t>(items.size()), 1, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
            const Item& it = items[i];
            const LinearWeights& l = s.experts[it.expert];
            const int64_t row0 = offsets[it.expert], M = offsets[it.expert + 1] - row0;
            LinearArgs a{in.xf ? in.xf + row0 * K : nullptr, in.xb ? in.xb + row0 * K : nullptr, M, K, K,
                         l.w->data_ptr(), l.w->stride(0), l.wtype,
                         l.scale.defined() ? l.scale.data_ptr<float>() : nullptr, nullptr,
                         static_cast<char*>(y) + row0 * ldy * ysize, ldy, yt};
            if (s.panels) {
                if (gated) a.up_offset = s.N / kPanel / 2;
                kt.linear_panels(a, it.begin, it.end);
            } else {
                kt.linear(a, it.begin * kRowBlock, std::min(s.N, it.end * kRowBlock));
            }
        }
    });
}

}  // namespace

at::Tensor fused_experts(const at::Tensor& x, const at::Tensor& w13, const at::Tensor& w2,
                         const at::Tensor& topk_weights, const at::Tensor& topk_ids,
                         const c10::optional<at::Tensor>& w13_scale, const c10::optional<at::Tensor>& w2_scale) {
    const char* op = "sgl_kernel.fused_experts";
    check_cpu(x, "x");
    TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), op, ": x must be a contiguous [T, H], got ", x.sizes());
    const DType xt = dtype_of(x, "x");
    const int64_t T = x.size(0), H = x.size(1);
    TORCH_CHECK(topk_ids.dim() == 2 && topk_ids.size(0) == T && topk_weights.sizes() == topk_ids.sizes(), op,
                ": topk_ids and topk_weights must both be [T, k], got ", topk_ids.sizes(), " and ",
                topk_weights.sizes());
    TORCH_CHECK(w13.size(0) == w2.size(0), op, ": w13 and w2 hold ", w13.size(0), " and ", w2.size(0), " experts");
    const int64_t E = w13.size(0), Kc = topk_ids.size(1), S = T * Kc;
    const ExpertStack gu = expert_stack(w13, w13_scale, H, "w13");
    TORCH_CHECK(gu.N % 2 == 0, op, ": w13 must have an even number of rows (gate, up)");
    const int64_t I = gu.N / 2;
    const ExpertStack down = expert_stack(w2, w2_scale, I, "w2");
    TORCH_CHECK(down.N == H, op, ": w2 gives ", down.N, " outputs for hidden size ", H);
    for (const ExpertStack* s : {&gu, &down})
        if (s->panels)
            TORCH_CHECK(s->experts[0].wtype == (xt == DType::F32 ? WType::F32_PANELS : WType::BF16_PANELS), op,
                        ": panel weights must be of x's dtype");
    at::Tensor out = at::empty({T, H}, x.options());
    if (T == 0) return out;

    // the (token, choice) pairs sorted by expert, stably: pair p = t * k + c goes to pos[p]
    const at::Tensor ids = topk_ids.to(at::kLong).contiguous();
    const at::Tensor wts = topk_weights.to(at::kFloat).contiguous();
    const int64_t* id = ids.data_ptr<int64_t>();
    std::vector<int64_t> offsets(E + 1, 0), pos(S), token_of(S);
    for (int64_t p = 0; p < S; ++p) {
        TORCH_CHECK(id[p] >= 0 && id[p] < E, op, ": expert id ", id[p], " outside [0, ", E, ")");
        ++offsets[id[p] + 1];
    }
    for (int64_t e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
    {
        std::vector<int64_t> fill(offsets.begin(), offsets.end() - 1);
        for (int64_t p = 0; p < S; ++p) {
            pos[p] = fill[id[p]]++;
            token_of[pos[p]] = p / Kc;
        }
    }
    const size_t xsize = xt == DType::F32 ? 4 : 2;
    const auto at_dtype = x.scalar_type();
    at::Tensor xs = at::empty({S, H}, x.options());
    {
        const char* src = static_cast<const char*>(x.data_ptr());
        char* dst = static_cast<char*>(xs.data_ptr());
        at::parallel_for(0, S, 16, [&](int64_t r0, int64_t r1) {
            for (int64_t r = r0; r < r1; ++r) std::memcpy(dst + r * H * xsize, src + token_of[r] * H * xsize, H * xsize);
        });
    }
    const auto& kt = kernels();

    // gate_up + SiLU-and-mul -> h [S, I] in x's dtype
    at::Tensor h = at::empty({S, I}, x.options().dtype(at_dtype));
    {
        at::Tensor keep;
        const Rows in = rows_for(kt, gu.experts[0].wtype, xs.data_ptr(), xt, S, H, keep);
        if (gu.panels && I % kPanel == 0) {
            run_experts(gu, in, H, offsets, h.data_ptr(), I, xt, true);
        } else {
            at::Tensor both = at::empty({S, 2 * I}, x.options());
            run_experts(gu, in, H, offsets, both.data_ptr(), 2 * I, xt, false);
            run_silu_and_mul(both.data_ptr(), h.data_ptr(), I, 2 * I, xt, S);
        }
    }
    // down -> ys [S, H] in x's dtype
    at::Tensor ys = at::empty({S, H}, x.options());
    {
        at::Tensor keep;
        const Rows in = rows_for(kt, down.experts[0].wtype, h.data_ptr(), xt, S, I, keep);
        run_experts(down, in, I, offsets, ys.data_ptr(), H, xt, false);
    }
    // y[t] = sum_c w[t, c] * ys[pos[t * k + c]], as HF's expert loop adds it: in increasing expert
    // order, each weighted product and each partial sum rounded to x's dtype (a bf16 model's
    // next router sees the same bits, so a near-tie between two experts is broken as in HF)
    const float* w = wts.data_ptr<float>();
    at::parallel_for(0, T, 8, [&](int64_t t0, int64_t t1) {
        std::vector<float> acc(H);
        std::vector<int64_t> order(Kc);
        for (int64_t t = t0; t < t1; ++t) {
            for (int64_t c = 0; c < Kc; ++c) order[c] = c;
            std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return id[t * Kc + a] < id[t * Kc + b]; });
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (int64_t c : order) {
                const float wc = w[t * Kc + c];
                const int64_t r = pos[t * Kc + c];
                if (xt == DType::F32) {
                    const float* src = ys.data_ptr<float>() + r * H;
                    for (int64_t j = 0; j < H; ++j) acc[j] += wc * src[j];
                } else {
                    const uint16_t* src = reinterpret_cast<const uint16_t*>(ys.data_ptr()) + r * H;
                    for (int64_t j = 0; j < H; ++j) acc[j] = round_bf16(acc[j] + round_bf16(wc * widen_bf16(src[j])));
                }
            }
            if (xt == DType::F32) {
                std::memcpy(out.data_ptr<float>() + t * H, acc.data(), H * 4);
            } else {
                uint16_t* dst = reinterpret_cast<uint16_t*>(out.data_ptr()) + t * H;
                for (int64_t j = 0; j < H; ++j) dst[j] = bf16_bits(acc[j]);
            }
        }
    });
    return out;
}

}  // namespace sglk

TORCH_LIBRARY_FRAGMENT(sgl_kernel, m) {
    m.def("fused_experts(Tensor x, Tensor w13, Tensor w2, Tensor topk_weights, Tensor topk_ids, "
          "Tensor? w13_scale=None, Tensor? w2_scale=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(sgl_kernel, CPU, m) {
    m.impl("fused_experts", &sglk::fused_experts);
}
