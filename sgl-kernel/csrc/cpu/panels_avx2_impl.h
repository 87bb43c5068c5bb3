// The panel linear's AVX2 + FMA tiles, included by panels_impl.h into the avx2 kernel set (it
// defines panel_rows<TY, GATED, TW> there). TW is the weights' type: bf16 (BF16_PANELS) or fp32
// (F32_PANELS). Activations are fp32 rows (a.x; linear_ops.cpp converts bf16 ones once per call),
// each k broadcast from memory.
//
// A panel's pair row holds 32 features x 2 k (kernels.h): bf16 side by side per feature, so one
// 32-byte load is 8 features x (k, k + 1), and a shift gives the k weights as fp32 (a bf16 is the
// high half of its fp32), a mask the k + 1 ones; fp32 as two rows of 32 (k, then k + 1), loaded
// as they are. A tile is R rows x 16 features: 2 groups of 8 (GATED: 8 features of the gate panel
// and the same 8 of its up panel), k then k + 1, so that 2R accumulators, 2 weight vectors, a
// broadcast and the mask fit in the 16 registers with R = 6. Each k adds one product to each
// accumulator; from R = 5 on, a k's FMAs take longer to issue than one FMA's latency, so the
// chains never stall. GCC spills such a tile written with intrinsics (from 5 rows), so the k loop
// of 3- to 6-row tiles is inline asm (pair_loop). A panel takes 2 (GATED 4) such sub-passes, run
// over blocks of k (panel_tile_blocked). 1-2 rows (decode, bound by the weights' stream) take the
// whole panel in one pass (panel_narrow).
//
// Every output is summed over k in order, one FMA per k, in every tile: results do not depend
// on how rows were dealt to tiles, and the gated pass equals the plain one bit for bit.

constexpr int kSubPasses = 2;
constexpr int kGatedSubPasses = 4;

template <typename TW> struct PanelW;
template <> struct PanelW<bf16_t> {
    static constexpr int64_t kPerFeature = 2;  // elements of a feature in a pair row
    static __m256 k0(const bf16_t* p) {        // 8 features' k weights from their pair row
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), 16));
    }
    static __m256 k1(const bf16_t* p) {
        const __m256i mask = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
        return _mm256_castsi256_ps(_mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), mask));
    }
};
template <> struct PanelW<float> {
    static constexpr int64_t kPerFeature = 1;
    static __m256 k0(const float* p) { return _mm256_loadu_ps(p); }
    static __m256 k1(const float* p) { return _mm256_loadu_ps(p + kPanel); }
};
constexpr int64_t kPairElems = 2 * kPanel;  // a pair row, either type

#define SGLK_ROW_FMA(addr, acc0, acc1)                     \
    "vbroadcastss " addr ", %%ymm14\n\t"                    \
    "vfmadd231ps %%ymm12, %%ymm14, %%" acc0 "\n\t"          \
    "vfmadd231ps %%ymm13, %%ymm14, %%" acc1 "\n\t"
#define SGLK_ROWS3(off)                                          \
    SGLK_ROW_FMA(off "(%[x0])", "ymm0", "ymm6")                  \
    SGLK_ROW_FMA(off "(%[x0],%[ld],1)", "ymm1", "ymm7")          \
    SGLK_ROW_FMA(off "(%[x0],%[ld],2)", "ymm2", "ymm8")
#define SGLK_ROWS4(off) SGLK_ROWS3(off) SGLK_ROW_FMA(off "(%[x3])", "ymm3", "ymm9")
#define SGLK_ROWS5(off) SGLK_ROWS4(off) SGLK_ROW_FMA(off "(%[x3],%[ld],1)", "ymm4", "ymm10")
#define SGLK_ROWS6(off) SGLK_ROWS5(off) SGLK_ROW_FMA(off "(%[x3],%[ld],2)", "ymm5", "ymm11")
// The weights of k (K0) and k + 1 (K1) into ymm12 (w) and ymm13 (w2); STEP: bytes a pair row.
#define SGLK_BF16_K0                          \
    "vmovdqu (%[w]), %%ymm12\n\t"             \
    "vmovdqu (%[w2]), %%ymm13\n\t"            \
    "vpslld $16, %%ymm12, %%ymm12\n\t"        \
    "vpslld $16, %%ymm13, %%ymm13\n\t"
#define SGLK_BF16_K1                          \
    "vpand (%[w]), %%ymm15, %%ymm12\n\t"      \
    "vpand (%[w2]), %%ymm15, %%ymm13\n\t"
#define SGLK_BF16_STEP "128"
#define SGLK_F32_K0                           \
    "vmovups (%[w]), %%ymm12\n\t"             \
    "vmovups (%[w2]), %%ymm13\n\t"
#define SGLK_F32_K1                           \
    "vmovups 128(%[w]), %%ymm12\n\t"          \
    "vmovups 128(%[w2]), %%ymm13\n\t"
#define SGLK_F32_STEP "256"
#define SGLK_PAIR_LOOP(ROWS, K0, K1, STEP)                                            \
    "vmovups 0(%[out]), %%ymm0\n\t"                                                  \
    "vmovups 32(%[out]), %%ymm1\n\t"                                                 \
    "vmovups 64(%[out]), %%ymm2\n\t"                                                 \
    "vmovups 96(%[out]), %%ymm3\n\t"                                                 \
    "vmovups 128(%[out]), %%ymm4\n\t"                                                \
    "vmovups 160(%[out]), %%ymm5\n\t"                                                \
    "vmovups 192(%[out]), %%ymm6\n\t"                                                \
    "vmovups 224(%[out]), %%ymm7\n\t"                                                \
    "vmovups 256(%[out]), %%ymm8\n\t"                                                \
    "vmovups 288(%[out]), %%ymm9\n\t"                                                \
    "vmovups 320(%[out]), %%ymm10\n\t"                                               \
    "vmovups 352(%[out]), %%ymm11\n\t"                                               \
    "vpcmpeqd %%ymm15, %%ymm15, %%ymm15\n\t"                                          \
    "vpslld $16, %%ymm15, %%ymm15\n\t" /* the bf16 k + 1 mask, 0xffff0000 */        \
    "1:\n\t"                                                                        \
    "prefetcht1 (%[pf])\n\t"                                                        \
    "prefetcht1 (%[pf2])\n\t"                                                       \
    K0 ROWS("") K1 ROWS("4")                                                        \
    "add $" STEP ", %[w]\n\t"                                                       \
    "add $" STEP ", %[w2]\n\t"                                                      \
    "add $8, %[x0]\n\t"                                                             \
    "add $8, %[x3]\n\t"                                                             \
    "add %[pfs], %[pf]\n\t"                                                         \
    "add %[pfs], %[pf2]\n\t"                                                        \
    "dec %[n]\n\t"                                                                  \
    "jnz 1b\n\t"                                                                    \
    "vmovups %%ymm0, 0(%[out])\n\t"                                                 \
    "vmovups %%ymm1, 32(%[out])\n\t"                                                \
    "vmovups %%ymm2, 64(%[out])\n\t"                                                \
    "vmovups %%ymm3, 96(%[out])\n\t"                                                \
    "vmovups %%ymm4, 128(%[out])\n\t"                                               \
    "vmovups %%ymm5, 160(%[out])\n\t"                                               \
    "vmovups %%ymm6, 192(%[out])\n\t"                                               \
    "vmovups %%ymm7, 224(%[out])\n\t"                                               \
    "vmovups %%ymm8, 256(%[out])\n\t"                                               \
    "vmovups %%ymm9, 288(%[out])\n\t"                                               \
    "vmovups %%ymm10, 320(%[out])\n\t"                                              \
    "vmovups %%ymm11, 352(%[out])\n\t"

// out[0][r] += sum over pairs p < n of the (k = 2p, 2p + 1) products of row r of x with the 8
// features at w, out[1][r] the same with w2 (R = 3 to 6 rows; out is [2][6] vectors, rows past
// R scratch); pf and pf2 advance by pf_step a pair, one prefetch each. n >= 1.
template <typename TW, int R>
inline void pair_loop(__m256 (&out)[2][6], const TW* w, const TW* w2, const float* x, int64_t ldx, int64_t n,
                      const char* pf, const char* pf2, int64_t pf_step) {
    static_assert(R >= 3 && R <= 6, "pair_loop is written for 3 to 6 rows");
    const float* x3 = x + 3 * ldx;
    const int64_t ld = ldx * static_cast<int64_t>(sizeof(float));
#define SGLK_PAIR_OPERANDS                                                                          \
    : [w] "+r"(w), [w2] "+r"(w2), [x0] "+r"(x), [x3] "+r"(x3), [pf] "+r"(pf), [pf2] "+r"(pf2),      \
      [n] "+r"(n)                                                                                   \
    : [ld] "r"(ld), [pfs] "r"(pf_step), [out] "r"(&out[0][0])                                      \
    : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",      \
      "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "memory", "cc"
#define SGLK_PAIR_ASM(ROWS)                                                                               \
    if constexpr (sizeof(TW) == 2)                                                                        \
        __asm__ volatile(SGLK_PAIR_LOOP(ROWS, SGLK_BF16_K0, SGLK_BF16_K1, SGLK_BF16_STEP) SGLK_PAIR_OPERANDS); \
    else                                                                                                  \
        __asm__ volatile(SGLK_PAIR_LOOP(ROWS, SGLK_F32_K0, SGLK_F32_K1, SGLK_F32_STEP) SGLK_PAIR_OPERANDS);
    if constexpr (R == 6) {
        SGLK_PAIR_ASM(SGLK_ROWS6)
    } else if constexpr (R == 5) {
        SGLK_PAIR_ASM(SGLK_ROWS5)
    } else if constexpr (R == 4) {
        SGLK_PAIR_ASM(SGLK_ROWS4)
    } else {
        SGLK_PAIR_ASM(SGLK_ROWS3)
    }
#undef SGLK_PAIR_ASM
#undef SGLK_PAIR_OPERANDS
}
#undef SGLK_PAIR_LOOP
#undef SGLK_F32_STEP
#undef SGLK_F32_K1
#undef SGLK_F32_K0
#undef SGLK_BF16_STEP
#undef SGLK_BF16_K1
#undef SGLK_BF16_K0
#undef SGLK_ROWS6
#undef SGLK_ROWS5
#undef SGLK_ROWS4
#undef SGLK_ROWS3
#undef SGLK_ROW_FMA

// The odd last k of rows [0, R) (k = K - 1: k0 of pair row `pairs`, whose k + 1 is bf16 padding
// or, in fp32, past the panel), added to c0 (features at w) and c1 (at w2).
template <typename TW, int R>
inline void last_k(__m256 (&c0)[R], __m256 (&c1)[R], const TW* w, const TW* w2, const float* x, int64_t ldx,
                   int64_t K) {
    const int64_t at = (K / 2) * kPairElems;
    const __m256 a0 = PanelW<TW>::k0(w + at), b0 = PanelW<TW>::k0(w2 + at);
    for (int r = 0; r < R; ++r) {
        const __m256 xv = _mm256_broadcast_ss(x + r * ldx + K - 1);
        c0[r] = _mm256_fmadd_ps(xv, a0, c0[r]);
        c1[r] = _mm256_fmadd_ps(xv, b0, c1[r]);
    }
}

// A sub-pass's end: the odd last k, then the outputs (bias; GATED: silu(gate) * up) of rows
// [m0, m0 + R), features f0 .. f0 + 15 (GATED: f0 .. f0 + 7).
template <typename TY, typename TW, int R, bool GATED>
inline void finish_sub(const LinearArgs& a, int64_t m0, int64_t panel, int64_t f0, __m256 (&c0)[R],
                       __m256 (&c1)[R], const TW* w, const TW* w2, const float* x) {
    if (a.K & 1) last_k<TW, R>(c0, c1, w, w2, x, a.ldx, a.K);
    for (int r = 0; r < R; ++r) {
        if constexpr (GATED) {
            gated_store<TY>(a, m0 + r, panel, f0, vf(c0[r]), vf(c1[r]));
        } else {
            panel_store<TY>(a, m0 + r, panel * kPanel, f0, vf(c0[r]));
            panel_store<TY>(a, m0 + r, panel * kPanel, f0 + VL, vf(c1[r]));
        }
    }
}

// 1 or 2 rows: the whole panel (GATED: and its up panel) in one pass, each pair row read once, in
// order.
template <typename TY, typename TW, int R, bool GATED>
void panel_narrow(const LinearArgs& a, int64_t m0, int64_t panel, const char* pf, int64_t pf_step) {
    constexpr int G = kPanel / VL;  // 4 groups of 8 features
    constexpr int H = GATED ? 2 : 1;
    constexpr int64_t fe = PanelW<TW>::kPerFeature;
    const TW* w = static_cast<const TW*>(a.w) + panel * a.ldw;
    const TW* wu = w + a.up_offset * a.ldw;
    const int64_t up_bytes = GATED ? a.up_offset * a.ldw * static_cast<int64_t>(sizeof(TW)) : 0;
    const float* x = a.x + m0 * a.ldx;
    const int64_t ldx = a.ldx, pairs = a.K / 2;
    __m256 c[H][R][G];
    for (auto& h : c)
        for (auto& row : h)
            for (auto& v : row) v = _mm256_setzero_ps();
    for (int64_t p = 0; p < pairs; ++p) {
        if (pf) prefetch_share<GATED>(pf + p * pf_step, pf_step, up_bytes);
        __m256 x0[R], x1[R];
        for (int r = 0; r < R; ++r) {
            x0[r] = _mm256_broadcast_ss(x + r * ldx + 2 * p);
            x1[r] = _mm256_broadcast_ss(x + r * ldx + 2 * p + 1);
        }
        for (int h = 0; h < H; ++h) {
            const TW* wp = (h ? wu : w) + p * kPairElems;
            for (int g = 0; g < G; ++g) {
                const __m256 k0 = PanelW<TW>::k0(wp + g * VL * fe), k1 = PanelW<TW>::k1(wp + g * VL * fe);
                for (int r = 0; r < R; ++r) {
                    c[h][r][g] = _mm256_fmadd_ps(x0[r], k0, c[h][r][g]);
                    c[h][r][g] = _mm256_fmadd_ps(x1[r], k1, c[h][r][g]);
                }
            }
        }
    }
    if (a.K & 1) {
        for (int h = 0; h < H; ++h) {
            const TW* wp = (h ? wu : w) + pairs * kPairElems;
            for (int g = 0; g < G; ++g) {
                const __m256 k0 = PanelW<TW>::k0(wp + g * VL * fe);
                for (int r = 0; r < R; ++r)
                    c[h][r][g] = _mm256_fmadd_ps(_mm256_broadcast_ss(x + r * ldx + a.K - 1), k0, c[h][r][g]);
            }
        }
    }
    for (int r = 0; r < R; ++r)
        for (int g = 0; g < G; ++g) {
            if constexpr (GATED) gated_store<TY>(a, m0 + r, panel, g * VL, vf(c[0][r][g]), vf(c[1][r][g]));
            else panel_store<TY>(a, m0 + r, panel * kPanel, g * VL, vf(c[0][r][g]));
        }
}

// 3 to 6 rows, all SUBS sub-passes of the panel, in blocks of kBlockPairs k pairs: a block's
// rows of the panel (GATED: and its up panel; at most 16 KB) stay in L1 through the sub-passes,
// which each read a 32- or 64-byte part of every line (read k by k through the whole K, the lines
// of an fp32 gated pass came from L2 twice: L2-bound). The accumulators go to memory between
// blocks; the sums keep their k order.
constexpr int64_t kBlockPairs = 32;

template <typename TY, typename TW, int R, bool GATED>
void panel_tile_blocked(const LinearArgs& a, int64_t m0, int64_t panel, const char* pf, int64_t pf_step) {
    constexpr int SUBS = GATED ? kGatedSubPasses : kSubPasses;
    constexpr int64_t fe = PanelW<TW>::kPerFeature;
    const int64_t up_bytes = GATED ? a.up_offset * a.ldw * static_cast<int64_t>(sizeof(TW)) : 0;
    const float* x = a.x + m0 * a.ldx;
    const int64_t ldx = a.ldx, pairs = a.K / 2;
    const int64_t sub_step = (pf_step + SUBS - 1) / SUBS;  // a sub-pass prefetches 1/SUBS of the share
    const TW* w[SUBS];
    const TW* w2[SUBS];
    for (int s = 0; s < SUBS; ++s) {
        w[s] = static_cast<const TW*>(a.w) + panel * a.ldw + fe * s * (kPanel / SUBS);
        w2[s] = GATED ? w[s] + a.up_offset * a.ldw : w[s] + fe * VL;
    }
    __m256 acc[SUBS][2][6];
    for (auto& sub : acc)
        for (auto& half : sub)
            for (auto& v : half) v = _mm256_setzero_ps();
    for (int64_t p0 = 0; p0 < pairs; p0 += kBlockPairs) {
        const int64_t n = imin_(kBlockPairs, pairs - p0);
        for (int s = 0; s < SUBS; ++s) {
            const char* p1 = pf ? pf + (s * pairs + p0) * sub_step : reinterpret_cast<const char*>(w[s]);
            pair_loop<TW, R>(acc[s], w[s] + p0 * kPairElems, w2[s] + p0 * kPairElems, x + 2 * p0, ldx, n, p1,
                             p1 + up_bytes, pf ? sub_step : 0);
        }
    }
    for (int s = 0; s < SUBS; ++s) {
        __m256 c0[R], c1[R];
        for (int r = 0; r < R; ++r) {
            c0[r] = acc[s][0][r];
            c1[r] = acc[s][1][r];
        }
        finish_sub<TY, TW, R, GATED>(a, m0, panel, s * (kPanel / SUBS), c0, c1, w[s], w2[s], x);
    }
}

template <typename TY, typename TW, int R, bool GATED>
void panel_tile(const LinearArgs& a, int64_t m0, int64_t panel, const char* pf, int64_t pf_step) {
    if constexpr (R <= 2) panel_narrow<TY, TW, R, GATED>(a, m0, panel, pf, pf_step);
    else panel_tile_blocked<TY, TW, R, GATED>(a, m0, panel, pf, pf_step);
}

constexpr int64_t kPanelTileRowsHere = 6, kGatedTileRowsHere = 6;

template <typename TY, bool GATED, typename TW>
void panel_rows(const LinearArgs& a, int64_t m0, int64_t rows, int64_t panel, const char* pf, int64_t pf_step) {
    with_rows<6>(rows, [&](auto r) { panel_tile<TY, TW, decltype(r)::value, GATED>(a, m0, panel, pf, pf_step); });
}
