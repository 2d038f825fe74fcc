#include "core/thread_pool.h"

#include <algorithm>

namespace strata {

ThreadPool::ThreadPool(int n_threads) {
    for (int i = 1; i < std::max(1, n_threads); ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard lock(mutex_);
        stop_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
}

static void run_share(const std::function<void(int64_t, int64_t)>& fn, int64_t n, int index, int count) {
    const int64_t begin = n * index / count;
    const int64_t end = n * (index + 1) / count;
    if (begin < end) fn(begin, end);
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    if (n <= 0) return;
    if (workers_.empty() || n == 1) {
        fn(0, n);
        return;
    }
    {
        std::lock_guard lock(mutex_);
        job_ = &fn;
        job_n_ = n;
        pending_ = static_cast<int>(workers_.size());
        ++generation_;
    }
    wake_.notify_all();
    run_share(fn, n, 0, size());
    std::unique_lock lock(mutex_);
    done_.wait(lock, [this] { return pending_ == 0; });
    job_ = nullptr;
}

void ThreadPool::worker_loop(int index) {
    uint64_t seen = 0;
    for (;;) {
        const std::function<void(int64_t, int64_t)>* job;
        int64_t n;
        {
            std::unique_lock lock(mutex_);
            wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
            if (stop_) return;
            seen = generation_;
            job = job_;
            n = job_n_;
        }
        run_share(*job, n, index, size());
        {
            std::lock_guard lock(mutex_);
            if (--pending_ == 0) done_.notify_one();
        }
    }
}

int default_thread_count() { return std::max(1u, std::thread::hardware_concurrency()); }

}  // namespace strata
