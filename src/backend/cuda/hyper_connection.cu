// Hyper-connection read and write (model_ops.h): the grouped RMS norm (elementwise.cu), the down / inject / up
// products (matmul), and two small kernels of this file: the silu of the low-rank product, and the sigmoid, stream
// mix and inject transform together.
#include <algorithm>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/model_ops.h"

namespace strata::cuda {

namespace {

constexpr int kThreads = 256;

// low[i] = silu(low[i] / hc), as cpu::silu of the quotient.
__global__ void low_rank_silu_kernel(float* low, int64_t n, float hc) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = low[i] / hc;
    low[i] = v / (1.0f + expf(-v));
}

// mixed[t][j] = (sum over streams s in order of sigmoid(g[t][s H + j]) * xn[t][s H + j]) / hc; the first T * hc threads
// also turn inject into 2 * sigmoid(inject / hc). Products and sums rounded step by step (no contraction), as the CPU.
__global__ void mix_kernel(const float* gate, const float* xn, float* mixed, float* inject, int64_t n_tokens,
                           int64_t hc, int64_t H) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const float fhc = static_cast<float>(hc);
    if (inject && i < n_tokens * hc) {
        const float v = inject[i] / fhc;
        inject[i] = 2.0f * (1.0f / (1.0f + expf(-v)));
    }
    if (i >= n_tokens * H) return;
    const int64_t t = i / H, j = i % H;
    const float* g = gate + t * hc * H + j;
    const float* x = xn + t * hc * H + j;
    float sum = 0.0f;
    for (int64_t s = 0; s < hc; ++s) {
        const float sg = 1.0f / (1.0f + expf(-g[s * H]));
        sum = __fadd_rn(sum, __fmul_rn(sg, x[s * H]));
    }
    mixed[i] = sum / fhc;
}

// residual[t][s][j] += inject[t][s] * block_out[t][j].
__global__ void write_kernel(float* residual, const float* block_out, const float* inject, int64_t n_tokens,
                             int64_t hc, int64_t H) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_tokens * hc * H) return;
    const int64_t ts = i / H, j = i % H, t = ts / hc;
    residual[i] = __fadd_rn(residual[i], __fmul_rn(inject[ts], block_out[t * H + j]));
}

unsigned blocks_for(int64_t n) {
    return static_cast<unsigned>((n + kThreads - 1) / kThreads);
}

}  // namespace

int64_t hyper_connection_workspace_floats(const HyperConnectionDims& s, int64_t n_tokens) {
    // xn [T x HC], low [T x r] (rounded up to 64 floats), gate [T x HC]
    const int64_t HC = s.n_streams * s.n_embd;
    return n_tokens * HC + (n_tokens * s.low_rank + 63) / 64 * 64 + n_tokens * HC;
}

void hyper_connection_read(Context& ctx, const HyperConnectionReadArgs& a) {
    const HyperConnectionDims& s = a.shape;
    const HyperConnectionDeviceWeights& w = a.weights;
    const int64_t T = a.n_tokens, hc = s.n_streams, H = s.n_embd, HC = hc * H, R = s.low_rank;
    if (T <= 0) return;
    if (hc <= 0 || H <= 0 || R <= 0) throw Error("CUDA hyper-connection read: bad shape");
    if (!a.residual || !a.mixed || !a.workspace || !w.norm || !w.down || !w.up)
        throw Error("CUDA hyper-connection read: null residual, output, workspace or weight");
    if (a.inject && !w.inject) throw Error("CUDA hyper-connection read: inject asked for without inject weights");
    if (w.down->ne[0] != HC || w.down->ne[1] != R || w.up->ne[0] != R || w.up->ne[1] != HC ||
        (a.inject && (w.inject->ne[0] != HC || w.inject->ne[1] != hc)))
        throw Error("CUDA hyper-connection read: weight shapes do not match the streams, width and rank");
    STRATA_CUDA_CHECK(cudaSetDevice(ctx.info().index));
    cudaStream_t stream = ctx.stream().handle();
    float* xn = a.workspace;
    float* low = xn + T * HC;
    float* gate = low + (T * R + 63) / 64 * 64;

    rms_norm_grouped(ctx, {.x = a.residual, .out = xn, .n_tokens = T, .n_groups = hc, .group = H, .gamma = w.norm,
                           .eps = s.eps});
    if (a.inject)
        matmul_shared_input(ctx, xn, T, {{w.down, low}, {w.inject, a.inject}});  // x quantized once for both
    else
        matmul(ctx, {.w = *w.down, .x = xn, .y = low, .n_tokens = T});
    low_rank_silu_kernel<<<blocks_for(T * R), kThreads, 0, stream>>>(low, T * R, static_cast<float>(hc));
    STRATA_CUDA_CHECK_LAUNCH("low_rank_silu_kernel");
    matmul(ctx, {.w = *w.up, .x = low, .y = gate, .n_tokens = T});
    mix_kernel<<<blocks_for(T * std::max(H, hc)), kThreads, 0, stream>>>(gate, xn, a.mixed, a.inject, T, hc, H);
    STRATA_CUDA_CHECK_LAUNCH("mix_kernel");
}

void hyper_connection_write(Context& ctx, const HyperConnectionDims& s, float* residual, const float* block_out,
                            const float* inject, int64_t n_tokens) {
    if (n_tokens <= 0) return;
    if (!residual || !block_out || !inject) throw Error("CUDA hyper-connection write: null pointer");
    if (s.n_streams <= 0 || s.n_embd <= 0) throw Error("CUDA hyper-connection write: bad shape");
    STRATA_CUDA_CHECK(cudaSetDevice(ctx.info().index));
    const int64_t n = n_tokens * s.n_streams * s.n_embd;
    write_kernel<<<blocks_for(n), kThreads, 0, ctx.stream().handle()>>>(residual, block_out, inject, n_tokens,
                                                                       s.n_streams, s.n_embd);
    STRATA_CUDA_CHECK_LAUNCH("write_kernel");
}

}  // namespace strata::cuda
