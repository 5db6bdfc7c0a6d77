// Int8 GEMM for many activation rows (prefill), AVX2, with weight rows in the 32-bit lanes of a
// register: out[m, rows] = x_hat[m, cols] . W[rows, cols], the same arithmetic as the 8-bit GEMV
// of fused.h (x quantized once per 32-element slice, integer products, a float scale per 16 or 32
// weights), organised so that each weight block is decoded once per 64 tokens, not once per token.
//
// Why lanes: the first version dotted one weight row with one token per register, so every 32
// products ended in a madd, an int-to-float conversion, a scale multiply and a horizontal sum:
// about 8 vector instructions per 32 multiply-adds. Here a tile holds 8 weight rows, decoded and
// transposed so that 32-bit lane r of each register holds 4 consecutive values of row r (group g
// of a 32-element sub-block = values 4g..4g+3). One token's 4 activation bytes are broadcast to
// all lanes, and a maddubs then gives 8 rows' partial sums at once. The int16 pair sums of several
// groups are added before one madd (as many as cannot overflow: see groups16), and the float
// conversion and scaling happen once per sub-block (Q6_K: per 16-element half) for 8 rows. That
// is about 3-4 instructions per 32 multiply-adds on the 4- and 5-bit types, and the 8 results of
// a token are 8 adjacent outputs (one store, no horizontal sums).
//
// That halved the prefill's CPU time (Gemma 3 270M Q4_K_M, 128 tokens, one thread: 208 -> 365
// tokens per CPU second; docs/benchmarks.md).
//
// Exactness: each sub-block's integer dot is exact (the int16 sums are bounded below 32767); the
// float32 work is one scale multiply per sub-block (or half) and its accumulation.
#pragma once

#if defined(__AVX2__) && defined(__FMA__)

#include <algorithm>
#include <vector>

#include "fused.h"

namespace gguf_cpu {

constexpr int LANE_ROWS = 8;        // weight rows per tile: one per 32-bit lane
constexpr int LANE_TOKENS = 4;      // tokens per micro-kernel call (4 x 3 accumulators + 3 temporaries)
constexpr int64_t LANE_TOKEN_BLOCK = 64;  // tokens per pass over a tile (their int8 rows stay in L2)

// Types whose decoded values can be negative: the kernel applies the sign trick
// (maddubs(|q|, sign(x, q)), maddubs taking its first operand unsigned).
template <int QT> constexpr bool signed_values() { return !Decoder<QT>::bias; }

// Largest |value| a decoder produces (signed types: the magnitude the sign trick feeds maddubs).
template <int QT> constexpr int max_magnitude() {
    return QT == Q8_0 ? 128 : QT == Q4_0 ? 8 : QT == Q5_0 ? 16 : QT == Q6_K ? 32
         : QT == Q4_1 || QT == Q4_K ? 15 : 31;  // Q5_1, Q5_K
}
// 4-element groups whose maddubs pair sums (each <= 2 * 127 * max_magnitude) add up in int16
// without overflow: 8 (a whole sub-block) for the 4-bit types and Q5_0, 4 for Q5_1 / Q5_K / Q6_K,
// 1 for Q8_0. Activations are clamped to [-127, 127] by quantize_activations.
template <int QT> constexpr int groups16() {
    return std::min(8, 32767 / (2 * 127 * max_magnitude<QT>()));
}
// Q6_K has a scale per 16 values; every other handled type one per 32 (s0 == s1).
template <int QT> constexpr bool split_scales() { return QT == Q6_K; }

// One decoded tile of LANE_ROWS rows. Sub-block s: q[(s * 8 + g) * 32 + 4 * r + j] = value 4g + j
// of row r; scale[s * 16 + r] = row r's scale of values 0-15, scale[s * 16 + 8 + r] of 16-31;
// bias[s * 8 + r] = row r's additive offset (types with a minimum). Rows past the matrix are 0.
struct LaneTile {
    std::vector<int8_t> q;
    std::vector<float> scale, bias;
    explicit LaneTile(int64_t nsub) : q(nsub * 256), scale(nsub * 16), bias(nsub * 8) {}
};

// 8x8 transpose of 32-bit elements: v[r] element g -> v[g] element r.
static inline void transpose8x32(__m256i v[8]) {
    __m256i t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(v[i], v[i + 1]);
        t[i + 1] = _mm256_unpackhi_epi32(v[i], v[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 4; ++i) {
        v[i] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x20);
        v[i + 4] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x31);
    }
}

template <int QT>
static void decode_lane_tile(const uint8_t* w, int64_t row_bytes, int64_t first, int count, int64_t cols,
                             LaneTile& t) {
    using D = Decoder<QT>;
    const int64_t nb = cols / (32 * D::subs);
    for (int64_t block = 0; block < nb; ++block) {
        for (int k = 0; k < D::subs; ++k) {
            const int64_t s = block * D::subs + k;
            __m256i v[8];
            for (int r = 0; r < LANE_ROWS; ++r) {
                if (r < count) {
                    const Sub sub = D::get(w + (first + r) * row_bytes + block * D::bytes, k);
                    v[r] = sub.q;
                    t.scale[s * 16 + r] = sub.s0, t.scale[s * 16 + 8 + r] = sub.s1, t.bias[s * 8 + r] = sub.bias;
                } else {
                    v[r] = _mm256_setzero_si256();
                    t.scale[s * 16 + r] = t.scale[s * 16 + 8 + r] = t.bias[s * 8 + r] = 0.f;
                }
            }
            transpose8x32(v);
            for (int g = 0; g < 8; ++g) _mm256_storeu_si256((__m256i*)(t.q.data() + (s * 8 + g) * 32), v[g]);
        }
    }
}

// res[n * 8 + r] = row r of the tile . token n (scale and offset included), N tokens from xq.
template <int QT, int N>
static inline void lane_kernel(const LaneTile& t, int64_t nsub, const int8_t* xq, const float* xd,
                               const float* xsum, int64_t cols, float* res) {
    constexpr bool SIGNED = signed_values<QT>(), BIAS = Decoder<QT>::bias, SPLIT = split_scales<QT>();
    constexpr int G16 = groups16<QT>();
    constexpr int PER_SCALE = SPLIT ? 4 : 8;               // groups sharing one scale
    constexpr int CHUNK = G16 < PER_SCALE ? G16 : PER_SCALE;  // groups summed in int16 per madd
    static_assert(PER_SCALE % CHUNK == 0, "int16 chunks must not straddle a scale");
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[N];
    for (int n = 0; n < N; ++n) acc[n] = _mm256_setzero_ps();
    for (int64_t s = 0; s < nsub; ++s) {
        const int8_t* qs = t.q.data() + s * 256;
        for (int half = 0; half < 8; half += PER_SCALE) {
            __m256i i32[N];
            for (int c = half; c < half + PER_SCALE; c += CHUNK) {
                __m256i i16[N];
                for (int g = c; g < c + CHUNK; ++g) {
                    const __m256i w = _mm256_loadu_si256((const __m256i*)(qs + g * 32));
                    const __m256i magnitude = SIGNED ? _mm256_sign_epi8(w, w) : w;
                    for (int n = 0; n < N; ++n) {
                        const __m256i xb = _mm256_set1_epi32(*(const int32_t*)(xq + n * cols + s * 32 + 4 * g));
                        const __m256i p = _mm256_maddubs_epi16(magnitude, SIGNED ? _mm256_sign_epi8(xb, w) : xb);
                        i16[n] = g == c ? p : _mm256_add_epi16(i16[n], p);
                    }
                }
                for (int n = 0; n < N; ++n) {
                    const __m256i m = _mm256_madd_epi16(i16[n], ones);
                    i32[n] = c == half ? m : _mm256_add_epi32(i32[n], m);
                }
            }
            const __m256 scale = _mm256_loadu_ps(t.scale.data() + s * 16 + (half ? 8 : 0));
            for (int n = 0; n < N; ++n)
                acc[n] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i32[n]), _mm256_mul_ps(scale, _mm256_broadcast_ss(xd + n * nsub + s)),
                                         acc[n]);
        }
        if (BIAS) {
            const __m256 bias = _mm256_loadu_ps(t.bias.data() + s * 8);
            for (int n = 0; n < N; ++n) acc[n] = _mm256_fmadd_ps(bias, _mm256_broadcast_ss(xsum + n * nsub + s), acc[n]);
        }
    }
    for (int n = 0; n < N; ++n) _mm256_storeu_ps(res + n * 8, acc[n]);
}

// Rows [begin, end) of out[m, rows]; xq[m, cols] int8, xd / xsum[m, cols / 32] (quantize_activations).
template <int QT>
static void lane_gemm_rows(const uint8_t* w, int64_t row_bytes, const int8_t* xq, const float* xd, const float* xsum,
                           float* out, int64_t m, int64_t rows, int64_t cols, int64_t begin, int64_t end) {
    const int64_t nsub = cols / 32;
    LaneTile tile(nsub);
    alignas(32) float res[LANE_TOKENS * 8];
    for (int64_t block = 0; block < m; block += LANE_TOKEN_BLOCK) {
        const int64_t block_end = std::min(m, block + LANE_TOKEN_BLOCK);
        for (int64_t first = begin; first < end; first += LANE_ROWS) {
            const int count = (int)std::min<int64_t>(LANE_ROWS, end - first);
            decode_lane_tile<QT>(w, row_bytes, first, count, cols, tile);  // again per token block: cheap next to the dots
            for (int64_t n0 = block; n0 < block_end; n0 += LANE_TOKENS) {
                const int tokens = (int)std::min<int64_t>(LANE_TOKENS, block_end - n0);
                const int8_t* xb = xq + n0 * cols;
                const float *db = xd + n0 * nsub, *sb = xsum + n0 * nsub;
                static_assert(LANE_TOKENS == 4, "lane_gemm_rows dispatches 1..4 tokens");
                switch (tokens) {
                    case 4: lane_kernel<QT, 4>(tile, nsub, xb, db, sb, cols, res); break;
                    case 3: lane_kernel<QT, 3>(tile, nsub, xb, db, sb, cols, res); break;
                    case 2: lane_kernel<QT, 2>(tile, nsub, xb, db, sb, cols, res); break;
                    default: lane_kernel<QT, 1>(tile, nsub, xb, db, sb, cols, res); break;
                }
                for (int n = 0; n < tokens; ++n) {
                    float* o = out + (n0 + n) * rows + first;
                    if (count == LANE_ROWS)
                        _mm256_storeu_ps(o, _mm256_load_ps(res + n * 8));
                    else
                        std::copy(res + n * 8, res + n * 8 + count, o);
                }
            }
        }
    }
}

using LaneRowsFn = void (*)(const uint8_t*, int64_t, const int8_t*, const float*, const float*, float*, int64_t,
                            int64_t, int64_t, int64_t, int64_t);

static LaneRowsFn lane_gemm_for(int qtype) {
    switch (qtype) {
        case Q4_0: return &lane_gemm_rows<Q4_0>;
        case Q4_1: return &lane_gemm_rows<Q4_1>;
        case Q5_0: return &lane_gemm_rows<Q5_0>;
        case Q5_1: return &lane_gemm_rows<Q5_1>;
        case Q8_0: return &lane_gemm_rows<Q8_0>;
        case Q4_K: return &lane_gemm_rows<Q4_K>;
        case Q5_K: return &lane_gemm_rows<Q5_K>;
        case Q6_K: return &lane_gemm_rows<Q6_K>;
        default: return nullptr;
    }
}

}  // namespace gguf_cpu

#endif
