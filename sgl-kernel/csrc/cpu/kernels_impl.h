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

template <typename U> inline U bf_round_u(U u) {  // f2bf of fp32 bits, any uint32 vector width
    U rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (u & 0x7fffffffu) > 0x7f800000u ? U{} + 0x7fc0u : rounded;
}
inline vu bf_round_bits(vf v) { return bf_round_u(reinterpret_cast<vu&>(v)); }  // bf16 bits in the low half

// fp32 -> bf16, round to nearest even. The AVX512-BF16 sets take one vcvtneps2bf16 where the
// others take ~8 integer instructions (a third of an RMSNorm's or RoPE's work, measured); it
// differs only where no model value goes: a NaN keeps its sign (bf_round: always 0x7fc0) and an
// fp32 denormal input (below 1.2e-38) becomes a signed zero. Scalar tails (f2bf) keep bf_round.
#if SGLK_BF16_DOT
inline vh bf_round_half(vf v) {
    const __m256bh h = _mm512_cvtneps_pbh(reinterpret_cast<const __m512&>(v));
    return reinterpret_cast<const vh&>(h);
}
#else
inline vh bf_round_half(vf v) { return __builtin_convertvector(bf_round_bits(v), vh); }
#endif

template <typename T> inline void vst(T* p, vf v);
template <> inline void vst<float>(float* p, vf v) { *reinterpret_cast<vf*>(p) = v; }
template <> inline void vst<bf16_t>(bf16_t* p, vf v) { *reinterpret_cast<vh*>(p) = bf_round_half(v); }

template <typename T> inline vf vrnd(vf v) { return v; }
template <> inline vf vrnd<bf16_t>(vf v) {
#if SGLK_BF16_DOT  // (GCC widens a vh in halves: four instructions where vpmovzxwd is one)
    const __m256bh h = _mm512_cvtneps_pbh(reinterpret_cast<const __m512&>(v));
    const __m512i w = _mm512_slli_epi32(_mm512_cvtepu16_epi32(reinterpret_cast<const __m256i&>(h)), 16);
    vu u = reinterpret_cast<const vu&>(w);
#else
    vu u = bf_round_bits(v) << 16;
#endif
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

inline float hmax(vf v) {  // a tree of halvings, as hsum
    typedef float v4 __attribute__((vector_size(16)));
#if SGLK_VEC_BYTES == 64
    typedef float v8 __attribute__((vector_size(32)));
    v8 lo8 = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7), hi8 = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    v8 a = hi8 > lo8 ? hi8 : lo8;
    v4 lo = __builtin_shufflevector(a, a, 0, 1, 2, 3), hi = __builtin_shufflevector(a, a, 4, 5, 6, 7);
    v4 b = hi > lo ? hi : lo;
#elif SGLK_VEC_BYTES == 32
    v4 lo = __builtin_shufflevector(v, v, 0, 1, 2, 3), hi = __builtin_shufflevector(v, v, 4, 5, 6, 7);
    v4 b = hi > lo ? hi : lo;
#else
    v4 b = v;
#endif
    v4 c = __builtin_shufflevector(b, b, 2, 3, 0, 1);
    b = c > b ? c : b;
    return b[1] > b[0] ? b[1] : b[0];
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
// Register tiles of MR activation rows x NR weight rows, one accumulator vector per output
// (dot products along K, summed across lanes at the end): per k-step MR + NR loads feed MR * NR
// FMAs, where one weight row at a time (the first version) needed MR + 1 loads for MR FMAs and
// was load-bound beyond 4 rows. A column of tiles (NR weight rows, all M rows) reads its weights
// from memory in the first row pass and from L1 in the others.
//
// Software prefetch, one per cache line: the out-of-order window alone keeps too few lines in
// flight once a line takes several loads, and the hardware prefetcher restarts at every call.
// While a column runs, the next column's weights are prefetched, spread evenly over its row
// passes and k-steps, so the stream from memory goes on at the same rate through every pass.
//
// With AVX512-BF16 (vdpbf16ps) and bf16 activations, bf16 and int8 weights are multiplied as
// bf16 pairs (products exact in fp32, as the FMA path's; int8 values are exact in bf16): 32
// weights per instruction instead of 16, and no conversion of the activations.
// AVX-512: 3 x 8 = 24 accumulators + 3 activations + 1 weight of 32 registers; 8 weight rows, so
// that a row's 8 sums come out of one transposing reduction as a vector (sum8) and the scale,
// bias and store are vector ops: with one horizontal sum and a scalar store per output the
// epilogue took ~40% of a tile's instructions at K = 576.
constexpr int kLinearMR = VL >= 16 ? 3 : 2;
constexpr int kLinearNR = VL >= 16 ? 8 : 4;

// Rows of the next tile when `rest` rows are left: kLinearMR, but 2 + 2 rather than 3 + 1 (a
// one-row tile loads 9 vectors for 8 products).
inline int tile_rows(int64_t rest) {
    if (rest == kLinearMR + 1 && kLinearMR == 3) return 2;
    return int(imin_(rest, kLinearMR));
}

struct Prefetch {
    const char* p;   // where this pass's share of the next column starts
    int64_t step;    // bytes per k-step (a multiple of 64, or 0)
    inline void at(int64_t i) const {
        for (int64_t b = 0; b < step; b += 64) __builtin_prefetch(p + i * step + b, 0, 3);
    }
};

// acc[m][j] = lane-wise partial sums of x[m, :k] * w[j, :k]; returns k (the rest is the tail).
template <typename TW, int MR, int NR>
inline int64_t dot_tile(const float* x, int64_t ldx, const TW* w, int64_t ldw, int64_t K, Prefetch pf,
                        vf (&acc)[MR][NR]) {
    int64_t k = 0;
    for (int64_t i = 0; k + VL <= K; k += VL, ++i) {
        pf.at(i);
        vf xv[MR];
        for (int m = 0; m < MR; ++m) xv[m] = vld<float>(x + m * ldx + k);
        for (int j = 0; j < NR; ++j) {
            const vf wv = vld<TW>(w + j * ldw + k);
            for (int m = 0; m < MR; ++m) acc[m][j] += xv[m] * wv;
        }
    }
    return k;
}

constexpr int kDotK = 32;  // bf16 weights per vdpbf16ps step

#if SGLK_BF16_DOT
constexpr bool kBf16Dot = true;

// acc += pairwise bf16 products (vdpbf16ps). Inline asm: with the intrinsic, GCC stored every
// accumulator of a tile to the stack at each k-step (a 2x slowdown).
inline vf dpbf16(vf acc, vh2 a, vh2 b) {
    __asm__("vdpbf16ps %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
    return acc;
}

template <typename TW> inline vh2 dot_wvec(const TW* p);
template <> inline vh2 dot_wvec<bf16_t>(const bf16_t* p) { return *reinterpret_cast<const vh2*>(p); }
template <> inline vh2 dot_wvec<int8_t>(const int8_t* p) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(b)));
    const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(b, 1)));
    return (vh2)_mm512_cvtne2ps_pbh(hi, lo);  // low 16 lanes from lo
}

// As dot_tile, with bf16 activations and 32 weights per step. (A masked vector tail in this loop
// made GCC keep acc in memory: the tail stays scalar, in finish_tile.)
template <typename TW, int MR, int NR>
inline int64_t dot_tile_bf16(const bf16_t* x, int64_t ldx, const TW* w, int64_t ldw, int64_t K, Prefetch pf,
                             vf (&acc)[MR][NR]) {
    int64_t k = 0;
    for (int64_t i = 0; k + kDotK <= K; k += kDotK, ++i) {
        pf.at(i);
        vh2 xv[MR];
        for (int m = 0; m < MR; ++m) xv[m] = *reinterpret_cast<const vh2*>(x + m * ldx + k);
        for (int j = 0; j < NR; ++j) {
            const vh2 wv = dot_wvec<TW>(w + j * ldw + k);
            for (int m = 0; m < MR; ++m) acc[m][j] = dpbf16(acc[m][j], xv[m], wv);
        }
    }
    return k;
}
#else
constexpr bool kBf16Dot = false;
#endif

// Whether this ISA's kernel reads bf16 activations as they are: bf16 or int8 weights on AVX512-BF16.
inline bool reads_bf16(WType wt) { return kBf16Dot && wt != WType::F32 && wt != WType::F32_PANELS; }
inline bool dot_bf16(const LinearArgs& a) { return a.xb && reads_bf16(a.wtype); }

template <typename T> constexpr bool kIsF32 = false;
template <> constexpr bool kIsF32<float> = true;

#if SGLK_VEC_BYTES == 64
typedef float v8f __attribute__((vector_size(32), aligned(4), may_alias));
typedef uint32_t v8u __attribute__((vector_size(32), aligned(4), may_alias));
typedef uint16_t v8h __attribute__((vector_size(16), aligned(2), may_alias));

// The 8 horizontal sums of a[0..7] as one vector, by pairwise interleave-and-add: 8 adds and 15
// shuffles instead of 8 x 8 instructions.
inline v8f sum8(const vf (&a)[8]) {
    vf t[4];
    for (int i = 0; i < 4; ++i)  // per 128-bit lane: (a0+a2, b0+b2, a1+a3, b1+b3) of a = a[2i], b = a[2i+1]
        t[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29) +
               __builtin_shufflevector(a[2 * i], a[2 * i + 1], 2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31);
    vf u[2];
    for (int i = 0; i < 2; ++i)  // per 128-bit lane: the lane's sums of a[4i .. 4i + 3]
        u[i] = __builtin_shufflevector(t[2 * i], t[2 * i + 1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29) +
               __builtin_shufflevector(t[2 * i], t[2 * i + 1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    // lanes (u0 L0+L1, u0 L2+L3, u1 L0+L1, u1 L2+L3), then the two halves of each added
    const vf r = __builtin_shufflevector(u[0], u[1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
                 __builtin_shufflevector(u[0], u[1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    return __builtin_shufflevector(r, r, 0, 1, 2, 3, 8, 9, 10, 11) + __builtin_shufflevector(r, r, 4, 5, 6, 7, 12, 13, 14, 15);
}

inline v8f v8load(const float* p) { return *reinterpret_cast<const v8f*>(p); }
template <typename TY> inline void v8store(TY* p, v8f v);
template <> inline void v8store<float>(float* p, v8f v) { *reinterpret_cast<v8f*>(p) = v; }
template <> inline void v8store<bf16_t>(bf16_t* p, v8f v) {
    *reinterpret_cast<v8h*>(p) = __builtin_convertvector(bf_round_u(reinterpret_cast<v8u&>(v)), v8h);
}
#endif

// x[k:K] . w[k:K]: the K tail after the vector steps.
template <typename TX, typename TW>
inline float tail_dot(const TX* x, const TW* w, int64_t k, int64_t K) {
    float s = 0.0f;
    for (; k < K; ++k) s += ld<TX>(x, k) * ld<TW>(w, k);
    return s;
}

// Sums the tile's accumulators (plus the K tail from k on), scales, adds the bias, stores.
template <typename TW, typename TY, typename TX, int MR, int NR>
inline void finish_tile(const LinearArgs& a, const TX* x, const TW* w, const vf (&acc)[MR][NR], int64_t k, TY* Y,
                        int64_t m, int64_t n) {
    for (int i = 0; i < MR; ++i) {
        const TX* xi = x + i * a.ldx;
#if SGLK_VEC_BYTES == 64
        if constexpr (NR == 8) {
            v8f v = sum8(acc[i]);
            for (int j = 0; j < NR; ++j) v[j] += tail_dot(xi, w + j * a.ldw, k, a.K);
            if (a.w_scale) v *= v8load(a.w_scale + n);
            if (a.bias) v += v8load(a.bias + n);
            if constexpr (std::is_same_v<TY, float>)
                if (a.round_to_bf16) {
                    v8u u = bf_round_u(reinterpret_cast<v8u&>(v)) << 16;
                    v = reinterpret_cast<v8f&>(u);
                }
            v8store<TY>(Y + (m + i) * a.ldy + n, v);
            continue;
        }
#endif
        for (int j = 0; j < NR; ++j) {
            float s = hsum(acc[i][j]) + tail_dot(xi, w + j * a.ldw, k, a.K);
            if (a.w_scale) s *= a.w_scale[n + j];
            if (a.bias) s += a.bias[n + j];
            if constexpr (std::is_same_v<TY, float>)
                if (a.round_to_bf16) s = rnd<bf16_t>(s);
            st<TY>(Y + (m + i) * a.ldy, n + j, s);
        }
    }
}

template <typename TW, typename TY, int MR, int NR>
inline void linear_tile(const LinearArgs& a, const TW* w, TY* Y, int64_t m, int64_t n, Prefetch pf) {
    vf acc[MR][NR];
    for (int i = 0; i < MR; ++i)
        for (int j = 0; j < NR; ++j) acc[i][j] = vf{};
#if SGLK_BF16_DOT
    if constexpr (!kIsF32<TW>) {
        if (dot_bf16(a)) {
            const bf16_t* x = a.xb + m * a.ldx;
            const int64_t k = dot_tile_bf16<TW, MR, NR>(x, a.ldx, w, a.ldw, a.K, pf, acc);
            finish_tile<TW, TY, bf16_t, MR, NR>(a, x, w, acc, k, Y, m, n);
            return;
        }
    }
#endif
    const float* x = a.x + m * a.ldx;
    const int64_t k = dot_tile<TW, MR, NR>(x, a.ldx, w, a.ldw, a.K, pf, acc);
    finish_tile<TW, TY, float, MR, NR>(a, x, w, acc, k, Y, m, n);
}

template <typename TW, typename TY, int NR>
inline void column_passes(const LinearArgs& a, const TW* w, TY* Y, int64_t n, Prefetch pf, int64_t share) {
    for (int64_t m = 0; m < a.M; pf.p += share) {
        const int rows = tile_rows(a.M - m);
        if (rows == kLinearMR) linear_tile<TW, TY, kLinearMR, NR>(a, w, Y, m, n, pf);
        else if (rows == 2) linear_tile<TW, TY, 2, NR>(a, w, Y, m, n, pf);
        else linear_tile<TW, TY, 1, NR>(a, w, Y, m, n, pf);
        m += rows;
    }
}

// All M rows against weight rows n .. n + NR, prefetching the next NR rows' weights.
template <typename TW, typename TY, int NR>
void linear_column(const LinearArgs& a, const TW* W, TY* Y, int64_t n) {
    const TW* w = W + n * a.ldw;
    const int64_t kstep = dot_bf16(a) ? kDotK : VL;
    int64_t passes = 0;
    for (int64_t rest = a.M; rest > 0; rest -= tile_rows(rest)) ++passes;
    const int64_t ksteps = imax_(1, a.K / kstep);
    const int64_t bytes = NR * a.ldw * int64_t(sizeof(TW));  // the next column's, contiguous
    const int64_t share = (bytes + passes - 1) / passes;
    Prefetch pf{reinterpret_cast<const char*>(w) + bytes, ((share + ksteps - 1) / ksteps + 63) / 64 * 64};
#if SGLK_BF16_DOT
    if constexpr (sizeof(TW) == 1) {
        // int8 weights read by several passes: converted to bf16 once (exact), into a column
        // buffer the passes read from L1, instead of 5 conversion instructions per 32 weights
        // and pass.
        constexpr int64_t kMaxK = 2048;
        if (dot_bf16(a) && passes > 1 && a.K <= kMaxK) {
            alignas(64) bf16_t buf[NR * kMaxK];
            for (int j = 0; j < NR; ++j) {
                int64_t k = 0;
                for (; k + kDotK <= a.K; k += kDotK)
                    *reinterpret_cast<vh2*>(buf + j * a.K + k) = dot_wvec<TW>(w + j * a.ldw + k);
                for (; k < a.K; ++k) buf[j * a.K + k] = f2bf(float(w[j * a.ldw + k]));
            }
            LinearArgs b = a;
            b.ldw = a.K;
            column_passes<bf16_t, TY, NR>(b, buf, Y, n, pf, share);
            return;
        }
    }
#endif
    column_passes<TW, TY, NR>(a, w, Y, n, pf, share);
}

template <typename TW, typename TY>
void linear_t(const LinearArgs& a, int64_t n0, int64_t n1) {
    const TW* W = static_cast<const TW*>(a.w);
    TY* Y = static_cast<TY*>(a.y);
    int64_t n = n0;
    for (; n + kLinearNR <= n1; n += kLinearNR) linear_column<TW, TY, kLinearNR>(a, W, Y, n);
    for (; n < n1; ++n) linear_column<TW, TY, 1>(a, W, Y, n);
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
// c, s: the token's cos/sin rows already rounded to T (HF multiplies in the model's dtype).
template <typename T>
void rope_heads(const T* src, T* dst, int64_t heads, int64_t head, int64_t rd, const float* c, const float* s) {
    const int64_t half = rd / 2;
    for (int64_t h = 0; h < heads; ++h) {
        const T* x = src + h * head;
        T* y = dst + h * head;
        int64_t i = 0;
        for (; i + VL <= half; i += VL) {
            vf x1 = vld<T>(x + i), x2 = vld<T>(x + i + half);
            vf c1 = vld<float>(c + i), s1 = vld<float>(s + i);
            vf c2 = vld<float>(c + i + half), s2 = vld<float>(s + i + half);
            vst<T>(y + i, vrnd<T>(x1 * c1) + vrnd<T>(-x2 * s1));
            vst<T>(y + i + half, vrnd<T>(x2 * c2) + vrnd<T>(x1 * s2));
        }
        for (; i < half; ++i) {
            float x1 = ld<T>(x, i), x2 = ld<T>(x, i + half);
            st<T>(y, i, rnd<T>(x1 * c[i]) + rnd<T>(-x2 * s[i]));
            st<T>(y, i + half, rnd<T>(x2 * c[i + half]) + rnd<T>(x1 * s[i + half]));
        }
        for (int64_t j = rd; j < head; ++j) y[j] = x[j];  // past rotary_dim: unchanged
    }
}

constexpr int64_t kMaxRotaryDim = 512;  // ops.cpp checks

template <typename T>
void rope_t(const RopeArgs& a, int64_t t0, int64_t t1) {
    alignas(64) float c[kMaxRotaryDim], s[kMaxRotaryDim];  // a token's cos/sin, rounded once for its heads
    for (int64_t t = t0; t < t1; ++t) {
        const float* ct = a.cos + a.positions[t] * a.rotary_dim;
        const float* st_ = a.sin + a.positions[t] * a.rotary_dim;
        int64_t i = 0;
        for (; i + VL <= a.rotary_dim; i += VL) {
            vst<float>(c + i, vrnd<T>(vld<float>(ct + i)));
            vst<float>(s + i, vrnd<T>(vld<float>(st_ + i)));
        }
        for (; i < a.rotary_dim; ++i) c[i] = rnd<T>(ct[i]), s[i] = rnd<T>(st_[i]);
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

// Row m's outputs at columns n.. n + VL - 1 into its running argmax (LinearArgs::argmax_value):
// argmax_t's vector step, the columns as lane indices.
inline void argmax_lanes(const LinearArgs& a, int64_t m, int64_t n, vf v) {
    float* best_value = a.argmax_value + m * VL;
    int32_t* best_index = a.argmax_index + m * VL;
    vi idx, bidx;
    for (int l = 0; l < VL; ++l) idx[l] = static_cast<int32_t>(n) + l;
    __builtin_memcpy(&bidx, best_index, sizeof bidx);
    const vf best = vld<float>(best_value);
    const vi take = (v > best) | ((v != v) & (best == best));
    vst<float>(best_value, take ? v : best);
    bidx = take ? idx : bidx;
    __builtin_memcpy(best_index, &bidx, sizeof bidx);
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

bool linear_reads_bf16(WType wt) { return reads_bf16(wt); }

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
