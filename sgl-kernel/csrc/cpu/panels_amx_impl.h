// AMX tiles for bf16 panels, included by isa_amx.cpp at the end of panels_impl.h's namespace (it
// uses panel_store and gated_store). The amx set is the avx512bf16 set plus this: its
// linear_panels hands bf16 panels with K a multiple of 32 here, everything else to the vdpbf16ps
// tiles.
//
// The panel layout already is the operand tdpbf16ps takes for B: a panel's pair row is 32
// features x (k, k + 1), 128 bytes, so 16 pair rows from a 64-byte offset are one B tile
// (32 k x 16 features, row stride 128 bytes) and the panel is two of them side by side. A tiles are
// 16 activation rows x 32 k read in place (row stride ldx). Per k block of 32, with 16-row groups
// g and g + 1: C0 += A_g B_lo, C1 += A_g B_hi, C2 += A_g+1 B_lo, C3 += A_g+1 B_hi (tmm0-3 sums,
// tmm4-5 A, tmm6-7 B); gated, the same over the gate panel and then over its up panel. A panel
// comes from memory once per block of 192 rows, and while the tiles work on it, the next one is
// prefetched into L2 (without that, 64 rows took 31 ms over the default model's weights, 19 with
// it; oneDNN 21). The sums go through a 16 x 16 fp32 buffer per tile to the same stores as
// the vector tiles (bias, rounding, SiLU), so a gated call equals linear + silu_and_mul bit for bit;
// those stores run a few rows per k block inside the next pair's tile loop (PendingStores).
// Every output is one k-ordered chain of tdpbf16ps, whatever the rows beside it, so rows do not
// change each other's results.

inline bool amx_takes(const LinearArgs& a) {
    return a.wtype == WType::BF16_PANELS && a.xb != nullptr && a.K % 32 == 0 && a.K > 0;
}

// The stores of one pair of row groups' sums (bias, rounding, SiLU: panel_store / gated_store),
// done a few rows at a time inside the k loop of the tiles that compute the next pair's sums.
// Stored after the tiles instead, a 16-row pair's epilogue (a gated one is ~2000 vector
// instructions) fills the out-of-order window and the tiles wait: at 512 rows the default model's
// gate_up took 41 ms over its 30 layers, 28 without the stores.
template <typename TY, bool GATED>
struct PendingStores {
    const LinearArgs& a;
    const float (*c)[16 * 16] = nullptr;   // the pair's sums (GATED: of the gate panel)
    const float (*cu)[16 * 16] = nullptr;  // GATED: of the up panel
    int64_t panel = 0, g = 0, rows0 = 0, units = 0, done = 0;

    void set(const float (*c_)[16 * 16], const float (*cu_)[16 * 16], int64_t panel_, int64_t g_, bool two) {
        c = c_, cu = cu_, panel = panel_, g = g_, done = 0;
        rows0 = imin_(16, a.M - g * 16);
        units = rows0 + (two ? imin_(16, a.M - (g + 1) * 16) : 0);
    }
    inline void step(int64_t n) {  // the next n rows
        for (; n > 0 && done < units; --n, ++done) {
            const int64_t h = done < rows0 ? 0 : 1, r = done - h * rows0, m = (g + h) * 16 + r;
            const float* lo = c[2 * h] + r * 16;
            const float* hi = c[2 * h + 1] + r * 16;
            if constexpr (GATED) {
                gated_store<TY>(a, m, panel, 0, vld<float>(lo), vld<float>(cu[2 * h] + r * 16));
                gated_store<TY>(a, m, panel, 16, vld<float>(hi), vld<float>(cu[2 * h + 1] + r * 16));
            } else {
                panel_store<TY>(a, m, panel * kPanel, 0, vld<float>(lo));
                panel_store<TY>(a, m, panel * kPanel, 16, vld<float>(hi));
            }
        }
    }
    void finish() { step(units); }
};

// Rows of groups g (x0, row stride s0) and g + 1 (x1, or nullptr) times one panel w: the sums of
// g into c[0] (features 0-15) and c[1] (16-31), of g + 1 into c[2], c[3], each 16 x 16 fp32.
// Meanwhile `pf_step` bytes a k block from pf on (the next panel's share, or nullptr) go to L2,
// and `per_step` rows of the previous pair's stores are done per k block.
template <typename Pending>
inline void amx_tiles(const bf16_t* w, int64_t kblocks, const bf16_t* x0, int64_t s0, const bf16_t* x1, int64_t s1,
                      const char* pf, int64_t pf_step, int64_t pf_end, float (*c)[16 * 16], Pending& pending,
                      int64_t per_step) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t kb = 0; kb < kblocks; ++kb) {
        if (pf)
            for (int64_t o = kb * pf_step; o < imin_((kb + 1) * pf_step, pf_end); o += 64) __builtin_prefetch(pf + o, 0, 2);
        const bf16_t* b = w + kb * 16 * 2 * kPanel;
        _tile_loadd(4, x0 + kb * 32, s0);
        _tile_loadd(6, b, 4 * kPanel);
        _tile_loadd(7, b + kPanel, 4 * kPanel);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        if (x1) {
            _tile_loadd(5, x1 + kb * 32, s1);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
        pending.step(per_step);
    }
    _tile_stored(0, c[0], 64);
    _tile_stored(1, c[1], 64);
    if (x1) {
        _tile_stored(2, c[2], 64);
        _tile_stored(3, c[3], 64);
    }
}

template <typename TY, bool GATED>
void amx_panels_t(const LinearArgs& a, int64_t p0, int64_t p1) {
    const int64_t M = a.M, K = a.K, kblocks = K / 32;
    // Fewer than 16 rows: tiles of M rows. More: 16-row tiles, the rows past the last whole group
    // from a zero-padded copy (an A tile loads all its rows).
    const int rows = static_cast<int>(imin_(M, 16));
    const int64_t groups = (M + 15) / 16, in_place = M < 16 ? M : M / 16 * 16;
    std::vector<bf16_t> tail;
    if (in_place < M) {
        tail.assign(16 * K, 0);
        for (int64_t m = in_place; m < M; ++m)
            __builtin_memcpy(tail.data() + (m - in_place) * K, a.xb + m * a.ldx, K * sizeof(bf16_t));
    }
    auto group_rows = [&](int64_t g) { return g * 16 < in_place ? a.xb + g * 16 * a.ldx : tail.data(); };
    auto group_stride = [&](int64_t g) { return (g * 16 < in_place ? a.ldx : K) * static_cast<int64_t>(sizeof(bf16_t)); };
    // Sums of two pairs in turn: one being computed, the other's stores pending.
    alignas(64) float c[2][4][16 * 16], cu[2][4][16 * 16];  // GATED: c of the gate panel, cu of the up panel
    PendingStores<TY, GATED> pending{a};
    const int64_t per_step = (32 + kblocks * (GATED ? 2 : 1) - 1) / (kblocks * (GATED ? 2 : 1));
    int cur = 0;
    constexpr int64_t kGroupBlock = kPanelRowBlock / 16;  // row groups per pass over the panels (in L2)
    const int64_t panel_bytes = a.ldw * static_cast<int64_t>(sizeof(bf16_t));
    const int64_t up_elems = a.up_offset * a.ldw;
    amx_configure(rows);
    for (int64_t gb = 0; gb < groups; gb += kGroupBlock) {
        const int64_t ge = imin_(groups, gb + kGroupBlock);
        // Each pass over a panel's k blocks (one per pair of groups) prefetches its share of the
        // next panel into L2 (GATED: the up pass, of the next up panel), so that the stream from
        // memory overlaps the tiles' work.
        const int64_t passes = (ge - gb + 1) / 2, share = (panel_bytes + passes - 1) / passes;
        const int64_t pf_step = (share + kblocks - 1) / kblocks;
        for (int64_t p = p0; p < p1; ++p) {
            const bf16_t* w = static_cast<const bf16_t*>(a.w) + p * a.ldw;
            const int64_t next = p + 1 < p1 ? p + 1 : (ge < groups ? p0 : -1);
            const char* pf_panel = next < 0 ? nullptr : static_cast<const char*>(a.w) + next * panel_bytes;
            for (int64_t g = gb; g < ge; g += 2) {
                const bool two = g + 1 < ge;
                const bf16_t* x0 = group_rows(g);
                const bf16_t* x1 = two ? group_rows(g + 1) : nullptr;
                const int64_t s0 = group_stride(g), s1 = two ? group_stride(g + 1) : 0;
                const int64_t offset = (g - gb) / 2 * share, end = imax_(0, imin_(share, panel_bytes - offset));
                const char* pf = pf_panel ? pf_panel + offset : nullptr;
                amx_tiles(w, kblocks, x0, s0, x1, s1, pf, pf_step, end, c[cur], pending, per_step);
                if constexpr (GATED) {
                    amx_tiles(w + up_elems, kblocks, x0, s0, x1, s1, pf ? pf + up_elems * sizeof(bf16_t) : nullptr,
                              pf_step, end, cu[cur], pending, per_step);
                }
                pending.finish();
                pending.set(c[cur], cu[cur], p, g, two);
                cur ^= 1;
            }
        }
    }
    pending.finish();
    _tile_release();  // back to the init state: no tile data to save on a context switch
}

inline void amx_panels(const LinearArgs& a, int64_t p0, int64_t p1) {
    const bool gated = a.up_offset > 0;
    if (a.ytype == DType::F32) gated ? amx_panels_t<float, true>(a, p0, p1) : amx_panels_t<float, false>(a, p0, p1);
    else gated ? amx_panels_t<bf16_t, true>(a, p0, p1) : amx_panels_t<bf16_t, false>(a, p0, p1);
}
