// Compiled CPU GGUF quantizer: float32 blocks -> GGUF block bytes, one block per call of an
// encoder, blocks spread over torch's thread pool with at::parallel_for.
//
// Each encoder is the torch code of legacy.py / kquants.py / search.py written out per block,
// with the same float32 and float64 operations in the same order (this file is built with
// -ffp-contract=off so no multiply-add is fused behind our back):
//
// * Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: byte-identical to the torch path and to gguf-py.
// * Q4_K, Q5_K, Q6_K: the same candidate grids, least-squares fits and refits. The torch path sums
//   its float32 products in float64 (search.py), as this file does; such sums are exact or nearly
//   so in any order, so on ordinary weights the bytes are the torch path's. On weights that already
//   lie on a quantization grid (dequantized K-quants) candidates can tie to the last bit, and a
//   near-tie may break the other way; the block then settles in another optimum about as good
//   (tests/test_gguf_quant_compiled.py measures both cases).
//
// Contract (api.py checks it): `src` holds `blocks` contiguous blocks of float32, `dst` room for
// `blocks` blocks of the type's size. Pointers travel as integers (see gguf_cpu.cpp) and the GIL
// is released for the whole call.
//
// Built twice from this one file: as a torch extension (native.py; at::parallel_for, c10::Half,
// pybind11), and with -DTOOLKIT_QUANT_PLAIN as a plain shared library with a C entry point
// (plain.py; OpenMP, the compiler's _Float16, ctypes), which lets `toolkit convert` quantize a
// GGUF file without importing torch. The encoders are the same code in both, so are the bytes.
#if defined(TOOLKIT_QUANT_PLAIN)
#include <omp.h>
#else
#include <pybind11/pybind11.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace gguf_quant {

#if defined(__AVX2__)
// The search loops below, 8 elements at a time: the same float32 operations (products, rounding
// to nearest even, clamps) and float64 sums, which for these rows are exact in any order (a sum of
// up to 256 float32 products spans few enough bits), so the lanes change no result.
static inline void add_pd(__m256d& acc, __m256 v) {  // acc += v's 8 values as float64 (two halves)
    acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
    acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
}
static inline double hsum(__m256d v) {
    __m128d low = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(low, _mm_unpackhi_pd(low, low)));
}
static inline __m256 round_clamp(__m256 v, __m256 lo, __m256 hi) {
    return _mm256_min_ps(_mm256_max_ps(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), lo), hi);
}
#endif

// GGMLQuantizationType numbers
enum { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };

#if defined(TOOLKIT_QUANT_PLAIN)
// IEEE float -> half conversions round to nearest even, as c10::Half does (F16C where present)
static inline uint16_t half_bits(float v) {
    const _Float16 h = static_cast<_Float16>(v);
    uint16_t bits;
    std::memcpy(&bits, &h, 2);
    return bits;
}
static inline float half_value(uint16_t bits) {
    _Float16 h;
    std::memcpy(&h, &bits, 2);
    return static_cast<float>(h);
}
#else
static inline uint16_t half_bits(float v) { return c10::Half(v).x; }
static inline float half_value(uint16_t bits) { return static_cast<float>(c10::Half(bits, c10::Half::from_bits())); }
#endif
static inline void put_half(uint8_t* out, uint16_t bits) { std::memcpy(out, &bits, 2); }  // little-endian hosts
static inline float recip(float v) { return v == 0.f ? 0.f : 1.f / v; }          // bits.safe_reciprocal
static inline double recip(double v) { return v == 0.0 ? 0.0 : 1.0 / v; }
static inline float clampf(float v, float lo, float hi) { return std::min(std::max(v, lo), hi); }
static inline float rne(float v) { return std::nearbyint(v); }                     // torch.round: half to even
// bits.round_half_away (C roundf) in the torch path's own operations, which vectorize (roundf does not)
static inline float round_away(float v) {
    const float magnitude = std::fabs(v), whole = std::floor(magnitude);
    const float r = whole + std::floor(2.f * (magnitude - whole));
    return v < 0.f ? -r : r;
}

// ---- 32-element types (legacy.py) ---------------------------------------------------------------
// numpy's take(argmax(abs)): the first element of largest magnitude, with its sign
static inline float signed_max(const float* x) {
    float best = std::fabs(x[0]);
    int at = 0;
    for (int j = 1; j < 32; ++j)
        if (std::fabs(x[j]) > best) best = std::fabs(x[j]), at = j;
    return x[at];
}

static inline void min_max(const float* x, float& lo, float& hi) {
    lo = hi = x[0];
    for (int j = 1; j < 32; ++j) lo = std::min(lo, x[j]), hi = std::max(hi, x[j]);
}

static void q8_0(const float* x, uint8_t* out) {
#if defined(__AVX2__)
    // the scalar code below, 8 lanes at a time: the same float operations on each element (a max,
    // one multiply, round_away's floors), so the same bytes; codes are within +-127 (|x| <= amax),
    // so the saturating packs never saturate
    const __m256 sign = _mm256_set1_ps(-0.f), two = _mm256_set1_ps(2.f), zero = _mm256_setzero_ps();
    __m256 v[4], peak = zero;
    for (int i = 0; i < 4; ++i) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        peak = _mm256_max_ps(peak, _mm256_andnot_ps(sign, v[i]));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(peak), _mm256_extractf128_ps(peak, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float d = _mm_cvtss_f32(h) / 127.f, id = recip(d);
    put_half(out, half_bits(d));
    const __m256 scale = _mm256_set1_ps(id);
    __m256i q[4];
    for (int i = 0; i < 4; ++i) {
        const __m256 scaled = _mm256_mul_ps(v[i], scale);
        const __m256 magnitude = _mm256_andnot_ps(sign, scaled), whole = _mm256_floor_ps(magnitude);
        __m256 r = _mm256_add_ps(whole, _mm256_floor_ps(_mm256_mul_ps(two, _mm256_sub_ps(magnitude, whole))));
        r = _mm256_blendv_ps(r, _mm256_xor_ps(r, sign), _mm256_cmp_ps(scaled, zero, _CMP_LT_OQ));
        q[i] = _mm256_cvttps_epi32(r);
    }
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2),
                        _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
#else
    float amax = 0.f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.f, id = recip(d);
    put_half(out, half_bits(d));
    for (int j = 0; j < 32; ++j) out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(round_away(x[j] * id)));
#endif
}

// trunc(scaled + offset), at most `top` (legacy._codes); scaled + offset >= 0 here
static inline int code_of(float scaled, float offset, int top) {
    return std::min(top, static_cast<int>(scaled + offset));
}

static inline void pack_nibbles16(const int* q, uint8_t* out) {
    for (int j = 0; j < 16; ++j) out[j] = static_cast<uint8_t>((q[j] & 15) | ((q[j + 16] & 15) << 4));
}

static inline void put_high_bits(const int* q, uint8_t* out) {  // bit 4 of code j -> bit j, LSB first
    uint32_t bits = 0;
    for (int j = 0; j < 32; ++j) bits |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
    std::memcpy(out, &bits, 4);
}

static void q4_0(const float* x, uint8_t* out) {
    const float d = signed_max(x) / -8.f, id = recip(d);
    int q[32];
    for (int j = 0; j < 32; ++j) q[j] = code_of(x[j] * id, 8.5f, 15);
    put_half(out, half_bits(d));
    pack_nibbles16(q, out + 2);
}

static void q4_1(const float* x, uint8_t* out) {
    float lo, hi;
    min_max(x, lo, hi);
    const float d = (hi - lo) / 15.f, id = recip(d);
    int q[32];
    for (int j = 0; j < 32; ++j) q[j] = code_of((x[j] - lo) * id, 0.5f, 15);
    put_half(out, half_bits(d));
    put_half(out + 2, half_bits(lo));
    pack_nibbles16(q, out + 4);
}

static void q5_0(const float* x, uint8_t* out) {
    const float d = signed_max(x) / -16.f, id = recip(d);
    int q[32];
    for (int j = 0; j < 32; ++j) q[j] = code_of(x[j] * id, 16.5f, 31);
    put_half(out, half_bits(d));
    put_high_bits(q, out + 2);
    pack_nibbles16(q, out + 6);
}

static void q5_1(const float* x, uint8_t* out) {
    float lo, hi;
    min_max(x, lo, hi);
    const float d = (hi - lo) / 31.f, id = recip(d);
    int q[32];
    for (int j = 0; j < 32; ++j) q[j] = code_of((x[j] - lo) * id, 0.5f, 31);
    put_half(out, half_bits(d));
    put_half(out + 2, half_bits(lo));
    put_high_bits(q, out + 4);
    pack_nibbles16(q, out + 8);
}

// ---- Q4_K / Q5_K (kquants._affine_codes, search.affine_search) -----------------------------------
struct Affine {
    int nmax;
    int candidates;       // 1 + nstep + 1: the range-based choice, then the grid
    float factors[32];    // search.affine_search's `factors`, as float32
};

static Affine make_affine(int nmax, double rmin, int nstep) {
    Affine a{nmax, nstep + 2, {}};
    a.factors[0] = static_cast<float>(nmax);
    for (int i = 0; i <= nstep; ++i) a.factors[1 + i] = static_cast<float>(nmax + rmin + 0.1 * i);
    return a;
}
static const Affine AFFINE_Q4 = make_affine(15, -1.0, 20);
static const Affine AFFINE_Q5 = make_affine(31, -0.5, 15);

// Best x ~ scale * L - offset for one 32-element sub-block (search.affine_search); offset >= 0.
static void affine_search(const float* x, const Affine& p, float& scale_out, float& offset_out) {
    float sq = 0.f;
    {
        double s = 0.0;
        for (int j = 0; j < 32; ++j) s += static_cast<double>(x[j] * x[j]);
        sq = static_cast<float>(s / 32.0);
    }
    const float rms = std::sqrt(sq);
    float w[32];
    for (int j = 0; j < 32; ++j) w[j] = rms + std::fabs(x[j]);            // kquants._sub_block_weights
    float lo = x[0], hi = x[0];
    for (int j = 1; j < 32; ++j) lo = std::min(lo, x[j]), hi = std::max(hi, x[j]);
    lo = std::min(lo, 0.f);
    const float spread = hi - lo;
    const float denom = spread > 0.f ? spread : 1.f;
    double W = 0, X = 0, XX = 0;
    float shifted[32];
    for (int j = 0; j < 32; ++j) {
        const float wx = w[j] * x[j];
        W += w[j], X += wx, XX += static_cast<double>(wx * x[j]);
        shifted[j] = x[j] - lo;
    }
    const float nmax = static_cast<float>(p.nmax);
    double best_error = std::numeric_limits<double>::infinity(), best_scale = 0, best_min = 0;
    bool have = false;
    for (int c = 0; c < p.candidates; ++c) {
        const float inverse = p.factors[c] / denom;
        double L = 0, LL = 0, LX = 0;
#if defined(__AVX2__)
        {
            const __m256 vinverse = _mm256_set1_ps(inverse), zero = _mm256_setzero_ps(), top = _mm256_set1_ps(nmax);
            __m256d sl = _mm256_setzero_pd(), sll = _mm256_setzero_pd(), slx = _mm256_setzero_pd();
            for (int j = 0; j < 32; j += 8) {
                const __m256 l = round_clamp(_mm256_mul_ps(vinverse, _mm256_loadu_ps(shifted + j)), zero, top);
                const __m256 wl = _mm256_mul_ps(l, _mm256_loadu_ps(w + j));
                add_pd(sl, wl);
                add_pd(sll, _mm256_mul_ps(wl, l));
                add_pd(slx, _mm256_mul_ps(wl, _mm256_loadu_ps(x + j)));
            }
            L = hsum(sl), LL = hsum(sll), LX = hsum(slx);
        }
#else
        for (int j = 0; j < 32; ++j) {
            const float l = clampf(rne(inverse * shifted[j]), 0.f, nmax);
            const float wl = l * w[j];
            L += wl, LL += static_cast<double>(wl * l), LX += static_cast<double>(wl * x[j]);
        }
#endif
        double scale, minimum;
        if (c == 0) {  // the range-based choice keeps its own scale and min
            scale = static_cast<double>(1.f / inverse);
            minimum = static_cast<double>(lo);
        } else {       // search._fit_affine
            const double det = W * LL - L * L;
            if (!(det > 0)) continue;  // unusable (infinite error)
            scale = (W * LX - X * L) / det;
            minimum = (LL * X - L * LX) / det;
            if (minimum > 0) {
                scale = LX / (LL > 0 ? LL : 1.0);
                minimum = 0.0;
            }
        }
        if (!std::isfinite(scale) || !std::isfinite(minimum)) continue;
        const double error = scale * scale * LL + 2 * scale * minimum * L + minimum * minimum * W
                             - 2 * scale * LX - 2 * minimum * X + XX;         // search._affine_error
        if (!have || error < best_error) best_error = error, best_scale = scale, best_min = minimum, have = true;
    }
    if (spread == 0.f) {  // a constant sub-block: all codes 0, the offset carries the value
        scale_out = 0.f;
        offset_out = static_cast<float>(-static_cast<double>(lo));
    } else {
        scale_out = static_cast<float>(best_scale);
        offset_out = static_cast<float>(-best_min);
    }
}

// kquants._six_bit: 8 non-negative values -> 6-bit integers and the fp16 super-scale
static void six_bit(const float* values, uint8_t* codes, uint16_t& d) {
    float peak = values[0];
    for (int j = 1; j < 8; ++j) peak = std::max(peak, values[j]);
    const float step = peak / 63.f, inverse = recip(step);
    for (int j = 0; j < 8; ++j) codes[j] = static_cast<uint8_t>(clampf(rne(values[j] * inverse), 0.f, 63.f));
    d = half_bits(step);
}

// kquants._affine_decode_codes: codes for fixed scales, and the block's squared error
static double affine_decode(const float* x, const uint8_t* sc, const uint8_t* mc, uint16_t d_bits,
                            uint16_t dmin_bits, int nmax, uint8_t* codes) {
    const float d = half_value(d_bits), dmin = half_value(dmin_bits), top = static_cast<float>(nmax);
    double error = 0;
#if defined(__AVX2__)
    __m256d acc = _mm256_setzero_pd();
#endif
    for (int j = 0; j < 8; ++j) {
        const float step = d * static_cast<float>(sc[j]), shift = dmin * static_cast<float>(mc[j]);
        const float inverse = recip(step);
        const float* xs = x + 32 * j;
#if defined(__AVX2__)
        const __m256 vstep = _mm256_set1_ps(step), vshift = _mm256_set1_ps(shift), vinverse = _mm256_set1_ps(inverse);
        const __m256 zero = _mm256_setzero_ps(), vtop = _mm256_set1_ps(top);
        for (int i = 0; i < 32; i += 8) {
            const __m256 xv = _mm256_loadu_ps(xs + i);
            const __m256 q = round_clamp(_mm256_mul_ps(_mm256_add_ps(xv, vshift), vinverse), zero, vtop);
            const __m256 e = _mm256_sub_ps(_mm256_sub_ps(_mm256_mul_ps(q, vstep), vshift), xv);
            add_pd(acc, _mm256_mul_ps(e, e));
            alignas(32) int32_t whole[8];
            _mm256_store_si256(reinterpret_cast<__m256i*>(whole), _mm256_cvttps_epi32(q));
            for (int k = 0; k < 8; ++k) codes[32 * j + i + k] = static_cast<uint8_t>(whole[k]);
        }
#else
        for (int i = 0; i < 32; ++i) {
            const float q = clampf(rne((xs[i] + shift) * inverse), 0.f, top);
            const float e = q * step - shift - xs[i];
            codes[32 * j + i] = static_cast<uint8_t>(q);
            error += static_cast<double>(e * e);
        }
#endif
    }
#if defined(__AVX2__)
    error = hsum(acc);
#endif
    return error;
}

// kquants._refit_super_scales: least-squares (d, dmin) over the block, kept where it decodes closer
static void refit_super(const float* x, const uint8_t* sc, const uint8_t* mc, uint16_t& d, uint16_t& dmin,
                        int nmax, uint8_t* codes, int rounds = 2) {
    double error = affine_decode(x, sc, mc, d, dmin, nmax, codes);
    uint8_t trial[256];
    double sbb = 0;
    for (int j = 0; j < 8; ++j) sbb += static_cast<double>(mc[j]) * mc[j];
    sbb *= 32;
    for (int round = 0; round < rounds; ++round) {
        double saa = 0, sab = 0, sax = 0, sbx = 0;
        for (int j = 0; j < 8; ++j) {
            const double s = sc[j], m = mc[j];
            for (int i = 0; i < 32; ++i) {
                const double a = s * codes[32 * j + i], xv = x[32 * j + i];
                saa += a * a, sab += a * m, sax += a * xv, sbx += m * xv;
            }
        }
        const double det = saa * sbb - sab * sab;
        const bool ok = det > 1e-30 * saa * sbb;
        double new_d = ok ? (sbb * sax - sab * sbx) / det : sax / (saa > 0 ? saa : 1.0);
        double new_dmin = ok ? (sab * sax - saa * sbx) / det : static_cast<double>(half_value(dmin));
        if (new_d < 0) new_d = 0;      // clamp(min=0); NaN stays NaN (then not finite below)
        if (new_dmin < 0) new_dmin = 0;
        uint16_t nd = half_bits(static_cast<float>(new_d)), ndmin = half_bits(static_cast<float>(new_dmin));
        if (!std::isfinite(half_value(nd)) || !std::isfinite(half_value(ndmin))) nd = d, ndmin = dmin;
        const double new_error = affine_decode(x, sc, mc, nd, ndmin, nmax, trial);
        if (new_error < error) {
            d = nd, dmin = ndmin, error = new_error;
            std::memcpy(codes, trial, 256);
        }
    }
}

// kquants._refit_sub_scales: per sub-block least-squares (scale, min) for the current codes,
// rounded to 6 bits; the block keeps the new integers if they decode closer
static void refit_sub(const float* x, uint8_t* sc, uint8_t* mc, uint16_t d, uint16_t dmin, int nmax, uint8_t* codes) {
    const double error = affine_decode(x, sc, mc, d, dmin, nmax, codes);
    const double inv_d = recip(static_cast<double>(half_value(d))), inv_dmin = recip(static_cast<double>(half_value(dmin)));
    uint8_t new_s[8], new_m[8], trial[256];
    for (int j = 0; j < 8; ++j) {
        double sq = 0, sqq = 0, sx = 0, sqx = 0;
        for (int i = 0; i < 32; ++i) {
            const double q = codes[32 * j + i], xv = x[32 * j + i];
            sq += q, sqq += q * q, sx += xv, sqx += q * xv;
        }
        const double n = 32, det = n * sqq - sq * sq;
        const bool ok = det > 0;
        const double alpha = ok ? (n * sqx - sq * sx) / det : 0.0;
        const double beta = ok ? (sq * sqx - sqq * sx) / det : -sx / n;
        new_s[j] = static_cast<uint8_t>(std::min(std::max(std::nearbyint(alpha * inv_d), 0.0), 63.0));
        new_m[j] = static_cast<uint8_t>(std::min(std::max(std::nearbyint(std::max(beta, 0.0) * inv_dmin), 0.0), 63.0));
    }
    if (affine_decode(x, new_s, new_m, d, dmin, nmax, trial) < error) {
        std::memcpy(sc, new_s, 8), std::memcpy(mc, new_m, 8), std::memcpy(codes, trial, 256);
    }
}

// d, dmin, 6-bit scales and mins, codes [8][32] of one 256-element block (kquants._affine_codes)
static void affine_block(const float* x, const Affine& p, uint16_t& d, uint16_t& dmin, uint8_t* sc, uint8_t* mc,
                         uint8_t* codes) {
    float scale[8], offset[8];
    for (int j = 0; j < 8; ++j) {
        affine_search(x + 32 * j, p, scale[j], offset[j]);
        scale[j] = scale[j] > 0.f ? scale[j] : 0.f;  // clamp(min=0)
    }
    six_bit(scale, sc, d);
    six_bit(offset, mc, dmin);
    refit_super(x, sc, mc, d, dmin, p.nmax, codes);
    refit_sub(x, sc, mc, d, dmin, p.nmax, codes);
    refit_super(x, sc, mc, d, dmin, p.nmax, codes);
}

static void pack_scales(const uint8_t* s, const uint8_t* m, uint8_t* out) {  // kquants._pack_scales
    for (int j = 0; j < 4; ++j) {
        out[j] = static_cast<uint8_t>(s[j] | ((s[j + 4] >> 4) << 6));
        out[4 + j] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
        out[8 + j] = static_cast<uint8_t>((s[j + 4] & 0x0F) | ((m[j + 4] & 0x0F) << 4));
    }
}

static void nibble_pairs(const uint8_t* codes, uint8_t* out) {  // sub-blocks 2i, 2i+1 share 32 bytes
    for (int pair = 0; pair < 4; ++pair)
        for (int i = 0; i < 32; ++i)
            out[32 * pair + i] = static_cast<uint8_t>((codes[64 * pair + i] & 0x0F) | ((codes[64 * pair + 32 + i] & 0x0F) << 4));
}

static void q4_k(const float* x, uint8_t* out) {
    uint16_t d, dmin;
    uint8_t sc[8], mc[8], codes[256];
    affine_block(x, AFFINE_Q4, d, dmin, sc, mc, codes);
    put_half(out, d);
    put_half(out + 2, dmin);
    pack_scales(sc, mc, out + 4);
    nibble_pairs(codes, out + 16);
}

static void q5_k(const float* x, uint8_t* out) {
    uint16_t d, dmin;
    uint8_t sc[8], mc[8], codes[256];
    affine_block(x, AFFINE_Q5, d, dmin, sc, mc, codes);
    put_half(out, d);
    put_half(out + 2, dmin);
    pack_scales(sc, mc, out + 4);
    for (int i = 0; i < 32; ++i) {  // bit b of byte i <- bit 4 of sub-block b's code i
        int high = 0;
        for (int b = 0; b < 8; ++b) high |= ((codes[32 * b + i] >> 4) & 1) << b;
        out[16 + i] = static_cast<uint8_t>(high);
    }
    nibble_pairs(codes, out + 48);
}

// ---- Q6_K (kquants.q6_k, search.symmetric_search) ------------------------------------------------
struct Symmetric {
    float offsets[19];  // 0, then 0.1 * i for i in -9..9, i != 0 (as float32)
};
static Symmetric make_symmetric() {
    Symmetric s{};
    int k = 1;
    for (int i = -9; i <= 9; ++i)
        if (i) s.offsets[k++] = static_cast<float>(0.1 * i);
    return s;
}
static const Symmetric SYMMETRIC = make_symmetric();

static inline float first_signed_max(const float* v, int n) {
    float best = std::fabs(v[0]);
    int at = 0;
    for (int j = 1; j < n; ++j)
        if (std::fabs(v[j]) > best) best = std::fabs(v[j]), at = j;
    return v[at];
}

// best x ~ scale * L, L in [-32, 31], weights x**2, for one 16-element sub-block
static float symmetric_search(const float* x) {
    const float peak = first_signed_max(x, 16);
    const float denom = peak == 0.f ? 1.f : peak;
    float wx[16], w[16];
    for (int i = 0; i < 16; ++i) w[i] = x[i] * x[i], wx[i] = w[i] * x[i];
    double best_merit = 0, best_lx = 0, best_l2 = 1;
    for (int c = 0; c < 19; ++c) {
        const float inverse = -(32.f + SYMMETRIC.offsets[c]) / denom;
        double lx = 0, l2 = 0;
#if defined(__AVX2__)
        {
            const __m256 vinverse = _mm256_set1_ps(inverse), lo = _mm256_set1_ps(-32.f), hi = _mm256_set1_ps(31.f);
            __m256d slx = _mm256_setzero_pd(), sl2 = _mm256_setzero_pd();
            for (int i = 0; i < 16; i += 8) {
                const __m256 l = round_clamp(_mm256_mul_ps(vinverse, _mm256_loadu_ps(x + i)), lo, hi);
                add_pd(slx, _mm256_mul_ps(l, _mm256_loadu_ps(wx + i)));
                add_pd(sl2, _mm256_mul_ps(_mm256_mul_ps(l, l), _mm256_loadu_ps(w + i)));
            }
            lx = hsum(slx), l2 = hsum(sl2);
        }
#else
        for (int i = 0; i < 16; ++i) {
            const float l = clampf(rne(inverse * x[i]), -32.f, 31.f);
            lx += static_cast<double>(l * wx[i]), l2 += static_cast<double>(l * l * w[i]);
        }
#endif
        const double merit = l2 > 0 ? lx * lx / l2 : -1.0;
        if (c == 0 || merit > best_merit) best_merit = merit, best_lx = lx, best_l2 = l2 > 0 ? l2 : 1.0;
    }
    if (std::fabs(peak) < 1e-15f) return 0.f;
    return static_cast<float>(best_lx / best_l2);
}

static void q6_k(const float* x, uint8_t* out) {
    float scale[16];
    for (int j = 0; j < 16; ++j) scale[j] = symmetric_search(x + 16 * j);
    const uint16_t d_bits = half_bits(first_signed_max(scale, 16) / -128.f);
    const float d = half_value(d_bits), inverse = recip(d);
    uint8_t codes[256];
    int8_t scale_codes[16];
    for (int j = 0; j < 16; ++j) {
        const float s = clampf(rne(scale[j] * inverse), -128.f, 127.f);
        scale_codes[j] = static_cast<int8_t>(s);
        const float step = d * s, step_inverse = recip(step);
        for (int i = 0; i < 16; ++i)
            codes[16 * j + i] = static_cast<uint8_t>(clampf(rne(x[16 * j + i] * step_inverse), -32.f, 31.f) + 32.f);
    }
    for (int half = 0; half < 2; ++half) {
        const uint8_t* c = codes + 128 * half;
        for (int j = 0; j < 64; ++j)   // low nibbles: byte j <- elements j, 64 + j
            out[64 * half + j] = static_cast<uint8_t>((c[j] & 0x0F) | ((c[64 + j] & 0x0F) << 4));
        for (int j = 0; j < 32; ++j)   // high 2 bits: byte j <- elements j, 32 + j, 64 + j, 96 + j
            out[128 + 32 * half + j] = static_cast<uint8_t>(((c[j] >> 4) & 3) | (((c[32 + j] >> 4) & 3) << 2)
                                                             | (((c[64 + j] >> 4) & 3) << 4) | (((c[96 + j] >> 4) & 3) << 6));
    }
    std::memcpy(out + 192, scale_codes, 16);
    put_half(out + 208, d_bits);
}

// ---- dispatch -------------------------------------------------------------------------------------
using Encoder = void (*)(const float*, uint8_t*);
struct Type {
    Encoder encode;
    int elements, bytes;
    int64_t grain;  // blocks per parallel chunk: ~64K elements of work for the cheap types
};

static bool type_of(int qtype, Type& t) {
    switch (qtype) {
        case Q8_0: t = {q8_0, 32, 34, 4096}; return true;
        case Q4_0: t = {q4_0, 32, 18, 4096}; return true;
        case Q4_1: t = {q4_1, 32, 20, 4096}; return true;
        case Q5_0: t = {q5_0, 32, 22, 4096}; return true;
        case Q5_1: t = {q5_1, 32, 24, 4096}; return true;
        case Q4_K: t = {q4_k, 256, 144, 32}; return true;
        case Q5_K: t = {q5_k, 256, 176, 32}; return true;
        case Q6_K: t = {q6_k, 256, 210, 64}; return true;
        default: return false;
    }
}

bool handles(int qtype) {
    Type t;
    return type_of(qtype, t);
}

// Whether every value is finite (exponent bits not all ones): an integer OR, which vectorizes,
// over the block the encoder is about to read anyway (a separate pass over the tensor cost ~10%).
static inline bool finite_block(const float* x, int n) {
    uint32_t bad = 0;
    for (int j = 0; j < n; ++j) {
        uint32_t bits;
        std::memcpy(&bits, x + j, 4);
        bad |= static_cast<uint32_t>((bits & 0x7F800000u) == 0x7F800000u);
    }
    return bad == 0;
}

// Encodes every block; returns false if any input value was NaN or infinite (the bytes of such
// blocks are then meaningless, and the caller refuses the tensor).
bool quantize(int64_t src_ptr, int64_t dst_ptr, int64_t blocks, int qtype) {
    Type t;
    if (!type_of(qtype, t)) throw std::invalid_argument("gguf_quant: unsupported type " + std::to_string(qtype));
    const float* src = reinterpret_cast<const float*>(src_ptr);
    uint8_t* dst = reinterpret_cast<uint8_t*>(dst_ptr);
    std::atomic<bool> finite{true};
    auto encode_range = [&](int64_t begin, int64_t end) {
        bool ok = true;
        for (int64_t b = begin; b < end; ++b) {
            ok &= finite_block(src + b * t.elements, t.elements);
            t.encode(src + b * t.elements, dst + b * t.bytes);
        }
        if (!ok) finite.store(false, std::memory_order_relaxed);
    };
#if defined(TOOLKIT_QUANT_PLAIN)
    // chunks of `grain` blocks over OpenMP's threads (OMP_NUM_THREADS); blocks are independent,
    // so the split changes no byte
    const int64_t chunks = (blocks + t.grain - 1) / t.grain;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t c = 0; c < chunks; ++c) encode_range(c * t.grain, std::min(blocks, (c + 1) * t.grain));
#else
    at::parallel_for(0, blocks, t.grain, encode_range);
#endif
    return finite.load();
}

}  // namespace gguf_quant

#if defined(TOOLKIT_QUANT_PLAIN)
// C entry point for ctypes: 1 = every value finite, 0 = some value was not, -1 = unknown type
extern "C" int toolkit_gguf_quantize(const float* src, uint8_t* dst, int64_t blocks, int qtype) {
    if (!gguf_quant::handles(qtype)) return -1;
    return gguf_quant::quantize(reinterpret_cast<int64_t>(src), reinterpret_cast<int64_t>(dst), blocks, qtype) ? 1 : 0;
}
#else
PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
    namespace py = pybind11;
    module.def("quantize", &gguf_quant::quantize, py::call_guard<py::gil_scoped_release>());
    module.def("handles", &gguf_quant::handles);
}
#endif
