// GGUF (llama.cpp) quantized weights multiplied in their blocks: included once per ISA by
// isa_*.cpp after kernels_impl.h and panels_impl.h, whose vectors and panel GEMM it uses.
//
// A weight is [N, row_bytes] bytes, each row K values in blocks of the row's type (ggml's
// layouts: Q4_0 = fp16 d + 16 bytes of nibbles, ..., Q6_K = 256 values in 210 bytes; the
// formulas below are llama.cpp's dequantize_row_* ones, value for value).
//
// Two paths (linear_ops.cpp `run_gguf_linear` picks by rows):
// - gguf_linear_rows (decode, few rows): each thread dequantizes one weight row at a time into an
//   fp32 row buffer that stays in L1, then multiplies it with up to 4 activation rows per pass
//   (vector FMAs, fp32 accumulation). The weight is read from memory once per call in its
//   quantized size, which is what sets a decode step's time.
// - gguf_linear_panels (prefill, many rows): each thread dequantizes 32 weight rows into an fp32
//   panel ([K][32], pack_linear_weight's F32_PANELS layout) and runs the panel GEMM of this ISA
//   (panels_impl.h) on it for all rows: the dequantization is paid once per 32 outputs per call
//   and the GEMM runs at the fp32 panel kernel's speed.

namespace {

inline float gg_h2f(uint16_t h) {  // IEEE half -> float (no F16C on the generic set)
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        float f = static_cast<float>(mant) * (1.0f / 16777216.0f);  // subnormal: mant * 2^-24
        __builtin_memcpy(&u, &f, 4);
        u |= sign;
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (mant << 13);
    } else {
        u = sign | ((exp + 112u) << 23) | (mant << 13);
    }
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
}

inline uint16_t gg_u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

// ---- one block of each type -> out[0 .. values) --------------------------------------------------
inline void dq_q4_0(const uint8_t* b, float* y) {
    const float d = gg_h2f(gg_u16(b));
    const uint8_t* qs = b + 2;
    // low nibbles then high nibbles: two loops of contiguous stores vectorize, one interleaved does not
    for (int j = 0; j < 16; ++j) y[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
    for (int j = 0; j < 16; ++j) y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
}

inline void dq_q4_1(const uint8_t* b, float* y) {
    const float d = gg_h2f(gg_u16(b)), m = gg_h2f(gg_u16(b + 2));
    const uint8_t* qs = b + 4;
    for (int j = 0; j < 16; ++j) y[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
    for (int j = 0; j < 16; ++j) y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
}

inline void dq_q5(const uint8_t* b, float* y, bool with_min) {
    const float d = gg_h2f(gg_u16(b)), m = with_min ? gg_h2f(gg_u16(b + 2)) : 0.0f;
    const uint8_t* p = b + (with_min ? 4 : 2);
    uint32_t qh;
    __builtin_memcpy(&qh, p, 4);
    const uint8_t* qs = p + 4;
    const int off = with_min ? 0 : 16;
    for (int j = 0; j < 16; ++j) {
        const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
        y[j] = static_cast<float>(((qs[j] & 0x0F) | h0) - off) * d + m;
        y[j + 16] = static_cast<float>(((qs[j] >> 4) | h1) - off) * d + m;
    }
}

inline void dq_q8_0(const uint8_t* b, float* y) {
    const float d = gg_h2f(gg_u16(b));
    const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(qs[j]) * d;
}

inline void dq_q2_k(const uint8_t* b, float* y) {
    const uint8_t* scales = b;
    const uint8_t* q = b + 16;
    const float d = gg_h2f(gg_u16(b + 80)), dmin = gg_h2f(gg_u16(b + 82));
    int is = 0;
    for (int n = 0; n < 256; n += 128) {
        int shift = 0;
        for (int j = 0; j < 4; ++j) {
            uint8_t sc = scales[is++];
            float dl = d * (sc & 0xF), ml = dmin * (sc >> 4);
            for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((q[l] >> shift) & 3) - ml;
            sc = scales[is++];
            dl = d * (sc & 0xF), ml = dmin * (sc >> 4);
            for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((q[l + 16] >> shift) & 3) - ml;
            shift += 2;
        }
        q += 32;
    }
}

inline void dq_q3_k(const uint8_t* b, float* y) {
    const uint8_t* hm = b;
    const uint8_t* q = b + 32;
    const float d_all = gg_h2f(gg_u16(b + 108));
    uint32_t aux[4];
    __builtin_memcpy(aux, b + 96, 12);
    const uint32_t kmask1 = 0x03030303u, kmask2 = 0x0f0f0f0fu, tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
    aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
    aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
    aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
    int8_t scales[16];
    __builtin_memcpy(scales, aux, 16);
    int is = 0;
    uint8_t m = 1;
    for (int n = 0; n < 256; n += 128) {
        int shift = 0;
        for (int j = 0; j < 4; ++j) {
            float dl = d_all * static_cast<float>(scales[is++] - 32);
            for (int l = 0; l < 16; ++l)
                *y++ = dl * static_cast<float>(static_cast<int>((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
            dl = d_all * static_cast<float>(scales[is++] - 32);
            for (int l = 0; l < 16; ++l)
                *y++ = dl * static_cast<float>(static_cast<int>((q[l + 16] >> shift) & 3) - ((hm[l + 16] & m) ? 0 : 4));
            shift += 2;
            m <<= 1;
        }
        q += 32;
    }
}

inline void k4_scale_min(int j, const uint8_t* q, uint8_t& d, uint8_t& m) {
    if (j < 4) {
        d = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

inline void dq_q4_k(const uint8_t* b, float* y) {
    const float d = gg_h2f(gg_u16(b)), dmin = gg_h2f(gg_u16(b + 2));
    const uint8_t* scales = b + 4;
    const uint8_t* q = b + 16;
    for (int j = 0, is = 0; j < 256; j += 64, is += 2) {
        uint8_t sc, mn;
        k4_scale_min(is, scales, sc, mn);
        const float d1 = d * sc, m1 = dmin * mn;
        k4_scale_min(is + 1, scales, sc, mn);
        const float d2 = d * sc, m2 = dmin * mn;
        for (int l = 0; l < 32; ++l) y[l] = d1 * static_cast<float>(q[l] & 0xF) - m1;
        for (int l = 0; l < 32; ++l) y[l + 32] = d2 * static_cast<float>(q[l] >> 4) - m2;
        y += 64;
        q += 32;
    }
}

inline void dq_q5_k(const uint8_t* b, float* y) {
    const float d = gg_h2f(gg_u16(b)), dmin = gg_h2f(gg_u16(b + 2));
    const uint8_t* scales = b + 4;
    const uint8_t* qh = b + 16;
    const uint8_t* ql = b + 48;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0, is = 0; j < 256; j += 64, is += 2) {
        uint8_t sc, mn;
        k4_scale_min(is, scales, sc, mn);
        const float d1 = d * sc, m1 = dmin * mn;
        k4_scale_min(is + 1, scales, sc, mn);
        const float d2 = d * sc, m2 = dmin * mn;
        for (int l = 0; l < 32; ++l) y[l] = d1 * static_cast<float>((ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0)) - m1;
        for (int l = 0; l < 32; ++l) y[l + 32] = d2 * static_cast<float>((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
        y += 64;
        ql += 32;
        u1 <<= 2;
        u2 <<= 2;
    }
}

inline void dq_q6_k(const uint8_t* b, float* y) {
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = gg_h2f(gg_u16(b + 208));
    for (int n = 0; n < 256; n += 128) {
        for (int l = 0; l < 32; ++l) {
            const int is = l / 16;
            const int q1 = static_cast<int>((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int q2 = static_cast<int>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int q3 = static_cast<int>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int q4 = static_cast<int>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * sc[is] * q1;
            y[l + 32] = d * sc[is + 2] * q2;
            y[l + 64] = d * sc[is + 4] * q3;
            y[l + 96] = d * sc[is + 6] * q4;
        }
        y += 128;
        ql += 64;
        qh += 32;
        sc += 8;
    }
}

// One row of K values of type `t` (K a multiple of the block size) -> y[0 .. K).
inline void gguf_row(GgufType t, const uint8_t* row, float* y, int64_t K) {
    switch (t) {
        case GgufType::F32: __builtin_memcpy(y, row, K * 4); return;
        case GgufType::F16:
            for (int64_t k = 0; k < K; ++k) y[k] = gg_h2f(gg_u16(row + 2 * k));
            return;
        case GgufType::BF16:
            for (int64_t k = 0; k < K; ++k) y[k] = bf2f(gg_u16(row + 2 * k));
            return;
        default: break;
    }
    const int64_t bv = gguf_block_values(t), bb = gguf_block_bytes(t);
    for (int64_t i = 0; i < K / bv; ++i, row += bb, y += bv) {
        switch (t) {
            case GgufType::Q4_0: dq_q4_0(row, y); break;
            case GgufType::Q4_1: dq_q4_1(row, y); break;
            case GgufType::Q5_0: dq_q5(row, y, false); break;
            case GgufType::Q5_1: dq_q5(row, y, true); break;
            case GgufType::Q8_0: dq_q8_0(row, y); break;
            case GgufType::Q2_K: dq_q2_k(row, y); break;
            case GgufType::Q3_K: dq_q3_k(row, y); break;
            case GgufType::Q4_K: dq_q4_k(row, y); break;
            case GgufType::Q5_K: dq_q5_k(row, y); break;
            case GgufType::Q6_K: dq_q6_k(row, y); break;
            default: break;  // checked by the caller (linear_ops.cpp gguf_type_of)
        }
    }
}

inline float gg_hsum(vf v) {
    float s = 0.0f;
    for (int i = 0; i < VL; ++i) s += v[i];
    return s;
}

inline void gg_store(const GgufLinearArgs& a, int64_t m, int64_t n, float v) {
    if (a.bias) v += a.bias[n];
    if (a.ytype == DType::F32) static_cast<float*>(a.y)[m * a.ldy + n] = a.round_to_bf16 ? rnd<bf16_t>(v) : v;
    else static_cast<bf16_t*>(a.y)[m * a.ldy + n] = f2bf(v);
}

// R activation rows [m0, m0 + R) times the dequantized row w (K values).
template <int R>
inline void gg_dot_rows(const GgufLinearArgs& a, const float* w, int64_t m0, int64_t n) {
    vf acc[R] = {};
    int64_t k = 0;
    for (; k + VL <= a.K; k += VL) {
        const vf wv = vld<float>(w + k);
        for (int r = 0; r < R; ++r) acc[r] += vld<float>(a.x + (m0 + r) * a.ldx + k) * wv;
    }
    for (int r = 0; r < R; ++r) {
        float s = gg_hsum(acc[r]);
        for (int64_t kk = k; kk < a.K; ++kk) s += a.x[(m0 + r) * a.ldx + kk] * w[kk];
        gg_store(a, m0 + r, n, s);
    }
}

}  // namespace

void gguf_dequantize(GgufType t, const uint8_t* q, int64_t ldq, int64_t K, float* out, int64_t row_begin,
                     int64_t row_end) {
    for (int64_t r = row_begin; r < row_end; ++r) gguf_row(t, q + r * ldq, out + r * K, K);
}

void gguf_linear_rows(const GgufLinearArgs& a, float* wbuf, int64_t n_begin, int64_t n_end) {
    for (int64_t n = n_begin; n < n_end; ++n) {
        gguf_row(a.qtype, a.q + n * a.ldq, wbuf, a.K);
        int64_t m = 0;
        for (; m + 4 <= a.M; m += 4) gg_dot_rows<4>(a, wbuf, m, n);
        switch (a.M - m) {
            case 3: gg_dot_rows<3>(a, wbuf, m, n); break;
            case 2: gg_dot_rows<2>(a, wbuf, m, n); break;
            case 1: gg_dot_rows<1>(a, wbuf, m, n); break;
            default: break;
        }
    }
}

// panel_buf: [K][32] fp32 scratch of this thread, row_buf: K floats.
void gguf_linear_panels(const GgufLinearArgs& a, float* panel_buf, float* row_buf, int64_t p_begin, int64_t p_end) {
    for (int64_t p = p_begin; p < p_end; ++p) {
        for (int64_t c = 0; c < kPanel; ++c) {
            gguf_row(a.qtype, a.q + (p * kPanel + c) * a.ldq, row_buf, a.K);
            for (int64_t k = 0; k < a.K; ++k) panel_buf[k * kPanel + c] = row_buf[k];
        }
        const int64_t el = a.ytype == DType::F32 ? 4 : 2;
        LinearArgs la{a.x, nullptr, a.M, a.K, a.ldx, panel_buf, a.K * kPanel, WType::F32_PANELS, nullptr,
                      a.bias ? a.bias + p * kPanel : nullptr, static_cast<char*>(a.y) + p * kPanel * el, a.ldy,
                      a.ytype};
        la.round_to_bf16 = a.round_to_bf16;
        linear_panels(la, 0, 1);
    }
}
