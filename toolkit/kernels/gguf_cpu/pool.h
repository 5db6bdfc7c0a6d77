// A small "help-first" thread pool for the decode GEMVs: the calling thread never waits for a
// worker to wake up.
//
// Why not at::parallel_for (OpenMP) here: toolkit loads OpenMP with passive waiting (see
// toolkit/core/openmp.py), so each parallel region first wakes a sleeping worker (a futex), and on
// the 2-core dev VM that cost 100-200 us, more than a whole 1024x640 GEMV (~60 us). The region then
// also waits at its closing barrier for that worker, which on a machine where another process holds
// the other core can take a scheduler timeslice (milliseconds). Spinning OpenMP workers fix the
// first and make the second worse.
//
// Here a job is a count of chunks; the caller publishes it and then claims chunks itself, one at a
// time, from a shared counter, exactly like the workers do. It waits only for chunks a worker has
// already claimed and is running. A worker that is asleep, descheduled, or does not exist (after a
// fork) simply claims nothing, so the worst case is the single-thread time plus one atomic per
// chunk. Workers spin (bounded, ~`kSpinMicros`) for the next job after each one, because decode
// issues a GEMV every few tens of microseconds; after that they sleep on a condition variable, so
// an idle process costs no CPU.
//
// Thread count: at::get_num_threads() at each call (torch.set_num_threads and toolkit's CoreShare
// govern it), so the pool never uses more threads than torch would.
#pragma once

#include <ATen/Parallel.h>
#include <pthread.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace gguf_cpu {

class HelpFirstPool {
public:
    using Job = void (*)(void* context, int64_t chunk);
    static constexpr int64_t kSpinMicros = 300;  // covers the Python gap between two GEMVs of a layer

    // Run job(context, c) for c in [0, chunks) on up to `threads` threads (the caller included).
    void run(int64_t chunks, int threads, Job job, void* context) {
        const int helpers = static_cast<int>(std::min<int64_t>(threads, chunks)) - 1;
        // One job at a time: a second caller (another Python thread, the GIL being released)
        // runs its own chunks alone instead of waiting.
        std::unique_lock<std::mutex> owner(run_mutex_, std::try_to_lock);
        if (helpers <= 0 || !owner.owns_lock()) {
            for (int64_t c = 0; c < chunks; ++c) job(context, c);
            return;
        }
        ensure_workers(helpers);
        // Close the previous job (no claim of it can succeed any more), then fill in this one.
        const uint64_t gen = (state_.load() >> 32) + 1;
        state_.store((gen - 1) << 32 | kClosed);
        job_.store(job, std::memory_order_relaxed), context_.store(context, std::memory_order_relaxed);
        chunks_.store(chunks, std::memory_order_relaxed), helpers_.store(helpers, std::memory_order_relaxed);
        done_.store(0);
        state_.store(gen << 32);  // open: chunk 0 is next
        if (sleepers_.load() > 0) {
            std::lock_guard<std::mutex> lock(mutex_);
            wake_.notify_all();
        }
        int64_t finished = 0;
        for (int64_t c; (c = claim(gen, chunks)) >= 0; ++finished) job(context, c);
        // Only chunks some worker claimed are left; they are running now.
        if (finished) done_.fetch_add(finished);
        total_.fetch_add(chunks, std::memory_order_relaxed);
        while (done_.load() < chunks) _mm_pause();
        state_.store(gen << 32 | kClosed);
    }

    int workers() const { return static_cast<int>(workers_.size()); }
    // Chunks run (by anyone) and chunks run by workers since start: how much the helpers helped.
    int64_t chunks_run() const { return total_.load(std::memory_order_relaxed); }
    int64_t chunks_helped() const { return helped_.load(std::memory_order_relaxed); }

    static HelpFirstPool& instance() {
        // Never destroyed (workers are detached and may still sleep at exit); re-created after a
        // fork, whose child has none of the parent's threads.
        static HelpFirstPool* pool = [] {
            pthread_atfork(nullptr, nullptr, [] { current() = new HelpFirstPool(); });
            return new HelpFirstPool();
        }();
        if (!current()) current() = pool;
        return *current();
    }

private:
    static constexpr uint64_t kClosed = 0xFFFFFFFFu;

    static HelpFirstPool*& current() {
        static HelpFirstPool* pointer = nullptr;
        return pointer;
    }

    // The next chunk of job `gen`, or -1 when it has none left (or is no longer the open job).
    int64_t claim(uint64_t gen, int64_t chunks) {
        uint64_t s = state_.load();
        for (;;) {
            if ((s >> 32) != gen || (s & kClosed) == kClosed || static_cast<int64_t>(s & kClosed) >= chunks) return -1;
            if (state_.compare_exchange_weak(s, s + 1)) return static_cast<int64_t>(s & kClosed);
        }
    }

    void ensure_workers(int count) {
        while (static_cast<int>(workers_.size()) < count) {
            const int id = static_cast<int>(workers_.size());
            workers_.emplace_back([this, id] { work(id); });
            workers_.back().detach();
        }
    }

    void work(int id) {
        uint64_t seen = 0;  // the newest generation this worker has run or found already closed
        for (;;) {
            const uint64_t s = state_.load();
            const uint64_t gen = s >> 32;
            if (gen == seen || (s & kClosed) == kClosed) {
                // Nothing to do. After a wake-up that came too late (the job already closed), spin
                // again rather than sleep: the next GEMV is likely a few microseconds away.
                seen = gen;
                if (!spin_for_change(seen)) sleep_until_change(seen);
                continue;
            }
            seen = gen;
            // Read the job after seeing it open; a claim below succeeds only while it still is,
            // which means these fields were not rewritten in between (run() closes a job first).
            const Job job = job_.load(std::memory_order_relaxed);
            void* const context = context_.load(std::memory_order_relaxed);
            const int64_t chunks = chunks_.load(std::memory_order_relaxed);
            if (id >= helpers_.load(std::memory_order_relaxed)) continue;  // fewer threads wanted for this job
            int64_t finished = 0;
            for (int64_t c; (c = claim(gen, chunks)) >= 0; ++finished) job(context, c);
            if (finished) done_.fetch_add(finished), helped_.fetch_add(finished, std::memory_order_relaxed);
        }
    }

    // Spin until a new job opens (true) or the spin time runs out (false).
    bool spin_for_change(uint64_t seen) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicros);
        for (;;) {
            for (int i = 0; i < 64; ++i) {
                const uint64_t s = state_.load(std::memory_order_relaxed);
                if ((s >> 32) != seen && (s & kClosed) != kClosed) return true;
                _mm_pause();
            }
            if (std::chrono::steady_clock::now() > until) return false;
        }
    }

    void sleep_until_change(uint64_t seen) {
        std::unique_lock<std::mutex> lock(mutex_);
        sleepers_.fetch_add(1);  // seq_cst with run()'s publish-then-check: one of us sees the other
        wake_.wait(lock, [&] { return (state_.load() >> 32) != seen; });  // a job was published since
        sleepers_.fetch_sub(1);
    }

    std::atomic<uint64_t> state_{kClosed};  // generation << 32 | next chunk (kClosed: none open)
    std::atomic<int64_t> done_{0};
    std::atomic<int64_t> total_{0}, helped_{0};
    std::atomic<int> sleepers_{0};
    // the open job (written while no job is open, read by workers before they claim)
    std::atomic<Job> job_{nullptr};
    std::atomic<void*> context_{nullptr};
    std::atomic<int64_t> chunks_{0};
    std::atomic<int> helpers_{0};
    std::mutex run_mutex_, mutex_;
    std::condition_variable wake_;
    std::vector<std::thread> workers_;
};

// parallel over [0, n) in chunks of `grain` on the pool, with at::get_num_threads() threads.
template <class F>
void pool_for(int64_t n, int64_t grain, const F& body) {
    if (n <= 0) return;
    grain = std::max<int64_t>(1, grain);
    const int64_t chunks = (n + grain - 1) / grain;
    struct Ctx { const F* body; int64_t n, grain; } ctx{&body, n, grain};
    HelpFirstPool::instance().run(chunks, at::get_num_threads(), [](void* p, int64_t c) {
        const Ctx& k = *static_cast<const Ctx*>(p);
        (*k.body)(c * k.grain, std::min(k.n, (c + 1) * k.grain));
    }, &ctx);
}

}  // namespace gguf_cpu
