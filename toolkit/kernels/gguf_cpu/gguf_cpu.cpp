// Compiled CPU kernels for packed GGUF weights: a GEMV that reads the file's bytes directly
// (fused.h with AVX2 + FMA; otherwise a row buffer from blocks.h and a dot product), and a row
// dequantizer (for the tile-then-GEMM path of many-token calls).
//
// Contract (the Python side, ops.py, checks it before calling): `w` is `rows` contiguous packed
// rows of `row_bytes` bytes, each `cols` logical elements of type `qtype`; `x` is `m` contiguous
// float32 rows of `cols`; `out` is `m` contiguous float32 rows of `rows`. Pointers travel as
// integers so this file needs only ATen's parallel header (fast to compile), and the GIL is
// released for the whole call. A decode GEMV splits its rows on the help-first pool of pool.h
// (the caller never waits for a sleeping worker); the dequantizer uses at::parallel_for. Both take
// torch.get_num_threads() threads, so torch.set_num_threads governs them like every other op.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "blocks.h"
#include "fused.h"
#include "gemm.h"
#include "pool.h"

namespace gguf_cpu {

static inline float dot(const float* a, const float* b, int64_t n) {
#if defined(__AVX2__) && defined(__FMA__)
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    const __m256 s = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float total = _mm_cvtss_f32(h);
    for (; i < n; ++i) total += a[i] * b[i];
    return total;
#else
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; ++k) s[k] += a[i + k] * b[i + k];
    float total = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; ++i) total += a[i] * b[i];
    return total;
#endif
}


// Rows per parallel chunk of a GEMV: at least ~4M weight-times-token products (~0.5 ms on one core).
// Why so many: waking a sleeping OpenMP worker (passive waiting, see toolkit/__init__.py) cost
// 100-200 us on the 2-core dev VM, so a 256x640 GEMV took 37 us on one thread and 222 us on two;
// only the large matrices (the LM head, 12 ms -> 22 ms on one thread) gain from a second thread.
static int64_t min_chunk = int64_t(1) << 22;
static int64_t grain_for(int64_t cols, int64_t m = 1) {
    return std::max<int64_t>(1, min_chunk / std::max<int64_t>(cols * m, 1));
}
// Tuning hook (not called by toolkit): rerun the grain measurements on another machine.
void set_min_chunk(int64_t products) { min_chunk = std::max<int64_t>(1, products); }
// Rows per chunk of a decode GEMV on the help-first pool (pool.h): ~64K weight-times-token products
// (~10 us on one core), so even a 256x640 GEMV splits; whole 16-row groups keep threads' outputs on
// separate cache lines. Small chunks cost one atomic each and balance a late or slow helper.
static int64_t pool_products = int64_t(1) << 16;
static int64_t pool_grain(int64_t cols, int64_t m) {
    const int64_t rows = std::max<int64_t>(1, pool_products / std::max<int64_t>(cols * m, 1));
    return (rows + 15) / 16 * 16;
}
// Tuning hook (not called by toolkit).
void set_pool_chunk(int64_t products) { pool_products = std::max<int64_t>(1, products); }
// Prefill GEMM (gemm.h) chunks: ~2M weight-times-token products (~40 us on one core), claimed one at
// a time from a shared counter by the threads of one OpenMP region. The former split gave each
// thread one fixed range of rows, so the call waited for the slower thread (one woken late, or
// whose core another process held); now a thread that starts late just takes fewer chunks. The
// help-first pool (pool.h) was measured too: its worker spins ~300 us after each job, which suits
// decode's back-to-back GEMVs but here burned a core next to the norms and attention between
// GEMMs (more CPU time, and slower under load).
static int64_t gemm_products = int64_t(1) << 21;
static int64_t gemm_grain(int64_t cols, int64_t m) {  // in tiles of LANE_ROWS rows
    return std::max<int64_t>(1, gemm_products / std::max<int64_t>(int64_t(8) * cols * m, 1));
}
// Tuning hook (not called by toolkit; a test makes chunks small so two threads share a matrix).
void set_gemm_chunk(int64_t products) { gemm_products = std::max<int64_t>(1, products); }
// Rows per chunk when dequantizing a prefill tile: ~256K weights.
static int64_t dequant_grain(int64_t cols) { return std::max<int64_t>(1, (int64_t(1) << 18) / std::max<int64_t>(cols, 1)); }

// x[n] (n a multiple of 32) to int8 per 32-element slice: q = round-half-even(x / d), d = max|x| / 127
// (0 for an all-zero slice); also d and d * sum(q) per slice. |x - d q| <= d / 2.
// The AVX2 path computes the same float32 products and the same rounding (vroundps to nearest
// even = nearbyint in the default mode), so both paths give identical bytes.
void quantize_activations(const float* x, int64_t n, int8_t* q, float* d, float* qsum) {
    for (int64_t b = 0; b < n / 32; ++b) {
        const float* xb = x + 32 * b;
#if defined(__AVX2__)
        const __m256 magnitude_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
        __m256 v[4], top = _mm256_setzero_ps();
        for (int k = 0; k < 4; ++k) {
            v[k] = _mm256_loadu_ps(xb + 8 * k);
            top = _mm256_max_ps(top, _mm256_and_ps(v[k], magnitude_mask));
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        const float amax = _mm_cvtss_f32(h);
        const float scale = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
        const __m256 vinv = _mm256_set1_ps(inv), hi = _mm256_set1_ps(127.f), lo = _mm256_set1_ps(-127.f);
        __m256i i32[4];
        for (int k = 0; k < 4; ++k) {
            const __m256 r = _mm256_round_ps(_mm256_mul_ps(v[k], vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            i32[k] = _mm256_cvtps_epi32(_mm256_min_ps(hi, _mm256_max_ps(lo, r)));
        }
        const __m256i total = _mm256_add_epi32(_mm256_add_epi32(i32[0], i32[1]), _mm256_add_epi32(i32[2], i32[3]));
        __m128i t = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
        // packs work per 128-bit lane: the permute puts the four 8-value groups back in order
        const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(i32[0], i32[1]), _mm256_packs_epi32(i32[2], i32[3]));
        _mm256_storeu_si256((__m256i*)(q + 32 * b),
                            _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
        d[b] = scale;
        qsum[b] = scale * static_cast<float>(_mm_cvtsi128_si32(t));
#else
        float amax = 0.f;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
        const float scale = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
        int sum = 0;
        for (int j = 0; j < 32; ++j) {
            const int v = static_cast<int>(std::nearbyint(xb[j] * inv));
            q[32 * b + j] = static_cast<int8_t>(std::max(-127, std::min(127, v)));
            sum += q[32 * b + j];
        }
        d[b] = scale;
        qsum[b] = scale * static_cast<float>(sum);
#endif
    }
}

// m rows of x quantized (quantize_activations); split over the threads only past ~1M elements
// (~0.5 ms on one core): waking a sleeping OpenMP worker costs 100-200 us on a small shared
// machine, more than quantizing a 128 x 640 prefill activation (~40 us) takes.
static void quantize_rows(const float* x, int64_t m, int64_t cols, int8_t* xq, float* xd, float* xsum) {
    const int64_t nsub = cols / 32;
    at::parallel_for(0, m, std::max<int64_t>(1, (int64_t(1) << 20) / std::max<int64_t>(cols, 1)), [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i)
            quantize_activations(x + i * cols, cols, xq + i * cols, xd + i * nsub, xsum + i * nsub);
    });
}

// Many-token product with 8-bit activations (gemm.h): false where this build or type has no such
// path (no AVX2; the caller then dequantizes tiles and uses a float GEMM).
bool gemm(int64_t x_ptr, int64_t w_ptr, int64_t out_ptr, int64_t m, int64_t rows, int64_t cols, int64_t row_bytes,
          int qtype) {
#if defined(__AVX2__) && defined(__FMA__)
    LaneRowsFn rows_fn = lane_gemm_for(qtype);
    if (!rows_fn) return false;
    const float* x = reinterpret_cast<const float*>(x_ptr);
    const uint8_t* w = reinterpret_cast<const uint8_t*>(w_ptr);
    float* out = reinterpret_cast<float*>(out_ptr);
    const int64_t nsub = cols / 32;
    std::vector<int8_t> xq(m * cols);
    std::vector<float> xd(m * nsub), xsum(m * nsub);
    quantize_rows(x, m, cols, xq.data(), xd.data(), xsum.data());
    const int64_t tiles = (rows + LANE_ROWS - 1) / LANE_ROWS, grain = gemm_grain(cols, m);
    const int64_t chunks = (tiles + grain - 1) / grain;
    std::atomic<int64_t> next{0};
    const int threads = static_cast<int>(std::min<int64_t>(at::get_num_threads(), chunks));
    at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {  // one index per thread; each claims chunks
        for (int64_t c; (c = next.fetch_add(1)) < chunks;)
            rows_fn(w, row_bytes, xq.data(), xd.data(), xsum.data(), out, m, rows, cols, c * grain * LANE_ROWS,
                    std::min(rows, (c + 1) * grain * LANE_ROWS));
    });
    return true;
#else
    (void)x_ptr, (void)w_ptr, (void)out_ptr, (void)m, (void)rows, (void)cols, (void)row_bytes, (void)qtype;
    return false;
#endif
}

void gemv(int64_t x_ptr, int64_t w_ptr, int64_t out_ptr, int64_t m, int64_t rows, int64_t cols,
          int64_t row_bytes, int qtype, bool int8) {
    const float* x = reinterpret_cast<const float*>(x_ptr);
    const uint8_t* w = reinterpret_cast<const uint8_t*>(w_ptr);
    float* out = reinterpret_cast<float*>(out_ptr);
#if defined(__AVX2__) && defined(__FMA__)
    Int8RowsFn integer = int8 ? int8_for(qtype, m) : nullptr;
    if (integer) {
        const int64_t nsub = cols / 32;
        std::vector<int8_t> xq(m * cols);
        std::vector<float> xd(m * nsub), xsum(m * nsub);
        quantize_rows(x, m, cols, xq.data(), xd.data(), xsum.data());
        pool_for(rows, pool_grain(cols, m), [&](int64_t begin, int64_t end) {
            integer(w, row_bytes, xq.data(), xd.data(), xsum.data(), out, rows, cols, begin, end);
        });
        return;
    }
    if (RowsFn fused = fused_for(qtype, m)) {
        const int64_t nsub = cols / 32;
        std::vector<float> xsum(m * nsub);  // per 32-element slice of x, for types with an offset
        for (int64_t i = 0; i < m * nsub; ++i) {
            float s = 0.f;
            for (int j = 0; j < 32; ++j) s += x[32 * i + j];
            xsum[i] = s;
        }
        pool_for(rows, pool_grain(cols, m), [&](int64_t begin, int64_t end) {
            fused(w, row_bytes, x, xsum.data(), out, rows, cols, begin, end);
        });
        return;
    }
#endif
    // Generic: decode a row into a small per-thread buffer (stays in L1/L2), then one dot per
    // activation row, so the row is decoded once however many activation rows there are.
    at::parallel_for(0, rows, grain_for(cols, m), [&](int64_t begin, int64_t end) {
        std::vector<float> buffer(cols);
        for (int64_t r = begin; r < end; ++r) {
            dequant_row(qtype, w + r * row_bytes, buffer.data(), cols);
            for (int64_t i = 0; i < m; ++i) out[i * rows + r] = dot(buffer.data(), x + i * cols, cols);
        }
    });
}

void dequantize(int64_t w_ptr, int64_t out_ptr, int64_t rows, int64_t cols, int64_t row_bytes, int qtype) {
    const uint8_t* w = reinterpret_cast<const uint8_t*>(w_ptr);
    float* out = reinterpret_cast<float*>(out_ptr);
    at::parallel_for(0, rows, dequant_grain(cols), [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) dequant_row(qtype, w + r * row_bytes, out + r * cols, cols);
    });
}

// Threads one GEMV of `rows` x `cols` really ran on (a test checks the pool uses torch's count).
int pool_threads_used(int64_t rows, int64_t cols) {
    std::mutex lock;
    std::vector<std::thread::id> ids;
    pool_for(rows, pool_grain(cols, 1), [&](int64_t, int64_t) {
        const auto me = std::this_thread::get_id();
        {
            std::lock_guard<std::mutex> guard(lock);
            if (std::find(ids.begin(), ids.end(), me) == ids.end()) ids.push_back(me);
        }
        const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
        while (std::chrono::steady_clock::now() < until) {}  // hold the chunk so a helper takes the next
    });
    return static_cast<int>(ids.size());
}

int block_elements(int qtype) { return block_elems(qtype); }

// How many threads one at::parallel_for of this build really uses (a test checks it is
// torch.get_num_threads(): built without OpenMP, parallel_for silently runs on one thread).
int parallel_threads() {
    std::vector<int> used(at::get_num_threads() + 1, 0);
    at::parallel_for(0, 1024, 1, [&](int64_t, int64_t) { used.at(at::get_thread_num()) = 1; });
    int count = 0;
    for (int flag : used) count += flag;
    return count;
}

// What the compiler enabled, for the bench and the logs.
const char* isa() {
#if defined(__AVX2__) && defined(__FMA__)
    return "avx2+fma (int8 activations: maddubs)";
#else
    return "scalar";
#endif
}

}  // namespace gguf_cpu

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
    namespace py = pybind11;
    module.def("gemv", &gguf_cpu::gemv, py::call_guard<py::gil_scoped_release>());
    module.def("quantize_activations", [](int64_t x, int64_t n, int64_t q, int64_t d, int64_t qsum) {
        gguf_cpu::quantize_activations(reinterpret_cast<const float*>(x), n, reinterpret_cast<int8_t*>(q),
                                       reinterpret_cast<float*>(d), reinterpret_cast<float*>(qsum));
    });
    module.def("gemm", &gguf_cpu::gemm, py::call_guard<py::gil_scoped_release>());
    module.def("dequantize", &gguf_cpu::dequantize, py::call_guard<py::gil_scoped_release>());
    module.def("set_min_chunk", &gguf_cpu::set_min_chunk);
    module.def("set_pool_chunk", &gguf_cpu::set_pool_chunk);
    module.def("set_gemm_chunk", &gguf_cpu::set_gemm_chunk);
    module.def("pool_chunks", [] {
        auto& pool = gguf_cpu::HelpFirstPool::instance();
        return std::make_pair(pool.chunks_run(), pool.chunks_helped());
    });
    module.def("pool_threads_used", &gguf_cpu::pool_threads_used, py::call_guard<py::gil_scoped_release>());
    module.def("parallel_threads", &gguf_cpu::parallel_threads);
    module.def("block_elements", &gguf_cpu::block_elements);
    module.def("isa", &gguf_cpu::isa);
}
