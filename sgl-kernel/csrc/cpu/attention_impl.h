// The attention kernels' bodies (paged decode and extend attention over the KV pool), included
// once per ISA by isa_*.cpp right after kernels_impl.h, whose vector helpers they use.

namespace {

// ---- paged decode attention: one query per request, K/V read in place from the pool ------------
// Work item = (request, run of kv heads, split of the context); each keeps an online softmax for
// the query heads of its GQA groups and, when the context is split, leaves (max, sum, acc) in
// `partial` for `combine` to merge.
constexpr int64_t kMaxGroupDim = 8192;  // query heads per kv head * head dim (checked by ops.cpp)
constexpr int64_t kMaxDv = 512;
constexpr int64_t kMaxTaskHeads = 256;  // query heads per work item (ops.cpp picks kv_per_task)
constexpr int64_t kBlock = 16;          // keys scored per block

template <typename T>
inline float dot_q(const float* q, const T* k, int64_t d) {
    vf acc{};
    int64_t i = 0;
    for (; i + VL <= d; i += VL) acc += vld<float>(q + i) * vld<T>(k + i);
    float s = hsum(acc);
    for (; i < d; ++i) s += q[i] * ld<T>(k, i);
    return s;
}

template <typename T>
inline void axpy(float* acc, float p, const T* v, int64_t n) {  // acc += p * v
    int64_t i = 0;
    for (; i + VL <= n; i += VL) vst<float>(acc + i, vld<float>(acc + i) + p * vld<T>(v + i));
    for (; i < n; ++i) acc[i] += p * ld<T>(v, i);
}

// Slots of the context's keys [j0, j0 + nb) of request row `row` (through the SWA slot map when
// given), and the cache lines of their K/V rows for kv heads [kh0, kh0 + nh) requested into L2.
// The extend kernel calls it for its next block: slots are scattered over the pool, so the misses
// overlap with the current block's arithmetic instead of stalling one after another. `Args`:
// DecodeAttnArgs or ExtendAttnArgs (the same pool fields).
template <typename T, typename Args>
inline void block_slots(const Args& a, int64_t row, int64_t j0, int64_t nb, int64_t kh0, int64_t nh,
                        int64_t* slots) {
    for (int64_t j = 0; j < nb; ++j) {
        int64_t slot = a.req_to_token ? a.req_to_token[row * a.ld_r2t + j0 + j]
                                      : a.req_to_token32[row * a.ld_r2t + j0 + j];
        slots[j] = slot = a.slot_map ? a.slot_map[slot] : slot;
        const char* k = reinterpret_cast<const char*>(static_cast<const T*>(a.k_cache) + (slot * a.hk + kh0) * a.d);
        const char* v = reinterpret_cast<const char*>(static_cast<const T*>(a.v_cache) + (slot * a.hk + kh0) * a.dv);
        for (int64_t off = 0; off < nh * a.d * static_cast<int64_t>(sizeof(T)); off += 64) __builtin_prefetch(k + off, 0, 2);
        for (int64_t off = 0; off < nh * a.dv * static_cast<int64_t>(sizeof(T)); off += 64) __builtin_prefetch(v + off, 0, 2);
    }
}

template <typename Args>
inline int64_t slot_of(const Args& a, int64_t row, int64_t j) {
    const int64_t slot = a.req_to_token ? a.req_to_token[row * a.ld_r2t + j] : a.req_to_token32[row * a.ld_r2t + j];
    return a.slot_map ? a.slot_map[slot] : slot;
}

// A decode work item's request, kv heads [kh0, kh0 + nh) and keys [lo, hi).
struct DecodeItem {
    int64_t b, kh0, nh, lo, hi, sp;
};
inline DecodeItem decode_item(const DecodeAttnArgs& a, int64_t task) {
    const int64_t H = a.kv_per_task, runs = (a.hk + H - 1) / H;
    DecodeItem it;
    it.sp = task % a.n_split;
    it.kh0 = (task / a.n_split) % runs * H;
    it.nh = imin_(H, a.hk - it.kh0);
    it.b = task / (a.n_split * runs);
    const int64_t seq = a.seq_lens[it.b];
    const int64_t start = a.window > 0 ? imax_(0, seq - a.window) : 0;
    it.lo = start + it.sp * a.split_len;
    it.hi = imin_(seq, it.lo + a.split_len);
    return it;
}

// Requests the K/V rows of the keys a thread will read next into L2, kPrefetchLead keys ahead of
// the arithmetic and across its work items (an item of a few dozen keys would otherwise start
// with a stall), a few keys at a time: requested a whole block at once, the misses queue behind
// each other and the kernel read the pool at ~15 GB/s; spread over the block's heads, at 30-35
// (this machine streams ~38 GB/s).
template <typename T>
struct DecodePrefetcher {
    const DecodeAttnArgs& a;
    int64_t task, task_end, j;
    DecodeItem it;
    int64_t row;
    DecodePrefetcher(const DecodeAttnArgs& args, int64_t t0, int64_t t1) : a(args), task(t0), task_end(t1), j(0) {
        if (task < task_end) start();
    }
    void start() {
        it = decode_item(a, task);
        row = a.req_pool_indices[it.b];
        j = it.lo;
    }
    void advance(int64_t n) {
        while (n > 0 && task < task_end) {
            if (j >= it.hi) {
                if (++task >= task_end) return;
                start();
                continue;
            }
            const int64_t slot = slot_of(a, row, j);
            const char* k = reinterpret_cast<const char*>(static_cast<const T*>(a.k_cache) + (slot * a.hk + it.kh0) * a.d);
            const char* v = reinterpret_cast<const char*>(static_cast<const T*>(a.v_cache) + (slot * a.hk + it.kh0) * a.dv);
            for (int64_t off = 0; off < it.nh * a.d * static_cast<int64_t>(sizeof(T)); off += 64) __builtin_prefetch(k + off, 0, 2);
            for (int64_t off = 0; off < it.nh * a.dv * static_cast<int64_t>(sizeof(T)); off += 64) __builtin_prefetch(v + off, 0, 2);
            ++j;
            --n;
        }
    }
};
constexpr int64_t kPrefetchLead = 16;  // keys (more is slower: the requests queue behind each other)

// One block of keys for the G query heads of a kv head: scores, online-softmax update, acc += p V.
// Each K and V vector is loaded (and converted) once for all G heads: with the group size known at
// compile time (GC > 0; dispatched for 1-8) the G partial dot products and the G accumulators of
// one vector of dv stay in registers over the block. Scores are exponentiated a vector at a time
// (a block is a whole number of vectors; lanes past `nb` are masked to 0). With AVX512-BF16, bf16
// scores are vdpbf16ps dot products of the stored q and K pairs (exact products, fp32 sums, the
// scale applied to the sum): half the instructions of converting both to fp32 first.
template <typename T, int GC>
inline void attend_block(const DecodeAttnArgs& a, const float* qf, const T* qraw, const T* const* kp, const T* const* vp,
                         int64_t nb, int64_t G_rt, float* acc, float* mx, float* sum) {
    const int64_t G = GC > 0 ? GC : G_rt, d = a.d, dv = a.dv;
    alignas(64) float sc[64][kBlock];  // G <= 64 (ops.cpp checks)
    float alpha[64];
    int64_t j = 0;
#if SGLK_VEC_BYTES == 64
    if constexpr (GC > 0) {
        // 8 keys at a time per query head: 8 partial vectors, then one transposing reduction
        // (sum8) gives the 8 scores as a vector, instead of a horizontal sum per key and head.
        // K rows are re-read per head from L1. Past nb, key 0 stands in (its scores are masked).
#if SGLK_BF16_DOT
        if constexpr (!kIsF32<T>) {
            if (d % (2 * VL) == 0) {  // bf16 pairs multiplied as stored (vdpbf16ps), the scale after the sum
                for (; j < nb; j += 8) {
                    const T* kr[8];
                    for (int t = 0; t < 8; ++t) kr[t] = kp[j + t < nb ? j + t : 0];
                    for (int g = 0; g < GC; ++g) {
                        vf part[8];
                        for (int t = 0; t < 8; ++t) part[t] = vf{};
                        for (int64_t c = 0; c < d; c += 2 * VL) {
                            const vh2 qv = *reinterpret_cast<const vh2*>(qraw + g * d + c);
                            for (int t = 0; t < 8; ++t) part[t] = dpbf16(part[t], qv, *reinterpret_cast<const vh2*>(kr[t] + c));
                        }
                        *reinterpret_cast<v8f*>(sc[g] + j) = sum8(part) * a.scale;
                    }
                }
            }
        }
#endif
        if (j == 0 && d % VL == 0) {
            for (; j < nb; j += 8) {
                const T* kr[8];
                for (int t = 0; t < 8; ++t) kr[t] = kp[j + t < nb ? j + t : 0];
                for (int g = 0; g < GC; ++g) {
                    vf part[8];
                    for (int t = 0; t < 8; ++t) part[t] = vf{};
                    for (int64_t c = 0; c < d; c += VL) {
                        const vf qv = vld<float>(qf + g * d + c);
                        for (int t = 0; t < 8; ++t) part[t] += qv * vld<T>(kr[t] + c);
                    }
                    *reinterpret_cast<v8f*>(sc[g] + j) = sum8(part);
                }
            }
        }
        if (j > 0 && a.logit_cap > 0)
            for (int64_t g = 0; g < G; ++g)
                for (int64_t t = 0; t < nb; ++t) sc[g][t] = a.logit_cap * __builtin_tanhf(sc[g][t] / a.logit_cap);
    }
#endif
    for (; j < nb; ++j) {
        if constexpr (GC > 0) {
            vf part[GC];
            for (int g = 0; g < GC; ++g) part[g] = vf{};
            int64_t c = 0;
            for (; c + VL <= d; c += VL) {
                const vf kc = vld<T>(kp[j] + c);
                for (int g = 0; g < GC; ++g) part[g] += vld<float>(qf + g * d + c) * kc;
            }
            for (int g = 0; g < GC; ++g) {
                float s = hsum(part[g]);
                for (int64_t t = c; t < d; ++t) s += qf[g * d + t] * ld<T>(kp[j], t);
                sc[g][j] = s;
            }
        } else {
            for (int64_t g = 0; g < G; ++g) sc[g][j] = dot_q<T>(qf + g * d, kp[j], d);
        }
        if (a.logit_cap > 0)
            for (int64_t g = 0; g < G; ++g) sc[g][j] = a.logit_cap * __builtin_tanhf(sc[g][j] / a.logit_cap);
    }
    if constexpr (GC > 0 && GC <= VL && kBlock % VL == 0) {
        // The G heads' softmax updates side by side (independent chains the compiler interleaves),
        // their rescale factors from one vexp; lanes past nb masked instead of patched.
        constexpr int NV = kBlock / VL;
        vi iota;
        for (int l = 0; l < VL; ++l) iota[l] = l;
        vi valid[NV];
        for (int v = 0; v < NV; ++v) valid[v] = iota + v * VL < static_cast<int32_t>(nb);
        float bm[GC];
        for (int g = 0; g < GC; ++g) {
            vf bmv = splat(mx[g]);
            for (int v = 0; v < NV; ++v) {
                const vf x = valid[v] ? vld<float>(sc[g] + v * VL) : splat(-__builtin_inff());
                bmv = x > bmv ? x : bmv;
            }
            bm[g] = hmax(bmv);
        }
        vf mo{}, mn{};
        for (int g = 0; g < GC; ++g) {
            mo[g] = mx[g];
            mn[g] = bm[g];
        }
        const vf al = mo == -__builtin_inff() ? vf{} : vexp(mo - mn);
        for (int g = 0; g < GC; ++g) {
            vf ps{};
            for (int v = 0; v < NV; ++v) {
                vf p = vexp(vld<float>(sc[g] + v * VL) - bm[g]);
                p = valid[v] ? p : vf{};
                vst<float>(sc[g] + v * VL, p);
                ps += p;
            }
            alpha[g] = al[g];
            sum[g] = sum[g] * al[g] + hsum(ps);
            mx[g] = bm[g];
        }
    } else
    for (int64_t g = 0; g < G; ++g) {
        float* sg = sc[g];
        for (int64_t j = nb; j < kBlock; ++j) sg[j] = -__builtin_inff();
        vf bmv = splat(mx[g]);
        for (int64_t j = 0; j < kBlock; j += VL) {
            const vf s = vld<float>(sg + j);
            bmv = s > bmv ? s : bmv;
        }
        const float bm = hmax(bmv);
        alpha[g] = mx[g] == -__builtin_inff() ? 0.0f : __builtin_expf(mx[g] - bm);
        vf ps{};
        for (int64_t j = 0; j < kBlock; j += VL) {
            vf p = vexp(vld<float>(sg + j) - bm);
            vst<float>(sg + j, p);
            ps += p;
        }
        float psum = hsum(ps);
        for (int64_t j = nb; j < kBlock; ++j) {  // padding lanes: exp(-inf - bm) is ~1e-38, not 0
            psum -= sg[j];
            sg[j] = 0.0f;
        }
        sum[g] = sum[g] * alpha[g] + psum;
        mx[g] = bm;
    }
    int64_t c = 0;
    for (; c + VL <= dv; c += VL) {
        if constexpr (GC > 0) {
            vf r[GC];
            for (int g = 0; g < GC; ++g) r[g] = vld<float>(acc + g * dv + c) * alpha[g];
            for (int64_t j = 0; j < nb; ++j) {
                const vf vc = vld<T>(vp[j] + c);
                for (int g = 0; g < GC; ++g) r[g] += sc[g][j] * vc;
            }
            for (int g = 0; g < GC; ++g) vst<float>(acc + g * dv + c, r[g]);
        } else {
            for (int64_t g = 0; g < G; ++g) {
                vf r = vld<float>(acc + g * dv + c) * alpha[g];
                for (int64_t j = 0; j < nb; ++j) r += sc[g][j] * vld<T>(vp[j] + c);
                vst<float>(acc + g * dv + c, r);
            }
        }
    }
    for (; c < dv; ++c)
        for (int64_t g = 0; g < G; ++g) {
            float r = acc[g * dv + c] * alpha[g];
            for (int64_t j = 0; j < nb; ++j) r += sc[g][j] * ld<T>(vp[j], c);
            acc[g * dv + c] = r;
        }
}

// Work item `task` = (request, run of a.kv_per_task kv heads, split). A thread walks a block's
// slots once for all the run's heads, whose K (and V) rows lie side by side in the pool, so
// contiguous slots are read as one stream. With one split (a.partial == nullptr) the result goes
// straight to `out`; otherwise (max, sum, acc) go to `partial` for `combine`.
template <typename T, int GC>
void decode_split_t(const DecodeAttnArgs& a, int64_t task0, int64_t task1) {
    const int64_t G = a.hq / a.hk, d = a.d, dv = a.dv;
    alignas(64) float qf[kMaxGroupDim];   // kv_per_task * G * d <= kMaxGroupDim (ops.cpp picks it)
    alignas(64) float acc[kMaxGroupDim];  // kv_per_task * G * dv <= kMaxGroupDim
    float mx[kMaxTaskHeads], sum[kMaxTaskHeads];
    int64_t slots[kBlock];
    const T* kp[kBlock];
    const T* vp[kBlock];
    DecodePrefetcher<T> pf(a, task0, task1);
    pf.advance(kPrefetchLead);
    for (int64_t task = task0; task < task1; ++task) {
        const DecodeItem it = decode_item(a, task);
        const int64_t b = it.b, kh0 = it.kh0, nh = it.nh, nq = nh * G, lo = it.lo, hi = it.hi, sp = it.sp;
        const T* q = static_cast<const T*>(a.q) + b * a.ldq + kh0 * G * d;
        int64_t i = 0;
        for (; i + VL <= nq * d; i += VL) vst<float>(qf + i, vld<T>(q + i) * a.scale);
        for (; i < nq * d; ++i) qf[i] = ld<T>(q, i) * a.scale;
        for (i = 0; i < nq * dv; ++i) acc[i] = 0.0f;
        for (int64_t h = 0; h < nq; ++h) { mx[h] = -__builtin_inff(); sum[h] = 0.0f; }
        const int64_t row = a.req_pool_indices[b];
        for (int64_t j0 = lo; j0 < hi; j0 += kBlock) {
            const int64_t nb = imin_(kBlock, hi - j0);
            for (int64_t j = 0; j < nb; ++j) slots[j] = slot_of(a, row, j0 + j);
            for (int64_t h = 0; h < nh; ++h) {
                pf.advance(h + 1 < nh ? nb / nh : nb - (nh - 1) * (nb / nh));  // spread over the heads
                for (int64_t j = 0; j < nb; ++j) {
                    kp[j] = static_cast<const T*>(a.k_cache) + (slots[j] * a.hk + kh0 + h) * d;
                    vp[j] = static_cast<const T*>(a.v_cache) + (slots[j] * a.hk + kh0 + h) * dv;
                }
                attend_block<T, GC>(a, qf + h * G * d, q + h * G * d, kp, vp, nb, G, acc + h * G * dv, mx + h * G, sum + h * G);
            }
        }
        if (a.partial == nullptr) {  // one split: normalise into out
            T* out = static_cast<T*>(a.out) + (b * a.hq + kh0 * G) * dv;
            for (int64_t h = 0; h < nq; ++h) {
                const float inv = sum[h] > 0 ? 1.0f / sum[h] : 0.0f;
                int64_t c = 0;
                for (; c + VL <= dv; c += VL) vst<T>(out + h * dv + c, vld<float>(acc + h * dv + c) * inv);
                for (; c < dv; ++c) st<T>(out + h * dv, c, acc[h * dv + c] * inv);
            }
            continue;
        }
        for (int64_t h = 0; h < nq; ++h) {
            float* part = a.partial + ((b * a.hq + kh0 * G + h) * a.n_split + sp) * (dv + 2);
            part[0] = mx[h];
            part[1] = sum[h];
            for (int64_t c = 0; c < dv; ++c) part[2 + c] = acc[h * dv + c];
        }
    }
}

template <typename T>
void decode_combine_t(const DecodeAttnArgs& a, int64_t r0, int64_t r1) {  // rows = b * hq + h
    const int64_t dv = a.dv, ns = a.n_split;
    for (int64_t r = r0; r < r1; ++r) {
        const float* part = a.partial + r * ns * (dv + 2);
        float m = -__builtin_inff();
        for (int64_t s = 0; s < ns; ++s) m = fmax_(m, part[s * (dv + 2)]);
        float o[kMaxDv];
        for (int64_t i = 0; i < dv; ++i) o[i] = 0.0f;
        float l = 0;
        for (int64_t s = 0; s < ns; ++s) {
            const float* p = part + s * (dv + 2);
            if (p[1] == 0.0f) continue;  // an empty split
            const float f = __builtin_expf(p[0] - m);
            l += p[1] * f;
            axpy<float>(o, f, p + 2, dv);
        }
        const float inv = l > 0 ? 1.0f / l : 0.0f;
        T* out = static_cast<T*>(a.out) + r * dv;
        for (int64_t i = 0; i < dv; ++i) st<T>(out, i, o[i] * inv);
    }
}

// ---- paged extend attention: a batch's new tokens over their requests' slots, in place --------
// Work item = VL (query, head) pairs of one request and kv head ("lanes": lane = t * G + g for new
// token t and query head g of the group), so that a vector holds one score per lane: for each key,
// scores[lanes] = sum_i K[key][i] * Qt[i][lanes] is d broadcast-FMAs, and acc^T[c][lanes] += V[key][c]
// * p[lanes] is dv more, with no horizontal sums; the online softmax runs per lane on whole
// vectors. Each lane masks the keys past its own position (causal) and, with a window, those at
// or before position - window. K/V rows of a block are converted to fp32 once per item.
constexpr int64_t kMaxHeadDim = 512;  // d and dv (ops.cpp checks)

// DC: the head dim as a compile-time constant (d == dv == DC; 0: read from the arguments). With it
// every K/V element of a block sits at a constant offset from one base register, so the score and
// value loops are broadcast FMAs with memory operands, 16 (scores) or 8 (value columns) independent
// accumulators in flight to hide the FMA latency.
template <typename T, int DC>
void extend_t(const ExtendAttnArgs& a, int64_t task0, int64_t task1) {
    const int64_t G = a.hq / a.hk, d = DC > 0 ? DC : a.d, dv = DC > 0 ? DC : a.dv;
    alignas(64) float qt[kMaxHeadDim * VL];   // [d][VL]: the lanes' scaled queries, transposed
    alignas(64) float acc[kMaxHeadDim * VL];  // [dv][VL]
    alignas(64) float kf[VL * kMaxHeadDim];   // [VL keys][d] of the current block, fp32
    alignas(64) float vf_[VL * kMaxHeadDim];  // [VL keys][dv]
    int64_t slot_buf[2][VL];
    for (int64_t task = task0; task < task1; ++task) {
        const int64_t* tk = a.tasks + 3 * task;
        const int64_t r = tk[0], kh = tk[1], lane0 = tk[2];
        const int64_t n = a.extend_lens[r], prefix = a.prefix_lens[r], row = a.rows[r];
        const int64_t lanes = imin_(VL, n * G - lane0);
        alignas(64) float posf[VL];
        int64_t t_lo = lane0 / G, t_hi = (lane0 + lanes - 1) / G;  // the item's new tokens
        for (int64_t l = 0; l < VL; ++l) {
            const int64_t lane = lane0 + (l < lanes ? l : lanes - 1);  // idle lanes copy the last one
            const int64_t t = lane / G, g = lane % G;
            posf[l] = static_cast<float>(prefix + t);
            const T* q = static_cast<const T*>(a.q) + (a.starts[r] + t) * a.ldq + (kh * G + g) * d;
            for (int64_t i = 0; i < d; ++i) qt[i * VL + l] = ld<T>(q, i) * a.scale;
        }
        for (int64_t i = 0; i < dv * VL; ++i) acc[i] = 0.0f;
        const vf pos = vld<float>(posf);
        vf mx = splat(-__builtin_inff()), sum{};
        const int64_t hi = prefix + t_hi + 1;
        const int64_t lo = a.window > 0 ? imax_(0, prefix + t_lo + 1 - a.window) : 0;
        if (lo < hi) block_slots<T>(a, row, lo, imin_(VL, hi - lo), kh, 1, slot_buf[0]);
        for (int64_t j0 = lo, cur = 0; j0 < hi; j0 += VL, cur ^= 1) {
            const int64_t nb = imin_(VL, hi - j0);
            const int64_t* slots = slot_buf[cur];
            if (j0 + VL < hi) block_slots<T>(a, row, j0 + VL, imin_(VL, hi - j0 - VL), kh, 1, slot_buf[cur ^ 1]);
            // The block's K/V rows in fp32, [key][dim]; rows past nb repeat the first (scored, then
            // weighted 0: finite, so 0 * row adds nothing).
            for (int64_t j = 0; j < VL; ++j) {
                const int64_t sj = slots[j < nb ? j : 0];
                const T* k = static_cast<const T*>(a.k_cache) + (sj * a.hk + kh) * d;
                const T* v = static_cast<const T*>(a.v_cache) + (sj * a.hk + kh) * dv;
                int64_t i = 0;
                for (; i + VL <= d; i += VL) vst<float>(kf + j * d + i, vld<T>(k + i));
                for (; i < d; ++i) kf[j * d + i] = ld<T>(k, i);
                for (i = 0; i + VL <= dv; i += VL) vst<float>(vf_ + j * dv + i, vld<T>(v + i));
                for (; i < dv; ++i) vf_[j * dv + i] = ld<T>(v, i);
            }
            vf sc[VL];
#pragma GCC unroll 16
            for (int64_t j = 0; j < VL; ++j) sc[j] = vf{};
            for (int64_t i = 0; i < d; ++i) {
                const vf qi = vld<float>(qt + i * VL);
                const float* kc = kf + i;
#pragma GCC unroll 16
                for (int64_t j = 0; j < VL; ++j) sc[j] += kc[j * d] * qi;
            }
            vf bm = mx;
            for (int64_t j = 0; j < nb; ++j) {
                vf s = sc[j];
                if (a.logit_cap > 0)
                    for (int l = 0; l < VL; ++l) s[l] = a.logit_cap * __builtin_tanhf(s[l] / a.logit_cap);
                const float kp = static_cast<float>(j0 + j);
                vi hidden = kp > pos;
                if (a.window > 0) hidden |= kp <= pos - static_cast<float>(a.window);
                s = hidden ? splat(-__builtin_inff()) : s;
                sc[j] = s;
                bm = s > bm ? s : bm;
            }
            const vi none = bm == -__builtin_inff();  // lanes with no visible key yet
            const vf base = none ? vf{} : bm;
            const vf alpha = mx == -__builtin_inff() ? vf{} : vexp(mx - base);
            vf ps{};
            for (int64_t j = 0; j < nb; ++j) {
                const vi hidden = sc[j] == -__builtin_inff();
                sc[j] = hidden ? vf{} : vexp(sc[j] - base);
                ps += sc[j];
            }
            for (int64_t j = nb; j < VL; ++j) sc[j] = vf{};
            sum = sum * alpha + ps;
            mx = bm;
            // acc^T += V^T p over all VL rows (a constant trip count), 8 value columns at a time.
            constexpr int64_t kCols = 8;
            int64_t c = 0;
            for (; c + kCols <= dv; c += kCols) {
                vf o[kCols];
#pragma GCC unroll 8
                for (int64_t u = 0; u < kCols; ++u) o[u] = vld<float>(acc + (c + u) * VL) * alpha;
                const float* vc = vf_ + c;
#pragma GCC unroll 16
                for (int64_t j = 0; j < VL; ++j) {
#pragma GCC unroll 8
                    for (int64_t u = 0; u < kCols; ++u) o[u] += vc[j * dv + u] * sc[j];
                }
#pragma GCC unroll 8
                for (int64_t u = 0; u < kCols; ++u) vst<float>(acc + (c + u) * VL, o[u]);
            }
            for (; c < dv; ++c) {
                vf o = vld<float>(acc + c * VL) * alpha;
                for (int64_t j = 0; j < VL; ++j) o += vf_[j * dv + c] * sc[j];
                vst<float>(acc + c * VL, o);
            }
        }
        alignas(64) float inv[VL];
        vst<float>(inv, sum > 0.0f ? 1.0f / sum : vf{});
        for (int64_t l = 0; l < lanes; ++l) {
            const int64_t lane = lane0 + l, t = lane / G, g = lane % G;
            T* out = static_cast<T*>(a.out) + ((a.starts[r] + t) * a.hq + kh * G + g) * dv;
            for (int64_t c = 0; c < dv; ++c) st<T>(out, c, acc[c * VL + l] * inv[l]);
        }
    }
}

template <typename T>
void extend_d(const ExtendAttnArgs& a, int64_t t0, int64_t t1) {  // the head dim as a constant
    if (a.d == 64 && a.dv == 64) extend_t<T, 64>(a, t0, t1);
    else if (a.d == 128 && a.dv == 128) extend_t<T, 128>(a, t0, t1);
    else extend_t<T, 0>(a, t0, t1);
}

#if SGLK_AMX
#include "attention_amx_impl.h"
#endif

}  // namespace

template <typename T>
void decode_split_g(const DecodeAttnArgs& a, int64_t t0, int64_t t1) {  // the group size as a constant
    switch (a.hq / a.hk) {
        case 1: decode_split_t<T, 1>(a, t0, t1); break;
        case 2: decode_split_t<T, 2>(a, t0, t1); break;
        case 3: decode_split_t<T, 3>(a, t0, t1); break;
        case 4: decode_split_t<T, 4>(a, t0, t1); break;
        case 5: decode_split_t<T, 5>(a, t0, t1); break;
        case 6: decode_split_t<T, 6>(a, t0, t1); break;
        case 7: decode_split_t<T, 7>(a, t0, t1); break;
        case 8: decode_split_t<T, 8>(a, t0, t1); break;
        default: decode_split_t<T, 0>(a, t0, t1);
    }
}

void decode_attention_split(const DecodeAttnArgs& a, int64_t t0, int64_t t1) {
    if (a.dtype == DType::F32) decode_split_g<float>(a, t0, t1);
    else decode_split_g<bf16_t>(a, t0, t1);
}

void decode_attention_combine(const DecodeAttnArgs& a, int64_t r0, int64_t r1) {
    if (a.dtype == DType::F32) decode_combine_t<float>(a, r0, r1);
    else decode_combine_t<bf16_t>(a, r0, r1);
}

void extend_attention(const ExtendAttnArgs& a, int64_t t0, int64_t t1) {
#if SGLK_AMX
    if (amx_extend_takes(a)) return amx_extend(a, t0, t1);
#endif
    if (a.dtype == DType::F32) extend_d<float>(a, t0, t1);
    else extend_d<bf16_t>(a, t0, t1);
}

int vector_lanes() { return VL; }  // fp32 lanes: the extend kernel's (query, head) pairs per work item
