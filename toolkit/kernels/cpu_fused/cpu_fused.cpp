// Compiled CPU versions of a decoder layer's small ops, for float32 activations: RMSNorm (alone
// and after a residual add), rotary of q and k, the gated activation, the KV-cache store and
// paged attention. Each is one pass over its data instead of the 5-20 ATen calls the torch
// references (kernels/reference.py, the test oracle) make; at one decode token the tensors are a
// few KiB and the cost of the references is almost all per-call overhead.
//
// Contract (ops.py checks it before calling): every pointer is to float32 data unless named
// otherwise (int32 / int64 tables), rows are contiguous, a row stride is given where a caller's
// view may have one. Pointers travel as integers so only ATen's parallel header is needed; the
// GIL is released for the whole call.
#include <pybind11/pybind11.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace cpu_fused {

static inline float sum_squares(const float* x, int64_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // 8 lanes: vectorizable without -ffast-math
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; ++k) acc[k] += x[i + k] * x[i + k];
    float total = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; ++i) total += x[i] * x[i];
    return total;
}

static inline void norm_row(const float* x, const float* w, float* out, int64_t n, float eps, float offset) {
    const float inv = 1.0f / std::sqrt(sum_squares(x, n) / static_cast<float>(n) + eps);
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv * (offset + w[i]);
}

// Rows per parallel chunk of a norm: ~256K elements (~0.1 ms). Waking a sleeping OpenMP worker costs
// 100-200 us on a small shared machine, so a prefill's 128 x 640 norm stays on one thread.
static int64_t norm_grain(int64_t n) { return std::max<int64_t>(1, (int64_t(1) << 18) / std::max<int64_t>(n, 1)); }

// out[r] = x[r] / rms(x[r]) * (offset + w)
void rms_norm(int64_t x_ptr, int64_t w_ptr, int64_t out_ptr, int64_t rows, int64_t n, double eps, double offset) {
    const float* x = reinterpret_cast<const float*>(x_ptr);
    const float* w = reinterpret_cast<const float*>(w_ptr);
    float* out = reinterpret_cast<float*>(out_ptr);
    at::parallel_for(0, rows, norm_grain(n), [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) norm_row(x + r * n, w, out + r * n, n, float(eps), float(offset));
    });
}

// total = x + residual; out = rms_norm(total)
void add_rms_norm(int64_t x_ptr, int64_t res_ptr, int64_t w_ptr, int64_t out_ptr, int64_t total_ptr, int64_t rows,
                  int64_t n, double eps, double offset) {
    const float* x = reinterpret_cast<const float*>(x_ptr);
    const float* res = reinterpret_cast<const float*>(res_ptr);
    const float* w = reinterpret_cast<const float*>(w_ptr);
    float* out = reinterpret_cast<float*>(out_ptr);
    float* total = reinterpret_cast<float*>(total_ptr);
    at::parallel_for(0, rows, norm_grain(n), [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
            for (int64_t i = 0; i < n; ++i) total[r * n + i] = x[r * n + i] + res[r * n + i];
            norm_row(total + r * n, w, out + r * n, n, float(eps), float(offset));
        }
    });
}

// Rotate-half RoPE of the first `rotary_dim` features of each head; angle = float(position) * inv_freq
// in float32 as the reference computes it. x rows have `x_stride` floats; out rows are dense.
static void rotate(const float* x, int64_t x_stride, float* out, int64_t tokens,
                   int64_t heads, int64_t head_dim, int64_t rotary_dim, const float* cos_table,
                   const float* sin_table) {
    const int64_t half = rotary_dim / 2;
    for (int64_t t = 0; t < tokens; ++t) {
        const float* c = cos_table + t * half;
        const float* s = sin_table + t * half;
        for (int64_t h = 0; h < heads; ++h) {
            const float* in = x + t * x_stride + h * head_dim;
            float* o = out + (t * heads + h) * head_dim;
            for (int64_t j = 0; j < half; ++j) {
                const float a = in[j], b = in[j + half];
                o[j] = a * c[j] - b * s[j];
                o[j + half] = b * c[j] + a * s[j];
            }
            for (int64_t j = rotary_dim; j < head_dim; ++j) o[j] = in[j];
        }
    }
}

void rotary_qk(int64_t pos_ptr, int64_t q_ptr, int64_t q_stride, int64_t k_ptr, int64_t k_stride, int64_t inv_ptr,
               int64_t q_out_ptr, int64_t k_out_ptr, int64_t tokens, int64_t q_heads, int64_t k_heads,
               int64_t head_dim, int64_t rotary_dim) {
    const int64_t* positions = reinterpret_cast<const int64_t*>(pos_ptr);
    const float* inv_freq = reinterpret_cast<const float*>(inv_ptr);
    const int64_t half = rotary_dim / 2;
    std::vector<float> cos_table(tokens * half), sin_table(tokens * half);  // shared by q and k
    for (int64_t t = 0; t < tokens; ++t)
        for (int64_t j = 0; j < half; ++j) {
            const float angle = static_cast<float>(positions[t]) * inv_freq[j];
            cos_table[t * half + j] = std::cos(angle);
            sin_table[t * half + j] = std::sin(angle);
        }
    rotate(reinterpret_cast<const float*>(q_ptr), q_stride, reinterpret_cast<float*>(q_out_ptr), tokens,
           q_heads, head_dim, rotary_dim, cos_table.data(), sin_table.data());
    rotate(reinterpret_cast<const float*>(k_ptr), k_stride, reinterpret_cast<float*>(k_out_ptr), tokens,
           k_heads, head_dim, rotary_dim, cos_table.data(), sin_table.data());
}

#if defined(__AVX2__) && defined(__FMA__)
// exp of 8 floats: x = n ln2 + r (|r| <= ln2 / 2, ln2 split in two for an exact n ln2), e^r by
// the degree-7 Taylor-like minimax polynomial of Cephes' expf, times 2^n built in the exponent
// bits. Within ~2 float32 ulp of std::exp over the clamped range; inputs are clamped to
// [-87.3, 88.3] (e^x stays a normal float), which only moves results that round to 0 or
// overflow the activations' formulas anyway.
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
}
#endif

// out[t, i] = act(x[t, i]) * x[t, width + i]; act 0 = silu, 1 = gelu (tanh approximation), 2 = gelu (erf).
// silu and gelu-tanh are g / (1 + e^-z) (z = g, or 2 * sqrt(2 / pi) * (g + 0.044715 g^3)); with
// AVX2 eight at a time through exp8 (a prefill's 128 x 2048 gelu-tanh: 1.9 ms -> see the commit).
void gated_activation(int64_t x_ptr, int64_t out_ptr, int64_t tokens, int64_t width, int activation) {
    const float* x = reinterpret_cast<const float*>(x_ptr);
    float* out = reinterpret_cast<float*>(out_ptr);
    at::parallel_for(0, tokens, std::max<int64_t>(1, 16384 / std::max<int64_t>(width, 1)), [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
            const float* gate = x + t * 2 * width;
            const float* up = gate + width;
            float* o = out + t * width;
            int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
            if (activation == 0 || activation == 1) {
                const __m256 one = _mm256_set1_ps(1.0f), cube = _mm256_set1_ps(0.044715f);
                const __m256 factor = _mm256_set1_ps(-1.5957691216057308f), minus = _mm256_set1_ps(-1.0f);
                for (; i + 8 <= width; i += 8) {
                    const __m256 g = _mm256_loadu_ps(gate + i);
                    const __m256 z = activation == 0 ? _mm256_mul_ps(g, minus)
                        : _mm256_mul_ps(factor, _mm256_fmadd_ps(_mm256_mul_ps(cube, g), _mm256_mul_ps(g, g), g));
                    const __m256 a = _mm256_div_ps(g, _mm256_add_ps(one, exp8(z)));
                    _mm256_storeu_ps(o + i, _mm256_mul_ps(a, _mm256_loadu_ps(up + i)));
                }
            }
#endif
            for (; i < width; ++i) {
                const float g = gate[i];
                float a;
                if (activation == 0) a = g / (1.0f + std::exp(-g));
                // 0.5 (1 + tanh z) = 1 / (1 + exp(-2z)): one expf instead of tanhf (~2x faster here)
                else if (activation == 1) a = g / (1.0f + std::exp(-1.5957691216057308f * (g + 0.044715f * g * g * g)));
                else a = 0.5f * g * (1.0f + std::erf(g * 0.7071067811865476f));
                o[i] = a * up[i];
            }
        }
    });
}

// cache[slot[t]] = rows t of k and v ([kv_heads * head_dim] each, row stride given); slot < 0 skipped.
void store_kv(int64_t k_ptr, int64_t k_stride, int64_t v_ptr, int64_t v_stride, int64_t kc_ptr, int64_t vc_ptr,
              int64_t slot_ptr, int64_t tokens, int64_t width) {
    const float* k = reinterpret_cast<const float*>(k_ptr);
    const float* v = reinterpret_cast<const float*>(v_ptr);
    float* kc = reinterpret_cast<float*>(kc_ptr);
    float* vc = reinterpret_cast<float*>(vc_ptr);
    const int64_t* slots = reinterpret_cast<const int64_t*>(slot_ptr);
    for (int64_t t = 0; t < tokens; ++t) {
        if (slots[t] < 0) continue;
        std::memcpy(kc + slots[t] * width, k + t * k_stride, width * sizeof(float));
        std::memcpy(vc + slots[t] * width, v + t * v_stride, width * sizeof(float));
    }
}

// a . b over n floats. With AVX2 four independent 8-lane accumulators: one accumulator made each
// 256-element dot a chain of 32 dependent FMAs, latency-bound (a 128-token prefill's attention
// ran at ~10 G multiply-adds/s on one Zen 3 core).
static inline float dot_product(const float* a, const float* b, int64_t n) {
    int64_t i = 0;
    float total = 0.0f;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    const __m256 sum = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    total = _mm_cvtss_f32(h);
#else
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
    total = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
#endif
    for (; i < n; ++i) total += a[i] * b[i];
    return total;
}

// Paged causal attention. Token t of sequence s (query_start[s] <= t < query_start[s + 1]) sits at
// position seq_lens[s] - query_len + (t - query_start[s]) and sees keys at positions
// (position - window, position] (window 0: all earlier). q/out [T, heads, dim]; caches
// [blocks, block_size, kv_heads, dim]; block_tables [seqs, table_stride] int32 or int64. Softmax in float32
// over max-subtracted scores; optional tanh soft-capping of the scores.
void paged_attention(int64_t q_ptr, int64_t kc_ptr, int64_t vc_ptr, int64_t out_ptr, int64_t qsl_ptr,
                     int64_t seq_lens_ptr, int64_t tables_ptr, int64_t table_stride, bool tables_int64, int64_t seqs, int64_t tokens,
                     int64_t heads, int64_t kv_heads, int64_t dim, int64_t block_size, double scale, int64_t window,
                     double softcap) {
    const float* q = reinterpret_cast<const float*>(q_ptr);
    const float* kc = reinterpret_cast<const float*>(kc_ptr);
    const float* vc = reinterpret_cast<const float*>(vc_ptr);
    float* out = reinterpret_cast<float*>(out_ptr);
    const int32_t* qsl = reinterpret_cast<const int32_t*>(qsl_ptr);
    const int32_t* seq_lens = reinterpret_cast<const int32_t*>(seq_lens_ptr);
    const int32_t* tables32 = reinterpret_cast<const int32_t*>(tables_ptr);
    const int64_t* tables64 = reinterpret_cast<const int64_t*>(tables_ptr);
    auto block_of = [&](int64_t s, int64_t p) -> int64_t {  // the engine passes int64 tables, generate() int32
        const int64_t at = s * table_stride + p / block_size;
        return tables_int64 ? tables64[at] : int64_t(tables32[at]);
    };
    const int64_t groups = heads / kv_heads;
    int64_t longest = 0;
    for (int64_t s = 0; s < seqs; ++s) longest = std::max<int64_t>(longest, seq_lens[s]);
    // One work item is a (token, kv head) pair with the `groups` query heads that share it: each K and
    // V row is read once for all of them (from L1 for the second and later heads) instead of once per
    // query head. An item reads ~2 * context * dim floats; chunks of at least ~2M of them, since
    // waking a sleeping OpenMP worker costs 100-200 us on a small shared machine.
    const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 21) / std::max<int64_t>(2 * longest * dim * groups, 1));
    const auto run_items = [&](int64_t begin, int64_t end) {
        std::vector<float> scores(groups * std::max<int64_t>(longest, 1));
        std::vector<const float*> rows(std::max<int64_t>(longest, 1));  // V row of each visible position
        int64_t s = 0;
        for (int64_t item = begin; item < end; ++item) {
            const int64_t t = item / kv_heads, kvh = item % kv_heads;
            while (s + 1 < seqs && qsl[s + 1] <= t) ++s;
            while (s > 0 && qsl[s] > t) --s;
            const int64_t context = seq_lens[s], query_len = qsl[s + 1] - qsl[s];
            const int64_t position = context - query_len + (t - qsl[s]);
            const int64_t first = window > 0 ? std::max<int64_t>(0, position - window + 1) : 0;
            const float* q0 = q + (t * heads + kvh * groups) * dim;  // the group's query heads, consecutive
            float* o0 = out + (t * heads + kvh * groups) * dim;
            std::fill(o0, o0 + groups * dim, 0.0f);
            if (position < first) continue;
            const int64_t span = position - first + 1;
            for (int64_t p = first; p <= position; ++p) {
                const int64_t row = block_of(s, p) * block_size + p % block_size;
                const float* kv = kc + (row * kv_heads + kvh) * dim;
                for (int64_t g = 0; g < groups; ++g) {
                    float score = dot_product(q0 + g * dim, kv, dim) * float(scale);
                    if (softcap > 0) score = std::tanh(score / float(softcap)) * float(softcap);
                    scores[g * span + (p - first)] = score;
                }
            }
            for (int64_t g = 0; g < groups; ++g) {
                float* sc = scores.data() + g * span;
                float best = -std::numeric_limits<float>::infinity();
                for (int64_t j = 0; j < span; ++j) best = std::max(best, sc[j]);
                float total = 0.0f;
                int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
                __m256 sum8 = _mm256_setzero_ps();
                const __m256 top = _mm256_set1_ps(best);
                for (; j + 8 <= span; j += 8) {
                    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + j), top));
                    _mm256_storeu_ps(sc + j, e);
                    sum8 = _mm256_add_ps(sum8, e);
                }
                alignas(32) float lanes[8];
                _mm256_store_ps(lanes, sum8);
                for (int k = 0; k < 8; ++k) total += lanes[k];
#endif
                for (; j < span; ++j) total += (sc[j] = std::exp(sc[j] - best));
                const float norm = 1.0f / total;
                for (j = 0; j < span; ++j) sc[j] *= norm;
            }
            for (int64_t p = first; p <= position; ++p)
                rows[p - first] = vc + ((block_of(s, p) * block_size + p % block_size) * kv_heads + kvh) * dim;
            for (int64_t g = 0; g < groups; ++g) {
                const float* weights = scores.data() + g * span;
                float* o = o0 + g * dim;
                int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
                // 64 output values stay in eight ymm accumulators over all positions (no store per
                // position, which bounded the plain loop)
                for (; i + 64 <= dim; i += 64) {
                    __m256 acc[8];
                    for (int k = 0; k < 8; ++k) acc[k] = _mm256_setzero_ps();
                    for (int64_t j = 0; j < span; ++j) {
                        const __m256 w = _mm256_broadcast_ss(weights + j);
                        const float* vv = rows[j] + i;
                        for (int k = 0; k < 8; ++k) acc[k] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vv + 8 * k), acc[k]);
                    }
                    for (int k = 0; k < 8; ++k) _mm256_storeu_ps(o + i + 8 * k, acc[k]);
                }
#endif
                for (int64_t j = 0; j < span; ++j)
                    for (int64_t d = i; d < dim; ++d) o[d] += weights[j] * rows[j][d];
            }
        }
    };
    // A prompt's later tokens see more context (causal), so fixed halves of the items left the thread
    // with the second half ~3x the work (2 threads: 25 -> 21 ms for a 128-token Gemma 3 prefill). The
    // threads claim chunks from a shared counter instead, the longest-context chunks first.
    const int64_t items = tokens * kv_heads, chunks = (items + grain - 1) / grain;
    std::atomic<int64_t> next{0};
    const int threads = static_cast<int>(std::min<int64_t>(at::get_num_threads(), chunks));
    at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
        for (int64_t c; (c = next.fetch_add(1)) < chunks;) {
            const int64_t r = chunks - 1 - c;
            run_items(r * grain, std::min(items, (r + 1) * grain));
        }
    });
}

}  // namespace cpu_fused

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
    namespace py = pybind11;
    auto release = py::call_guard<py::gil_scoped_release>();
    module.def("rms_norm", &cpu_fused::rms_norm, release);
    module.def("add_rms_norm", &cpu_fused::add_rms_norm, release);
    module.def("rotary_qk", &cpu_fused::rotary_qk, release);
    module.def("gated_activation", &cpu_fused::gated_activation, release);
    module.def("store_kv", &cpu_fused::store_kv, release);
    module.def("paged_attention", &cpu_fused::paged_attention, release);
}
