// Event timing of eager work (StreamProfiler) and the copy bandwidth the roofline figures use.
#include <cuda_runtime.h>

#include <cstdio>
#include <numeric>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"

namespace strata::cuda {

StreamProfiler::StreamProfiler(std::vector<std::string> kinds) : kinds_(std::move(kinds)), ms_(kinds_.size(), 0.0) {}

StreamProfiler::~StreamProfiler() {
    for (CUevent_st* e : events_)
        if (cudaEventDestroy(e) != cudaSuccess) (void)cudaGetLastError();
}

void StreamProfiler::mark(Context& ctx, int kind) {
    STRATA_ASSERT(kind >= 0 && static_cast<size_t>(kind) < kinds_.size());
    if (marks_.size() == events_.size()) {
        cudaEvent_t e = nullptr;
        STRATA_CUDA_CHECK(cudaEventCreate(&e));
        events_.push_back(e);
    }
    STRATA_CUDA_CHECK(cudaEventRecord(events_[marks_.size()], ctx.stream().handle()));
    marks_.push_back(kind);
}

void StreamProfiler::finish(Context& ctx) {
    if (marks_.empty()) return;
    mark(ctx, marks_.back());  // the end of the last section
    STRATA_CUDA_CHECK(cudaEventSynchronize(events_[marks_.size() - 1]));
    for (size_t i = 0; i + 1 < marks_.size(); ++i) {
        float ms = 0;
        STRATA_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i], events_[i + 1]));
        ms_[static_cast<size_t>(marks_[i])] += ms;
    }
    marks_.clear();
}

std::string StreamProfiler::report(int64_t n_tokens) const {
    const double total = std::accumulate(ms_.begin(), ms_.end(), 0.0);
    std::string out;
    char line[160];
    for (size_t k = 0; k < kinds_.size(); ++k) {
        if (ms_[k] == 0) continue;
        std::snprintf(line, sizeof line, "  %-22s %10.2f ms %10.1f us/token %6.1f%%\n", kinds_[k].c_str(), ms_[k],
                      1e3 * ms_[k] / static_cast<double>(std::max<int64_t>(n_tokens, 1)),
                      total > 0 ? 100.0 * ms_[k] / total : 0.0);
        out += line;
    }
    std::snprintf(line, sizeof line, "  %-22s %10.2f ms %10.1f us/token\n", "total", total,
                  1e3 * total / static_cast<double>(std::max<int64_t>(n_tokens, 1)));
    return out + line;
}

double measure_copy_bandwidth(Context& ctx, size_t bytes) {
    const DeviceBuffer a = ctx.allocate(bytes, "scratch"), b = ctx.allocate(bytes, "scratch");
    cudaStream_t s = ctx.stream().handle();
    STRATA_CUDA_CHECK(cudaMemsetAsync(a.data(), 1, bytes, s));
    STRATA_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, s));  // warm-up
    cudaEvent_t start = nullptr, stop = nullptr;
    STRATA_CUDA_CHECK(cudaEventCreate(&start));
    STRATA_CUDA_CHECK(cudaEventCreate(&stop));
    constexpr int kReps = 10;
    STRATA_CUDA_CHECK(cudaEventRecord(start, s));
    for (int i = 0; i < kReps; ++i)
        STRATA_CUDA_CHECK(cudaMemcpyAsync(i % 2 ? a.data() : b.data(), i % 2 ? b.data() : a.data(), bytes,
                                          cudaMemcpyDeviceToDevice, s));
    STRATA_CUDA_CHECK(cudaEventRecord(stop, s));
    STRATA_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    STRATA_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return 2.0 * static_cast<double>(bytes) * kReps / (static_cast<double>(ms) * 1e-3) / 1e9;
}

}  // namespace strata::cuda
