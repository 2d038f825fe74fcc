// A persistent pool of worker threads for data-parallel loops. The calling thread takes part in the work.
//
// Low wake-up latency: between jobs, workers spin on the job counter for a short while before they sleep (a decode
// step issues a few hundred jobs of tens of microseconds each, and a condition-variable wake costs as much). Ranges
// are claimed dynamically, so a thread slowed down by another process does not hold the others up; callers must not
// depend on which thread runs which range. Submitting a job allocates nothing.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <vector>

namespace strata {

class ThreadPool {
public:
    explicit ThreadPool(int n_threads);  // n_threads counts the caller; 1 means no workers
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return static_cast<int>(workers_.size()) + 1; }

    // Calls fn(begin, end) on disjoint ranges covering [0, n) of at most `grain` items (0: about n / (4 * size()));
    // returns when all are done. Not reentrant: fn must not call parallel_for on the same pool.
    template <class Fn>
    void parallel_for(int64_t n, Fn&& fn, int64_t grain = 0) {
        using F = std::remove_reference_t<Fn>;
        run(n, grain, [](void* ctx, int64_t b, int64_t e) { (*static_cast<F*>(ctx))(b, e); },
            const_cast<void*>(static_cast<const void*>(&fn)));
    }

private:
    using Trampoline = void (*)(void* ctx, int64_t begin, int64_t end);
    void run(int64_t n, int64_t grain, Trampoline call, void* ctx);
    void work_on_current_job();
    void worker_loop();

    std::vector<std::thread> workers_;
    // The current job. Written by the submitting thread before generation_ is bumped (release), read after.
    Trampoline call_ = nullptr;
    void* ctx_ = nullptr;
    int64_t n_ = 0;
    int64_t grain_ = 1;
    alignas(64) std::atomic<int64_t> next_{0};      // first unclaimed item
    alignas(64) std::atomic<int> unfinished_{0};    // workers still inside the current job
    alignas(64) std::atomic<uint64_t> generation_{0};
    std::atomic<bool> stop_{false};
};

int default_thread_count();  // physical parallelism of this machine

// fn(i) for every i in [0, n): spread over `pool` when it has workers and n >= min_parallel, else on the caller. Each
// i is done by one thread alone, so results do not depend on the split (the per-token glue of a prompt).
template <class Fn>
void parallel_each(ThreadPool* pool, int64_t n, Fn&& fn, int64_t min_parallel = 4) {
    if (pool == nullptr || pool->size() <= 1 || n < min_parallel) {
        for (int64_t i = 0; i < n; ++i) fn(i);
        return;
    }
    pool->parallel_for(n, [&fn](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) fn(i);
    });
}

}  // namespace strata
