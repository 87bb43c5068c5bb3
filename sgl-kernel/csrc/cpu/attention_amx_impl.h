// Extend attention on AMX tiles, included by attention_impl.h inside its namespace in the amx set
// (after amx_tiles.h). It takes bf16 pools with d % 32 == 0 and dv % 16 == 0; the rest goes to
// extend_t.
//
// The same work items and lanes as extend_t (16 (query, head) pairs of one request and kv head, a
// lane per query), turned on their side so that both products are tile products and the softmax
// stays vertical (one vector per key, a lane per query, no horizontal sums):
//   S^T [32 keys x 16 lanes] = K [32 keys x d] . Q^T     (A: K rows, B: Q^T in pairs of dims)
//   O^T [dv x 16 lanes]     += V^T [dv x 32 keys] . P^T  (A: V^T rows, B: P^T in pairs of keys)
// An item's keys go in chunks of up to 512: a chunk's S^T is kept whole, so its softmax is two
// plain passes and its V^T P^T sums run over all of its blocks in tiles without rescaling; chunks
// merge online (flash-attention style). K rows and V^T blocks of a (request, kv head) are packed
// once per thread into contiguous buffers (the pool's slots are scattered) and reused by all of
// its items on that thread. P goes to bf16 for the second product (as the GPU kernels do); sums
// and softmax are fp32. Default model shapes (9 query / 3 kv heads of 64), a layer: one 512-token
// prompt 1.69 -> 0.50 ms, 64 prompts of 32 tokens 1.34 -> 0.60 ms (against extend_t).
// Unlike extend_t it reads (and weighs 0) the K/V rows of up to 31 keys before an item's window
// and of its request's later new tokens: pool slots hold finite values (zero-initialised or
// written), as a 0 weight times a NaN row would not be 0.
constexpr int64_t kKeyBlock = 32;

// r[i][j] -> r[j][i] for 16 x 16 dwords (4 rounds of 16 shuffles).
inline void transpose16(__m512i (&r)[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int g = 0; g < 16; g += 4) {  // u[g + k]: column 4L + k of rows g..g+3 in 128-bit lane L
        r[g] = _mm512_castps_si512(_mm512_shuffle_ps(_mm512_castsi512_ps(t[g]), _mm512_castsi512_ps(t[g + 2]), 0x44));
        r[g + 1] = _mm512_castps_si512(_mm512_shuffle_ps(_mm512_castsi512_ps(t[g]), _mm512_castsi512_ps(t[g + 2]), 0xee));
        r[g + 2] = _mm512_castps_si512(_mm512_shuffle_ps(_mm512_castsi512_ps(t[g + 1]), _mm512_castsi512_ps(t[g + 3]), 0x44));
        r[g + 3] = _mm512_castps_si512(_mm512_shuffle_ps(_mm512_castsi512_ps(t[g + 1]), _mm512_castsi512_ps(t[g + 3]), 0xee));
    }
    for (int k = 0; k < 4; ++k) {
        const __m512i v = _mm512_shuffle_i32x4(r[k], r[4 + k], 0x88), w = _mm512_shuffle_i32x4(r[8 + k], r[12 + k], 0x88);
        const __m512i v1 = _mm512_shuffle_i32x4(r[k], r[4 + k], 0xdd), w1 = _mm512_shuffle_i32x4(r[8 + k], r[12 + k], 0xdd);
        t[k] = _mm512_shuffle_i32x4(v, w, 0x88);
        t[8 + k] = _mm512_shuffle_i32x4(v, w, 0xdd);
        t[4 + k] = _mm512_shuffle_i32x4(v1, w1, 0x88);
        t[12 + k] = _mm512_shuffle_i32x4(v1, w1, 0xdd);
    }
    for (int i = 0; i < 16; ++i) r[i] = t[i];
}

inline bool amx_extend_takes(const ExtendAttnArgs& a) {  // (scale > 0: the fast keys' max is taken unscaled)
    return a.dtype == DType::BF16 && a.d % 32 == 0 && a.dv % 16 == 0 && a.scale > 0 && VL == 16;
}

// One thread's K rows ([key][d]) and V^T blocks ([block][dv][32 keys]) of keys [base, end) of one
// (request, kv head); keys past the context are zeros (finite: their weights are 0).
struct KvPack {
    int64_t r = -1, kh = -1, base = 0, end = 0;
    std::vector<bf16_t> k, vt;
};

inline void pack_through(const ExtendAttnArgs& a, KvPack& pk, int64_t row, int64_t ctx, int64_t need) {
    const int64_t d = a.d, dv = a.dv;
    if (need <= pk.end) return;
    pk.k.resize((need - pk.base) * d);
    pk.vt.resize((need - pk.base) * dv);
    for (int64_t b0 = pk.end; b0 < need; b0 += kKeyBlock) {
        const bf16_t* vrow[kKeyBlock];  // nullptr: past the context (zeros)
        for (int64_t j = 0; j < kKeyBlock; ++j) {
            bf16_t* kd = pk.k.data() + (b0 - pk.base + j) * d;
            vrow[j] = nullptr;
            if (b0 + j >= ctx) {
                __builtin_memset(kd, 0, d * sizeof(bf16_t));
                continue;
            }
            const int64_t slot = slot_of(a, row, b0 + j);
            __builtin_memcpy(kd, static_cast<const bf16_t*>(a.k_cache) + (slot * a.hk + pk.kh) * d, d * sizeof(bf16_t));
            vrow[j] = static_cast<const bf16_t*>(a.v_cache) + (slot * a.hk + pk.kh) * dv;
        }
        // V^T [dv][32 keys]: dword (V[2p][c], V[2p + 1][c]) at row c, column p, i.e. the transpose
        // of the [16 p][dv] matrix of those dwords, 16 value dims at a time.
        bf16_t* vt = pk.vt.data() + (b0 - pk.base) * dv;
        for (int64_t c0 = 0; c0 < dv; c0 += 16) {
            __m512i w[16];
            for (int p = 0; p < 16; ++p) {
                const __m256i e = vrow[2 * p] ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vrow[2 * p] + c0)) : __m256i{};
                const __m256i o = vrow[2 * p + 1] ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vrow[2 * p + 1] + c0)) : __m256i{};
                w[p] = _mm512_or_si512(_mm512_cvtepu16_epi32(e), _mm512_slli_epi32(_mm512_cvtepu16_epi32(o), 16));
            }
            transpose16(w);
            for (int c = 0; c < 16; ++c) _mm512_storeu_si512(vt + (c0 + c) * kKeyBlock, w[c]);
        }
    }
    pk.end = need;
}

// S^T of one block of 32 keys (K rows kb) into tiles C0 (keys 0-15) and C1 (16-31); Q^T's pairs of
// dims in tiles 6 and 7 when `resident` (d <= 64), else loaded per 32 dims, alternating. (The
// tile intrinsics take their tile numbers as literal text, hence the macro.)
#define SGLK_SCORE_BLOCK(C0, C1)                                                  \
    inline void score_block_##C0##C1(const bf16_t* kb, int64_t d, const uint32_t* qt, bool resident) { \
        _tile_zero(C0);                                                           \
        _tile_zero(C1);                                                           \
        for (int64_t c = 0; c < d / 32; ++c) {                                    \
            _tile_loadd(4, kb + 32 * c, d * sizeof(bf16_t));                      \
            _tile_loadd(5, kb + 16 * d + 32 * c, d * sizeof(bf16_t));             \
            if (c % 2 == 0) {                                                     \
                if (!resident) _tile_loadd(6, qt + c * 16 * 16, 64);              \
                _tile_dpbf16ps(C0, 4, 6);                                         \
                _tile_dpbf16ps(C1, 5, 6);                                         \
            } else {                                                              \
                if (!resident) _tile_loadd(7, qt + c * 16 * 16, 64);              \
                _tile_dpbf16ps(C0, 4, 7);                                         \
                _tile_dpbf16ps(C1, 5, 7);                                         \
            }                                                                     \
        }                                                                         \
    }
SGLK_SCORE_BLOCK(0, 1)
SGLK_SCORE_BLOCK(2, 3)
#undef SGLK_SCORE_BLOCK

// O^T [16 * nw dims from dim w0][16 lanes] of one chunk's blocks into pv: sums in tiles 0..nw-1
// across the blocks (nw independent chains), V^T in tiles 4/5 and P^T in 6/7, alternating.
inline void value_chunk(const bf16_t* vt, int64_t dv, const uint32_t* pt, int64_t nblk, int64_t w0, int64_t nw,
                        float* pv) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t b = 0; b < nblk; ++b) {
        const bf16_t* v = vt + b * dv * kKeyBlock + w0 * 16 * kKeyBlock;
        const uint32_t* p = pt + b * 16 * 16;
#define SGLK_PV(B)                                                                                  \
    _tile_loadd(B, p, 64);                                                                          \
    _tile_loadd(4, v, 64);                                                                          \
    _tile_dpbf16ps(0, 4, B);                                                                        \
    if (nw > 1) { _tile_loadd(5, v + 16 * kKeyBlock, 64); _tile_dpbf16ps(1, 5, B); }                \
    if (nw > 2) { _tile_loadd(4, v + 32 * kKeyBlock, 64); _tile_dpbf16ps(2, 4, B); }                \
    if (nw > 3) { _tile_loadd(5, v + 48 * kKeyBlock, 64); _tile_dpbf16ps(3, 5, B); }
        if (b % 2 == 0) {
            SGLK_PV(6)
        } else {
            SGLK_PV(7)
        }
#undef SGLK_PV
    }
    _tile_stored(0, pv, 64);
    if (nw > 1) _tile_stored(1, pv + 256, 64);
    if (nw > 2) _tile_stored(2, pv + 512, 64);
    if (nw > 3) _tile_stored(3, pv + 768, 64);
}

// Keys per pass: S^T of a chunk is kept whole (32 KB), so its softmax is two plain passes (max,
// then exp) and the tiles' products over its blocks need no rescaling; chunks merge online.
constexpr int64_t kKeyChunk = 512;

// One pass of a work item over up to kKeyChunk of its keys, with what the pipeline needs of it.
struct ExtendUnit {
    int64_t task = -1;                     // -1: past the thread's last item
    int64_t r, kh, lane0, lanes, lo, hi;   // the item: request, kv head, lanes, keys [lo, hi)
    int64_t start;                         // first key of its first chunk (lo rounded down to a block)
    int64_t c0, nk, nblk;                  // this chunk: keys [c0, c0 + nk) in nblk blocks
    int slot, sb;                          // its KvPack and S^T buffer
    alignas(64) float pos[16];             // the lanes' query positions (idle lanes: the last one's)
};

struct ExtendScratch {
    KvPack pack[2];
    alignas(64) uint32_t qt[kMaxHeadDim / 2 * 16];     // the last prepared item's Q^T, [d / 2 pair rows][16 lanes]
    alignas(64) float s[2][kKeyChunk * 16];             // S^T of two chunks, [keys][16 lanes]
    alignas(64) uint32_t pt[kKeyChunk / 2 * 16];        // a chunk's P^T in pairs of keys, a B tile per block
    alignas(64) float pv[kMaxHeadDim * 16];             // its V^T P^T, [dv][16]
    alignas(64) float acc[kMaxHeadDim * 16];            // the item's O^T, [dv][16]
};

// The unit after u (its next chunk, or the next item's first) with its keys packed and, for a
// new item, its Q^T transposed; task == -1 past task_end.
inline void next_unit(const ExtendAttnArgs& a, ExtendScratch& sc, const ExtendUnit& u, int64_t task_end,
                      ExtendUnit& n) {
    const int64_t G = a.hq / a.hk, d = a.d;
    if (u.task >= 0 && u.c0 + kKeyChunk < u.hi) {  // the same item's next chunk
        n = u;
        n.c0 = u.c0 + kKeyChunk;
        n.sb = 1 - u.sb;
    } else {
        const int64_t task = u.task + 1;
        if (task >= task_end) {
            n.task = -1;
            return;
        }
        const int64_t* tk = a.tasks + 3 * task;
        const int64_t r = tk[0], kh = tk[1], lane0 = tk[2];
        const int64_t nn = a.extend_lens[r], prefix = a.prefix_lens[r];
        const int64_t lanes = imin_(VL, nn * G - lane0), t_lo = lane0 / G, t_hi = (lane0 + lanes - 1) / G;
        const int64_t lo = a.window > 0 ? imax_(0, prefix + t_lo + 1 - a.window) : 0;
        const int slot = u.task >= 0 && u.r == r && u.kh == kh ? u.slot : 1 - u.slot;
        const int sb = 1 - u.sb;
        n.task = task, n.r = r, n.kh = kh, n.lane0 = lane0, n.lanes = lanes, n.lo = lo, n.hi = prefix + t_hi + 1;
        n.start = n.c0 = lo / kKeyBlock * kKeyBlock;
        n.slot = slot, n.sb = sb;
        KvPack& pk = sc.pack[slot];
        if (pk.r != r || pk.kh != kh || n.start < pk.base) pk.r = r, pk.kh = kh, pk.base = pk.end = n.start;
        const bf16_t* qrow[16];
        for (int64_t l = 0; l < VL; ++l) {  // idle lanes: zero queries, the last lane's position
            const int64_t lane = lane0 + (l < lanes ? l : lanes - 1), t = lane / G, g = lane % G;
            n.pos[l] = static_cast<float>(prefix + t);
            qrow[l] = l < lanes ? static_cast<const bf16_t*>(a.q) + (a.starts[r] + t) * a.ldq + (kh * G + g) * d : nullptr;
        }
        for (int64_t i0 = 0; i0 < d; i0 += 32) {  // Q^T in pairs of dims: the lanes' dwords, transposed
            __m512i w[16];
            for (int l = 0; l < 16; ++l) w[l] = qrow[l] ? _mm512_loadu_si512(qrow[l] + i0) : __m512i{};
            transpose16(w);
            for (int i = 0; i < 16; ++i) _mm512_store_si512(sc.qt + (i0 / 2 + i) * 16, w[i]);
        }
    }
    n.nk = imin_(kKeyChunk, n.hi - n.c0);
    n.nblk = (n.nk + kKeyBlock - 1) / kKeyBlock;
    pack_through(a, sc.pack[n.slot], a.rows[n.r], a.prefix_lens[n.r] + a.extend_lens[n.r], n.c0 + n.nblk * kKeyBlock);
}

// S^T of unit u into its S^T buffer, block by block, two tile pairs in turn so that a block's
// products overlap the previous block's stores.
inline void issue_scores(const ExtendAttnArgs& a, ExtendScratch& sc, const ExtendUnit& u) {
    const int64_t d = a.d;
    const bool resident = d <= 64;
    const uint32_t* qt = sc.qt;  // u's item is the last one prepared (issue_scores follows next_unit)
    if (resident) {
        _tile_loadd(6, qt, 64);
        if (d > 32) _tile_loadd(7, qt + 16 * 16, 64);
    }
    const KvPack& pk = sc.pack[u.slot];
    const bf16_t* kc = pk.k.data() + (u.c0 - pk.base) * d;
    float* s = sc.s[u.sb];
    for (int64_t b = 0; b < u.nblk; ++b) {
        if (b % 2 == 0) score_block_01(kc + b * kKeyBlock * d, d, qt, resident);
        else score_block_23(kc + b * kKeyBlock * d, d, qt, resident);
        if (b > 0) {
            float* dst = s + (b - 1) * kKeyBlock * 16;
            if (b % 2 == 0) { _tile_stored(2, dst, 64); _tile_stored(3, dst + 256, 64); }
            else { _tile_stored(0, dst, 64); _tile_stored(1, dst + 256, 64); }
        }
    }
    float* last = s + (u.nblk - 1) * kKeyBlock * 16;
    if (u.nblk % 2 == 1) { _tile_stored(0, last, 64); _tile_stored(1, last + 256, 64); }
    else { _tile_stored(2, last, 64); _tile_stored(3, last + 256, 64); }
}

// 2^t for t <= 0 (softmax weights): a degree-5 polynomial of the fraction and vscalefps for the
// exponent (rel. error < 3e-6; t < -150 gives 0).
inline vf vexp2_neg(vf t) {
    const __m512 x = _mm512_max_ps(reinterpret_cast<const __m512&>(t), _mm512_set1_ps(-160.0f));
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const vf f = reinterpret_cast<const vf&>(x) - reinterpret_cast<const vf&>(n);
    vf p = splat(1.3333558e-3f);
    p = p * f + 9.6181291e-3f;
    p = p * f + 5.5504109e-2f;
    p = p * f + 2.4022651e-1f;
    p = p * f + 6.9314718e-1f;
    p = p * f + 1.0f;
    const __m512 r = _mm512_scalef_ps(reinterpret_cast<const __m512&>(p), n);
    return reinterpret_cast<const vf&>(r);
}

// The online softmax of unit u's chunk, as extend_t's (masked keys weigh 0, lanes with no visible
// key yet keep max -inf): (mx, sum) updated, P^T into sc.pt; returns the factor for the item's
// earlier sums. Keys visible to every lane (most of them) take a short path: scaled in registers,
// their weights 2^(s * scale * log2(e) - max * log2(e)) one FMA and vexp2_neg away; the others
// (and every key under a logit cap) are transformed, masked and stored first.
inline vf chunk_softmax(const ExtendAttnArgs& a, ExtendScratch& sc, const ExtendUnit& u, vf& mx, vf& sum) {
    float* s = sc.s[u.sb];
    const vf pos = vld<float>(u.pos);
    const float max_pos = u.pos[VL - 1];
    // Keys [fast0, fast1) of the chunk are visible to every lane: at or after the item's first key
    // (lo) and after the last lane's window start, at or before the first lane's position.
    int64_t fast0 = u.lo - u.c0, fast1 = static_cast<int64_t>(u.pos[0]) + 1 - u.c0;
    if (a.window > 0) fast0 = imax_(fast0, static_cast<int64_t>(max_pos) - a.window + 1 - u.c0);
    if (a.logit_cap > 0) fast0 = fast1 = 0;
    fast0 = imin_(imax_(fast0, 0), u.nk);
    fast1 = imax_(imin_(fast1, u.nk), fast0);
    auto masked = [&](int64_t j) {  // key j scaled, capped and masked, stored for the exp pass
        vf x = vld<float>(s + j * 16) * a.scale;
        if (a.logit_cap > 0)
            for (int l = 0; l < VL; ++l) x[l] = a.logit_cap * __builtin_tanhf(x[l] / a.logit_cap);
        const float kp = static_cast<float>(u.c0 + j);
        vi hidden = kp > pos;
        if (a.window > 0) hidden |= kp <= pos - static_cast<float>(a.window);
        x = hidden ? splat(-__builtin_inff()) : x;
        vst<float>(s + j * 16, x);
        return x;
    };
    vf bm = mx;
    for (int64_t j = 0; j < fast0; ++j) {
        const vf x = masked(j);
        bm = x > bm ? x : bm;
    }
    if (fast1 > fast0) {  // raw scores, two chains of max (one dependent max per key is latency-bound)
        vf m0 = splat(-__builtin_inff()), m1 = m0;
        int64_t j = fast0;
        for (; j + 1 < fast1; j += 2) {
            const vf x0 = vld<float>(s + j * 16), x1 = vld<float>(s + (j + 1) * 16);
            m0 = x0 > m0 ? x0 : m0;
            m1 = x1 > m1 ? x1 : m1;
        }
        if (j < fast1) {
            const vf x = vld<float>(s + j * 16);
            m1 = x > m1 ? x : m1;
        }
        const vf fm = (m1 > m0 ? m1 : m0) * a.scale;  // scale > 0: the scaled maximum, exactly
        bm = fm > bm ? fm : bm;
    }
    for (int64_t j = fast1; j < u.nk; ++j) {
        const vf x = masked(j);
        bm = x > bm ? x : bm;
    }
    const vi none = bm == -__builtin_inff();
    const vf base = none ? vf{} : bm;
    const vf alpha = mx == -__builtin_inff() ? vf{} : vexp(mx - base);
    constexpr float kLog2e = 1.44269504088896341f;
    const float fast_mul = a.scale * kLog2e;
    const vf base2 = base * kLog2e;
    auto weight = [&](int64_t k) -> vf {
        const vf x = vld<float>(s + k * 16);
        if (k >= fast0 && k < fast1) return vexp2_neg(x * fast_mul - base2);
        return x == -__builtin_inff() ? vf{} : vexp2_neg(x * kLog2e - base2);
    };
    const __m512i pair_index = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                                23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    vf ps0{}, ps1{};
    for (int64_t k = 0; k < u.nblk * kKeyBlock; k += 2) {  // P^T pair row k / 2: (P[k][l], P[k + 1][l])
        const vf p0 = k < u.nk ? weight(k) : vf{};
        const vf p1 = k + 1 < u.nk ? weight(k + 1) : vf{};
        ps0 += p0;
        ps1 += p1;
        // 32 bf16 (p0 then p1), interleaved: element 2l = p0[l], 2l + 1 = p1[l]
        const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(reinterpret_cast<const __m512&>(p1),
                                                          reinterpret_cast<const __m512&>(p0));
        _mm512_store_si512(sc.pt + k / 2 * 16, _mm512_permutexvar_epi16(pair_index, both));
    }
    sum = sum * alpha + (ps0 + ps1);
    mx = bm;
    return alpha;
}

// Per thread, its units (chunks of work items) one after another, each unit's S^T issued one unit
// ahead: the next unit's keys are packed and its S^T tiles issued before the vectors start the
// current unit's softmax, and the unit after next is prepared (keys packed, Q transposed) right
// after the current unit's V^T P^T tiles are issued. The tiles then run beside the vector work as
// far as the out-of-order window reaches (issuing the S^T tiles a block at a time inside the
// softmax loop gained nothing more). Two KvPacks (the unit after next may start another
// (request, kv head) while the next still needs its own) and two S^T buffers.
void amx_extend(const ExtendAttnArgs& a, int64_t task0, int64_t task1) {
    const int64_t G = a.hq / a.hk, dv = a.dv;
    // ~180 KB + the packs, per thread; freed when the thread ends (a scheduler on shared cores ends
    // its OpenMP workers after every forward: compute_turns.py)
    static thread_local std::unique_ptr<ExtendScratch> scratch;
    if (!scratch) scratch.reset(new ExtendScratch);
    ExtendScratch& sc = *scratch;
    for (KvPack& pk : sc.pack) pk.r = -1;
    amx_configure(16);
    ExtendUnit units[3];  // the current one, the next, the one after (rotating)
    units[2].task = task0 - 1, units[2].r = -1, units[2].c0 = units[2].hi = 0;  // "before task0"
    units[2].slot = units[2].sb = 1;
    next_unit(a, sc, units[2], task1, units[0]);
    if (units[0].task >= 0) issue_scores(a, sc, units[0]);
    if (units[0].task >= 0) next_unit(a, sc, units[0], task1, units[1]);
    if (units[0].task >= 0 && units[1].task >= 0) issue_scores(a, sc, units[1]);
    vf mx{}, sum{};
    for (int cur = 0; units[cur].task >= 0; cur = (cur + 1) % 3) {
        const ExtendUnit& u = units[cur];
        const ExtendUnit& nx = units[(cur + 1) % 3];
        ExtendUnit& after = units[(cur + 2) % 3];
        if (u.c0 == u.start) {
            mx = splat(-__builtin_inff()), sum = vf{};
            for (int64_t i = 0; i < dv * VL; ++i) sc.acc[i] = 0.0f;
        }
        const vf alpha = chunk_softmax(a, sc, u, mx, sum);
        const KvPack& pk = sc.pack[u.slot];
        const bf16_t* vt = pk.vt.data() + (u.c0 - pk.base) * dv;
        for (int64_t w0 = 0; w0 < dv / 16; w0 += 4)
            value_chunk(vt, dv, sc.pt, u.nblk, w0, imin_(4, dv / 16 - w0), sc.pv + w0 * 256);
        if (nx.task >= 0) {
            next_unit(a, sc, nx, task1, after);
            if (after.task >= 0) issue_scores(a, sc, after);
        } else {
            after.task = -1;
        }
        for (int64_t c = 0; c < dv; ++c)
            vst<float>(sc.acc + c * 16, vld<float>(sc.acc + c * 16) * alpha + vld<float>(sc.pv + c * 16));
        if (u.c0 + kKeyChunk < u.hi) continue;  // the item's last chunk: O = (O^T)^T / sum
        const vf inv = sum > 0.0f ? 1.0f / sum : vf{};
        for (int64_t c0 = 0; c0 < dv; c0 += 16) {
            __m512i w[16];
            for (int c = 0; c < 16; ++c) {
                const vf o = vld<float>(sc.acc + (c0 + c) * 16) * inv;
                w[c] = reinterpret_cast<const __m512i&>(o);
            }
            transpose16(w);
            for (int64_t l = 0; l < u.lanes; ++l) {
                const int64_t lane = u.lane0 + l, t = lane / G, g = lane % G;
                vst<bf16_t>(static_cast<bf16_t*>(a.out) + ((a.starts[u.r] + t) * a.hq + u.kh * G + g) * dv + c0,
                            reinterpret_cast<const vf&>(w[l]));
            }
        }
    }
    _tile_release();
    for (KvPack& pk : sc.pack)  // a long prompt's packs are not kept for the next call
        if (pk.k.capacity() + pk.vt.capacity() > (size_t{8} << 20)) pk.k = {}, pk.vt = {};
}
