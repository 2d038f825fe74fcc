#include "core/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define STRATA_CPU_RELAX() _mm_pause()
#else
#define STRATA_CPU_RELAX() ((void)0)
#endif

namespace strata {

namespace {
// How long an idle worker spins before it sleeps: long enough to cover the gap between two jobs of one forward pass
// (tens of microseconds), short enough not to burn a core between requests.
constexpr auto kSpin = std::chrono::microseconds(2000);
}  // namespace

ThreadPool::ThreadPool(int n_threads) {
    for (int i = 1; i < std::max(1, n_threads); ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
    stop_.store(true);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    for (auto& w : workers_) w.join();
}

void ThreadPool::work_on_current_job() {
    for (;;) {
        const int64_t begin = next_.fetch_add(grain_, std::memory_order_relaxed);
        if (begin >= n_) return;
        call_(ctx_, begin, std::min(n_, begin + grain_));
    }
}

void ThreadPool::run(int64_t n, int64_t grain, Trampoline call, void* ctx) {
    if (n <= 0) return;
    if (grain <= 0) grain = std::max<int64_t>(1, n / (4 * size()));
    if (workers_.empty() || n <= grain) {
        call(ctx, 0, n);
        return;
    }
    call_ = call;
    ctx_ = ctx;
    n_ = n;
    grain_ = grain;
    next_.store(0, std::memory_order_relaxed);
    unfinished_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    work_on_current_job();
    // A worker that is late is usually descheduled (more runnable threads than cores): after a short spin, give the
    // core away instead of burning the time slice it needs.
    for (int spins = 0; unfinished_.load(std::memory_order_acquire) != 0; ++spins) {
        if (spins < 4096) {
            STRATA_CPU_RELAX();
        } else {
            std::this_thread::yield();
        }
    }
}

void ThreadPool::worker_loop() {
    uint64_t seen = 0;  // the generation at construction: a job submitted before this thread got here is still seen
    for (;;) {
        uint64_t now = generation_.load(std::memory_order_acquire);
        if (now == seen) {
            const auto until = std::chrono::steady_clock::now() + kSpin;
            int spins = 0;
            while ((now = generation_.load(std::memory_order_acquire)) == seen) {
                STRATA_CPU_RELAX();
                if (++spins % 256 == 0) {
                    if (std::chrono::steady_clock::now() > until) {
                        generation_.wait(seen, std::memory_order_acquire);
                    } else {
                        std::this_thread::yield();  // let a runnable thread have the core while we wait
                    }
                }
            }
        }
        seen = now;
        if (stop_.load()) return;
        work_on_current_job();
        unfinished_.fetch_sub(1, std::memory_order_acq_rel);
    }
}

int default_thread_count() { return std::max(1u, std::thread::hardware_concurrency()); }

}  // namespace strata
