// Mixture of experts: softmax router over all experts, top-k, optional renormalisation, SwiGLU experts, plus a shared
// SwiGLU expert scaled by sigmoid(ffn_gate_inp_shexp . x). Math: Qwen4ExpTextSparseMoeBlock (same in qwen3.5/next).
#pragma once

#include <optional>
#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"
#include "model/binding.h"
#include "model/scratch.h"

namespace strata {

struct MoeShape {
    int64_t n_embd = 0;
    int64_t n_expert = 0;
    int64_t n_expert_used = 0;
    int64_t n_ff = 0;         // routed expert width F
    int64_t n_ff_shared = 0;  // shared expert width Fs (0: none)
    bool normalize_weights = true;
};

struct MoeWeights {
    Tensor router;                                                   // {H, E}
    std::optional<Tensor> gate_up;                                   // {H, 2F, E} fused: gate rows first
    std::optional<Tensor> gate, up;                                  // {H, F, E}
    Tensor down;                                                     // {F, H, E}
    std::vector<float> shared_gate;                                  // {H}
    std::optional<Tensor> shared_gate_proj, shared_up, shared_down;  // {H, Fs}, {H, Fs}, {Fs, H}
    // Each expert's 2-D views of the above, made once at load (unnamed, so copying them costs nothing).
    std::vector<Tensor> expert_gate, expert_up, expert_down;
};

MoeWeights bind_moe(const TensorBinder& binder, int64_t block, const MoeShape& shape);

// Where moe_forward reports each call's routing (LoadOptions::routing_trace; runtime/routing_trace.h writes it to a
// file): `n_rows` rows of `k` expert ids (of n_expert) and their combine weights, row-major, the rows in the order
// of the call's input rows. Called from the thread that runs the forward pass; must not throw into it.
class RoutingSink {
  public:
    virtual ~RoutingSink() = default;
    virtual void record(int64_t layer, int64_t n_expert, int64_t k, int64_t n_rows, const int32_t* ids,
                        const float* weights) = 0;
};

// Row-wise: every row is routed on its own, so the rows of several sequences can go through at once (each expert then
// reads its weights once for all the rows that chose it).
struct MoeForwardArgs {
    const MoeShape& shape;
    const MoeWeights& weights;
    const float* x;  // [n_tokens x H]
    float* out;      // [n_tokens x H]
    int64_t n_tokens = 1;
    Scratch& scratch;
    ThreadPool* pool = nullptr;
    int64_t layer = 0;               // the block index, for routing
    RoutingSink* routing = nullptr;  // when set, told the experts each row chose
};
void moe_forward(const MoeForwardArgs& args);

}  // namespace strata
