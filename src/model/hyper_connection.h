// Hyper-connections (qwen4exp): the residual is hc parallel streams of H values. A block reads one H-wide input from
// them through a low-rank gated mix and writes its output back to every stream with a per-stream injection weight.
// Math: Qwen4ExpTextGatedResidual; GGUF: hc_{attn,ffn}_{norm,down,up,inject}, output_hc_{norm,down,up}.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"
#include "model/binding.h"
#include "model/scratch.h"

namespace strata {

struct HyperConnectionShape {
    int64_t n_streams = 0;  // hc
    int64_t n_embd = 0;     // H
    int64_t low_rank = 0;   // r
    float eps = 1e-6f;
};

struct HyperConnectionWeights {
    std::vector<float> norm;       // {HC}, gamma already 1 + w
    Tensor down;                   // {HC, r}
    Tensor up;                     // {r, HC}
    std::optional<Tensor> inject;  // {HC, hc}; absent on the final mixer
};

// Binds `{prefix}_norm.weight`, `_down`, `_up` and, when with_inject, `_inject`.
HyperConnectionWeights bind_hyper_connection(const TensorBinder& binder, const std::string& prefix,
                                             const HyperConnectionShape& shape, bool with_inject);

struct HyperConnectionReadArgs {
    const HyperConnectionShape& shape;
    const HyperConnectionWeights& weights;
    const float* residual;  // [n_tokens x HC]
    float* mixed;           // [n_tokens x H] out: the block input
    float* inject;          // [n_tokens x hc] out: 2 * sigmoid(inject . xn / hc); null for the final mixer
    int64_t n_tokens = 1;
    Scratch& scratch;
    ThreadPool* pool = nullptr;
};
// Row-wise, so rows of several sequences can go through at once.
void hyper_connection_read(const HyperConnectionReadArgs& args);

// residual[s] += inject[s] * block_out, for every stream s of every token.
void hyper_connection_write(const HyperConnectionShape& shape, float* residual, const float* block_out,
                            const float* inject, int64_t n_tokens, ThreadPool* pool);

}  // namespace strata
