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
    int32_t* order = scratch.take<int32_t>(T * E);  // per token: expert ids, the top K first
    parallel_each(a.pool, T, [&](int64_t t) {
        float* p = probs + t * E;
        int32_t* top = order + t * E;
        cpu::softmax(p, E);
        top_k_into(p, E, K, top);
        float sum = 0.0f;
        for (int64_t k = 0; k < K; ++k) sum += p[top[k]];
        for (int64_t k = 0; k < K; ++k) {
            chosen[t * K + k] = top[k];
            weight[t * K + k] = s.normalize_weights ? p[top[k]] / sum : p[top[k]];
        }
    });
    if (a.routing) a.routing->record(a.layer, E, K, T, chosen, weight);

    // Each expert runs once over the rows that chose it; results land in their (row, slot) place. The (row, slot)
    // pairs are grouped by expert with a counting sort.
    int64_t* first = scratch.take_zeroed<int64_t>(E + 1);
    for (int64_t i = 0; i < T * K; ++i) ++first[chosen[i] + 1];
    for (int64_t e = 0; e < E; ++e) first[e + 1] += first[e];
    int64_t* slots = scratch.take<int64_t>(T * K);
    int64_t* fill = scratch.take<int64_t>(E);
    std::copy_n(first, E, fill);
    for (int64_t i = 0; i < T * K; ++i) slots[fill[chosen[i]]++] = i;

    // All experts' gate and up products (and the shared expert's) in one parallel pass, then all down products in a
    // second: two wake-ups of the pool per layer instead of three per expert. Expert e reads the rows of x at
    // source[first[e] .. first[e+1]) (slot order); the matmul quantizes each row of x once for all experts.
    const int64_t F = s.n_ff;
    int64_t* source = scratch.take<int64_t>(T * K);
    for (int64_t i = 0; i < T * K; ++i) source[i] = slots[i] / K;
    float* g = scratch.take<float>(T * K * F);
    float* u = scratch.take<float>(T * K * F);
    float* ys = scratch.take<float>(T * K * H);
    const int64_t FS = s.n_ff_shared;
    float* shared = FS > 0 ? scratch.take<float>(T * H) : nullptr;
    float* shared_g = FS > 0 ? scratch.take<float>(T * FS) : nullptr;
    float* shared_u = FS > 0 ? scratch.take<float>(T * FS) : nullptr;
    cpu::MatmulJob* jobs = scratch.take<cpu::MatmulJob>(2 * E + 2);
    int64_t n_jobs = 0;
    for (int64_t e = 0; e < E; ++e) {
        const int64_t n = first[e + 1] - first[e];
        if (n == 0) continue;
        const size_t ei = static_cast<size_t>(e);
        const int64_t* rows = source + first[e];
        jobs[n_jobs++] = {
            .w = &w.expert_gate[ei], .x = a.x, .y = g + first[e] * F, .n_tokens = n, .x_rows = rows, .x_count = T};
        jobs[n_jobs++] = {
            .w = &w.expert_up[ei], .x = a.x, .y = u + first[e] * F, .n_tokens = n, .x_rows = rows, .x_count = T};
    }
    if (FS > 0) {
        jobs[n_jobs++] = {.w = &*w.shared_gate_proj, .x = a.x, .y = shared_g, .n_tokens = T};
        jobs[n_jobs++] = {.w = &*w.shared_up, .x = a.x, .y = shared_u, .n_tokens = T};
    }
    cpu::matmul_many({jobs, static_cast<size_t>(n_jobs)}, a.pool);
    parallel_each(a.pool, T * K, [&](int64_t r) { cpu::silu_mul(g + r * F, u + r * F, F); }, 16);
    parallel_each(a.pool, T, [&](int64_t t) { cpu::silu_mul(shared_g + t * FS, shared_u + t * FS, FS); });
    n_jobs = 0;
    for (int64_t e = 0; e < E; ++e) {
        const int64_t n = first[e + 1] - first[e];
        if (n == 0) continue;
        jobs[n_jobs++] = {
            .w = &w.expert_down[static_cast<size_t>(e)], .x = g + first[e] * F, .y = ys + first[e] * H, .n_tokens = n};
    }
    if (FS > 0) jobs[n_jobs++] = {.w = &*w.shared_down, .x = shared_g, .y = shared, .n_tokens = T};
    cpu::matmul_many({jobs, static_cast<size_t>(n_jobs)}, a.pool);
    // ys is in slot order: the result for (row t, slot k) is row at[t * K + k] of it.
    int64_t* at = scratch.take<int64_t>(T * K);
    for (int64_t i = 0; i < T * K; ++i) at[slots[i]] = i;

    parallel_each(a.pool, T, [&](int64_t t) {
        float* o = a.out + t * H;
        for (int64_t j = 0; j < H; ++j) o[j] = 0.0f;
        for (int64_t k = 0; k < K; ++k) {
            const float* y = ys + at[t * K + k] * H;
            for (int64_t j = 0; j < H; ++j) o[j] += weight[t * K + k] * y[j];
        }
        if (s.n_ff_shared > 0) {
            const float gate = cpu::sigmoid(cpu::dot(w.shared_gate.data(), a.x + t * H, H));
            for (int64_t j = 0; j < H; ++j) o[j] += gate * shared[t * H + j];
        }
    });
}

}  // namespace strata
