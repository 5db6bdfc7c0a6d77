// Int8 GEMM for many activation rows (prefill), AVX2: out[m, rows] = x_hat[m, cols] . W[rows, cols].
//
// Same arithmetic as the 8-bit GEMV of fused.h (x quantized once per 32-element slice, integer
// products with maddubs/madd, one float scale per 16 weights), organised so that each weight block
// is decoded once per call instead of once per token:
//
//   1. a thread takes a range of weight rows; for each tile of TILE_ROWS rows it decodes the packed
//      blocks once into a small buffer that stays in L1 (int8 values, a float scale vector and an
//      additive offset per 32-element sub-block);
//   2. a register-tiled micro-kernel dots that buffer against MICRO_TOKENS tokens at a time.
//
// Types with a per-block minimum (Q4_1, Q5_1, Q4_K, Q5_K) decode to unsigned values that maddubs
// takes directly, their minimum adding bias * sum(x_hat) per sub-block; the others decode to
// signed values and use the sign trick (maddubs(|q|, sign(x, q))). Storing Q4_0 / Q5_0 unsigned
// with the constant 8 / 16 moved into that offset measured no faster, so they stay signed.
// Tokens are processed in blocks of TOKEN_BLOCK so the int8 activations a tile reads stay in L2.
#pragma once

#if defined(__AVX2__) && defined(__FMA__)

#include <algorithm>
#include <vector>

#include "fused.h"

namespace gguf_cpu {

// 3 rows x 4 tokens: 12 ymm accumulators, the weights and scale of the row in use, a temporary.
// Measured on a Zen 3 EPYC (one thread, best of 60): 3x4, 2x4 and 4x3 within noise of each other
// (~35 G multiply-adds/s), 4x4 spills.
#ifndef GEMM_TILE_ROWS  // -D overrides for tuning builds
#define GEMM_TILE_ROWS 3
#define GEMM_MICRO_TOKENS 4
#endif
constexpr int TILE_ROWS = GEMM_TILE_ROWS;          // weight rows decoded together (and dotted together)
constexpr int MICRO_TOKENS = GEMM_MICRO_TOKENS;    // tokens per micro-kernel call
constexpr int64_t TOKEN_BLOCK = 64;   // tokens per pass over a tile (their int8 rows stay in L2)

// Types whose decoded values can be negative: the micro-kernel applies the sign trick.
template <int QT> constexpr bool signed_values() { return !Decoder<QT>::bias; }

// One decoded tile: for tile row i and sub-block s, q[(i * nsub + s) * 32 ..] holds 32 int8 values,
// scale[(i * nsub + s) * 8 ..] the float scale of lanes 0-3 (elements 0-15) and 4-7 (16-31), and
// bias[i * nsub + s] the additive offset per element (dotted with sum(x_hat) of the slice).
struct DecodedTile {
    std::vector<int8_t> q;
    std::vector<float> scale, bias;
    explicit DecodedTile(int64_t nsub) : q(TILE_ROWS * nsub * 32), scale(TILE_ROWS * nsub * 8), bias(TILE_ROWS * nsub) {}
};

template <int QT>
static void decode_tile(const uint8_t* w, int64_t row_bytes, int64_t first, int count, int64_t cols, DecodedTile& t) {
    using D = Decoder<QT>;
    const int64_t nb = cols / (32 * D::subs), nsub = cols / 32;
    for (int i = 0; i < count; ++i) {
        const uint8_t* b = w + (first + i) * row_bytes;
        for (int64_t block = 0; block < nb; ++block, b += D::bytes) {
            for (int k = 0; k < D::subs; ++k) {
                const Sub s = D::get(b, k);
                const int64_t at = i * nsub + block * D::subs + k;
                _mm256_storeu_si256((__m256i*)(t.q.data() + at * 32), s.q);
                _mm256_storeu_ps(t.scale.data() + at * 8, _mm256_set_m128(_mm_set1_ps(s.s1), _mm_set1_ps(s.s0)));
                t.bias[at] = s.bias;
            }
        }
    }
}

// res[r * N + n] = sum over sub-blocks of the tile row r . token n (scale included, offset not).
template <int R, int N, bool SIGNED>
static inline void micro_kernel(const DecodedTile& t, int64_t nsub, const int8_t* xq, const float* xd, int64_t cols,
                                float* res) {
    __m256 acc[R][N];
    for (int r = 0; r < R; ++r)
        for (int n = 0; n < N; ++n) acc[r][n] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t s = 0; s < nsub; ++s) {
        for (int r = 0; r < R; ++r) {
            const __m256i w = _mm256_loadu_si256((const __m256i*)(t.q.data() + (r * nsub + s) * 32));
            const __m256i magnitude = SIGNED ? _mm256_sign_epi8(w, w) : w;
            const __m256 scale = _mm256_loadu_ps(t.scale.data() + (r * nsub + s) * 8);
            for (int n = 0; n < N; ++n) {  // x reloaded per row from L1: ymm registers go to the accumulators
                const __m256i xn = _mm256_loadu_si256((const __m256i*)(xq + n * cols + 32 * s));
                const __m256i pairs = _mm256_maddubs_epi16(magnitude, SIGNED ? _mm256_sign_epi8(xn, w) : xn);
                const __m256 dots = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
                acc[r][n] = _mm256_fmadd_ps(_mm256_mul_ps(scale, _mm256_broadcast_ss(xd + n * nsub + s)), dots, acc[r][n]);
            }
        }
    }
    for (int r = 0; r < R; ++r)
        for (int n = 0; n < N; ++n) res[r * N + n] = hsum8(acc[r][n]);
}

template <int QT, int N>
static inline void tile_tokens(const DecodedTile& t, int rows_here, int64_t nsub, const int8_t* xq, const float* xd,
                               int64_t cols, float* res) {
    constexpr bool S = signed_values<QT>();
    static_assert(TILE_ROWS <= 4, "tile_tokens dispatches 1..4 rows");
    switch (rows_here) {  // full tiles take the TILE_ROWS case; the last tile of a range may be shorter
        case 4: micro_kernel<4, N, S>(t, nsub, xq, xd, cols, res); break;
        case 3: micro_kernel<3, N, S>(t, nsub, xq, xd, cols, res); break;
        case 2: micro_kernel<2, N, S>(t, nsub, xq, xd, cols, res); break;
        default: micro_kernel<1, N, S>(t, nsub, xq, xd, cols, res); break;
    }
}

// Rows [begin, end) of out[m, rows]. xq[m, cols] int8, xd / xsum[m, cols / 32] (see quantize_activations).
template <int QT>
static void gemm_rows(const uint8_t* w, int64_t row_bytes, const int8_t* xq, const float* xd, const float* xsum,
                      float* out, int64_t m, int64_t rows, int64_t cols, int64_t begin, int64_t end) {
    constexpr bool offsets_needed = Decoder<QT>::bias;
    const int64_t nsub = cols / 32;
    DecodedTile tile(nsub);
    float res[TILE_ROWS * MICRO_TOKENS];
    // The offset term sum_s bias[r, s] * xsum[n, s] of a tile is a small matrix product; with xsum
    // transposed per token block it runs as vector FMAs over 8 tokens at a time (a scalar dot per
    // output cost as much as the integer products themselves on short rows).
    std::vector<float> xsum_t(offsets_needed ? nsub * TOKEN_BLOCK : 0), offsets(TILE_ROWS * TOKEN_BLOCK, 0.f);
    for (int64_t block = 0; block < m; block += TOKEN_BLOCK) {
        const int64_t block_end = std::min(m, block + TOKEN_BLOCK);
        if (offsets_needed) {
            std::fill(xsum_t.begin(), xsum_t.end(), 0.f);
            for (int64_t n = block; n < block_end; ++n)
                for (int64_t s = 0; s < nsub; ++s) xsum_t[s * TOKEN_BLOCK + (n - block)] = xsum[n * nsub + s];
        }
        for (int64_t first = begin; first < end; first += TILE_ROWS) {
            const int count = (int)std::min<int64_t>(TILE_ROWS, end - first);
            decode_tile<QT>(w, row_bytes, first, count, cols, tile);  // again per token block: cheap next to the dots
            if (offsets_needed) {
                for (int r = 0; r < count; ++r) {
                    float* off = offsets.data() + r * TOKEN_BLOCK;
                    std::fill(off, off + TOKEN_BLOCK, 0.f);
                    for (int64_t s = 0; s < nsub; ++s) {
                        const float b = tile.bias[r * nsub + s];
                        const float* xs = xsum_t.data() + s * TOKEN_BLOCK;
                        for (int64_t n = 0; n < TOKEN_BLOCK; ++n) off[n] += b * xs[n];
                    }
                }
            }
            for (int64_t n0 = block; n0 < block_end; n0 += MICRO_TOKENS) {
                const int tokens = (int)std::min<int64_t>(MICRO_TOKENS, block_end - n0);
                const int8_t* xb = xq + n0 * cols;
                const float* db = xd + n0 * nsub;
                static_assert(MICRO_TOKENS <= 4, "gemm_rows dispatches 1..4 tokens");
                switch (tokens) {
                    case 4: tile_tokens<QT, 4>(tile, count, nsub, xb, db, cols, res); break;
                    case 3: tile_tokens<QT, 3>(tile, count, nsub, xb, db, cols, res); break;
                    case 2: tile_tokens<QT, 2>(tile, count, nsub, xb, db, cols, res); break;
                    default: tile_tokens<QT, 1>(tile, count, nsub, xb, db, cols, res); break;
                }
                for (int r = 0; r < count; ++r)
                    for (int n = 0; n < tokens; ++n)
                        out[(n0 + n) * rows + first + r] = res[r * tokens + n] + offsets[r * TOKEN_BLOCK + (n0 - block) + n];
            }
        }
    }
}

using GemmRowsFn = void (*)(const uint8_t*, int64_t, const int8_t*, const float*, const float*, float*, int64_t,
                            int64_t, int64_t, int64_t, int64_t);

static GemmRowsFn gemm_for(int qtype) {
    switch (qtype) {
        case Q4_0: return &gemm_rows<Q4_0>;
        case Q4_1: return &gemm_rows<Q4_1>;
        case Q5_0: return &gemm_rows<Q5_0>;
        case Q5_1: return &gemm_rows<Q5_1>;
        case Q8_0: return &gemm_rows<Q8_0>;
        case Q4_K: return &gemm_rows<Q4_K>;
        case Q5_K: return &gemm_rows<Q5_K>;
        case Q6_K: return &gemm_rows<Q6_K>;
        default: return nullptr;
    }
}

}  // namespace gguf_cpu

#endif
