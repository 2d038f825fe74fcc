// The matrix product entry point: activations quantized on the device exactly as the CPU backend quantizes them,
// then the matvec kernels for up to kMaxMatvecTokens tokens, or for more tokens the tensor-core GEMM of
// gemm_tensor_core.cuh (quant weights, fp16 activations) or, for float weights, weights converted to f32 in row
// panels and a tiled f32 GEMM.
#include <cuda_fp16.h>

#include <algorithm>
#include <optional>
#include <string>

#include "backend/cuda/blas.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/internal.h"
#include "backend/cuda/gemm_tensor_core.cuh"
#include "backend/cuda/matvec_kernels.cuh"
#include "backend/cuda/quantize_device.cuh"

namespace strata::cuda {

namespace {

enum class ActivationFormat { F32, Q8_0, Q8_K };

// The CPU backend's activation type of each weight type (cpu::activation_type; llama.cpp's vec_dot_type).
ActivationFormat activation_format(DType w) {
    switch (w) {
        case DType::F32:
        case DType::F16:
        case DType::BF16: return ActivationFormat::F32;
        case DType::Q8_0:
        case DType::Q4_0:
        case DType::IQ4_NL: return ActivationFormat::Q8_0;
        default: return ActivationFormat::Q8_K;
    }
}

// ---- activation quantization ----------------------------------------------------------------------------------------

constexpr int kQuantizeThreads = 256;
using kernels::RowSource;
using kernels::SiluScaledSource;
using kernels::SwiGluSource;

// One thread per value, 256 values per thread block, grid.y over tokens. Q8_0: every warp is one block of 32, the
// rule of dtype.cpp's quantize_row(Q8_0): d = max|x| / 127 rounded to f16, q = roundf(x * (1 / d_unrounded)).
// Q8_K (in a multiple of 256): the whole thread block is one block, quant_k.cpp's quantize_q8_k: iscale = -127 / (the
// signed value of largest magnitude), q = min(127, nearest_int(iscale * x)), d = 1 / iscale.
// Where the values come from: quantize_device.cuh's sources (one thread per value).
template <ActivationFormat kFormat, typename Source = RowSource>
__global__ void __launch_bounds__(kQuantizeThreads)
    quantize_activations_kernel(const Source x, int64_t in, int64_t n_tokens, int8_t* q, float* d, float* s16) {
    __shared__ kernels::AbsMax warp_best[kQuantizeThreads / 32];
    kernels::enter_dependent_grid();  // the matvec kernel after it may start loading weights already
    const int lane = static_cast<int>(threadIdx.x) % 32;
    const int64_t e = static_cast<int64_t>(blockIdx.x) * kQuantizeThreads + threadIdx.x;
    for (int64_t t = blockIdx.y; t < n_tokens; t += gridDim.y) {
        if constexpr (kFormat == ActivationFormat::Q8_0) {
            if (e - lane >= in) return;  // whole warps: in is a multiple of 32
            kernels::quantize_q8_0_value(x(t, in, e), t * in + e, q, d, s16);
        } else {
            kernels::quantize_q8_k_value(x(t, in, e), t * in + e, true, q, d, s16, warp_best);
        }
    }
}

// hidden = silu(gate) * up for float weights (no quantization).
__global__ void swiglu_rows_kernel(const SwiGluSource src, int64_t in, int64_t n_rows) {
    const int64_t e = static_cast<int64_t>(blockIdx.x) * kQuantizeThreads + threadIdx.x;
    if (e >= in) return;
    for (int64_t t = blockIdx.y; t < n_rows; t += gridDim.y) (void)src(t, in, e);
}

// ---- tensor-core GEMM (T > kMaxMatvecTokens, quant weights) -----------------------------------------------------------

constexpr int kHalfThreads = 256;

// One block per token: xh[t * in + i] = d * q * 2^shift in fp16, and token_scale[t] = 2^-shift, the power of two that
// puts the token's largest possible |d * q| (127 max |d|) in [2^14, 2^15): no fp16 overflow (65504) for large
// activations, no subnormals for small ones, and the scaling is undone exactly on the f32 sums.
// The largest |d| of n scales, as the block's threads see it (every thread gets it).
__device__ __forceinline__ float block_max_abs(const float* d, int64_t n, float* warp_max) {
    float m = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, fabsf(d[i]));
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
    __syncthreads();
    m = warp_max[0];
    for (int w = 1; w < static_cast<int>(blockDim.x) / 32; ++w) m = fmaxf(m, warp_max[w]);
    return m;
}

// The power of two that puts 127 * m (the largest |d * q| a row can hold) in [2^14, 2^15).
__device__ __forceinline__ int half_shift(float m) {
    int e = 0;
    (void)frexpf(127.0f * m, &e);  // 127 m < 2^e
    return m > 0.0f ? max(-100, min(100, 15 - e)) : 0;
}

// The shift of a whole window (the cuBLAS path multiplies every token's sums by one alpha) in two launches: each of up
// to kWindowMaxBlocks blocks writes the largest |d| of its stretch, then one block takes the largest of those and
// writes out[0] = alpha = 2^-shift, out[1] = beta = 0, out[2] = 2^shift (what activations_to_half multiplies by).
// A maximum does not depend on the order it is taken in: the same shift as one block over every scale, which took
// 170 us a launch at 4,096 tokens of 10,240 values (7% of a Flash-Next prompt) on one SM.
constexpr int kWindowMaxBlocks = 1024;
constexpr int kWindowMaxThreads = 256;

__global__ void __launch_bounds__(kWindowMaxThreads) window_block_max_kernel(const float* d, int64_t n, float* maxima) {
    __shared__ float warp_max[kWindowMaxThreads / 32];
    const int64_t per_block = (n + gridDim.x - 1) / gridDim.x;
    const int64_t first = blockIdx.x * per_block, count = max(int64_t{0}, min(per_block, n - first));
    const float m = block_max_abs(d + first, count, warp_max);
    if (threadIdx.x == 0) maxima[blockIdx.x] = m;
}

__global__ void __launch_bounds__(1024) window_half_scale_kernel(const float* maxima, int64_t n, float* out) {
    __shared__ float warp_max[32];
    const int shift = half_shift(block_max_abs(maxima, n, warp_max));
    if (threadIdx.x == 0) {
        out[0] = ldexpf(1.0f, -shift);
        out[1] = 0.0f;
        out[2] = ldexpf(1.0f, shift);
    }
}

// With window_up set, the window's shift (window_half_scale_kernel) instead of the token's own, and no token_scale.
__global__ void __launch_bounds__(kHalfThreads)
    activations_to_half_kernel(const int8_t* q, const float* d, int64_t in, __half* xh, float* token_scale,
                               const float* window_up) {
    __shared__ float warp_max[kHalfThreads / 32];
    const int64_t t = blockIdx.x;
    const float* dt = d + t * (in / 32);
    float up = 0.0f;
    if (window_up) {
        up = *window_up;
    } else {
        const int shift = half_shift(block_max_abs(dt, in / 32, warp_max));
        if (threadIdx.x == 0) token_scale[t] = ldexpf(1.0f, -shift);
        up = ldexpf(1.0f, shift);
    }
    const int8_t* qt = q + t * in;
    __half* ot = xh + t * in;
    for (int64_t i = static_cast<int64_t>(threadIdx.x) * 8; i < in; i += kHalfThreads * 8) {
        const int2 v = *reinterpret_cast<const int2*>(qt + i);
        const float s = dt[i / 32] * up;
        const auto to_half2 = [s](int word, int byte) {
            return __floats2half2_rn(s * static_cast<float>(static_cast<int8_t>(word >> (8 * byte))),
                                     s * static_cast<float>(static_cast<int8_t>(word >> (8 * byte + 8))));
        };
        const __half2 h[4] = {to_half2(v.x, 0), to_half2(v.x, 2), to_half2(v.y, 0), to_half2(v.y, 2)};
        *reinterpret_cast<uint4*>(ot + i) = *reinterpret_cast<const uint4*>(h);
    }
}

// y[t * ldy + r] = the split-K partial sums of (t, r) added in split order (the same bits on every run).
__global__ void sum_split_k_kernel(const float* partials, int splits, int64_t rows, int64_t tokens, float* y,
                                   int64_t ldy) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= rows * tokens) return;
    float s = partials[i];
    for (int k = 1; k < splits; ++k) s += partials[k * rows * tokens + i];
    y[(i / rows) * ldy + i % rows] = s;
}

// Tiles and split-K of one GEMM. The split depends on the shape only (a fixed block target, not the device's SM
// count), so scratch sizes and each sum's order are the same on every device and run.
struct GemmPlan {
    int tile_tokens = 64;
    int splits = 1;
    int64_t k_tiles_per_split = 0;
};

// ~2 blocks of 256 threads on each of an H200's 132 SMs; split-K doubles while the blocks stay within 1.25x of it.
constexpr int64_t kGemmTargetBlocks = 264;
constexpr int kGemmMaxSplits = 8;
constexpr int64_t kGemmMinTilesPerSplit = 4;  // k tiles of 64: each split keeps its double buffer busy

GemmPlan gemm_plan(int64_t rows, int64_t in, int64_t tokens) {
    GemmPlan plan;
    // 128 tokens a block halve the weight decoding per product; below 256 tokens they would leave blocks half empty.
    plan.tile_tokens = tokens >= 256 ? 128 : 64;
    const int64_t tiles = (rows + kernels::kGemmRows - 1) / kernels::kGemmRows *
                          ((tokens + plan.tile_tokens - 1) / plan.tile_tokens);
    const int64_t k_tiles = (in + kernels::kGemmTileK - 1) / kernels::kGemmTileK;
    int splits = 1;
    while (splits < kGemmMaxSplits && tiles * splits * 2 * 4 <= kGemmTargetBlocks * 5 &&
           k_tiles >= kGemmMinTilesPerSplit * splits * 2)
        splits *= 2;
    plan.k_tiles_per_split = (k_tiles + splits - 1) / splits;
    plan.splits = static_cast<int>((k_tiles + plan.k_tiles_per_split - 1) / plan.k_tiles_per_split);  // none empty
    return plan;
}

// ---- GEMM (T > kMaxMatvecTokens) ------------------------------------------------------------------------------------

constexpr int kGemmTile = 64;
constexpr int kGemmTileK = 16;

// y[n * ldy + m] = sum_k w[m * k_len + k] * x[n * k_len + k] for m < rows, n < tokens: 64 x 64 outputs per block of
// 256 threads, 4 x 4 per thread, both operands staged through shared memory 16 k-steps at a time.
__global__ void __launch_bounds__(256) gemm_nt_kernel(const float* w, const float* x, float* y, int64_t rows,
                                                      int64_t tokens, int64_t k_len, int64_t ldy) {
    __shared__ float ws[kGemmTileK][kGemmTile];
    __shared__ float xs[kGemmTileK][kGemmTile];
    const int tid = static_cast<int>(threadIdx.x);
    const int tx = tid % 16, ty = tid / 16;
    const int64_t m0 = static_cast<int64_t>(blockIdx.x) * kGemmTile, n0 = static_cast<int64_t>(blockIdx.y) * kGemmTile;
    float acc[4][4] = {};
    for (int64_t k0 = 0; k0 < k_len; k0 += kGemmTileK) {
        // 64 rows x 16 k of each operand: thread tid loads row tid / 4, k (tid % 4) * 4 .. + 3.
        const int lr = tid / 4, lk = (tid % 4) * 4;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int64_t k = k0 + lk + j;
            const int64_t m = m0 + lr, n = n0 + lr;
            ws[lk + j][lr] = (m < rows && k < k_len) ? w[m * k_len + k] : 0.0f;
            xs[lk + j][lr] = (n < tokens && k < k_len) ? x[n * k_len + k] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kGemmTileK; ++kk) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = ws[kk][tx + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; ++j) b[j] = xs[kk][ty + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int64_t m = m0 + tx + 16 * i, n = n0 + ty + 16 * j;
            if (m < rows && n < tokens) y[n * ldy + m] = acc[i][j];
        }
}

// ---- helpers --------------------------------------------------------------------------------------------------------

size_t align_up(size_t n) {
    return (n + 255) / 256 * 256;
}

bool launch_matvec(const MatvecLaunch& l) {
    return launch_matvec_float(l) || launch_matvec_basic(l) || launch_matvec_kquant(l) || launch_matvec_iq(l);
}

bool launch_gemm(const GemmLaunch& l) {
    return launch_gemm_basic(l) || launch_gemm_kquant(l) || launch_gemm_iq(l);
}

bool launch_dequantize(const DequantizeLaunch& l) {
    return launch_dequantize_float(l) || launch_dequantize_basic(l) || launch_dequantize_kquant(l) ||
           launch_dequantize_iq(l);
}

// Bytes of f32 weight rows the GEMM path dequantizes at a time.
constexpr size_t kGemmPanelBytes = size_t{64} << 20;

}  // namespace

bool launch_matvec_any(const MatvecLaunch& l) {
    return launch_matvec(l);
}

bool supports_gemm_tensor_core(DType type) {
    switch (type) {
        case DType::Q8_0: case DType::Q4_0: case DType::IQ4_NL: case DType::IQ4_XS: case DType::Q2_K:
        case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: case DType::IQ2_XS:
        case DType::IQ3_XXS: case DType::IQ3_S: case DType::IQ1_M: return true;
        default: return false;
    }
}

size_t gemm_tile_shared_bytes(int tile_tokens) {
    return kernels::gemm_shared_bytes(tile_tokens);
}

bool launch_grouped_gemm(const GroupedGemmLaunch& l) {
    return launch_grouped_gemm_basic(l) || launch_grouped_gemm_kquant(l) || launch_grouped_gemm_iq(l);
}

void activations_to_half(const QuantizedActivations& act, int64_t in, int64_t n_rows, __half* x, float* row_scale,
                         cudaStream_t stream) {
    STRATA_ASSERT(in % 32 == 0 && n_rows > 0);
    activations_to_half_kernel<<<static_cast<unsigned>(n_rows), kHalfThreads, 0, stream>>>(act.q, act.d, in, x,
                                                                                           row_scale, nullptr);
    STRATA_CUDA_CHECK_LAUNCH("activations_to_half_kernel");
}

bool launch_dequantize_any(const DequantizeLaunch& l) {
    return launch_dequantize(l);
}

bool same_activation_format(DType a, DType b) {
    return activation_format(a) == activation_format(b);
}

bool reads_quantized_activations(DType w_type) {
    return activation_format(w_type) != ActivationFormat::F32;
}

QuantizedActivationBytes quantized_activation_bytes(DType w_type, int64_t n_values) {
    if (!reads_quantized_activations(w_type)) return {};
    const size_t n = static_cast<size_t>(n_values);
    return {.q = align_up(n), .d = align_up(n / 32 * 4), .s16 = align_up(n / 16 * 4)};
}

QuantizedActivations quantized_activations_at(void* base, DType w_type, int64_t n_values) {
    const QuantizedActivationBytes b = quantized_activation_bytes(w_type, n_values);
    if (b.total() == 0) return {nullptr, nullptr, nullptr};
    auto* p = static_cast<uint8_t*>(base);
    return {.q = reinterpret_cast<int8_t*>(p), .d = reinterpret_cast<float*>(p + b.q),
            .s16 = reinterpret_cast<float*>(p + b.q + b.d)};
}

namespace {

// The quantizer's launch for any value source, in a quantized format.
template <typename Source>
void launch_quantize(ActivationFormat format, const Source& src, int64_t in, int64_t n_rows,
                     const QuantizedActivations& out, cudaStream_t stream, const char* what) {
    const dim3 grid(static_cast<unsigned>((in + kQuantizeThreads - 1) / kQuantizeThreads),
                    static_cast<unsigned>(std::min<int64_t>(n_rows, 65535)));
    auto* q = const_cast<int8_t*>(out.q);
    auto* d = const_cast<float*>(out.d);
    auto* s16 = const_cast<float*>(out.s16);
    if (format == ActivationFormat::Q8_0) {
        STRATA_ASSERT(in % 32 == 0);
        launch_dependent(what, quantize_activations_kernel<ActivationFormat::Q8_0, Source>, grid,
                         dim3(kQuantizeThreads), 0, stream, src, in, n_rows, q, d, s16);
    } else {
        STRATA_ASSERT(format == ActivationFormat::Q8_K && in % 256 == 0);
        launch_dependent(what, quantize_activations_kernel<ActivationFormat::Q8_K, Source>, grid,
                         dim3(kQuantizeThreads), 0, stream, src, in, n_rows, q, d, s16);
    }
}

}  // namespace

void quantize_activations(DType w_type, const float* x, int64_t in, int64_t n_rows, const QuantizedActivations& out,
                          cudaStream_t stream) {
    const ActivationFormat format = activation_format(w_type);
    if (format == ActivationFormat::F32 || n_rows <= 0) return;
    launch_quantize(format, RowSource{x}, in, n_rows, out, stream, "quantize_activations_kernel");
}

void quantize_swiglu(const SwiGluQuantize& a) {
    const ActivationFormat format = activation_format(a.w_type);
    if (a.n_rows <= 0) return;
    const SwiGluSource src{a.gate, a.up, a.stride, a.hidden};
    if (format == ActivationFormat::F32) {
        STRATA_ASSERT(a.hidden != nullptr);
        // Float weights read f32: the Q8_0 kernel's arithmetic would be wasted, so only the values are written.
        const dim3 grid(static_cast<unsigned>((a.in + kQuantizeThreads - 1) / kQuantizeThreads),
                        static_cast<unsigned>(std::min<int64_t>(a.n_rows, 65535)));
        swiglu_rows_kernel<<<grid, kQuantizeThreads, 0, a.stream>>>(src, a.in, a.n_rows);
        STRATA_CUDA_CHECK_LAUNCH("swiglu_rows_kernel");
        return;
    }
    launch_quantize(format, src, a.in, a.n_rows, a.out, a.stream, "quantize_activations_kernel (swiglu)");
}

void quantize_silu_scaled(DType w_type, const float* x, float divisor, int64_t in, int64_t n_rows,
                          const QuantizedActivations& out, cudaStream_t stream) {
    const ActivationFormat format = activation_format(w_type);
    STRATA_ASSERT(format != ActivationFormat::F32);
    if (n_rows <= 0) return;
    launch_quantize(format, SiluScaledSource{x, divisor}, in, n_rows, out, stream,
                    "quantize_activations_kernel (silu)");
}

bool can_form_own_activations(DType w_type, int64_t in, int64_t n_tokens) {
    return n_tokens == 1 && activation_format(w_type) == ActivationFormat::Q8_0 && in % 32 == 0 &&
           in <= kMaxOwnActivations;
}

bool reads_q8_k_activations(DType w_type) {
    return activation_format(w_type) == ActivationFormat::Q8_K;
}

bool reads_q8_0_activations(DType w_type) {
    return activation_format(w_type) == ActivationFormat::Q8_0;
}

size_t q8_0_activation_bytes(int64_t n_values) {
    return quantized_activation_bytes(DType::Q8_0, n_values).total();
}

bool supports_matmul(DType t) {
    switch (t) {
        case DType::F32:
        case DType::F16:
        case DType::BF16:
        case DType::Q8_0:
        case DType::Q4_0:
        case DType::Q2_K:
        case DType::Q3_K:
        case DType::Q4_K:
        case DType::Q5_K:
        case DType::Q6_K:
        case DType::IQ4_NL:
        case DType::IQ4_XS:
        case DType::IQ2_XS:
        case DType::IQ3_XXS:
        case DType::IQ3_S:
        case DType::IQ1_M: return true;
        default: return false;
    }
}

namespace {

// Scratch of one product: quantized activations, then for the GEMM path of quant weights their fp16 copy, the
// token scales and the split-K partial sums, or for float weights one f32 weight panel.
// With blas (quant weights, kBlasMinTokens tokens or more, cuBLAS allowed): token_scale holds the window's alpha,
// beta and up (window_half_scale_kernel) and from float 4 the blocks' maxima, and panel the weights in fp16.
struct ScratchLayout {
    size_t q = 0, d = 0, s = 0, x = 0, token_scale = 0, panel = 0;
    int64_t panel_rows = 0;
    GemmPlan plan;
    bool blas = false;
    size_t total() const { return q + d + s + x + token_scale + panel + 256; }
};

// The quantized activations at the front of a scratch laid out so.
QuantizedActivations activations_in(uint8_t* scratch, const ScratchLayout& l) {
    return {.q = reinterpret_cast<int8_t*>(scratch),
            .d = reinterpret_cast<float*>(scratch + l.q),
            .s16 = reinterpret_cast<float*>(scratch + l.q + l.d)};
}

bool takes_blas(const Tensor& w, int64_t tokens, bool allowed) {
    return allowed && tokens >= kBlasMinTokens && activation_format(w.type) != ActivationFormat::F32 &&
           supports_gemm_tensor_core(w.type);
}

ScratchLayout scratch_layout(const Tensor& w, int64_t tokens, bool blas_allowed) {
    const int64_t in = w.ne[0], rows = w.ne[1];
    const ActivationFormat format = activation_format(w.type);
    const bool matvec = tokens <= kMaxMatvecTokens;
    ScratchLayout l;
    const size_t n_act = static_cast<size_t>(tokens * in);
    l.q = format == ActivationFormat::F32 ? 0 : align_up(n_act);
    l.d = format == ActivationFormat::F32 ? 0 : align_up(n_act / 32 * 4);
    l.s = format == ActivationFormat::F32 ? 0 : align_up(n_act / 16 * 4);
    if (matvec) return l;
    if (takes_blas(w, tokens, blas_allowed)) {
        l.blas = true;
        l.x = align_up(n_act * sizeof(__half));
        l.token_scale = align_up((4 + kWindowMaxBlocks) * sizeof(float));  // alpha, beta, up; the blocks' maxima
        l.panel = align_up(static_cast<size_t>(rows * in) * sizeof(__half));
        return l;
    }
    if (format != ActivationFormat::F32) {
        l.plan = gemm_plan(rows, in, tokens);
        l.x = align_up(n_act * sizeof(__half));
        l.token_scale = align_up(static_cast<size_t>(tokens) * 4);
        l.panel = l.plan.splits > 1 ? align_up(static_cast<size_t>(l.plan.splits * rows * tokens) * 4) : 0;
        return l;
    }
    l.panel_rows = std::clamp<int64_t>(
        static_cast<int64_t>(kGemmPanelBytes / (static_cast<size_t>(in) * 4)) / kGemmTile * kGemmTile, kGemmTile,
        (rows + kGemmTile - 1) / kGemmTile * kGemmTile);
    l.panel = align_up(static_cast<size_t>(l.panel_rows * in) * 4);
    return l;
}

}  // namespace

namespace {

// The activations of a cuBLAS window as the GEMM path multiplies them: the quantized values in fp16 at one power of
// two for the whole window, and alpha (which undoes it), beta and that power, in the scratch laid out by `l`.
struct BlasWindow {
    const __half* x;
    const float* alpha_beta;
};

BlasWindow blas_window(const QuantizedActivations& act, int64_t in, int64_t tokens, uint8_t* scratch,
                       const ScratchLayout& l, cudaStream_t stream) {
    auto* xh = reinterpret_cast<__half*>(scratch + l.q + l.d + l.s);
    auto* alpha_beta = reinterpret_cast<float*>(scratch + l.q + l.d + l.s + l.x);
    const int64_t n_scales = tokens * (in / 32);
    const auto blocks = static_cast<int>(std::min<int64_t>(kWindowMaxBlocks, (n_scales + 4095) / 4096));
    window_block_max_kernel<<<blocks, kWindowMaxThreads, 0, stream>>>(act.d, n_scales, alpha_beta + 4);
    STRATA_CUDA_CHECK_LAUNCH("window_block_max_kernel");
    window_half_scale_kernel<<<1, 1024, 0, stream>>>(alpha_beta + 4, blocks, alpha_beta);
    STRATA_CUDA_CHECK_LAUNCH("window_half_scale_kernel");
    activations_to_half_kernel<<<static_cast<unsigned>(tokens), kHalfThreads, 0, stream>>>(act.q, act.d, in, xh,
                                                                                           nullptr, alpha_beta + 2);
    STRATA_CUDA_CHECK_LAUNCH("activations_to_half_kernel (window)");
    return {xh, alpha_beta};
}

// y = W . x for a cuBLAS window: the weights dequantized to fp16 as the GEMM path's tiles hold them (into the
// layout's panel), then cuBLAS's f32 sums: y^T = W . x^T in column-major terms.
void blas_product(Context& ctx, const Tensor& w, const BlasWindow& x, int64_t tokens, float* y, uint8_t* scratch,
                  const ScratchLayout& l) {
    const int64_t in = w.ne[0], rows = w.ne[1];
    auto* wh = reinterpret_cast<__half*>(scratch + l.q + l.d + l.s + l.x + l.token_scale);
    const DequantizeLaunch dq{.type = w.type, .w = static_cast<const uint8_t*>(w.data), .row_bytes = w.nb[1],
                              .rows = rows, .in = in, .out = nullptr, .stream = ctx.stream().handle(),
                              .out_half = wh};
    STRATA_ASSERT(launch_dequantize(dq));
    check_blas(cublasGemmEx(ctx.blas().get(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows),
                            static_cast<int>(tokens), static_cast<int>(in), x.alpha_beta, wh, CUDA_R_16F,
                            static_cast<int>(in), x.x, CUDA_R_16F, static_cast<int>(in), x.alpha_beta + 1, y,
                            CUDA_R_32F, static_cast<int>(rows), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}

}  // namespace

size_t matmul_scratch_bytes(const Tensor& w, int64_t n_tokens) {
    return std::max(scratch_layout(w, n_tokens, false).total(), scratch_layout(w, n_tokens, true).total());
}

namespace {

void check_weights(const Tensor& w) {
    if (w.device != Device::Cuda)
        throw Error("CUDA matmul: weight " + w.name + " is in host memory; upload it to the device first");
    if (!supports_matmul(w.type))
        throw Error(std::string("CUDA matmul: weight type ") + dtype_name(w.type) + " of " + w.name +
                    " is not supported by the CUDA backend");
    STRATA_ASSERT(w.ne[2] == 1 && w.ne[3] == 1);
    STRATA_ASSERT(w.ne[0] % traits(w.type).block_size == 0 && w.nb[1] >= row_bytes(w.type, w.ne[0]) &&
                  w.nb[1] % 2 == 0);
}

}  // namespace

void matmul_shared_input(Context& ctx, const float* x, int64_t n_tokens, std::initializer_list<MatmulOutput> outputs,
                         const void* x_q8_0) {
    if (n_tokens <= 0 || outputs.size() == 0) return;
    if (x_q8_0 && n_tokens != 1) throw Error("CUDA matmul_shared_input: x quantized ahead is for one token");
    // The matvec path quantizes x once per activation format; anything else goes through matmul on its own.
    size_t need = 0;
    for (const MatmulOutput& o : outputs) {
        check_weights(*o.w);
        if (o.w->ne[0] != outputs.begin()->w->ne[0])
            throw Error("CUDA matmul_shared_input: " + o.w->name + " takes rows of " + std::to_string(o.w->ne[0]) +
                        " values, " + outputs.begin()->w->name + " of " + std::to_string(outputs.begin()->w->ne[0]));
        need = std::max(need, scratch_layout(*o.w, n_tokens, ctx.blas_products()).total());
    }
    STRATA_CUDA_CHECK(cudaSetDevice(ctx.info().index));
    cudaStream_t stream = ctx.stream().handle();
    auto* scratch = static_cast<uint8_t*>(ctx.scratch(need));
    // A long window whose products all go to cuBLAS with one activation format: x quantized and turned to fp16 once
    // for all of them (the scratch's layout up to the weight panel is the same for every output of this width).
    const Tensor& first = *outputs.begin()->w;
    const bool blas_shared =
        n_tokens > kMaxMatvecTokens && std::all_of(outputs.begin(), outputs.end(), [&](const MatmulOutput& o) {
            return takes_blas(*o.w, n_tokens, ctx.blas_products()) && same_activation_format(o.w->type, first.type);
        });
    if (blas_shared) {
        const ScratchLayout layout = scratch_layout(first, n_tokens, true);
        const QuantizedActivations act = activations_in(scratch, layout);
        quantize_activations(first.type, x, first.ne[0], n_tokens, act, stream);
        const BlasWindow window = blas_window(act, first.ne[0], n_tokens, scratch, layout, stream);
        for (const MatmulOutput& o : outputs)
            if (o.w->ne[1] > 0) blas_product(ctx, *o.w, window, n_tokens, o.y, scratch, layout);
        return;
    }
    const Tensor* quantized_for = nullptr;  // whose format the scratch holds now
    // Consecutive outputs whose weights have the same type go out as the segments of one launch.
    std::optional<MatvecLaunch> pending;
    auto flush = [&] {
        if (pending) STRATA_ASSERT(launch_matvec(*pending));
        pending.reset();
    };
    for (const MatmulOutput& o : outputs) {
        const Tensor& w = *o.w;
        const int64_t in = w.ne[0], rows = w.ne[1];
        if (rows == 0) continue;
        if (n_tokens > kMaxMatvecTokens) {
            matmul(ctx, {.w = w, .x = x, .y = o.y, .n_tokens = n_tokens});  // rewrites the scratch
            continue;
        }
        const bool quantized_ahead = x_q8_0 && reads_q8_0_activations(w.type);  // rows of whole blocks of 32
        const QuantizedActivations act = quantized_ahead
                                             ? quantized_activations_at(const_cast<void*>(x_q8_0), w.type, in)
                                             : activations_in(scratch, scratch_layout(w, n_tokens, false));
        if (pending && pending->type == w.type && pending->n_more + 1 < kMaxMatvecSegments) {
            pending->more[pending->n_more++] = {.w = static_cast<const uint8_t*>(w.data), .row_bytes = w.nb[1],
                                                .rows = rows, .y = o.y};
            continue;
        }
        flush();
        if (!quantized_ahead && (!quantized_for || !same_activation_format(quantized_for->type, w.type))) {
            quantize_activations(w.type, x, in, n_tokens, act, stream);
            quantized_for = &w;
        }
        pending = MatvecLaunch{.type = w.type, .w = static_cast<const uint8_t*>(w.data), .row_bytes = w.nb[1],
                               .rows = rows, .in = in, .n_tokens = static_cast<int>(n_tokens), .act = act, .x = x,
                               .y = o.y, .stream = stream};
    }
    flush();
}

QuantizedActivations matvec_activations(Context& ctx, const Tensor& w, int64_t n_tokens) {
    check_weights(w);
    const ScratchLayout layout = scratch_layout(w, n_tokens, false);
    return activations_in(static_cast<uint8_t*>(ctx.scratch(layout.total())), layout);
}

bool matvec_reads_q8_0(const Tensor& w, int64_t n_tokens) {
    return n_tokens >= 1 && n_tokens <= kMaxMatvecTokens && reads_q8_0_activations(w.type) && w.ne[0] % 32 == 0;
}

void matvec_quantized(Context& ctx, const Tensor& w, const QuantizedActivations& act, const float* x, float* y,
                      int64_t n_tokens) {
    check_weights(w);
    STRATA_ASSERT(n_tokens >= 1 && n_tokens <= kMaxMatvecTokens);
    if (w.ne[1] == 0) return;
    STRATA_CUDA_CHECK(cudaSetDevice(ctx.info().index));
    const MatvecLaunch l{.type = w.type,
                         .w = static_cast<const uint8_t*>(w.data),
                         .row_bytes = w.nb[1],
                         .rows = w.ne[1],
                         .in = w.ne[0],
                         .n_tokens = static_cast<int>(n_tokens),
                         .act = act,
                         .x = x,
                         .y = y,
                         .stream = ctx.stream().handle()};
    STRATA_ASSERT(launch_matvec(l));
}

void matmul(Context& ctx, const MatmulArgs& a) {
    const Tensor& w = a.w;
    check_weights(w);
    const int64_t in = w.ne[0], rows = w.ne[1], tokens = a.n_tokens;
    if (tokens <= 0 || rows == 0) return;
    STRATA_CUDA_CHECK(cudaSetDevice(ctx.info().index));
    cudaStream_t stream = ctx.stream().handle();
    const auto* wdata = static_cast<const uint8_t*>(w.data);
    const ActivationFormat format = activation_format(w.type);
    const bool matvec = tokens <= kMaxMatvecTokens;

    const ScratchLayout layout = scratch_layout(w, tokens, ctx.blas_products());
    const size_t q_bytes = layout.q, d_bytes = layout.d, s_bytes = layout.s, x_bytes = layout.x;
    auto* scratch = static_cast<uint8_t*>(ctx.scratch(layout.total()));
    const QuantizedActivations act = activations_in(scratch, layout);

    quantize_activations(w.type, a.x, in, tokens, act, stream);

    if (matvec) return matvec_quantized(ctx, w, act, a.x, a.y, tokens);

    if (layout.blas) {
        const BlasWindow x = blas_window(act, in, tokens, scratch, layout, stream);
        blas_product(ctx, w, x, tokens, a.y, scratch, layout);
        return;
    }

    if (format != ActivationFormat::F32) {
        // Quant weights: the tensor-core GEMM on fp16 copies of the quantized activations (what the CPU multiplies).
        auto* xh = reinterpret_cast<__half*>(scratch + q_bytes + d_bytes + s_bytes);
        auto* token_scale = reinterpret_cast<float*>(scratch + q_bytes + d_bytes + s_bytes + x_bytes);
        auto* partials = reinterpret_cast<float*>(scratch + q_bytes + d_bytes + s_bytes + x_bytes + layout.token_scale);
        activations_to_half_kernel<<<static_cast<unsigned>(tokens), kHalfThreads, 0, stream>>>(act.q, act.d, in, xh,
                                                                                               token_scale, nullptr);
        STRATA_CUDA_CHECK_LAUNCH("activations_to_half_kernel");
        const GemmPlan& plan = layout.plan;
        // A device whose blocks cannot hold 128-token tiles (sm_75: 64 KB) runs 64-token ones. The split stays the
        // plan's, and a token's sums do not depend on the tile that holds it, so the bits stay the same.
        const int tile_tokens =
            plan.tile_tokens == 128 && ctx.info().max_shared_per_block < kernels::gemm_shared_bytes(128)
                ? 64
                : plan.tile_tokens;
        const GemmLaunch l{.type = w.type, .w = wdata, .row_bytes = w.nb[1], .rows = rows, .in = in,
                           .n_tokens = tokens, .x = xh, .token_scale = token_scale, .y = a.y, .ldy = rows,
                           .tile_tokens = tile_tokens, .splits = plan.splits,
                           .k_tiles_per_split = plan.k_tiles_per_split, .partials = partials, .stream = stream};
        STRATA_ASSERT(launch_gemm(l));
        if (plan.splits > 1) {
            constexpr int kThreads = 256;
            const int64_t n = rows * tokens;
            sum_split_k_kernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
                partials, plan.splits, rows, tokens, a.y, rows);
            STRATA_CUDA_CHECK_LAUNCH("sum_split_k_kernel");
        }
        return;
    }

    // F32 weights in a long window (the routers, 3% of a Flash-Next prompt in the own f32 GEMM): cuBLAS's f32 GEMM
    // on the weights as they are (full f32 products, no TF32; only the order of the sums differs).
    if (w.type == DType::F32 && ctx.blas_products() && tokens >= kBlasMinTokens && w.nb[1] % 4 == 0) {
        const float one = 1.0f, zero = 0.0f;
        // The handle reads alpha and beta from device memory everywhere else: host scalars for this call alone.
        struct HostScalars {
            cublasHandle_t handle;
            explicit HostScalars(cublasHandle_t h) : handle(h) {
                check_blas(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode");
            }
            ~HostScalars() { (void)cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_DEVICE); }
        } host_scalars(ctx.blas().get());
        check_blas(cublasGemmEx(ctx.blas().get(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows),
                                static_cast<int>(tokens), static_cast<int>(in), &one, w.data, CUDA_R_32F,
                                static_cast<int>(w.nb[1] / 4), a.x, CUDA_R_32F, static_cast<int>(in), &zero, a.y,
                                CUDA_R_32F, static_cast<int>(rows), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   "cublasGemmEx (f32)");
        return;
    }

    // Float weights: converted to f32 panels (fp16 tiles would round F32 and BF16 weights; these matrices are small).
    const int64_t panel_rows = layout.panel_rows;
    auto* panel = reinterpret_cast<float*>(scratch + q_bytes + d_bytes + s_bytes + x_bytes + layout.token_scale);
    for (int64_t r0 = 0; r0 < rows; r0 += panel_rows) {
        const int64_t n_rows = std::min(panel_rows, rows - r0);
        const DequantizeLaunch l{.type = w.type, .w = wdata + r0 * w.nb[1], .row_bytes = w.nb[1], .rows = n_rows,
                                 .in = in, .out = panel, .stream = stream};
        STRATA_ASSERT(launch_dequantize(l));
        const dim3 grid(static_cast<unsigned>((n_rows + kGemmTile - 1) / kGemmTile),
                        static_cast<unsigned>((tokens + kGemmTile - 1) / kGemmTile));
        gemm_nt_kernel<<<grid, 256, 0, stream>>>(panel, a.x, a.y + r0, n_rows, tokens, in, rows);
        STRATA_CUDA_CHECK_LAUNCH("gemm_nt_kernel");
    }
}

}  // namespace strata::cuda
