// The linear over weights packed in panels (linear_ops.cpp `pack_linear_weight`), included once
// per ISA by isa_*.cpp after kernels_impl.h, whose helpers it uses.
//
// Panel layout, bf16 (BF16_PANELS): [N / 32][ceil(K / 2)][32][2]: for each block of 32 output
// features, K in pairs, each feature's pair side by side, zero past K. That is the operand
// vdpbf16ps multiplies: one 64-byte load is 16 features x 2 k. Activations are bf16 rows read in
// place; each row's (k, k + 1) pair is broadcast and multiplied with two such loads, so a register
// tile of 12 rows x 32 features (24 accumulators) needs no reduction and no packing of the
// activations (the row-major kernel in kernels_impl.h sums along K and reduces every output; this
// is how oneDNN's blocked GEMM works, and it reaches its speed from 1 row to prefill sizes).
// fp32 (F32_PANELS): [N / 32][K][32], i.e. the same pair rows of 64 values with k and k + 1 one
// after the other (no padding row for an odd K).
// Kernel sets without AVX512-BF16 read fp32 activations (linear_ops.cpp converts them): AVX2 has
// tiles of its own for both layouts (panels_avx2_impl.h), AVX512-BF16 for bf16 panels (and AMX,
// the amx set, for bf16 panels with K a multiple of 32: panels_amx_impl.h), every 512-bit set for
// fp32 panels (panel_tile_f32), the generic set a plain loop (only when asked for with use_isa).

namespace {

constexpr int kPanelTileRows = 12;      // activation rows per register tile
constexpr int kGatedTileRows = 6;       // gated (up_offset): 6 rows x (32 gate + 32 up)
constexpr int64_t kPanelRowBlock = 192;  // rows per pass over a thread's panels (stay in L2)

template <typename TY>
inline void panel_store(const LinearArgs& a, int64_t m, int64_t n0, int64_t j, vf v) {
    if (a.bias) v += vld<float>(a.bias + n0 + j);
    if constexpr (std::is_same_v<TY, float>) {
        if (a.round_to_bf16) v = vrnd<bf16_t>(v);
        if (a.argmax_value) return argmax_lanes(a, m, n0 + j, v);
    }
    vst<TY>(static_cast<TY*>(a.y) + m * a.ldy + n0 + j, v);
}

// Calls f(Rows<R>{}) with R = rows, for 1 <= rows <= MAX: the tile templates take the row count
// as a compile-time constant.
template <int R> struct Rows { static constexpr int value = R; };
template <int MAX, typename F>
inline void with_rows(int64_t rows, F&& f) {
    if constexpr (MAX <= 1) f(Rows<1>{});
    else if (rows >= MAX) f(Rows<MAX>{});
    else with_rows<MAX - 1>(rows, f);
}

// What a tile of rows [m0, ...) x panel `panel` reads: the panel (w), GATED its up panel (wu, up_bytes
// further) and the rows of x (TX: the activations this tile reads, xs their first row).
template <typename TW, typename TX>
struct TileOperands {
    const TW* w;
    const TW* wu;
    int64_t up_bytes;
    const TX* x;
};
template <typename TW, typename TX>
inline TileOperands<TW, TX> tile_operands(const LinearArgs& a, int64_t m0, int64_t panel, const TX* xs) {
    const TW* w = static_cast<const TW*>(a.w) + panel * a.ldw;
    return {w, w + a.up_offset * a.ldw, a.up_offset * a.ldw * static_cast<int64_t>(sizeof(TW)), xs + m0 * a.ldx};
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

// Into L2: the `step` bytes at pf (a k pair's share of the next panel), GATED: and at pf + up_bytes
// (of the next up panel).
template <bool GATED>
inline void prefetch_share(const char* pf, int64_t step, int64_t up_bytes) {
    __builtin_prefetch(pf, 0, 2);
    if (step > 64) __builtin_prefetch(pf + 64, 0, 2);
    if constexpr (GATED) {
        __builtin_prefetch(pf + up_bytes, 0, 2);
        if (step > 64) __builtin_prefetch(pf + up_bytes + 64, 0, 2);
    }
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
    const auto [w, wu, up_bytes, x] = tile_operands<bf16_t>(a, m0, panel, a.xb);
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
        if (pf) prefetch_share<GATED>(pf + p * pf_step, pf_step, up_bytes);
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

#elif SGLK_VEC_BYTES == 32
#include "panels_avx2_impl.h"
#endif

#if SGLK_VEC_BYTES == 64
// fp32 panels on 512-bit sets: rows [m0, m0 + R) x 32 features (GATED: and the up panel's 32),
// each k's two panel vectors times the rows' broadcast x[k], one FMA chain per output in k order:
// the AVX2 tiles' arithmetic, so both sets give the same bits. Prefetch as panel_tile.
template <typename TY, int R, bool GATED>
void panel_tile_f32(const LinearArgs& a, int64_t m0, int64_t panel, const char* pf, int64_t pf_step) {
    static_assert(VL == 16, "the fp32 panel tile is written for 512-bit vectors");
    constexpr int RU = GATED ? R : 1;
    const auto [w, wu, up_bytes, x] = tile_operands<float>(a, m0, panel, a.x);
    __m512 c0[R], c1[R], c2[RU], c3[RU];
    for (int r = 0; r < R; ++r) c0[r] = c1[r] = _mm512_setzero_ps();
    for (int r = 0; r < RU; ++r) c2[r] = c3[r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < a.K; ++k) {
        const __m512 b0 = _mm512_loadu_ps(w + k * kPanel), b1 = _mm512_loadu_ps(w + k * kPanel + 16);
        __m512 u0 = b0, u1 = b1;
        if constexpr (GATED) {
            u0 = _mm512_loadu_ps(wu + k * kPanel);
            u1 = _mm512_loadu_ps(wu + k * kPanel + 16);
        }
        if (pf && !(k & 1)) prefetch_share<GATED>(pf + (k / 2) * pf_step, pf_step, up_bytes);
#pragma GCC unroll 12
        for (int r = 0; r < R; ++r) {
            const __m512 xv = _mm512_set1_ps(x[r * a.ldx + k]);
            c0[r] = _mm512_fmadd_ps(xv, b0, c0[r]);
            c1[r] = _mm512_fmadd_ps(xv, b1, c1[r]);
            if constexpr (GATED) {
                c2[r] = _mm512_fmadd_ps(xv, u0, c2[r]);
                c3[r] = _mm512_fmadd_ps(xv, u1, c3[r]);
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        if constexpr (GATED) {
            gated_store<TY>(a, m0 + r, panel, 0, vf(c0[r]), vf(c2[r]));
            gated_store<TY>(a, m0 + r, panel, 16, vf(c1[r]), vf(c3[r]));
        } else {
            panel_store<TY>(a, m0 + r, panel * kPanel, 0, vf(c0[r]));
            panel_store<TY>(a, m0 + r, panel * kPanel, 16, vf(c1[r]));
        }
    }
}

// The 512-bit sets' tile for TW weights: vdpbf16ps for bf16 (AVX512-BF16 only), FMA for fp32.
template <typename TY, typename TW, int R, bool GATED>
inline void tile_512(const LinearArgs& a, int64_t m0, int64_t panel, const char* pf, int64_t pf_step) {
#if SGLK_BF16_DOT
    if constexpr (sizeof(TW) == 2) panel_tile<TY, R, GATED>(a, m0, panel, pf, pf_step);
#endif
    if constexpr (sizeof(TW) == 4) panel_tile_f32<TY, R, GATED>(a, m0, panel, pf, pf_step);
}

template <typename TY, bool GATED, typename TW>
void panel_rows_512(const LinearArgs& a, int64_t m0, int64_t rows, int64_t panel, const char* pf, int64_t pf_step) {
    with_rows<GATED ? kGatedTileRows : kPanelTileRows>(
        rows, [&](auto r) { tile_512<TY, TW, decltype(r)::value, GATED>(a, m0, panel, pf, pf_step); });
}
#endif

// The plain loop over either layout (fp32 rows of x): the kernel sets without a tile of their own
// (generic; AVX-512 without BF16 for bf16 panels), which only the tests ask for (use_isa).
template <typename TY, bool GATED, typename TW>
void panel_rows_plain(const LinearArgs& a, int64_t m0, int64_t rows, int64_t panel) {
    constexpr bool kBf16 = sizeof(TW) == 2;
    alignas(64) float acc[2][kPanel];
    for (int64_t m = m0; m < m0 + rows; ++m) {
        const float* x = a.x + m * a.ldx;
        for (int h = 0; h < (GATED ? 2 : 1); ++h) {  // the panel, then (GATED) its up panel
            const TW* w = static_cast<const TW*>(a.w) + (panel + h * a.up_offset) * a.ldw;
            for (int64_t j = 0; j < kPanel; ++j) acc[h][j] = 0.0f;
            for (int64_t k = 0; k < a.K; ++k) {
                const float xk = x[k];
                const TW* wk = w + (k / 2) * 2 * kPanel + (kBf16 ? (k & 1) : (k & 1) * kPanel);
                for (int64_t j = 0; j < kPanel; ++j) acc[h][j] += xk * ld<TW>(wk, kBf16 ? 2 * j : j);
            }
        }
        for (int64_t j = 0; j < kPanel; j += VL) {
            if constexpr (GATED) gated_store<TY>(a, m, panel, j, vld<float>(acc[0] + j), vld<float>(acc[1] + j));
            else panel_store<TY>(a, m, panel * kPanel, j, vld<float>(acc[0] + j));
        }
    }
}

// The tile this kernel set has for TW weights, or the plain loop.
template <typename TY, bool GATED, typename TW>
void panel_rows_any(const LinearArgs& a, int64_t m0, int64_t rows, int64_t panel, const char* pf, int64_t pf_step) {
#if SGLK_VEC_BYTES == 64
#if SGLK_BF16_DOT
    constexpr bool kTile = true;
#else
    constexpr bool kTile = sizeof(TW) == 4;  // bf16 panels need vdpbf16ps
#endif
    if constexpr (kTile) return panel_rows_512<TY, GATED, TW>(a, m0, rows, panel, pf, pf_step);
#elif SGLK_VEC_BYTES == 32
    return panel_rows<TY, GATED, TW>(a, m0, rows, panel, pf, pf_step);
#endif
    panel_rows_plain<TY, GATED, TW>(a, m0, rows, panel);
}

// A panel's first row tile reads it from memory, the others from L1/L2. So that the stream from
// memory overlaps the arithmetic, the row tiles of a panel prefetch the panel that comes next
// (this thread's next one, or its first again for the next block of rows), each tile a 1/T share,
// spread over its k pairs: with one tile the prefetch runs a whole panel ahead. The rows are dealt
// to the tiles evenly, since a tile of few rows has too few accumulators to hide vdpbf16ps' latency.
#if SGLK_BF16_DOT || SGLK_VEC_BYTES != 32  // AVX2 sets its own (panels_avx2_impl.h)
constexpr int64_t kPanelTileRowsHere = kPanelTileRows, kGatedTileRowsHere = kGatedTileRows;
#endif

template <typename TY, bool GATED, typename TW>
void linear_panels_t(const LinearArgs& a, int64_t p0, int64_t p1) {
    constexpr int64_t tile_rows = GATED ? kGatedTileRowsHere : kPanelTileRowsHere;
    const char* w = static_cast<const char*>(a.w);
    const int64_t panel_bytes = a.ldw * static_cast<int64_t>(sizeof(TW)), pairs = imax_(1, a.K / 2);
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
                panel_rows_any<TY, GATED, TW>(a, m, rows, p, next < 0 ? nullptr : w + next * panel_bytes + t * share,
                                              step);
                m += rows;
            }
        }
    }
}

template <typename TW>
void linear_panels_w(const LinearArgs& a, int64_t p0, int64_t p1) {
    const bool gated = a.up_offset > 0;
    if (a.ytype == DType::F32) gated ? linear_panels_t<float, true, TW>(a, p0, p1)
                                     : linear_panels_t<float, false, TW>(a, p0, p1);
    else gated ? linear_panels_t<bf16_t, true, TW>(a, p0, p1) : linear_panels_t<bf16_t, false, TW>(a, p0, p1);
}

#if SGLK_AMX
#include "panels_amx_impl.h"
#endif

}  // namespace

void linear_panels(const LinearArgs& a, int64_t panel_begin, int64_t panel_end) {
#if SGLK_AMX
    if (amx_takes(a)) return amx_panels(a, panel_begin, panel_end);
#endif
    if (a.wtype == WType::F32_PANELS) linear_panels_w<float>(a, panel_begin, panel_end);
    else linear_panels_w<bf16_t>(a, panel_begin, panel_end);
}
