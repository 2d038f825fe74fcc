// Norms and activations of the GDN and attention blocks, as the CPU reference computes them: sums of squares in
// double (each square exact in double, so only the order of the additions differs from the CPU), scales rounded to
// float, products rounded one by one without fused multiply-adds; activations with the device's expf (within 2 ulp).
#include <algorithm>
#include <string>

#include "backend/cuda/activation_device.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/norm_device.cuh"

namespace strata::cuda {

namespace {

constexpr int kNormThreads = 256;  // 8 warps, one group each

enum class NormKind { Rms, L2 };

// The end of both norm kernels: the group's scale from its sum of squares (in double, rounded to float as the CPU
// does), then the values from `first` on in steps of `step`, each product rounded on its own.
template <NormKind kKind>
__device__ __forceinline__ void scale_group(const GroupNormArgs& a, int64_t g, const float* x, float* out, double sum,
                                            int64_t first, int64_t step) {
    float scale;
    if constexpr (kKind == NormKind::Rms)
        scale = kernels::rms_scale(sum, a.group, a.eps);
    else
        scale = static_cast<float>(1.0 / sqrt(sum + a.eps));
    const float* gamma = a.gamma ? a.gamma + (a.gamma_shared ? 0 : g * a.group) : nullptr;
    for (int64_t i = first; i < a.group; i += step) {
        const float v = __fmul_rn(x[i], scale);
        out[i] = gamma ? __fmul_rn(v, gamma[i]) : v;
    }
}

// One warp per (token, group).
template <NormKind kKind>
__global__ void __launch_bounds__(kNormThreads) group_norm_kernel(GroupNormArgs a, int64_t row_stride) {
    kernels::enter_dependent_grid();
    const int lane = static_cast<int>(threadIdx.x) % 32;
    const int64_t item = static_cast<int64_t>(blockIdx.x) * (kNormThreads / 32) + threadIdx.x / 32;
    if (item >= a.n_tokens * a.n_groups) return;  // whole warps leave together
    const int64_t t = item / a.n_groups, g = item % a.n_groups;
    const float* x = a.x + t * row_stride + g * a.group;
    float* out = a.out + t * row_stride + g * a.group;
    // Each lane rewrites only the values it read itself, so out may equal x.
    scale_group<kKind>(a, g, x, out, kernels::warp_sum_of_squares(x, a.group, lane), lane, 32);
}

// One block per (token, group), for long groups (the hyper-connection norm: 4 groups of 2,560 at Flash-Next): a warp per
// group left one SM reading 10,240 values with 8 warps (34 us under ncu). Each thread sums a strided share in double,
// the warps' sums meet in shared memory, and every thread rewrites only the values it read.
template <NormKind kKind>
__global__ void __launch_bounds__(kNormThreads) group_norm_block_kernel(GroupNormArgs a, int64_t row_stride) {
    kernels::enter_dependent_grid();
    const int64_t item = blockIdx.x, t = item / a.n_groups, g = item % a.n_groups;
    const float* x = a.x + t * row_stride + g * a.group;
    float* out = a.out + t * row_stride + g * a.group;
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < a.group; i += kNormThreads) sum += static_cast<double>(x[i]) * x[i];
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    __shared__ double warp_sums[kNormThreads / 32];
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
    __syncthreads();
    double total = 0.0;
#pragma unroll
    for (int w = 0; w < kNormThreads / 32; ++w) total += warp_sums[w];
    scale_group<kKind>(a, g, x, out, total, threadIdx.x, kNormThreads);
}

// Groups at least this long take a block each.
constexpr int64_t kBlockPerGroupFrom = 1024;

template <NormKind kKind>
void launch_group_norm(Context& ctx, const GroupNormArgs& a, const char* name) {
    if (a.n_tokens < 0 || a.n_groups < 0 || a.group < 0)
        throw Error(std::string("CUDA ") + name + ": negative token, group or group-size count");
    if (a.n_tokens == 0 || a.n_groups == 0 || a.group == 0) return;
    if (!a.x || !a.out) throw Error(std::string("CUDA ") + name + ": null x or out");
    const int64_t row_stride = a.row_stride ? a.row_stride : a.n_groups * a.group;
    if (a.n_tokens > 1 && row_stride < a.n_groups * a.group)
        throw Error(std::string("CUDA ") + name + ": row_stride is shorter than n_groups * group");
    STRATA_CUDA_CHECK(cudaSetDevice(ctx.info().index));
    const int64_t items = a.n_tokens * a.n_groups;
    constexpr int64_t kPerBlock = kNormThreads / 32;
    const int64_t blocks = (items + kPerBlock - 1) / kPerBlock;
    if (blocks > 0x7fffffff) throw Error(std::string("CUDA ") + name + ": too many groups in one call");
    GroupNormArgs args = a;
    if (kKind == NormKind::L2) args.gamma = nullptr;
    if (a.group >= kBlockPerGroupFrom) {
        if (items > 0x7fffffff) throw Error(std::string("CUDA ") + name + ": too many groups in one call");
        launch_dependent("group_norm_block_kernel", group_norm_block_kernel<kKind>, dim3(static_cast<unsigned>(items)),
                         dim3(kNormThreads), 0, ctx.stream().handle(), args, row_stride);
        return;
    }
    launch_dependent("group_norm_kernel", group_norm_kernel<kKind>, dim3(static_cast<unsigned>(blocks)),
                     dim3(kNormThreads), 0, ctx.stream().handle(), args, row_stride);
}

constexpr int kElementThreads = 256;

unsigned element_blocks(int64_t n) {
    return static_cast<unsigned>(std::min<int64_t>((n + kElementThreads - 1) / kElementThreads, 65536));
}

// cpu::sigmoid and cpu::silu_mul (activation_device.cuh).
__global__ void sigmoid_kernel(float* x, int64_t n) {
    kernels::enter_dependent_grid();
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        x[i] = kernels::sigmoid(x[i]);
}

__global__ void silu_mul_kernel(float* g, const float* u, int64_t n) {
    kernels::enter_dependent_grid();
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const float v = g[i];
        g[i] = __fmul_rn(kernels::silu(v), u[i]);
    }
}

}  // namespace

void rms_norm_grouped(Context& ctx, const GroupNormArgs& a) {
    launch_group_norm<NormKind::Rms>(ctx, a, "rms_norm_grouped");
}

void l2_norm(Context& ctx, const GroupNormArgs& a) {
    launch_group_norm<NormKind::L2>(ctx, a, "l2_norm");
}

void sigmoid_inplace(Context& ctx, float* x, int64_t n) {
    if (n < 0) throw Error("CUDA sigmoid_inplace: negative length");
    if (n == 0) return;
    if (!x) throw Error("CUDA sigmoid_inplace: null pointer");
    STRATA_CUDA_CHECK(cudaSetDevice(ctx.info().index));
    launch_dependent("sigmoid_kernel", sigmoid_kernel, dim3(element_blocks(n)), dim3(kElementThreads), 0,
                     ctx.stream().handle(), x, n);
}

void silu_mul(Context& ctx, float* g, const float* u, int64_t n) {
    if (n < 0) throw Error("CUDA silu_mul: negative length");
    if (n == 0) return;
    if (!g || !u) throw Error("CUDA silu_mul: null pointer");
    STRATA_CUDA_CHECK(cudaSetDevice(ctx.info().index));
    launch_dependent("silu_mul_kernel", silu_mul_kernel, dim3(element_blocks(n)), dim3(kElementThreads), 0,
                     ctx.stream().handle(), g, u, n);
}

}  // namespace strata::cuda
