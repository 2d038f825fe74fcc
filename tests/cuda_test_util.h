// Shared by the CUDA test programs (tests/test_cuda_*.cpp), included only when the CUDA backend is compiled in: one
// device context per program, the skip without a device, CUDA error checks, random inputs, NMSE, and the two timing
// helpers the perf sections set their figures against (copy bandwidth, median replay of a captured graph).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "test_util.h"

namespace strata::cuda_test {

using strata::testing::gaussian_with_outliers;

using strata::testing::expect_error;

// Outputs are pre-filled with a quiet NaN no kernel produces by arithmetic, so unwritten values (and writes past the
// end, into sentinels) show.
constexpr uint32_t kPoison = 0x7fc0dead;

inline float poison() {
    float f;
    std::memcpy(&f, &kPoison, 4);
    return f;
}

inline bool is_poison(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u == kPoison;
}

// Why the tests named `tests` cannot run here, or "" when a device is present.
inline std::string device_skip_reason(const std::string& tests) {
    if (cuda::device_count() == 0) return "no CUDA device: " + tests + " skipped (" + cuda::no_device_reason() + ")";
    return "";
}

// One context for the whole program: creating one uploads the codebooks and takes the device's memory figures.
inline cuda::Context& context() {
    static std::unique_ptr<cuda::Context> ctx = std::make_unique<cuda::Context>();
    return *ctx;
}

inline std::vector<float> gaussian(size_t n, std::mt19937& rng, float sigma = 1.0f) {
    std::normal_distribution<float> d(0.0f, sigma);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
}

template <typename T>
cuda::DeviceBuffer upload(const std::vector<T>& v) {
    return context().upload(v.data(), std::max<size_t>(1, v.size()) * sizeof(T), "test");
}

template <typename T>
std::vector<T> download(const void* device, size_t n) {
    std::vector<T> v(n);
    context().download(device, v.data(), n * sizeof(T));
    return v;
}

// sum (got - ref)^2 / sum ref^2 over the first n values; a non-finite value makes it infinite.
inline double nmse(const float* got, const float* ref, size_t n) {
    double err2 = 0, ref2 = 0;
    for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(got[i])) return INFINITY;
        err2 += (static_cast<double>(got[i]) - ref[i]) * (static_cast<double>(got[i]) - ref[i]);
        ref2 += static_cast<double>(ref[i]) * ref[i];
    }
    return ref2 > 0 ? err2 / ref2 : err2;
}

inline double nmse(const std::vector<float>& got, const std::vector<float>& ref) {
    return nmse(got.data(), ref.data(), ref.size());
}

// Device-to-device copy bandwidth over 1 GiB, counting bytes read plus bytes written, in GB/s: the roofline.
inline double copy_bandwidth_gbs(cuda::Context& ctx) {
    return cuda::measure_copy_bandwidth(ctx, size_t{1} << 30);
}

// Median time of one replay of a graph holding the work `record` queues, in microseconds (-1 if capture fails).
template <typename Fn>
double graph_median_us(cuda::Context& ctx, Fn record, int reps = 21) {
    cudaStream_t stream = ctx.stream().handle();
    record();  // eager warm-up (and any one-time attribute set-up)
    ctx.synchronize();
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return -1;
    record();
    if (cudaStreamEndCapture(stream, &graph) != cudaSuccess) return -1;
    if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) return -1;
    cudaGraphLaunch(exec, stream);
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    std::vector<float> runs;
    for (int r = 0; r < reps; ++r) {
        cudaEventRecord(start, stream);
        cudaGraphLaunch(exec, stream);
        cudaEventRecord(stop, stream);
        cudaEventSynchronize(stop);
        float ms = 0;
        cudaEventElapsedTime(&ms, start, stop);
        runs.push_back(ms);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    std::sort(runs.begin(), runs.end());
    return runs[runs.size() / 2] * 1e3;
}

// rows x in weights of type t, each row quantized by our reference quantizer from its own random floats.
inline std::vector<uint8_t> random_weights(DType t, int64_t rows, int64_t in, std::mt19937& rng) {
    const size_t rb = strata::row_bytes(t, in);
    std::vector<uint8_t> w(rb * static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
        const std::vector<float> src = gaussian_with_outliers(in, rng);
        strata::quantize_row(t, src.data(), w.data() + rb * static_cast<size_t>(r), in);
    }
    return w;
}

inline strata::Tensor matrix(DType t, int64_t in, int64_t rows, const void* data, strata::Device device) {
    const int64_t ne[2] = {in, rows};
    strata::Tensor w = strata::make_tensor("w", t, 2, ne, data);
    w.device = device;
    return w;
}

}  // namespace strata::cuda_test

#define CHECK_CUDA(call)                                                           \
    do {                                                                           \
        const cudaError_t err_ = (call);                                           \
        ASSERT_EQ(err_, cudaSuccess) << #call << ": " << cudaGetErrorString(err_); \
    } while (0)

// Each program names its tests in kDeviceTests (e.g. "CUDA op tests") for the skip message.
#define SKIP_WITHOUT_DEVICE()                                                                             \
    do {                                                                                                  \
        if (const std::string why = strata::cuda_test::device_skip_reason(kDeviceTests); !why.empty()) { \
            GTEST_SKIP() << why;                                                                          \
        }                                                                                                 \
    } while (0)
