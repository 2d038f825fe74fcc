// A dense SwiGLU feed-forward block: out = down . (silu(gate . x) * up . x). qwen3next's Qwen3NextMLP in the layers
// mlp_only_layers / decoder_sparse_step make dense (no router, no shared expert); GGUF: blk.N.ffn_gate / ffn_up /
// ffn_down, {arch}.feed_forward_length wide, the blocks listed in strata.{arch}.dense_mlp_layers.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "core/thread_pool.h"
#include "model/binding.h"
#include "model/scratch.h"

namespace strata {

struct DenseFfnWeights {
    int64_t n_ff = 0;
    Tensor gate, up;  // {H, n_ff}
    Tensor down;      // {n_ff, H}
};

DenseFfnWeights bind_dense_ffn(const TensorBinder& binder, int64_t block, int64_t n_embd, int64_t n_ff);

struct DenseFfnForwardArgs {
    const DenseFfnWeights& weights;
    int64_t n_embd = 0;
    const float* x;  // [n_tokens x H]
    float* out;      // [n_tokens x H]
    int64_t n_tokens = 1;
    Scratch& scratch;
    ThreadPool* pool = nullptr;
};
// Row-wise, as the MoE's shared expert computes it.
void dense_ffn_forward(const DenseFfnForwardArgs& args);

}  // namespace strata
