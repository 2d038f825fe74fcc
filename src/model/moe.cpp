#include "model/moe.h"

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
    return w;
}

namespace {

// down(silu(gate x) * up x) for n rows of x.
void swiglu(const Tensor& gate, const Tensor& up, const Tensor& down, const float* x, float* y, int64_t n,
            ThreadPool* pool) {
    const int64_t F = gate.ne[1];
    std::vector<float> g(static_cast<size_t>(n * F)), u(static_cast<size_t>(n * F));
    cpu::matmul({.w = gate, .x = x, .y = g.data(), .n_tokens = n, .pool = pool});
    cpu::matmul({.w = up, .x = x, .y = u.data(), .n_tokens = n, .pool = pool});
    for (size_t i = 0; i < g.size(); ++i) g[i] = cpu::silu(g[i]) * u[i];
    cpu::matmul({.w = down, .x = g.data(), .y = y, .n_tokens = n, .pool = pool});
}

}  // namespace

void moe_forward(const MoeForwardArgs& a) {
    const MoeShape& s = a.shape;
    const MoeWeights& w = a.weights;
    const int64_t T = a.n_tokens, H = s.n_embd, E = s.n_expert, K = s.n_expert_used, F = s.n_ff;

    std::vector<float> probs(static_cast<size_t>(T * E));
    cpu::matmul({.w = w.router, .x = a.x, .y = probs.data(), .n_tokens = T, .pool = a.pool});
    std::vector<int32_t> chosen(static_cast<size_t>(T * K));
    std::vector<float> weight(static_cast<size_t>(T * K));
    for (int64_t t = 0; t < T; ++t) {
        float* p = probs.data() + t * E;
        cpu::softmax(p, E);
        const std::vector<int32_t> top = cpu::top_k(p, E, K);
        float sum = 0.0f;
        for (int64_t k = 0; k < K; ++k) sum += p[top[k]];
        for (int64_t k = 0; k < K; ++k) {
            chosen[t * K + k] = top[k];
            weight[t * K + k] = s.normalize_weights ? p[top[k]] / sum : p[top[k]];
        }
    }

    // Each expert runs once over the tokens that chose it; results land in their (token, slot) row.
    std::vector<float> expert_out(static_cast<size_t>(T * K * H));
    for (int64_t e = 0; e < E; ++e) {
        std::vector<int64_t> slots;
        for (int64_t i = 0; i < T * K; ++i)
            if (chosen[i] == e) slots.push_back(i);
        if (slots.empty()) continue;
        const int64_t n = static_cast<int64_t>(slots.size());
        std::vector<float> xs(static_cast<size_t>(n * H)), ys(static_cast<size_t>(n * H));
        for (int64_t i = 0; i < n; ++i)
            std::copy(a.x + (slots[i] / K) * H, a.x + (slots[i] / K + 1) * H, xs.data() + i * H);
        const Tensor gate = w.gate_up ? cpu::matrix_view(*w.gate_up, e, 0, F) : cpu::matrix_view(*w.gate, e, 0, F);
        const Tensor up = w.gate_up ? cpu::matrix_view(*w.gate_up, e, F, F) : cpu::matrix_view(*w.up, e, 0, F);
        const Tensor down = cpu::matrix_view(w.down, e, 0, H);
        swiglu(gate, up, down, xs.data(), ys.data(), n, a.pool);
        for (int64_t i = 0; i < n; ++i)
            std::copy(ys.data() + i * H, ys.data() + (i + 1) * H, expert_out.data() + slots[i] * H);
    }

    std::vector<float> shared;
    if (s.n_ff_shared > 0) {
        shared.resize(static_cast<size_t>(T * H));
        swiglu(*w.shared_gate_proj, *w.shared_up, *w.shared_down, a.x, shared.data(), T, a.pool);
    }
    for (int64_t t = 0; t < T; ++t) {
        float* o = a.out + t * H;
        for (int64_t j = 0; j < H; ++j) o[j] = 0.0f;
        for (int64_t k = 0; k < K; ++k) {
            const float* y = expert_out.data() + (t * K + k) * H;
            for (int64_t j = 0; j < H; ++j) o[j] += weight[t * K + k] * y[j];
        }
        if (s.n_ff_shared > 0) {
            const float g = cpu::sigmoid(cpu::dot(w.shared_gate.data(), a.x + t * H, H));
            for (int64_t j = 0; j < H; ++j) o[j] += g * shared[t * H + j];
        }
    }
}

}  // namespace strata
