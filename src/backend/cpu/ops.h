// Scalar reference ops: the oracle every other backend is checked against. Plain loops in a fixed order, f32 data,
// weights of any type dequantized row by row (never a whole-model f32 copy). Each output element is produced by one
// thread in one fixed summation order, so results do not depend on the thread count or on how tokens are batched.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace strata::cpu {

inline float silu(float x) {
    return x / (1.0f + std::exp(-x));
}
inline float sigmoid(float x) {
    return 1.0f / (1.0f + std::exp(-x));
}
// torch.nn.functional.softplus with beta 1 and threshold 20 (linear above it).
inline float softplus(float x) {
    return x > 20.0f ? x : std::log1p(std::exp(x));
}

// Dot product of n floats: eight interleaved partial sums combined in a fixed order.
float dot(const float* a, const float* b, int64_t n);

// ---- matrices -------------------------------------------------------------------------------------------------------

// A 2-D view {in, rows} of a weight: rows [row_begin, row_begin + n_rows) of slice `slice` (ne2 index, the expert) of
// a tensor of up to 3 dims. The view shares the tensor's data.
Tensor matrix_view(const Tensor& w, int64_t slice, int64_t row_begin, int64_t n_rows);

// y[t, o] = sum_i W[o, i] * x[t, i] for t < n_tokens, W {in, out} (ggml order, any computable type). x rows are
// `in` floats apart, y rows `out` floats apart. The activations are first quantized to the weight type's activation
// type (backend/cpu/quant_dot.h: llama.cpp's numerics), then every output is one dot-product kernel call, so y[t] does
// not depend on n_tokens, on the thread count or on which other products share the call. Parallel over output rows
// when a pool is given. Allocates only when a call needs more activation buffer than any call before on this thread.
struct MatmulArgs {
    const Tensor& w;
    const float* x;
    float* y;
    int64_t n_tokens = 1;
    ThreadPool* pool = nullptr;
};
void matmul(const MatmulArgs& args);

// Independent products computed in one parallel pass (one wake-up of the pool for all): the experts of a MoE layer,
// q/k/v projections. Jobs that read the same x quantize it once. A job may read its tokens from scattered rows of x
// (x_rows: token t is row x_rows[t] of the x_count rows of x): the rows of x are quantized once for every job that
// reads them, then each job's rows are copied out in their quantized form (MoE experts gathering their tokens).
struct MatmulJob {
    const Tensor* w;
    const float* x;
    float* y;
    int64_t n_tokens = 1;
    const int64_t* x_rows = nullptr;
    int64_t x_count = 0;
};
void matmul_many(std::span<const MatmulJob> jobs, ThreadPool* pool);

// Row `row` of a 2-D tensor {n, rows} as floats (token embeddings, PLE rows).
void get_row(const Tensor& t, int64_t row, float* out);

// A small tensor (norm gammas, conv taps, per-head scalars) as f32, all elements in storage order.
std::vector<float> to_f32(const Tensor& t);

// ---- normalisation --------------------------------------------------------------------------------------------------

// out = x / sqrt(mean(x^2) + eps) * gamma (gamma may be null: no scale). out may alias x.
void rms_norm(const float* x, int64_t n, const float* gamma, float eps, float* out);
// RMS over each group of `group` values; gamma covers all n_groups * group values.
void rms_norm_grouped(const float* x, int64_t n_groups, int64_t group, const float* gamma, float eps, float* out);
// out = x / sqrt(sum(x^2) + eps) (the FLA l2norm). out may alias x.
void l2_norm(const float* x, int64_t n, float eps, float* out);

// ---- positions ------------------------------------------------------------------------------------------------------

// NEOX rotary embedding in place over the first n_rot values of one head: pairs (i, i + n_rot/2) rotate by
// pos * base^(-2i/n_rot). Values past n_rot are left alone.
void rope_neox(float* x, int64_t n_rot, int64_t pos, float freq_base);

// ---- small vector ops -----------------------------------------------------------------------------------------------

void softmax(float* x, int64_t n);  // in place, max-subtracted
// Over arrays, for the elementwise gates of a prompt: with AVX-512 or AVX2 a vectorized exp within 2 ulp of expf,
// else the scalar functions above. The same values for any split of the array.
void sigmoid_inplace(float* x, int64_t n);
void silu_inplace(float* x, int64_t n);
void silu_mul(float* g, const float* u, int64_t n);  // g = silu(g) * u
// Indices of the k largest values, largest first; equal values keep the lower index first.
std::vector<int32_t> top_k(const float* values, int64_t n, int64_t k);

// ---- recurrent pieces -----------------------------------------------------------------------------------------------

// One step of a causal depthwise conv with dilation: out[c] = sum_j w[c, j] * in(t - (K-1-j) * dilation), where
// in(t) = x and older inputs come from `history` ((K-1)*dilation rows of C values, oldest first). The history is then
// shifted by one row and x appended. w is {K, C} (K taps per channel, contiguous).
struct ConvStepArgs {
    const float* x;
    const float* w;
    float* history;
    float* out;
    int64_t channels = 0;
    int64_t kernel = 0;
    int64_t dilation = 1;
};
void causal_conv_step(const ConvStepArgs& args);
// A causal conv's history of `rows` rows of `channels` values, oldest first, brought past n more input rows x (oldest
// first): what n causal_conv_step calls leave in it (a speculation commit replays kept rows with it).
void conv_history_push(float* history, int64_t rows, int64_t channels, const float* x, int64_t n);

// One token of the gated delta rule for one head. state is [dk][dv] (key index major). q is already L2-normalised
// and scaled; k L2-normalised. S = S * exp(g); S += k (beta * (v - S^T k))^T; out = S^T q.
struct DeltaStepArgs {
    float* state;
    const float* q;
    const float* k;
    const float* v;
    float g = 0.0f;
    float beta = 0.0f;
    int64_t dk = 0;
    int64_t dv = 0;
    float* out;
};
void gated_delta_step(const DeltaStepArgs& args);

// The same rule over n consecutive tokens of one head at once, in the chunked (WY) form of transformers'
// torch_chunk_gated_delta_rule: per chunk of up to kDeltaChunk tokens, the intra-chunk interactions become small dense
// products and the state is read and written once per chunk instead of four times per token. Equal to n
// gated_delta_step calls up to float rounding. The CPU model runs the per-token step (bench/NOTES.md: at 64 x 64
// heads this form measured 5x slower here, and the step keeps results independent of how a prompt is split); this is
// the reference for the GPU backend's chunked kernel. Token i's q, k, v start at q + i * q_stride (floats) and so on; g and
// beta are per token; out rows are out_stride apart.
constexpr int64_t kDeltaChunk = 64;
struct DeltaChunkArgs {
    float* state;
    const float* q;
    const float* k;
    const float* v;
    int64_t q_stride = 0, k_stride = 0, v_stride = 0;
    const float* g;
    const float* beta;
    int64_t n = 0, dk = 0, dv = 0;
    float* out;
    int64_t out_stride = 0;
};
void gated_delta_chunked(const DeltaChunkArgs& args);

// Softmax attention of one query head over the given cells: keys and values are rows `row_stride` floats apart,
// head data at key_head/value_head offset already applied. out (head_dim) = sum_c softmax(scale * q.k_c) v_c.
struct AttendArgs {
    const float* q;
    const float* keys;
    const float* values;
    int64_t row_stride = 0;
    int64_t head_dim = 0;
    std::span<const int32_t> cells;
    float scale = 1.0f;
    float* out;
};
void attend(const AttendArgs& args);

}  // namespace strata::cpu
