// The linear over weights packed in panels (ops.cpp `pack_linear_weight`), included once per ISA
// by isa_*.cpp after kernels_impl.h, whose helpers it uses.
//
// Panel layout, bf16: [N / 32][ceil(K / 2)][32][2]: for each block of 32 output features, K in
// pairs, each feature's pair side by side, zero past K. That is the operand vdpbf16ps multiplies:
// one 64-byte load is 16 features x 2 k. Activations are bf16 rows read in place; each row's
// (k, k + 1) pair is broadcast and multiplied with two such loads, so a register tile of 12 rows x
// 32 features (24 accumulators) needs no reduction and no packing of the activations (the
// row-major kernel in kernels_impl.h sums along K and reduces every output; this is how oneDNN's
// blocked GEMM works, and it reaches its speed from 1 row to prefill sizes). Kernel sets without
// AVX512-BF16 read fp32 activations (ops.cpp converts them): AVX2 a tile of its own (below), the
// others a plain loop over the same layout (only when asked for with use_isa).

namespace {

constexpr int kPanelTileRows = 12;      // activation rows per register tile
constexpr int kGatedTileRows = 6;       // gated (up_offset): 6 rows x (32 gate + 32 up)
constexpr int64_t kPanelRowBlock = 192;  // rows per pass over a thread's panels (stay in L2)

template <typename TY>
inline void panel_store(const LinearArgs& a, int64_t m, int64_t n0, int64_t j, vf v) {
    if (a.bias) v += vld<float>(a.bias + n0 + j);
    vst<TY>(static_cast<TY*>(a.y) + m * a.ldy + n0 + j, v);
}

// Gated: outputs j.. j + 15 of gate panel `panel` from its gate and up sums, rounded as
// silu_mul_t rounds what the unfused linear stored (same formula, same vexp).
template <typename TY>
inline void gated_store(const LinearArgs& a, int64_t m, int64_t panel, int64_t j, vf g, vf u) {
    if (a.bias) {
        g += vld<float>(a.bias + panel * kPanel + j);
        u += vld<float>(a.bias + (panel + a.up_offset) * kPanel + j);
    }
    g = vrnd<TY>(g);
    u = vrnd<TY>(u);
    vst<TY>(static_cast<TY*>(a.y) + m * a.ldy + panel * kPanel + j, vrnd<TY>(g / (1.0f + vexp(-g))) * u);
}

#if SGLK_BF16_DOT
inline vh2 pair_splat(const bf16_t* p) {  // (p[0], p[1]) in every 32-bit lane
    uint32_t u;
    __builtin_memcpy(&u, p, 4);
    return __builtin_bit_cast(vh2, vu{} + u);
}

// Rows [m0, m0 + R) of panel `panel`: R x 32 outputs (GATED: of gate panel `panel` and its up
// panel, 2 x R x 32 sums, R x 32 outputs). Meanwhile `pf_step` bytes a k pair from `pf` on (the
// next panel's share of this tile, see linear_panels_t; GATED: of the next up panel too) are
// prefetched into L2.
template <typename TY, int R, bool GATED>
void panel_tile(const LinearArgs& a, int64_t m0, int64_t panel, const char* pf, int64_t pf_step) {
    static_assert(VL == 16, "the bf16 panel tile is written for 512-bit vectors");
    constexpr int RU = GATED ? R : 1;
    const bf16_t* w = static_cast<const bf16_t*>(a.w) + panel * a.ldw;
    const bf16_t* wu = w + a.up_offset * a.ldw;
    const int64_t up_bytes = a.up_offset * a.ldw * static_cast<int64_t>(sizeof(bf16_t));
    const bf16_t* x = a.xb + m0 * a.ldx;
    const int64_t pairs = a.K / 2;
    vf c0[R], c1[R], c2[RU], c3[RU];
    for (int r = 0; r < R; ++r) c0[r] = c1[r] = vf{};
    for (int r = 0; r < RU; ++r) c2[r] = c3[r] = vf{};
    for (int64_t p = 0; p < pairs; ++p) {
        const vh2 b0 = *reinterpret_cast<const vh2*>(w + p * 64), b1 = *reinterpret_cast<const vh2*>(w + p * 64 + 32);
        vh2 u0{}, u1{};
        if constexpr (GATED) {
            u0 = *reinterpret_cast<const vh2*>(wu + p * 64);
            u1 = *reinterpret_cast<const vh2*>(wu + p * 64 + 32);
        }
        if (pf) {
            __builtin_prefetch(pf + p * pf_step, 0, 2);
            if (pf_step > 64) __builtin_prefetch(pf + p * pf_step + 64, 0, 2);
            if constexpr (GATED) {
                __builtin_prefetch(pf + up_bytes + p * pf_step, 0, 2);
                if (pf_step > 64) __builtin_prefetch(pf + up_bytes + p * pf_step + 64, 0, 2);
            }
        }
#pragma GCC unroll 12
        for (int r = 0; r < R; ++r) {
            const vh2 xv = pair_splat(x + r * a.ldx + 2 * p);
            c0[r] = dpbf16(c0[r], xv, b0);
            c1[r] = dpbf16(c1[r], xv, b1);
            if constexpr (GATED) {
                c2[r] = dpbf16(c2[r], xv, u0);
                c3[r] = dpbf16(c3[r], xv, u1);
            }
        }
    }
    if (a.K & 1) {  // the last k alone: its pair's second weight is the panel's zero padding
        const vh2 b0 = *reinterpret_cast<const vh2*>(w + pairs * 64), b1 = *reinterpret_cast<const vh2*>(w + pairs * 64 + 32);
        for (int r = 0; r < R; ++r) {
            const vh2 xv = __builtin_bit_cast(vh2, vu{} + static_cast<uint32_t>(x[r * a.ldx + a.K - 1]));
            c0[r] = dpbf16(c0[r], xv, b0);
            c1[r] = dpbf16(c1[r], xv, b1);
            if constexpr (GATED) {
                c2[r] = dpbf16(c2[r], xv, *reinterpret_cast<const vh2*>(wu + pairs * 64));
                c3[r] = dpbf16(c3[r], xv, *reinterpret_cast<const vh2*>(wu + pairs * 64 + 32));
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        if constexpr (GATED) {
            gated_store<TY>(a, m0 + r, panel, 0, c0[r], c2[r]);
            gated_store<TY>(a, m0 + r, panel, 16, c1[r], c3[r]);
        } else {
            panel_store<TY>(a, m0 + r, panel * kPanel, 0, c0[r]);
            panel_store<TY>(a, m0 + r, panel * kPanel, 16, c1[r]);
        }
    }
}

template <typename TY, bool GATED>
void panel_rows(const LinearArgs& a, int64_t m0, int64_t rows, int64_t panel, const char* pf, int64_t pf_step) {
    if constexpr (!GATED) {
        switch (rows) {
            case 12: return panel_tile<TY, 12, GATED>(a, m0, panel, pf, pf_step);
            case 11: return panel_tile<TY, 11, GATED>(a, m0, panel, pf, pf_step);
            case 10: return panel_tile<TY, 10, GATED>(a, m0, panel, pf, pf_step);
            case 9: return panel_tile<TY, 9, GATED>(a, m0, panel, pf, pf_step);
            case 8: return panel_tile<TY, 8, GATED>(a, m0, panel, pf, pf_step);
            case 7: return panel_tile<TY, 7, GATED>(a, m0, panel, pf, pf_step);
            default: break;
        }
    }
    switch (rows) {
        case 6: return panel_tile<TY, 6, GATED>(a, m0, panel, pf, pf_step);
        case 5: return panel_tile<TY, 5, GATED>(a, m0, panel, pf, pf_step);
        case 4: return panel_tile<TY, 4, GATED>(a, m0, panel, pf, pf_step);
        case 3: return panel_tile<TY, 3, GATED>(a, m0, panel, pf, pf_step);
        case 2: return panel_tile<TY, 2, GATED>(a, m0, panel, pf, pf_step);
        default: return panel_tile<TY, 1, GATED>(a, m0, panel, pf, pf_step);
    }
}
#elif SGLK_VEC_BYTES == 32
// AVX2 + FMA, which has no bf16 dot product. A 32-byte load of a pair row is 8 features x
// (k, k + 1); a shift gives the k weights as fp32 (a bf16 is the high half of its fp32), a mask
// the k + 1 ones. The activations are fp32 (a.x: ops.cpp converts bf16 rows once per call), each
// k broadcast from memory. A tile is R rows x 16 features: 2 groups of 8 (GATED: 8 features of
// the gate panel and the same 8 of its up panel), k then k + 1, so that 2R accumulators, 2 weight
// vectors, a broadcast and the mask fit in the 16 registers with R = 6. Each k adds one product
// to each accumulator; from R = 5 on, a k's FMAs take longer to issue than one FMA's latency, so
// the chains never stall. GCC spills such a tile written with intrinsics (from 5 rows), so the
// k loop of 5- and 6-row tiles is inline asm (pair_loop), of smaller tiles C. A panel takes 2
// (GATED 4) sub-passes, which read it from L1/L2 after the first.
constexpr int kSubPasses = 2;
constexpr int kGatedSubPasses = 4;

#define SGLK_ROW_FMA(addr, acc0, acc1)                     \
    "vbroadcastss " addr ", %%ymm14\n\t"                    \
    "vfmadd231ps %%ymm12, %%ymm14, %%" acc0 "\n\t"          \
    "vfmadd231ps %%ymm13, %%ymm14, %%" acc1 "\n\t"
#define SGLK_ROWS5(off)                                          \
    SGLK_ROW_FMA(off "(%[x0])", "ymm0", "ymm6")                  \
    SGLK_ROW_FMA(off "(%[x0],%[ld],1)", "ymm1", "ymm7")          \
    SGLK_ROW_FMA(off "(%[x0],%[ld],2)", "ymm2", "ymm8")          \
    SGLK_ROW_FMA(off "(%[x3])", "ymm3", "ymm9")                  \
    SGLK_ROW_FMA(off "(%[x3],%[ld],1)", "ymm4", "ymm10")
#define SGLK_ROWS6(off) SGLK_ROWS5(off) SGLK_ROW_FMA(off "(%[x3],%[ld],2)", "ymm5", "ymm11")
#define SGLK_PAIR_LOOP(ROWS)                                                         \
    "vxorps %%ymm0, %%ymm0, %%ymm0\n\t"                                              \
    "vxorps %%ymm1, %%ymm1, %%ymm1\n\t"                                              \
    "vxorps %%ymm2, %%ymm2, %%ymm2\n\t"                                              \
    "vxorps %%ymm3, %%ymm3, %%ymm3\n\t"                                              \
    "vxorps %%ymm4, %%ymm4, %%ymm4\n\t"                                              \
    "vxorps %%ymm5, %%ymm5, %%ymm5\n\t"                                              \
    "vxorps %%ymm6, %%ymm6, %%ymm6\n\t"                                              \
    "vxorps %%ymm7, %%ymm7, %%ymm7\n\t"                                              \
    "vxorps %%ymm8, %%ymm8, %%ymm8\n\t"                                              \
    "vxorps %%ymm9, %%ymm9, %%ymm9\n\t"                                              \
    "vxorps %%ymm10, %%ymm10, %%ymm10\n\t"                                           \
    "vxorps %%ymm11, %%ymm11, %%ymm11\n\t"                                           \
    "vpcmpeqd %%ymm15, %%ymm15, %%ymm15\n\t"                                          \
    "vpslld $16, %%ymm15, %%ymm15\n\t" /* the k + 1 mask, 0xffff0000 */             \
    "1:\n\t"                                                                        \
    "prefetcht1 (%[pf])\n\t"                                                        \
    "prefetcht1 (%[pf2])\n\t"                                                       \
    "vmovdqu (%[w]), %%ymm12\n\t"                                                   \
    "vmovdqu (%[w2]), %%ymm13\n\t"                                                  \
    "vpslld $16, %%ymm12, %%ymm12\n\t"                                              \
    "vpslld $16, %%ymm13, %%ymm13\n\t"                                              \
    ROWS("")                                                                        \
    "vpand (%[w]), %%ymm15, %%ymm12\n\t"                                            \
    "vpand (%[w2]), %%ymm15, %%ymm13\n\t"                                           \
    ROWS("4")                                                                       \
    "add $128, %[w]\n\t"                                                            \
    "add $128, %[w2]\n\t"                                                           \
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

// out[0][r] = sum over pairs p < n of the (k = 2p, 2p + 1) products of row r of x with the 8
// features at w, out[1][r] the same with w2 (R = 5 or 6 rows; out is [2][6] vectors, rows past
// R unspecified); pf and pf2 advance by pf_step a pair, one prefetch each. n >= 1.
template <int R>
inline void pair_loop(__m256 (&out)[2][6], const bf16_t* w, const bf16_t* w2, const float* x, int64_t ldx,
                      int64_t n, const char* pf, const char* pf2, int64_t pf_step) {
    static_assert(R == 5 || R == 6, "pair_loop is written for 5 and 6 rows");
    const float* x3 = x + 3 * ldx;
    const int64_t ld = ldx * static_cast<int64_t>(sizeof(float));
#define SGLK_PAIR_OPERANDS                                                                          \
    : [w] "+r"(w), [w2] "+r"(w2), [x0] "+r"(x), [x3] "+r"(x3), [pf] "+r"(pf), [pf2] "+r"(pf2),      \
      [n] "+r"(n)                                                                                   \
    : [ld] "r"(ld), [pfs] "r"(pf_step), [out] "r"(&out[0][0])                                      \
    : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",      \
      "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "memory", "cc"
    if constexpr (R == 6) __asm__ volatile(SGLK_PAIR_LOOP(SGLK_ROWS6) SGLK_PAIR_OPERANDS);
    else __asm__ volatile(SGLK_PAIR_LOOP(SGLK_ROWS5) SGLK_PAIR_OPERANDS);
#undef SGLK_PAIR_OPERANDS
}
#undef SGLK_PAIR_LOOP
#undef SGLK_ROWS6
#undef SGLK_ROWS5
#undef SGLK_ROW_FMA

// Features f0 .. f0 + 15 (GATED: f0 .. f0 + 7 and their up features) of panel `panel` for rows
// [m0, m0 + R). Sub-pass SUB of SUBS prefetches its 1/SUBS of the tile's share of the next panel
// (`pf`, pf_step bytes a pair; GATED: and of the next up panel).
template <typename TY, int R, bool GATED, int SUB, int SUBS>
void panel_sub(const LinearArgs& a, int64_t m0, int64_t panel, const char* pf, int64_t pf_step) {
    constexpr int f0 = SUB * (kPanel / SUBS);
    const bf16_t* w = static_cast<const bf16_t*>(a.w) + panel * a.ldw + 2 * f0;
    const bf16_t* w2 = GATED ? w + a.up_offset * a.ldw : w + 2 * VL;
    const int64_t up_bytes = GATED ? a.up_offset * a.ldw * static_cast<int64_t>(sizeof(bf16_t)) : 0;
    const float* x = a.x + m0 * a.ldx;
    const int64_t ldx = a.ldx, pairs = a.K / 2;
    const int64_t sub_step = (pf_step + SUBS - 1) / SUBS;
    if (pf) pf += SUB * pairs * sub_step;
    __m256 c0[R], c1[R];
    for (int r = 0; r < R; ++r) c0[r] = c1[r] = _mm256_setzero_ps();
    if constexpr (R >= 5) {
        if (pairs > 0) {
            const char* p1 = pf ? pf : reinterpret_cast<const char*>(w);
            __m256 out[2][6];
            pair_loop<R>(out, w, w2, x, ldx, pairs, p1, p1 + up_bytes, pf ? sub_step : 0);
            for (int r = 0; r < R; ++r) {
                c0[r] = out[0][r];
                c1[r] = out[1][r];
            }
        }
    } else {
        const __m256i mask = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
        for (int64_t p = 0; p < pairs; ++p) {
            if (pf) {
                __builtin_prefetch(pf + p * sub_step, 0, 2);
                if constexpr (GATED) __builtin_prefetch(pf + up_bytes + p * sub_step, 0, 2);
            }
            const __m256i* wa = reinterpret_cast<const __m256i*>(w + p * 64);
            const __m256i* wb = reinterpret_cast<const __m256i*>(w2 + p * 64);
            const __m256 a0 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256(wa), 16));
            const __m256 b0 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256(wb), 16));
            for (int r = 0; r < R; ++r) {
                const __m256 xv = _mm256_broadcast_ss(x + r * ldx + 2 * p);
                c0[r] = _mm256_fmadd_ps(xv, a0, c0[r]);
                c1[r] = _mm256_fmadd_ps(xv, b0, c1[r]);
            }
            const __m256 a1 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_loadu_si256(wa), mask));
            const __m256 b1 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_loadu_si256(wb), mask));
            for (int r = 0; r < R; ++r) {
                const __m256 xv = _mm256_broadcast_ss(x + r * ldx + 2 * p + 1);
                c0[r] = _mm256_fmadd_ps(xv, a1, c0[r]);
                c1[r] = _mm256_fmadd_ps(xv, b1, c1[r]);
            }
        }
    }
    if (a.K & 1) {  // the last k alone: its pair's second weight is the panel's zero padding
        const __m256 a0 = _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + pairs * 64)), 16));
        const __m256 b0 = _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w2 + pairs * 64)), 16));
        for (int r = 0; r < R; ++r) {
            const __m256 xv = _mm256_broadcast_ss(x + r * ldx + a.K - 1);
            c0[r] = _mm256_fmadd_ps(xv, a0, c0[r]);
            c1[r] = _mm256_fmadd_ps(xv, b0, c1[r]);
        }
    }
    for (int r = 0; r < R; ++r) {
        if constexpr (GATED) {
            gated_store<TY>(a, m0 + r, panel, f0, vf(c0[r]), vf(c1[r]));
        } else {
            panel_store<TY>(a, m0 + r, panel * kPanel, f0, vf(c0[r]));
            panel_store<TY>(a, m0 + r, panel * kPanel, f0 + VL, vf(c1[r]));
        }
    }
}

// 1 or 2 rows (decode of one or two sequences, bound by the weights' stream): the whole panel
// (GATED: and its up panel) in one pass, reading each 128-byte pair row once, in order.
template <typename TY, int R, bool GATED>
void panel_narrow(const LinearArgs& a, int64_t m0, int64_t panel, const char* pf, int64_t pf_step) {
    constexpr int G = kPanel / VL;  // 4 groups of 8 features
    const bf16_t* w = static_cast<const bf16_t*>(a.w) + panel * a.ldw;
    const bf16_t* wu = w + a.up_offset * a.ldw;
    const int64_t up_bytes = GATED ? a.up_offset * a.ldw * static_cast<int64_t>(sizeof(bf16_t)) : 0;
    const float* x = a.x + m0 * a.ldx;
    const int64_t ldx = a.ldx, pairs = a.K / 2;
    const __m256i mask = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
    __m256 c[GATED ? 2 : 1][R][G];
    for (auto& h : c)
        for (auto& row : h)
            for (auto& v : row) v = _mm256_setzero_ps();
    for (int64_t p = 0; p <= pairs; ++p) {
        if (p == pairs && !(a.K & 1)) break;  // p == pairs: the odd last k, zero-padded pair
        if (pf && p < pairs) {
            __builtin_prefetch(pf + p * pf_step, 0, 2);
            if (pf_step > 64) __builtin_prefetch(pf + p * pf_step + 64, 0, 2);
            if constexpr (GATED) {
                __builtin_prefetch(pf + up_bytes + p * pf_step, 0, 2);
                if (pf_step > 64) __builtin_prefetch(pf + up_bytes + p * pf_step + 64, 0, 2);
            }
        }
        __m256 x0[R], x1[R];
        for (int r = 0; r < R; ++r) {
            x0[r] = _mm256_broadcast_ss(x + r * ldx + 2 * p);
            x1[r] = p < pairs ? _mm256_broadcast_ss(x + r * ldx + 2 * p + 1) : _mm256_setzero_ps();
        }
        for (int h = 0; h < (GATED ? 2 : 1); ++h) {
            const __m256i* wp = reinterpret_cast<const __m256i*>((h ? wu : w) + p * 64);
            for (int g = 0; g < G; ++g) {
                const __m256i u = _mm256_loadu_si256(wp + g);
                const __m256 k0 = _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
                const __m256 k1 = _mm256_castsi256_ps(_mm256_and_si256(u, mask));
                for (int r = 0; r < R; ++r) {
                    c[h][r][g] = _mm256_fmadd_ps(x0[r], k0, c[h][r][g]);
                    c[h][r][g] = _mm256_fmadd_ps(x1[r], k1, c[h][r][g]);
                }
            }
        }
    }
    for (int r = 0; r < R; ++r)
        for (int g = 0; g < G; ++g) {
            if constexpr (GATED) gated_store<TY>(a, m0 + r, panel, g * VL, vf(c[0][r][g]), vf(c[1][r][g]));
            else panel_store<TY>(a, m0 + r, panel * kPanel, g * VL, vf(c[0][r][g]));
        }
}

template <typename TY, int R, bool GATED>
void panel_tile(const LinearArgs& a, int64_t m0, int64_t panel, const char* pf, int64_t pf_step) {
    if constexpr (R <= 2) {
        panel_narrow<TY, R, GATED>(a, m0, panel, pf, pf_step);
    } else if constexpr (GATED) {
        panel_sub<TY, R, true, 0, kGatedSubPasses>(a, m0, panel, pf, pf_step);
        panel_sub<TY, R, true, 1, kGatedSubPasses>(a, m0, panel, pf, pf_step);
        panel_sub<TY, R, true, 2, kGatedSubPasses>(a, m0, panel, pf, pf_step);
        panel_sub<TY, R, true, 3, kGatedSubPasses>(a, m0, panel, pf, pf_step);
    } else {
        panel_sub<TY, R, false, 0, kSubPasses>(a, m0, panel, pf, pf_step);
        panel_sub<TY, R, false, 1, kSubPasses>(a, m0, panel, pf, pf_step);
    }
}

template <typename TY, bool GATED>
void panel_rows(const LinearArgs& a, int64_t m0, int64_t rows, int64_t panel, const char* pf, int64_t pf_step) {
    switch (rows) {
        case 6: return panel_tile<TY, 6, GATED>(a, m0, panel, pf, pf_step);
        case 5: return panel_tile<TY, 5, GATED>(a, m0, panel, pf, pf_step);
        case 4: return panel_tile<TY, 4, GATED>(a, m0, panel, pf, pf_step);
        case 3: return panel_tile<TY, 3, GATED>(a, m0, panel, pf, pf_step);
        case 2: return panel_tile<TY, 2, GATED>(a, m0, panel, pf, pf_step);
        default: return panel_tile<TY, 1, GATED>(a, m0, panel, pf, pf_step);
    }
}
#else
template <typename TY, bool GATED>
void panel_rows(const LinearArgs& a, int64_t m0, int64_t rows, int64_t panel, const char*, int64_t) {
    alignas(64) float acc[2][kPanel];
    for (int64_t m = m0; m < m0 + rows; ++m) {
        const float* x = a.x + m * a.ldx;  // fp32 rows: this kernel set does not read bf16 (ops.cpp)
        for (int h = 0; h < (GATED ? 2 : 1); ++h) {  // the panel, then (GATED) its up panel
            const bf16_t* w = static_cast<const bf16_t*>(a.w) + (panel + h * a.up_offset) * a.ldw;
            for (int64_t j = 0; j < kPanel; ++j) acc[h][j] = 0.0f;
            for (int64_t k = 0; k < a.K; ++k) {
                const float xk = x[k];
                const bf16_t* wk = w + (k / 2) * 64 + (k & 1);
                for (int64_t j = 0; j < kPanel; ++j) acc[h][j] += xk * bf2f(wk[2 * j]);
            }
        }
        for (int64_t j = 0; j < kPanel; j += VL) {
            if constexpr (GATED) gated_store<TY>(a, m, panel, j, vld<float>(acc[0] + j), vld<float>(acc[1] + j));
            else panel_store<TY>(a, m, panel * kPanel, j, vld<float>(acc[0] + j));
        }
    }
}
#endif

// A panel's first row tile reads it from memory, the others from L1/L2. So that the stream from
// memory overlaps the arithmetic, the row tiles of a panel prefetch the panel that comes next
// (this thread's next one, or its first again for the next block of rows), each tile a 1/T share,
// spread over its k pairs: with one tile the prefetch runs a whole panel ahead. The rows are dealt
// to the tiles evenly, since a tile of few rows has too few accumulators to hide vdpbf16ps' latency.
#if !SGLK_BF16_DOT && SGLK_VEC_BYTES == 32
constexpr int64_t kPanelTileRowsHere = 6, kGatedTileRowsHere = 6;  // AVX2 (see panel_sub)
#else
constexpr int64_t kPanelTileRowsHere = kPanelTileRows, kGatedTileRowsHere = kGatedTileRows;
#endif

template <typename TY, bool GATED>
void linear_panels_t(const LinearArgs& a, int64_t p0, int64_t p1) {
    constexpr int64_t tile_rows = GATED ? kGatedTileRowsHere : kPanelTileRowsHere;
    const char* w = static_cast<const char*>(a.w);
    const int64_t panel_bytes = a.ldw * static_cast<int64_t>(sizeof(bf16_t)), pairs = imax_(1, a.K / 2);
    // AVX2 reads fp32 rows, twice the bytes: a block is what fits in 256 KB (of a 512 KB+ L2)
    const int64_t row_block = a.xb ? kPanelRowBlock
                                   : imax_(tile_rows, (256 * 1024 / (4 * imax_(1, a.K))) / tile_rows * tile_rows);
    for (int64_t mb = 0; mb < a.M; mb += row_block) {
        const int64_t me = imin_(a.M, mb + row_block);
        const int64_t tiles = (me - mb + tile_rows - 1) / tile_rows;
        const int64_t share = (panel_bytes + tiles - 1) / tiles, step = (share + pairs - 1) / pairs;
        for (int64_t p = p0; p < p1; ++p) {
            const int64_t next = p + 1 < p1 ? p + 1 : (me < a.M ? p0 : -1);
            for (int64_t t = 0, m = mb; t < tiles; ++t) {  // rows dealt evenly: 16 = 8 + 8, not 12 + 4
                const int64_t rows = (me - mb) / tiles + (t < (me - mb) % tiles);
                panel_rows<TY, GATED>(a, m, rows, p, next < 0 ? nullptr : w + next * panel_bytes + t * share, step);
                m += rows;
            }
        }
    }
}

}  // namespace

void linear_panels(const LinearArgs& a, int64_t panel_begin, int64_t panel_end) {
    const bool gated = a.up_offset > 0;
    if (a.ytype == DType::F32) gated ? linear_panels_t<float, true>(a, panel_begin, panel_end)
                                     : linear_panels_t<float, false>(a, panel_begin, panel_end);
    else gated ? linear_panels_t<bf16_t, true>(a, panel_begin, panel_end)
               : linear_panels_t<bf16_t, false>(a, panel_begin, panel_end);
}
