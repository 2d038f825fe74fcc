#include "model/moe.h"

#include <algorithm>
#include <numeric>

#include "backend/cpu/ops.h"
#include "core/error.h"

namespace strata {

MoeWeights bind_moe(const TensorBinder& binder, int64_t block, const MoeShape& s) {
    auto name = [&](const char* n) { return block_tensor(block, n); };
    const int64_t H = s.n_embd, E = s.n_expert, F = s.n_ff;
    MoeWeights w;
    w.router = binder.require(name("ffn_gate_inp.weight"), {H, E});
    w.gate_up = binder.optional(name("ffn_gate_up_exps.weight"), {H, 2 * F, E});
    if (!w.gate_up) {
        w.gate = binder.require(name("ffn_gate_exps.weight"), {H, F, E});
        w.up = binder.require(name("ffn_up_exps.weight"), {H, F, E});
    }
    w.down = binder.require(name("ffn_down_exps.weight"), {F, H, E});
    if (s.n_ff_shared > 0) {
        w.shared_gate = binder.require_f32(name("ffn_gate_inp_shexp.weight"), {H});
        w.shared_gate_proj = binder.require(name("ffn_gate_shexp.weight"), {H, s.n_ff_shared});
        w.shared_up = binder.require(name("ffn_up_shexp.weight"), {H, s.n_ff_shared});
        w.shared_down = binder.require(name("ffn_down_shexp.weight"), {s.n_ff_shared, H});
    }
    auto view = [](const Tensor& t, int64_t e, int64_t row, int64_t n) {
        Tensor v = cpu::matrix_view(t, e, row, n);
        v.name.clear();
        return v;
    };
    for (int64_t e = 0; e < E; ++e) {
        w.expert_gate.push_back(w.gate_up ? view(*w.gate_up, e, 0, F) : view(*w.gate, e, 0, F));
        w.expert_up.push_back(w.gate_up ? view(*w.gate_up, e, F, F) : view(*w.up, e, 0, F));
        w.expert_down.push_back(view(w.down, e, 0, H));
    }
    return w;
}

namespace {

// down(silu(gate x) * up x) for n rows of x.
void swiglu(const Tensor& gate, const Tensor& up, const Tensor& down, const float* x, float* y, int64_t n,
            Scratch& scratch, ThreadPool* pool) {
    const int64_t F = gate.ne[1];
    float* g = scratch.take<float>(n * F);
    float* u = scratch.take<float>(n * F);
    cpu::matmul({.w = gate, .x = x, .y = g, .n_tokens = n, .pool = pool});
    cpu::matmul({.w = up, .x = x, .y = u, .n_tokens = n, .pool = pool});
    for (int64_t i = 0; i < n * F; ++i) g[i] = cpu::silu(g[i]) * u[i];
    cpu::matmul({.w = down, .x = g, .y = y, .n_tokens = n, .pool = pool});
}

// The k largest of values[0, n), largest first, ties lower index first (cpu::top_k's order) into idx, which has room
// for n; nothing allocated.
void top_k_into(const float* values, int64_t n, int64_t k, int32_t* idx) {
    std::iota(idx, idx + n, 0);
    std::partial_sort(idx, idx + k, idx + n,
                      [&](int32_t a, int32_t b) { return values[a] > values[b] || (values[a] == values[b] && a < b); });
}

}  // namespace

void moe_forward(const MoeForwardArgs& a) {
    const MoeShape& s = a.shape;
    const MoeWeights& w = a.weights;
    const int64_t T = a.n_tokens, H = s.n_embd, E = s.n_expert, K = s.n_expert_used;
    Scratch& scratch = a.scratch;

    float* probs = scratch.take<float>(T * E);
    cpu::matmul({.w = w.router, .x = a.x, .y = probs, .n_tokens = T, .pool = a.pool});
    int32_t* chosen = scratch.take<int32_t>(T * K);
    float* weight = scratch.take<float>(T * K);
    int32_t* top = scratch.take<int32_t>(E);
    for (int64_t t = 0; t < T; ++t) {
        float* p = probs + t * E;
        cpu::softmax(p, E);
        top_k_into(p, E, K, top);
        float sum = 0.0f;
        for (int64_t k = 0; k < K; ++k) sum += p[top[k]];
        for (int64_t k = 0; k < K; ++k) {
            chosen[t * K + k] = top[k];
            weight[t * K + k] = s.normalize_weights ? p[top[k]] / sum : p[top[k]];
        }
    }

    // Each expert runs once over the rows that chose it; results land in their (row, slot) place. The (row, slot)
    // pairs are grouped by expert with a counting sort.
    int64_t* first = scratch.take_zeroed<int64_t>(E + 1);
    for (int64_t i = 0; i < T * K; ++i) ++first[chosen[i] + 1];
    for (int64_t e = 0; e < E; ++e) first[e + 1] += first[e];
    int64_t* slots = scratch.take<int64_t>(T * K);
    int64_t* fill = scratch.take<int64_t>(E);
    std::copy_n(first, E, fill);
    for (int64_t i = 0; i < T * K; ++i) slots[fill[chosen[i]]++] = i;

    float* expert_out = scratch.take<float>(T * K * H);
    float* xs = scratch.take<float>(T * H);  // an expert is chosen at most once per row
    float* ys = scratch.take<float>(T * H);
    for (int64_t e = 0; e < E; ++e) {
        const int64_t n = first[e + 1] - first[e];
        if (n == 0) continue;
        const int64_t* mine = slots + first[e];
        for (int64_t i = 0; i < n; ++i) std::copy_n(a.x + (mine[i] / K) * H, H, xs + i * H);
        swiglu(w.expert_gate[static_cast<size_t>(e)], w.expert_up[static_cast<size_t>(e)],
               w.expert_down[static_cast<size_t>(e)], xs, ys, n, scratch, a.pool);
        for (int64_t i = 0; i < n; ++i) std::copy_n(ys + i * H, H, expert_out + mine[i] * H);
    }

    float* shared = nullptr;
    if (s.n_ff_shared > 0) {
        shared = scratch.take<float>(T * H);
        swiglu(*w.shared_gate_proj, *w.shared_up, *w.shared_down, a.x, shared, T, scratch, a.pool);
    }
    for (int64_t t = 0; t < T; ++t) {
        float* o = a.out + t * H;
        for (int64_t j = 0; j < H; ++j) o[j] = 0.0f;
        for (int64_t k = 0; k < K; ++k) {
            const float* y = expert_out + (t * K + k) * H;
            for (int64_t j = 0; j < H; ++j) o[j] += weight[t * K + k] * y[j];
        }
        if (s.n_ff_shared > 0) {
            const float g = cpu::sigmoid(cpu::dot(w.shared_gate.data(), a.x + t * H, H));
            for (int64_t j = 0; j < H; ++j) o[j] += g * shared[t * H + j];
        }
    }
}

}  // namespace strata
