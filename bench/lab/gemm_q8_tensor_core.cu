// Lab (issue 7): a first tensor-core GEMM for prompt windows, Y[t][n] = sum_k W[n][k] X[t][k] with W in Q8_0 blocks,
// as one standalone file. The engine's GEMM path (matmul.cu, T > 8 tokens) dequantizes W to an f32 panel and runs a
// CUDA-core f32 GEMM: ~1.3 TFLOP/s on the H200 (bench/NOTES.md, 2026-12-01), which made 64-token prompt windows 2.6x
// slower than windows of 8. This kernel dequantizes each 128 x 32 tile of W to fp16 in shared memory (no panel in
// global memory) and multiplies it with the fp16 activations on tensor cores (WMMA 16x16x16, f32 sums). It checks
// itself against a double-precision host product of the same fp16-rounded inputs, then times Flash-Next-like shapes.
// Written in session 7 without a GPU to run it on: the next session runs it first, then ports it into matmul.cu.
//
//   nvcc -O3 -arch=sm_90 bench/lab/gemm_q8_tensor_core.cu -o /tmp/gemm_q8 && /tmp/gemm_q8
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#define CHECK(call)                                                                                 \
    do {                                                                                            \
        cudaError_t e = (call);                                                                     \
        if (e != cudaSuccess) {                                                                     \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e)); \
            std::exit(1);                                                                           \
        }                                                                                           \
    } while (0)

using namespace nvcuda;

constexpr int kBlock = 32;                  // Q8_0: 32 weights per block
constexpr int kBlockBytes = 2 + kBlock;     // fp16 scale, then 32 int8
constexpr int kTileRows = 128, kTileTokens = 64, kTileK = kBlock;
constexpr int kPad = 8;                     // halves of padding per shared row (bank conflicts)
constexpr int kThreads = 256;               // 8 warps: 4 along rows x 2 along tokens, 32 x 32 outputs each

// One thread block: rows [n0, n0 + 128) x tokens [t0, t0 + 64). Shapes: N % 128 == 0, T % 64 == 0, K % 32 == 0.
__global__ void __launch_bounds__(kThreads) gemm_q8_0_wmma(const uint8_t* w, const __half* x, float* y, int n_rows,
                                                           int k_len) {
    // WMMA loads need 32-byte aligned tile pointers: rows of 40 halves (80 bytes) at 16-row steps are, from an
    // aligned start.
    __shared__ __align__(32) __half ws[kTileRows][kTileK + kPad];
    __shared__ __align__(32) __half xs[kTileTokens][kTileK + kPad];
    const int tid = threadIdx.x, warp = tid / 32;
    const int n0 = blockIdx.x * kTileRows, t0 = blockIdx.y * kTileTokens;
    const int warp_n = (warp % 4) * 32, warp_t = (warp / 4) * 32;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
    for (auto& row : acc)
        for (auto& f : row) wmma::fill_fragment(f, 0.0f);
    const int blocks_per_row = k_len / kBlock;

    for (int kb = 0; kb < blocks_per_row; ++kb) {
        // W: thread -> (row tid / 2, half tid % 2 of the block): scale times 16 int8 values, as fp16.
        {
            const int r = tid / 2, part = tid % 2;
            const uint8_t* blk = w + (static_cast<size_t>(n0 + r) * blocks_per_row + kb) * kBlockBytes;
            const float d = __half2float(*reinterpret_cast<const __half*>(blk));
            const int8_t* q = reinterpret_cast<const int8_t*>(blk + 2) + part * 16;
#pragma unroll
            for (int i = 0; i < 16; ++i) ws[r][part * 16 + i] = __float2half_rn(d * static_cast<float>(q[i]));
        }
        // X: thread -> (token tid / 4, 8 consecutive halves).
        {
            const int t = tid / 4, c = (tid % 4) * 8;
            const uint4 v = *reinterpret_cast<const uint4*>(x + static_cast<size_t>(t0 + t) * k_len + kb * kBlock + c);
            *reinterpret_cast<uint4*>(&xs[t][c]) = v;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kTileK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(a[i], &ws[warp_n + 16 * i][kk], kTileK + kPad);
#pragma unroll
            for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(b[j], &xs[warp_t + 16 * j][kk], kTileK + kPad);
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
    // C(n, t) goes to y[t * n_rows + n]: a column-major store with leading dimension n_rows.
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j)
            wmma::store_matrix_sync(y + static_cast<size_t>(t0 + warp_t + 16 * j) * n_rows + n0 + warp_n + 16 * i,
                                    acc[i][j], n_rows, wmma::mem_col_major);
}

struct Problem {
    int n, k, t;
    std::vector<uint8_t> w;   // Q8_0 rows
    std::vector<__half> x;    // fp16 activations
};

Problem make_problem(int n, int k, int t, std::mt19937& rng) {
    Problem p{n, k, t, std::vector<uint8_t>(static_cast<size_t>(n) * (k / kBlock) * kBlockBytes),
              std::vector<__half>(static_cast<size_t>(t) * k)};
    std::uniform_int_distribution<int> q(-127, 127);
    std::uniform_real_distribution<float> scale(0.001f, 0.02f), value(-2.0f, 2.0f);
    for (size_t b = 0; b < p.w.size() / kBlockBytes; ++b) {
        const __half d = __float2half(scale(rng));
        std::memcpy(&p.w[b * kBlockBytes], &d, 2);
        for (int i = 0; i < kBlock; ++i)
            p.w[b * kBlockBytes + 2 + i] = static_cast<uint8_t>(static_cast<int8_t>(q(rng)));
    }
    for (auto& v : p.x) v = __float2half(value(rng));
    return p;
}

// The kernel's output and its time per call (median of `reps` after one warm-up).
std::pair<std::vector<float>, float> run(const Problem& p, int reps) {
    uint8_t* w;
    __half* x;
    float* y;
    CHECK(cudaMalloc(&w, p.w.size()));
    CHECK(cudaMalloc(&x, p.x.size() * sizeof(__half)));
    CHECK(cudaMalloc(&y, static_cast<size_t>(p.t) * p.n * sizeof(float)));
    CHECK(cudaMemcpy(w, p.w.data(), p.w.size(), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(x, p.x.data(), p.x.size() * sizeof(__half), cudaMemcpyHostToDevice));
    const dim3 grid(p.n / kTileRows, p.t / kTileTokens);
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    std::vector<float> ms;
    for (int r = 0; r <= reps; ++r) {
        CHECK(cudaEventRecord(start));
        gemm_q8_0_wmma<<<grid, kThreads>>>(w, x, y, p.n, p.k);
        CHECK(cudaEventRecord(stop));
        CHECK(cudaEventSynchronize(stop));
        float t = 0;
        CHECK(cudaEventElapsedTime(&t, start, stop));
        if (r > 0) ms.push_back(t);
    }
    CHECK(cudaGetLastError());
    std::vector<float> out(static_cast<size_t>(p.t) * p.n);
    CHECK(cudaMemcpy(out.data(), y, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(cudaFree(w));
    CHECK(cudaFree(x));
    CHECK(cudaFree(y));
    std::sort(ms.begin(), ms.end());
    return {out, ms.empty() ? 0.0f : ms[ms.size() / 2]};
}

int main() {
    std::mt19937 rng(7);
    // Correctness: every output against a double-precision product of the same inputs (each weight d * q rounded to
    // fp16 as the kernel rounds it); f32 sums on tensor cores should land within ~1e-5 of the row's scale.
    {
        const Problem p = make_problem(256, 512, 128, rng);
        const auto [got, ms] = run(p, 0);
        double worst = 0, scale = 0;
        const int blocks = p.k / kBlock;
        for (int t = 0; t < p.t; ++t)
            for (int n = 0; n < p.n; ++n) {
                double ref = 0;
                for (int b = 0; b < blocks; ++b) {
                    const uint8_t* blk = &p.w[(static_cast<size_t>(n) * blocks + b) * kBlockBytes];
                    __half dh;
                    std::memcpy(&dh, blk, 2);
                    const float d = __half2float(dh);
                    for (int i = 0; i < kBlock; ++i) {
                        const float q = static_cast<float>(static_cast<int8_t>(blk[2 + i]));
                        const float wv = __half2float(__float2half_rn(d * q));
                        const float xv = __half2float(p.x[static_cast<size_t>(t) * p.k + b * kBlock + i]);
                        ref += static_cast<double>(wv) * xv;
                    }
                }
                scale = std::max(scale, std::fabs(ref));
                worst = std::max(worst, std::fabs(ref - got[static_cast<size_t>(t) * p.n + n]));
            }
        std::printf("check 256 x 512 x 128: max |error| %.3g of a largest |output| %.3g (relative %.3g) %s\n", worst,
                    scale, worst / scale, worst / scale < 1e-4 ? "ok" : "FAILED");
        if (!(worst / scale < 1e-4)) return 1;
    }
    std::printf("| rows | k | tokens | ms | TFLOP/s | weight GB/s |\n| ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (const auto& [n, k] : {std::pair{4096, 2560}, std::pair{2560, 4096}, std::pair{12288, 2560}})
        for (int t : {64, 256, 512}) {
            const Problem p = make_problem(n, k, t, rng);
            const float ms = run(p, 10).second;
            const double flop = 2.0 * n * k * t;
            std::printf("| %d | %d | %d | %.3f | %.1f | %.0f |\n", n, k, t, ms, flop / (ms * 1e-3) / 1e12,
                        static_cast<double>(p.w.size()) / (ms * 1e-3) / 1e9);
        }
}
