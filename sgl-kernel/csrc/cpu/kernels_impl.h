// The kernels' bodies (attention ones: attention_impl.h), included once per ISA by isa_*.cpp under `namespace sglk::<isa>` with
// `kVecBytes` set to that ISA's vector width (16 generic, 32 AVX2, 64 AVX-512). Written with GCC
// vector extensions, so one source gives SSE2, AVX2/FMA and AVX-512 code per translation unit and
// accumulators stay in registers. No std:: or torch code here (see kernels.h).
//
// Numerics: fp32 accumulation everywhere. For bf16 tensors, every step torch rounds to bf16 is
// rounded here too (the add of the residual, the normalised value before the weight, silu before
// the product, each rope product), so results match the torch reference to bf16 rounding of the
// same fp32 values, not just "to a tolerance".

namespace {

constexpr int VL = kVecBytes / 4;  // fp32 lanes
typedef float vf __attribute__((vector_size(kVecBytes), aligned(4), may_alias));
typedef int32_t vi __attribute__((vector_size(kVecBytes), aligned(4), may_alias));
typedef uint32_t vu __attribute__((vector_size(kVecBytes), aligned(4), may_alias));
typedef uint16_t vh __attribute__((vector_size(kVecBytes / 2), aligned(2), may_alias));
typedef int8_t vb __attribute__((vector_size(kVecBytes / 4), aligned(1), may_alias));

inline vf splat(float c) { return vf{} + c; }

// ---- scalar conversions ---------------------------------------------------------------------------
inline float bf2f(bf16_t b) {
    uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
}

inline bf16_t f2bf(float f) {  // round to nearest even; NaN -> canonical quiet NaN (as c10)
    uint32_t u;
    __builtin_memcpy(&u, &f, 4);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return static_cast<bf16_t>((u & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u : rounded);
}

template <typename T> inline float ld(const T* p, int64_t i);
template <> inline float ld<float>(const float* p, int64_t i) { return p[i]; }
template <> inline float ld<bf16_t>(const bf16_t* p, int64_t i) { return bf2f(p[i]); }
template <> inline float ld<int8_t>(const int8_t* p, int64_t i) { return static_cast<float>(p[i]); }

template <typename T> inline void st(T* p, int64_t i, float v);
template <> inline void st<float>(float* p, int64_t i, float v) { p[i] = v; }
template <> inline void st<bf16_t>(bf16_t* p, int64_t i, float v) { p[i] = f2bf(v); }

template <typename T> inline float rnd(float v) { return v; }  // a store to T and a load back
template <> inline float rnd<bf16_t>(float v) { return bf2f(f2bf(v)); }

// ---- vector conversions ---------------------------------------------------------------------------
template <typename T> inline vf vld(const T* p);
template <> inline vf vld<float>(const float* p) { return *reinterpret_cast<const vf*>(p); }
typedef uint16_t vh2 __attribute__((vector_size(kVecBytes), aligned(2), may_alias));

// bf16 -> fp32 is "put the 16 bits in the high half": one interleave with zeros (a single
// vpermt2w / vpunpcklwd-class shuffle) instead of widen + shift.
inline vh2 zip_zero(vh h) {
#if SGLK_VEC_BYTES == 16
    return __builtin_shufflevector(vh{}, h, 0, 4, 1, 5, 2, 6, 3, 7);
#elif SGLK_VEC_BYTES == 32
    return __builtin_shufflevector(vh{}, h, 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
#else
    return __builtin_shufflevector(vh{}, h, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23, 8, 24, 9, 25,
                                   10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
#endif
}
template <> inline vf vld<bf16_t>(const bf16_t* p) {
    vh2 z = zip_zero(*reinterpret_cast<const vh*>(p));
    return reinterpret_cast<vf&>(z);
}
template <> inline vf vld<int8_t>(const int8_t* p) {  // GCC scalarises a convertvector from int8
#if SGLK_VEC_BYTES == 64
    return (vf)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#elif SGLK_VEC_BYTES == 32
    return (vf)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#else
    return __builtin_convertvector(__builtin_convertvector(*reinterpret_cast<const vb*>(p), vi), vf);
#endif
}

inline vu bf_round_bits(vf v) {  // the bf16 bits of v, in the low half of each lane
    vu u = reinterpret_cast<vu&>(v);
    vu rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (u & 0x7fffffffu) > 0x7f800000u ? vu{} + 0x7fc0u : rounded;
}

template <typename T> inline void vst(T* p, vf v);
template <> inline void vst<float>(float* p, vf v) { *reinterpret_cast<vf*>(p) = v; }
template <> inline void vst<bf16_t>(bf16_t* p, vf v) {
    *reinterpret_cast<vh*>(p) = __builtin_convertvector(bf_round_bits(v), vh);
}

template <typename T> inline vf vrnd(vf v) { return v; }
template <> inline vf vrnd<bf16_t>(vf v) {
    vu u = bf_round_bits(v) << 16;
    return reinterpret_cast<vf&>(u);
}

// Horizontal sum as a tree of halvings (a serial lane loop is a 16-add dependency chain).
inline float hsum(vf v) {
    typedef float v4 __attribute__((vector_size(16)));
#if SGLK_VEC_BYTES == 64
    typedef float v8 __attribute__((vector_size(32)));
    v8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) + __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    v4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
#elif SGLK_VEC_BYTES == 32
    v4 b = __builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7);
#else
    v4 b = v;
#endif
    b = b + __builtin_shufflevector(b, b, 2, 3, 0, 1);
    return b[0] + b[1];
}

inline float hmax(vf v) {
    float s = v[0];
    for (int i = 1; i < VL; ++i) s = v[i] > s ? v[i] : s;
    return s;
}

// exp(x) for the softmax and silu: Cephes' expf polynomial (rel. error < 2e-7), branch-free.
// NaN propagates; x < -87.3 gives ~1e-38 instead of 0.
inline vf vexp(vf x) {
    x = x > 88.3762626647949f ? splat(88.3762626647949f) : x;
    x = x < -87.3365447504019f ? splat(-87.3365447504019f) : x;
    vf n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
    vf r = x - n * 0.693359375f + n * 2.12194440e-4f;
    vf p = splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    vi e = (__builtin_convertvector(n, vi) + 127) << 23;
    return p * reinterpret_cast<vf&>(e);
}

inline float sexp(float x) { return vexp(splat(x))[0]; }

inline float fmax_(float a, float b) { return a > b ? a : b; }
inline int64_t imin_(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t imax_(int64_t a, int64_t b) { return a > b ? a : b; }

// ---- linear: y[m, n] = sum_k x[m, k] * w[n, k] (* scale[n]) + bias[n] -------------------------
// Meant for the memory-bound small-M regime (decode): each weight row is read once, in order (one
// sequential stream per thread), converted in registers and shared by up to kLinearMR activation
// rows; four accumulators per row hide the FMA latency.
//
// Software prefetch kLinearPrefetch bytes ahead, one per cache line: the out-of-order window alone
// keeps too few lines in flight once a line takes several loads (bf16: 2, int8: 4), and the
// hardware prefetcher restarts at every call. Measured on the default model's decode-step linears
// (30 layers + lm_head, 1 row, 2 threads, weights cold; benchmark/kernels/bench_cpu_ops.py): bf16
// 12.6 -> 15-16 GB/s, int8 11 -> 15, fp32 unchanged at 16-17, against ~16 GB/s for a plain copy.
constexpr int kLinearPrefetch = 4096;

template <typename TW, int MR>
inline void dot_rows(const float* x, int64_t ldx, const TW* w, int64_t K, float (&out)[MR]) {
    vf acc[MR][4];
    for (int m = 0; m < MR; ++m)
        for (int u = 0; u < 4; ++u) acc[m][u] = vf{};
    int64_t k = 0;
    for (; k + 4 * VL <= K; k += 4 * VL) {
        for (int b = 0; b < int(4 * VL * sizeof(TW)); b += 64)
            __builtin_prefetch(reinterpret_cast<const char*>(w + k) + kLinearPrefetch + b, 0, 3);
        for (int u = 0; u < 4; ++u) {
            vf wv = vld<TW>(w + k + u * VL);
            for (int m = 0; m < MR; ++m) acc[m][u] += vld<float>(x + m * ldx + k + u * VL) * wv;
        }
    }
    for (; k + VL <= K; k += VL) {
        vf wv = vld<TW>(w + k);
        for (int m = 0; m < MR; ++m) acc[m][0] += vld<float>(x + m * ldx + k) * wv;
    }
    for (int m = 0; m < MR; ++m) {
        float s = hsum((acc[m][0] + acc[m][1]) + (acc[m][2] + acc[m][3]));
        for (int64_t t = k; t < K; ++t) s += x[m * ldx + t] * ld<TW>(w, t);
        out[m] = s;
    }
}

// Registers: 4 x MR accumulators + a weight vector + an activation; AVX2 has 16 of them.
constexpr int kLinearMR = VL >= 16 ? 4 : 2;

template <typename TW, typename TY, int MR>
inline void linear_rows(const LinearArgs& a, const TW* w, TY* Y, int64_t m, int64_t n) {
    float out[MR];
    dot_rows<TW, MR>(a.x + m * a.ldx, a.ldx, w, a.K, out);
    for (int i = 0; i < MR; ++i) {
        float v = out[i];
        if (a.w_scale) v *= a.w_scale[n];
        if (a.bias) v += a.bias[n];
        st<TY>(Y + (m + i) * a.ldy, n, v);
    }
}

template <typename TW, typename TY>
void linear_t(const LinearArgs& a, int64_t n0, int64_t n1) {
    const TW* W = static_cast<const TW*>(a.w);
    TY* Y = static_cast<TY*>(a.y);
    for (int64_t n = n0; n < n1; ++n) {
        const TW* w = W + n * a.ldw;
        int64_t m = 0;
        for (; m + kLinearMR <= a.M; m += kLinearMR)  // later row groups re-read w from L1
            linear_rows<TW, TY, kLinearMR>(a, w, Y, m, n);
        for (; m < a.M; ++m) linear_rows<TW, TY, 1>(a, w, Y, m, n);
    }
}

template <typename TW>
void linear_w(const LinearArgs& a, int64_t n0, int64_t n1) {
    if (a.ytype == DType::F32) linear_t<TW, float>(a, n0, n1);
    else linear_t<TW, bf16_t>(a, n0, n1);
}

// ---- RMSNorm, optionally after adding the residual --------------------------------------------
template <typename T>
void rmsnorm_t(const NormArgs& a, int64_t r0, int64_t r1) {
    const int64_t H = a.H;
    const T* w = static_cast<const T*>(a.weight);
    for (int64_t r = r0; r < r1; ++r) {
        const T* x = static_cast<const T*>(a.x) + r * a.ldx;
        T* out = static_cast<T*>(a.out) + r * H;
        const T* h = x;  // the normalised input: x, or x + residual as stored in residual_out
        if (a.residual) {
            const T* res = static_cast<const T*>(a.residual) + r * a.ldr;
            T* ro = static_cast<T*>(a.residual_out) + r * H;
            int64_t i = 0;
            for (; i + VL <= H; i += VL) vst<T>(ro + i, vld<T>(x + i) + vld<T>(res + i));
            for (; i < H; ++i) st<T>(ro, i, ld<T>(x, i) + ld<T>(res, i));
            h = ro;
        }
        vf acc{};
        int64_t i = 0;
        for (; i + VL <= H; i += VL) {
            vf v = vld<T>(h + i);
            acc += v * v;
        }
        float ss = hsum(acc);
        for (; i < H; ++i) ss += ld<T>(h, i) * ld<T>(h, i);
        const float rs = 1.0f / __builtin_sqrtf(ss / static_cast<float>(H) + a.eps);
        i = 0;
        for (; i + VL <= H; i += VL) vst<T>(out + i, vrnd<T>(vld<T>(h + i) * rs) * vld<T>(w + i));
        for (; i < H; ++i) st<T>(out, i, rnd<T>(ld<T>(h, i) * rs) * ld<T>(w, i));
    }
}

// ---- silu(gate) * up over [rows, 2d] -> [rows, d] ------------------------------------------------
template <typename T>
void silu_mul_t(const void* xv, void* ov, int64_t d, int64_t ldx, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
        const T* g = static_cast<const T*>(xv) + r * ldx;
        const T* u = g + d;
        T* o = static_cast<T*>(ov) + r * d;
        int64_t i = 0;
        for (; i + VL <= d; i += VL) {
            vf gv = vld<T>(g + i);
            vst<T>(o + i, vrnd<T>(gv / (1.0f + vexp(-gv))) * vld<T>(u + i));
        }
        for (; i < d; ++i) {
            float gv = ld<T>(g, i);
            st<T>(o, i, rnd<T>(gv / (1.0f + sexp(-gv))) * ld<T>(u, i));
        }
    }
}

// ---- rotary embedding (NeoX / HF rotate_half layout) ----------------------------------------------
template <typename T>
void rope_heads(const T* src, T* dst, int64_t heads, int64_t head, int64_t rd, const float* c, const float* s) {
    const int64_t half = rd / 2;
    for (int64_t h = 0; h < heads; ++h) {
        const T* x = src + h * head;
        T* y = dst + h * head;
        int64_t i = 0;
        for (; i + VL <= half; i += VL) {
            vf x1 = vld<T>(x + i), x2 = vld<T>(x + i + half);
            vf c1 = vrnd<T>(vld<float>(c + i)), s1 = vrnd<T>(vld<float>(s + i));
            vf c2 = vrnd<T>(vld<float>(c + i + half)), s2 = vrnd<T>(vld<float>(s + i + half));
            vst<T>(y + i, vrnd<T>(x1 * c1) + vrnd<T>(-x2 * s1));
            vst<T>(y + i + half, vrnd<T>(x2 * c2) + vrnd<T>(x1 * s2));
        }
        for (; i < half; ++i) {
            float x1 = ld<T>(x, i), x2 = ld<T>(x, i + half);
            float c1 = rnd<T>(c[i]), s1 = rnd<T>(s[i]), c2 = rnd<T>(c[i + half]), s2 = rnd<T>(s[i + half]);
            st<T>(y, i, rnd<T>(x1 * c1) + rnd<T>(-x2 * s1));
            st<T>(y, i + half, rnd<T>(x2 * c2) + rnd<T>(x1 * s2));
        }
        for (int64_t j = rd; j < head; ++j) y[j] = x[j];  // past rotary_dim: unchanged
    }
}

template <typename T>
void rope_t(const RopeArgs& a, int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
        const float* c = a.cos + a.positions[t] * a.rotary_dim;
        const float* s = a.sin + a.positions[t] * a.rotary_dim;
        rope_heads<T>(static_cast<const T*>(a.q) + t * a.ldq, static_cast<T*>(a.q_out) + t * a.hq * a.head,
                      a.hq, a.head, a.rotary_dim, c, s);
        rope_heads<T>(static_cast<const T*>(a.k) + t * a.ldk, static_cast<T*>(a.k_out) + t * a.hk * a.head,
                      a.hk, a.head, a.rotary_dim, c, s);
    }
}

// ---- argmax over rows (greedy sampling), as torch.argmax: first index of the largest value; ----
// a NaN counts as larger than any number (the first NaN wins); an all -inf row gives 0.
inline bool argmax_better(float v, int64_t i, float bv, int64_t bi) {
    const bool vn = v != v, bn = bv != bv;
    if (vn || bn) return vn && (!bn || i < bi);
    return v > bv || (v == bv && i < bi);
}

template <typename T>
void argmax_t(const void* xv, int64_t ldx, int64_t V, int64_t* out, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
        const T* x = static_cast<const T*>(xv) + r * ldx;
        float bv = V > 0 ? ld<T>(x, 0) : 0.0f;
        int64_t bi = 0, i = 0;
        if (V >= VL) {
            alignas(64) float lane_v[VL];
            alignas(64) int32_t lane_i[VL];
            for (int l = 0; l < VL; ++l) lane_i[l] = l;
            vf best = vld<T>(x);
            vi bidx = *reinterpret_cast<const vi*>(lane_i);
            vi idx = bidx;
            for (i = VL; i + VL <= V && i + VL <= 0x7fffffff; i += VL) {
                idx += VL;
                const vf v = vld<T>(x + i);
                const vi take = (v > best) | ((v != v) & (best == best));
                best = take ? v : best;
                bidx = take ? idx : bidx;
            }
            vst<float>(lane_v, best);
            *reinterpret_cast<vi*>(lane_i) = bidx;
            bv = lane_v[0];
            bi = lane_i[0];
            for (int l = 1; l < VL; ++l)
                if (argmax_better(lane_v[l], lane_i[l], bv, bi)) { bv = lane_v[l]; bi = lane_i[l]; }
        }
        for (; i < V; ++i) {
            const float v = ld<T>(x, i);
            if (argmax_better(v, i, bv, bi)) { bv = v; bi = i; }
        }
        out[r] = bi;
    }
}

}  // namespace

void linear(const LinearArgs& a, int64_t n0, int64_t n1) {
    switch (a.wtype) {
        case WType::F32: linear_w<float>(a, n0, n1); break;
        case WType::BF16: linear_w<bf16_t>(a, n0, n1); break;
        case WType::I8: linear_w<int8_t>(a, n0, n1); break;
    }
}

void rmsnorm(const NormArgs& a, int64_t r0, int64_t r1) {
    if (a.dtype == DType::F32) rmsnorm_t<float>(a, r0, r1);
    else rmsnorm_t<bf16_t>(a, r0, r1);
}

void silu_and_mul(const void* x, void* out, int64_t d, int64_t ldx, DType dt, int64_t r0, int64_t r1) {
    if (dt == DType::F32) silu_mul_t<float>(x, out, d, ldx, r0, r1);
    else silu_mul_t<bf16_t>(x, out, d, ldx, r0, r1);
}

void rope(const RopeArgs& a, int64_t t0, int64_t t1) {
    if (a.dtype == DType::F32) rope_t<float>(a, t0, t1);
    else rope_t<bf16_t>(a, t0, t1);
}

void argmax_rows(const void* x, int64_t ldx, int64_t V, DType dt, int64_t* out, int64_t r0, int64_t r1) {
    if (dt == DType::F32) argmax_t<float>(x, ldx, V, out, r0, r1);
    else argmax_t<bf16_t>(x, ldx, V, out, r0, r1);
}
