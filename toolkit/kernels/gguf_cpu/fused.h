// Fused GEMV for AVX2 + FMA: each 32-element sub-block is decoded to 32 int8 values in a
// register, converted to float32 and multiplied with the activations, without writing the
// dequantized weights anywhere.
//
// Every handled type reduces to: 32 small integers q, a scale for the first 16 (s0) and the
// last 16 (s1), and an additive offset `bias` per element. Then
//     y . x = s0 * (q[0:16] . x[0:16]) + s1 * (q[16:32] . x[16:32]) + bias * sum(x[0:32])
// and sum(x) per sub-block is computed once per call. Results equal the dequantize-then-matmul
// reference up to float32 rounding order (the scale multiplies a partial sum instead of each
// weight). Layouts as in blocks.h.
#pragma once

#if defined(__AVX2__) && defined(__FMA__)

#include "blocks.h"

namespace gguf_cpu {

struct Sub {
    __m256i q;
    float s0, s1, bias;
};

template <int QT> struct Decoder;

template <> struct Decoder<Q8_0> {
    static constexpr int bytes = 34, subs = 1;
    static constexpr bool bias = false;
    static inline Sub get(const uint8_t* b, int) {
        const float d = fp16_at(b);
        return {_mm256_loadu_si256((const __m256i*)(b + 2)), d, d, 0.f};
    }
};

template <> struct Decoder<Q4_0> {
    static constexpr int bytes = 18, subs = 1;
    static constexpr bool bias = false;
    static inline Sub get(const uint8_t* b, int) {
        const float d = fp16_at(b);
        return {_mm256_sub_epi8(nibbles32(b + 2), _mm256_set1_epi8(8)), d, d, 0.f};
    }
};

template <> struct Decoder<Q4_1> {
    static constexpr int bytes = 20, subs = 1;
    static constexpr bool bias = true;
    static inline Sub get(const uint8_t* b, int) {
        const float d = fp16_at(b);
        return {nibbles32(b + 4), d, d, fp16_at(b + 2)};
    }
};

template <> struct Decoder<Q5_0> {
    static constexpr int bytes = 22, subs = 1;
    static constexpr bool bias = false;
    static inline Sub get(const uint8_t* b, int) {
        const float d = fp16_at(b);
        const __m256i q = _mm256_or_si256(nibbles32(b + 6), fifth_bits(u32_at(b + 2)));
        return {_mm256_sub_epi8(q, _mm256_set1_epi8(16)), d, d, 0.f};
    }
};

template <> struct Decoder<Q5_1> {
    static constexpr int bytes = 24, subs = 1;
    static constexpr bool bias = true;
    static inline Sub get(const uint8_t* b, int) {
        const float d = fp16_at(b);
        return {_mm256_or_si256(nibbles32(b + 8), fifth_bits(u32_at(b + 4))), d, d, fp16_at(b + 2)};
    }
};

// Q4_K / Q5_K sub-block k (0..7): nibble bytes 32 * (k / 2), low nibbles for even k, high for
// odd; Q5_K's fifth bit is bit k of qh byte l; value (d * scale_k) * q - dmin * min_k.
template <bool FIVE> struct DecoderK45 {
    static constexpr int bytes = FIVE ? 176 : 144, subs = 8;
    static constexpr bool bias = true;
    static inline Sub get(const uint8_t* b, int k) {
        int scale, min;
        k_scale_min(b + 4, k, &scale, &min);
        const __m256i raw = _mm256_loadu_si256((const __m256i*)(b + (FIVE ? 48 : 16) + 32 * (k / 2)));
        __m256i q = _mm256_and_si256(k & 1 ? _mm256_srli_epi16(raw, 4) : raw, _mm256_set1_epi8(0x0F));
        if (FIVE) {
            const __m256i h = _mm256_loadu_si256((const __m256i*)(b + 16));
            const __m256i bit = _mm256_and_si256(_mm256_srli_epi16(h, k), _mm256_set1_epi8(1));
            q = _mm256_or_si256(q, _mm256_slli_epi16(bit, 4));
        }
        const float d = fp16_at(b) * (float)scale;
        return {q, d, d, -(fp16_at(b + 2) * (float)min)};
    }
};
template <> struct Decoder<Q4_K> : DecoderK45<false> {};
template <> struct Decoder<Q5_K> : DecoderK45<true> {};

// Q6_K sub-block k (0..7): half h = k / 4 (ql + 64h, qh + 32h, scales + 8h), j = k % 4:
// low nibbles of ql[0:32] / ql[32:64] for j = 0 / 1, high nibbles for j = 2 / 3, two high bits
// at qh >> 2j; q - 32; scales 2j and 2j+1 of the half for the two 16-element halves.
template <> struct Decoder<Q6_K> {
    static constexpr int bytes = 210, subs = 8;
    static constexpr bool bias = false;
    static inline Sub get(const uint8_t* b, int k) {
        const int h = k / 4, j = k % 4;
        const __m256i raw = _mm256_loadu_si256((const __m256i*)(b + 64 * h + 32 * (j & 1)));
        const __m256i low = _mm256_and_si256(j >= 2 ? _mm256_srli_epi16(raw, 4) : raw, _mm256_set1_epi8(0x0F));
        const __m256i qh = _mm256_loadu_si256((const __m256i*)(b + 128 + 32 * h));
        const __m256i high = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j), _mm256_set1_epi8(3)), 4);
        const int8_t* sc = (const int8_t*)(b + 192 + 8 * h);
        const float d = fp16_at(b + 208);
        return {_mm256_sub_epi8(_mm256_or_si256(low, high), _mm256_set1_epi8(32)), d * (float)sc[2 * j],
                d * (float)sc[2 * j + 1], 0.f};
    }
};

static inline float hsum8(__m256 s) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

// Rows [begin, end) of out[m, rows] = x[m, cols] . W[row]; xsum[m, cols / 32] holds the sum of
// each 32-element slice of x (read only by types with an additive offset).
template <int QT, int M>
static void fused_rows(const uint8_t* w, int64_t row_bytes, const float* x, const float* xsum, float* out,
                       int64_t rows, int64_t cols, int64_t begin, int64_t end) {
    using D = Decoder<QT>;
    const int64_t nb = cols / (32 * D::subs), nsub = cols / 32;
    for (int64_t r = begin; r < end; ++r) {
        const uint8_t* b = w + r * row_bytes;
        __m256 acc[M];
        float offset[M];
        for (int m = 0; m < M; ++m) acc[m] = _mm256_setzero_ps(), offset[m] = 0.f;
        for (int64_t i = 0; i < nb; ++i, b += D::bytes) {
            for (int k = 0; k < D::subs; ++k) {
                const Sub s = D::get(b, k);
                const __m128i lo = _mm256_castsi256_si128(s.q), hi = _mm256_extracti128_si256(s.q, 1);
                const __m256 f0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
                const __m256 f1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
                const __m256 f2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
                const __m256 f3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
                const __m256 s0 = _mm256_set1_ps(s.s0), s1 = _mm256_set1_ps(s.s1);
                const int64_t sub = i * D::subs + k;
                for (int m = 0; m < M; ++m) {
                    const float* xb = x + m * cols + 32 * sub;
                    const __m256 t0 = _mm256_fmadd_ps(f1, _mm256_loadu_ps(xb + 8), _mm256_mul_ps(f0, _mm256_loadu_ps(xb)));
                    const __m256 t1 = _mm256_fmadd_ps(f3, _mm256_loadu_ps(xb + 24), _mm256_mul_ps(f2, _mm256_loadu_ps(xb + 16)));
                    acc[m] = _mm256_fmadd_ps(s1, t1, _mm256_fmadd_ps(s0, t0, acc[m]));
                    if (D::bias) offset[m] += s.bias * xsum[m * nsub + sub];
                }
            }
        }
        for (int m = 0; m < M; ++m) out[m * rows + r] = hsum8(acc[m]) + offset[m];
    }
}

// The same rows with 8-bit activations (as llama.cpp does): x is quantized per 32-element slice
// to xq = round(x / dx), dx = max|x| / 127 (quantize_activations below), and each sub-block's
// products are integer: maddubs(|q|, sign(xq, q)) gives q * xq summed in pairs (at most
// 2 * 128 * 127, inside int16), madd with ones sums them to 8 int32 lanes: lanes 0-3 cover
// elements 0-15 (scale s0), lanes 4-7 elements 16-31 (s1). The result is exactly
// sum W[j] * (dx * xq[j]) up to float32 rounding: the weights are unchanged, the activations
// move by at most dx / 2 each. The offset term uses the same quantized x (xsum = dx * sum xq).
template <int QT, int M>
static void int8_rows(const uint8_t* w, int64_t row_bytes, const int8_t* xq, const float* xd, const float* xsum,
                      float* out, int64_t rows, int64_t cols, int64_t begin, int64_t end) {
    using D = Decoder<QT>;
    const int64_t nb = cols / (32 * D::subs), nsub = cols / 32;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t r = begin; r < end; ++r) {
        const uint8_t* b = w + r * row_bytes;
        __m256 acc[M];
        float offset[M];
        for (int m = 0; m < M; ++m) acc[m] = _mm256_setzero_ps(), offset[m] = 0.f;
        for (int64_t i = 0; i < nb; ++i, b += D::bytes) {
            for (int k = 0; k < D::subs; ++k) {
                const Sub s = D::get(b, k);
                const __m256i magnitude = _mm256_sign_epi8(s.q, s.q);
                const __m256 scale = _mm256_set_m128(_mm_set1_ps(s.s1), _mm_set1_ps(s.s0));
                const int64_t sub = i * D::subs + k;
                for (int m = 0; m < M; ++m) {
                    const __m256i xv = _mm256_loadu_si256((const __m256i*)(xq + m * cols + 32 * sub));
                    const __m256i pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(xv, s.q));
                    const __m256 dots = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
                    acc[m] = _mm256_fmadd_ps(_mm256_mul_ps(scale, _mm256_set1_ps(xd[m * nsub + sub])), dots, acc[m]);
                    if (D::bias) offset[m] += s.bias * xsum[m * nsub + sub];
                }
            }
        }
        for (int m = 0; m < M; ++m) out[m * rows + r] = hsum8(acc[m]) + offset[m];
    }
}

using Int8RowsFn = void (*)(const uint8_t*, int64_t, const int8_t*, const float*, const float*, float*, int64_t,
                            int64_t, int64_t, int64_t);
using RowsFn = void (*)(const uint8_t*, int64_t, const float*, const float*, float*, int64_t, int64_t, int64_t,
                        int64_t);

// The two GEMV families (float32 activations, 8-bit activations): Family::at<QT, M>() names the
// row-range worker of type QT for M tokens.
struct FloatRows {
    using Fn = RowsFn;
    template <int QT, int M> static Fn at() { return &fused_rows<QT, M>; }
};
struct Int8Rows {
    using Fn = Int8RowsFn;
    template <int QT, int M> static Fn at() { return &int8_rows<QT, M>; }
};

template <class Family, int QT>
static typename Family::Fn pick_m(int64_t m) {
    switch (m) {
        case 1: return Family::template at<QT, 1>();
        case 2: return Family::template at<QT, 2>();
        case 3: return Family::template at<QT, 3>();
        case 4: return Family::template at<QT, 4>();
        default: return nullptr;
    }
}

// Row-range worker of a family for (type, M), or nullptr for a type without a decoder / M outside 1..4.
template <class Family>
static typename Family::Fn rows_for(int qtype, int64_t m) {
    switch (qtype) {
        case Q4_0: return pick_m<Family, Q4_0>(m);
        case Q4_1: return pick_m<Family, Q4_1>(m);
        case Q5_0: return pick_m<Family, Q5_0>(m);
        case Q5_1: return pick_m<Family, Q5_1>(m);
        case Q8_0: return pick_m<Family, Q8_0>(m);
        case Q4_K: return pick_m<Family, Q4_K>(m);
        case Q5_K: return pick_m<Family, Q5_K>(m);
        case Q6_K: return pick_m<Family, Q6_K>(m);
        default: return nullptr;
    }
}

static RowsFn fused_for(int qtype, int64_t m) { return rows_for<FloatRows>(qtype, m); }
static Int8RowsFn int8_for(int qtype, int64_t m) { return rows_for<Int8Rows>(qtype, m); }

}  // namespace gguf_cpu

#endif
