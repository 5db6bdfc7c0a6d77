// Row dequantizers for GGUF block types: packed bytes of one row -> float32 values.
//
// Each `dequant_<type>(row, out, nblocks)` writes nblocks * block_size floats. The arithmetic
// follows the format's definition (value = d * q, d * q + m, or (d * scale) * q - dmin * min)
// in float32, so the values equal gguf-py's `gguf.quants.dequantize`. Block layouts are those
// documented in gguf-py's quants.py; this file is written from that description.
//
// AVX2 paths sit under #ifdef __AVX2__ with a portable scalar fallback for every type.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

namespace gguf_cpu {

// Type ids: gguf-py's GGMLQuantizationType values.
enum QType : int { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };

inline float fp16_at(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
    if (exp == 0) {  // zero or subnormal: man * 2^-24, exact in float32
        const float v = (float)man * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    const uint32_t bits = exp == 31 ? (sign | 0x7F800000u | (man << 13)) : (sign | ((exp + 112) << 23) | (man << 13));
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
#endif
}

inline uint32_t u32_at(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// Q4_K / Q5_K: scale and min of sub-block j (0..7) from the 12 packed scale bytes.
inline void k_scale_min(const uint8_t* s, int j, int* scale, int* min) {
    if (j < 4) {
        *scale = s[j] & 63;
        *min = s[j + 4] & 63;
    } else {
        *scale = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        *min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

#if defined(__AVX2__)
// 32 signed bytes -> 32 floats: the first 16 times s0, the last 16 times s1.
inline void store_q32(__m256i q, float s0, float s1, float* out) {
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    const __m256 a = _mm256_set1_ps(s0), b = _mm256_set1_ps(s1);
    _mm256_storeu_ps(out, _mm256_mul_ps(a, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo))));
    _mm256_storeu_ps(out + 8, _mm256_mul_ps(a, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)))));
    _mm256_storeu_ps(out + 16, _mm256_mul_ps(b, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi))));
    _mm256_storeu_ps(out + 24, _mm256_mul_ps(b, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)))));
}

// 32 bytes (values < 128) -> d * q + m (sign +1) or d * q - m (sign -1), product rounded first.
inline void store_affine32(__m256i q, float d, float m, bool subtract, float* out) {
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int k = 0; k < 4; ++k) {
        const __m256 p = _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[k])));
        _mm256_storeu_ps(out + 8 * k, subtract ? _mm256_sub_ps(p, vm) : _mm256_add_ps(p, vm));
    }
}

// 16 packed bytes -> 32 bytes: low nibbles first, then high nibbles (the 32-element block order).
inline __m256i nibbles32(const uint8_t* p) {
    const __m128i raw = _mm_loadu_si128((const __m128i*)p), mask = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), mask), _mm_and_si128(raw, mask));
}

// Byte j is 0x10 where bit j of qh is set (the fifth bit of element j in Q5_0 / Q5_1).
inline __m256i fifth_bits(uint32_t qh) {
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)qh),
        _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}
#endif

inline void dequant_q8_0(const uint8_t* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, b += 34, y += 32) {
        const float d = fp16_at(b);
#if defined(__AVX2__)
        store_q32(_mm256_loadu_si256((const __m256i*)(b + 2)), d, d, y);
#else
        for (int j = 0; j < 32; ++j) y[j] = (float)(int8_t)b[2 + j] * d;
#endif
    }
}

inline void dequant_q4_0(const uint8_t* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, b += 18, y += 32) {
        const float d = fp16_at(b);
#if defined(__AVX2__)
        store_q32(_mm256_sub_epi8(nibbles32(b + 2), _mm256_set1_epi8(8)), d, d, y);
#else
        for (int j = 0; j < 16; ++j) {
            y[j] = d * (float)((b[2 + j] & 0x0F) - 8);
            y[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
        }
#endif
    }
}

inline void dequant_q4_1(const uint8_t* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, b += 20, y += 32) {
        const float d = fp16_at(b), m = fp16_at(b + 2);
#if defined(__AVX2__)
        store_affine32(nibbles32(b + 4), d, m, false, y);
#else
        for (int j = 0; j < 16; ++j) {
            y[j] = d * (float)(b[4 + j] & 0x0F) + m;
            y[j + 16] = d * (float)(b[4 + j] >> 4) + m;
        }
#endif
    }
}

inline void dequant_q5_0(const uint8_t* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, b += 22, y += 32) {
        const float d = fp16_at(b);
        const uint32_t qh = u32_at(b + 2);
#if defined(__AVX2__)
        const __m256i q = _mm256_or_si256(nibbles32(b + 6), fifth_bits(qh));
        store_q32(_mm256_sub_epi8(q, _mm256_set1_epi8(16)), d, d, y);
#else
        for (int j = 0; j < 16; ++j) {
            const int h0 = ((qh >> j) & 1) << 4, h1 = ((qh >> (j + 16)) & 1) << 4;
            y[j] = d * (float)(((b[6 + j] & 0x0F) | h0) - 16);
            y[j + 16] = d * (float)(((b[6 + j] >> 4) | h1) - 16);
        }
#endif
    }
}

inline void dequant_q5_1(const uint8_t* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, b += 24, y += 32) {
        const float d = fp16_at(b), m = fp16_at(b + 2);
        const uint32_t qh = u32_at(b + 4);
#if defined(__AVX2__)
        store_affine32(_mm256_or_si256(nibbles32(b + 8), fifth_bits(qh)), d, m, false, y);
#else
        for (int j = 0; j < 16; ++j) {
            const int h0 = ((qh >> j) & 1) << 4, h1 = ((qh >> (j + 16)) & 1) << 4;
            y[j] = d * (float)((b[8 + j] & 0x0F) | h0) + m;
            y[j + 16] = d * (float)((b[8 + j] >> 4) | h1) + m;
        }
#endif
    }
}

// Q4_K (144 bytes): d, dmin, 12 scale bytes, 128 bytes of nibbles; Q5_K (176 bytes) adds a
// 32-byte qh before the nibbles. Each 32 nibble bytes hold two 32-element sub-blocks (low
// nibbles, then high); bit 2k / 2k+1 of qh byte l is the fifth bit of those sub-blocks' element l.
template <bool FIVE>
inline void dequant_k45(const uint8_t* b, float* y, int64_t nb) {
    constexpr int size = FIVE ? 176 : 144;
    for (int64_t i = 0; i < nb; ++i, b += size) {
        const float d = fp16_at(b), dmin = fp16_at(b + 2);
        const uint8_t* scales = b + 4;
        const uint8_t* qh = b + 16;
        const uint8_t* qs = b + (FIVE ? 48 : 16);
        for (int k = 0; k < 4; ++k, qs += 32, y += 64) {
            int sc1, m1, sc2, m2;
            k_scale_min(scales, 2 * k, &sc1, &m1);
            k_scale_min(scales, 2 * k + 1, &sc2, &m2);
            const float d1 = d * (float)sc1, mm1 = dmin * (float)m1, d2 = d * (float)sc2, mm2 = dmin * (float)m2;
#if defined(__AVX2__)
            const __m256i raw = _mm256_loadu_si256((const __m256i*)qs), mask = _mm256_set1_epi8(0x0F);
            __m256i lo = _mm256_and_si256(raw, mask), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
            if (FIVE) {
                const __m256i h = _mm256_loadu_si256((const __m256i*)qh), one = _mm256_set1_epi8(1);
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * k), one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * k + 1), one), 4));
            }
            store_affine32(lo, d1, mm1, true, y);
            store_affine32(hi, d2, mm2, true, y + 32);
#else
            for (int l = 0; l < 32; ++l) {
                const int h0 = FIVE ? ((qh[l] >> (2 * k)) & 1) << 4 : 0;
                const int h1 = FIVE ? ((qh[l] >> (2 * k + 1)) & 1) << 4 : 0;
                y[l] = d1 * (float)((qs[l] & 0x0F) | h0) - mm1;
                y[l + 32] = d2 * (float)((qs[l] >> 4) | h1) - mm2;
            }
#endif
        }
    }
}

// Q6_K (210 bytes): 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 int8 scales, d.
// Per 128-element half: ql[0..63], qh[0..31], scales[0..7]; q - 32, one scale per 16 elements.
inline void dequant_q6_k(const uint8_t* b, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, b += 210) {
        const float d = fp16_at(b + 208);
        const uint8_t* ql = b;
        const uint8_t* qh = b + 128;
        const int8_t* sc = (const int8_t*)(b + 192);
        for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8, y += 128) {
            float s[8];
            for (int k = 0; k < 8; ++k) s[k] = d * (float)sc[k];
#if defined(__AVX2__)
            const __m256i a = _mm256_loadu_si256((const __m256i*)ql), c = _mm256_loadu_si256((const __m256i*)(ql + 32));
            const __m256i h = _mm256_loadu_si256((const __m256i*)qh);
            const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3), off = _mm256_set1_epi8(32);
            const __m256i low[4] = {_mm256_and_si256(a, m4), _mm256_and_si256(c, m4),
                                    _mm256_and_si256(_mm256_srli_epi16(a, 4), m4),
                                    _mm256_and_si256(_mm256_srli_epi16(c, 4), m4)};
            for (int k = 0; k < 4; ++k) {
                const __m256i high = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * k), m2), 4);
                const __m256i q = _mm256_sub_epi8(_mm256_or_si256(low[k], high), off);
                store_q32(q, s[2 * k], s[2 * k + 1], y + 32 * k);
            }
#else
            for (int l = 0; l < 32; ++l) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = s[is] * (float)q1;
                y[l + 32] = s[is + 2] * (float)q2;
                y[l + 64] = s[is + 4] * (float)q3;
                y[l + 96] = s[is + 6] * (float)q4;
            }
#endif
        }
    }
}

// Elements per block of a handled type, 0 for a type this file does not decode.
inline int block_elems(int qtype) {
    switch (qtype) {
        case Q4_0: case Q4_1: case Q5_0: case Q5_1: case Q8_0: return 32;
        case Q4_K: case Q5_K: case Q6_K: return 256;
        default: return 0;
    }
}

// Dequantize one row of `cols` elements; false for an unhandled type.
inline bool dequant_row(int qtype, const uint8_t* row, float* out, int64_t cols) {
    const int64_t nb = cols / block_elems(qtype);
    switch (qtype) {
        case Q4_0: dequant_q4_0(row, out, nb); return true;
        case Q4_1: dequant_q4_1(row, out, nb); return true;
        case Q5_0: dequant_q5_0(row, out, nb); return true;
        case Q5_1: dequant_q5_1(row, out, nb); return true;
        case Q8_0: dequant_q8_0(row, out, nb); return true;
        case Q4_K: dequant_k45<false>(row, out, nb); return true;
        case Q5_K: dequant_k45<true>(row, out, nb); return true;
        case Q6_K: dequant_q6_k(row, out, nb); return true;
        default: return false;
    }
}

}  // namespace gguf_cpu
