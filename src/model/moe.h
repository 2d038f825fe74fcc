// Mixture of experts: softmax router over all experts, top-k, optional renormalisation, SwiGLU experts, plus a shared
// SwiGLU expert scaled by sigmoid(ffn_gate_inp_shexp . x). Math: Qwen4ExpTextSparseMoeBlock (same in qwen3.5/next).
#pragma once

#include <functional>
#include <optional>
#include <span>
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

// ---- experts in host RAM (issue 25; DESIGN.md section 9) ------------------------------------------------------------
// The trunk asks these two interfaces, which the runtime layer implements (runtime/expert_cache_advisor.h,
// runtime/cpu_expert_pool.h), so the policies and the worker pool stay plain runtime code and the trunk stays policy-free.

// A change to one layer's VRAM expert cache: `admit` goes into `slot`, replacing whatever is there (-1: nothing).
struct ExpertSwap {
    int64_t slot = 0;
    int32_t admit = 0;
};

// Decides what a layer's VRAM expert cache holds while decoding. The trunk reports each window's routing after the
// window ran (`ids`: n_tokens rows of k expert ids) with the residents as they were during the window
// (`residents[slot]`: an expert id or -1), and applies the swaps it is given as copies land. One object serves every
// layer; calls come from the thread that runs the forward pass.
class ExpertCacheAdvisor {
  public:
    virtual ~ExpertCacheAdvisor() = default;
    virtual void observe(int64_t layer, int64_t n_expert, int64_t k, std::span<const int32_t> ids,
                         std::span<const int32_t> residents, std::vector<ExpertSwap>& swaps) = 0;
};

// A share of one MoE layer's routed experts computed on the host while the GPU computes the rest. For every pair
// p = t * K + k with mine[p] set, y[p] = down_e(silu(gate_e . x[t]) * (up_e . x[t])) with e = ids[p]: the expert's
// output row before the routing weight, computed from the host tensors in `weights` (each expert's rows read once for
// all the window's tokens that chose it). Pairs not mine are left untouched.
struct HostExpertJob {
    int64_t layer = 0;
    const MoeShape* shape = nullptr;
    const MoeWeights* weights = nullptr;
    int64_t n_tokens = 0;           // 1..8
    const float* x = nullptr;       // [n_tokens x H]
    const int32_t* ids = nullptr;   // [n_tokens x K]
    const uint8_t* mine = nullptr;  // [n_tokens x K]
    float* y = nullptr;             // [n_tokens x K x H]
};

class HostExpertCompute {
  public:
    virtual ~HostExpertCompute() = default;
    // Starts the job and returns at once; `done` runs on a worker thread once every row of the job is written (the
    // job's buffers stay valid until then). One job at a time: start() while a job runs is a logic error.
    virtual void start(const HostExpertJob& job, std::function<void()> done) = 0;
    // Waits at most `bound_us` for the running job; false when it did not finish (the job may still complete later).
    virtual bool wait(int64_t bound_us) = 0;
};

}  // namespace strata
