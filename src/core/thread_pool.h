// A persistent pool of worker threads for data-parallel loops. The calling thread takes part in the work.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace strata {

class ThreadPool {
public:
    explicit ThreadPool(int n_threads);  // n_threads counts the caller; 1 means no workers
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return static_cast<int>(workers_.size()) + 1; }
    // Calls fn(begin, end) on disjoint ranges covering [0, n); returns when all are done.
    void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

private:
    void worker_loop(int index);
    std::vector<std::thread> workers_;
    std::mutex mutex_;
    std::condition_variable wake_;
    std::condition_variable done_;
    const std::function<void(int64_t, int64_t)>* job_ = nullptr;
    int64_t job_n_ = 0;
    uint64_t generation_ = 0;
    int pending_ = 0;
    bool stop_ = false;
};

int default_thread_count();  // physical parallelism of this machine

}  // namespace strata
