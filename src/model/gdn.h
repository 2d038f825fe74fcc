// Gated DeltaNet (linear attention) block: projections, causal conv + SiLU, L2-normalised q/k, the gated delta rule
// per value head, gated RMSNorm, output projection. Math: Qwen4ExpTextGatedDeltaNet / Qwen3NextGatedDeltaNet;
// GGUF names and layouts: gguf-qwen4exp.md 2.2-2.4.
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"
#include "model/batch_rows.h"
#include "model/binding.h"
#include "model/scratch.h"

namespace strata {

enum class GateActivation { Sigmoid, Silu };

struct GdnShape {
    int64_t n_embd = 0;       // H
    int64_t n_k_heads = 0;    // nk (ssm.group_count)
    int64_t n_v_heads = 0;    // nv (ssm.time_step_rank)
    int64_t k_head_dim = 0;   // dk (ssm.state_size)
    int64_t v_head_dim = 0;   // dv (ssm.inner_size / nv)
    int64_t conv_kernel = 0;  // Kc
    // Value head h reads q/k head h % nk (llama.cpp's tiled order: qwen4exp, qwen35moe) or h / (nv / nk) (HF order,
    // kept by qwen3next files).
    bool tiled_value_heads = true;
    GateActivation output_gate = GateActivation::Silu;
    float eps = 1e-6f;  // gated RMSNorm

    int64_t key_dim() const { return n_k_heads * k_head_dim; }
    int64_t value_dim() const { return n_v_heads * v_head_dim; }
    int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
};

// How beta/alpha (and for old qwen3next files q/k/v/z) arrive.
enum class GdnProjection {
    Separate,        // attn_qkv + attn_gate + ssm_beta + ssm_alpha (qwen4exp, qwen35moe)
    FusedBetaAlpha,  // attn_qkv + attn_gate + ssm_ba (qwen3next)
    LegacyFused,     // ssm_in (per key group [q, k, v, z]) + ssm_ba (old qwen3next files)
};

struct GdnWeights {
    GdnProjection projection = GdnProjection::Separate;
    std::optional<Tensor> qkv;     // {H, CD}
    std::optional<Tensor> gate;    // {H, VD}  (z)
    std::optional<Tensor> ssm_in;  // {H, 2KD + 2VD}
    std::optional<Tensor> beta;    // {H, nv}
    std::optional<Tensor> alpha;   // {H, nv}
    std::optional<Tensor> ba;      // {H, 2nv}: per key group, nv/nk beta rows then nv/nk alpha rows
    std::vector<float> conv;       // {Kc, CD}
    std::vector<float> dt_bias;    // {nv}
    std::vector<float> a;          // {nv}: -exp(A_log)
    std::vector<float> norm;       // {dv}: raw gamma of the gated norm
    Tensor out;                    // {VD, H}
};

GdnWeights bind_gdn(const TensorBinder& binder, int64_t block, const GdnShape& shape);

struct GdnState {
    std::vector<float> conv_history;  // (Kc - 1) rows of CD
    std::vector<float> recurrent;     // nv x dk x dv
    void init(const GdnShape& shape);
    size_t bytes() const { return (conv_history.size() + recurrent.size()) * sizeof(float); }
};

// A speculative verification window's per-token inputs to one GDN block's state, for one sequence: enough to
// advance the state by a prefix of the window without running the block again (gdn_commit).
struct GdnWindow {
    GdnShape shape;
    int64_t count = 0;           // tokens recorded (0: none)
    std::vector<float> raw;      // count x CD: the conv's input rows
    std::vector<float> conv;     // count x CD: q, k, v after the conv, SiLU and the L2 norms
    std::vector<float> g, beta;  // count x nv: the delta rule's decay and write strength
};
// Brings `state` (as it was before the window) to after the window's first n_keep tokens: the conv history takes
// their input rows and the delta rule runs on their recorded q, k, v, g and beta, the same steps on the same inputs as
// the forward pass, so the state is bit for bit what a forward pass of those tokens leaves.
void gdn_commit(GdnState& state, const GdnWindow& window, int64_t n_keep);

// One pass over the rows of one or more sequences (batch_rows.h): the projections run over all rows at once; the
// conv and the delta rule per sequence on its own state (sequences and value heads in parallel).
struct GdnForwardArgs {
    const GdnShape& shape;
    const GdnWeights& weights;
    std::span<GdnState* const> states;        // one per sequence
    std::span<const SequenceRows> sequences;  // their rows, same order
    const float* x;                           // [n_tokens x H]
    float* out;                               // [n_tokens x H]
    int64_t n_tokens = 1;                     // all rows
    Scratch& scratch;
    ThreadPool* pool = nullptr;
    std::span<GdnWindow* const> windows = {};  // empty, or one per sequence: where to record its rows (null: not)
};
void gdn_forward(const GdnForwardArgs& args);

}  // namespace strata
