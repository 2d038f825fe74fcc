// The gated delta rule's test inputs, shared by test_cuda_recurrent (the kernel against the CPU step) and
// test_cuda_gdn_recurrence (its two kernels against each other): one window laid out as the model's conv output, and
// the CPU reference over it. CUDA builds only (it uses cuda_test_util.h's generators).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backend/cpu/ops.h"
#include "cuda_test_util.h"

namespace strata::cuda_test {

struct DeltaShape {
    int64_t dk, dv, heads, key_heads;
    bool tiled;
};

// One window's inputs laid out as the model's conv output: token rows of [q heads | k heads | v heads], q and k
// L2-normalised per head (q also scaled by 1/sqrt(dk), as the model does), g a log decay in (-1.5, 0), beta in (0, 1).
struct DeltaInputs {
    DeltaShape s;
    int64_t n_tokens = 0, row = 0;
    std::vector<float> rows, g, beta, state;

    DeltaInputs(const DeltaShape& shape, int64_t tokens, std::mt19937& rng) : s(shape), n_tokens(tokens) {
        const int64_t key_dim = s.key_heads * s.dk;
        row = 2 * key_dim + s.heads * s.dv;
        rows = gaussian(static_cast<size_t>(std::max<int64_t>(tokens, 1) * row), rng);
        for (int64_t t = 0; t < tokens; ++t)
            for (int64_t part = 0; part < 2; ++part)
                for (int64_t kh = 0; kh < s.key_heads; ++kh) {
                    float* x = rows.data() + t * row + part * key_dim + kh * s.dk;
                    strata::cpu::l2_norm(x, s.dk, 1e-6f, x);
                    if (part == 0)
                        for (int64_t i = 0; i < s.dk; ++i) x[i] /= std::sqrt(static_cast<float>(s.dk));
                }
        std::uniform_real_distribution<float> decay(-1.5f, -0.01f);
        std::normal_distribution<float> logit;
        g.resize(static_cast<size_t>(std::max<int64_t>(tokens, 1) * s.heads));
        beta.resize(g.size());
        for (size_t i = 0; i < g.size(); ++i) g[i] = decay(rng), beta[i] = strata::cpu::sigmoid(logit(rng));
        state = gaussian(static_cast<size_t>(s.heads * s.dk * s.dv), rng, 0.5f);
    }
    int64_t key_head(int64_t h) const { return s.tiled ? h % s.key_heads : h / (s.heads / s.key_heads); }
    int64_t out_row() const { return s.heads * s.dv; }
    size_t n_out() const { return static_cast<size_t>(n_tokens * out_row()); }

    // Tokens [first, first + count) token by token with the CPU reference; state updated in place.
    void reference(int64_t first, int64_t count, std::vector<float>& st, std::vector<float>& out) const {
        const int64_t key_dim = s.key_heads * s.dk;
        for (int64_t t = first; t < first + count; ++t)
            for (int64_t h = 0; h < s.heads; ++h) {
                const float* r = rows.data() + t * row;
                strata::cpu::gated_delta_step({.state = st.data() + h * s.dk * s.dv,
                                       .q = r + key_head(h) * s.dk,
                                       .k = r + key_dim + key_head(h) * s.dk,
                                       .v = r + 2 * key_dim + h * s.dv,
                                       .g = g[static_cast<size_t>(t * s.heads + h)],
                                       .beta = beta[static_cast<size_t>(t * s.heads + h)],
                                       .dk = s.dk,
                                       .dv = s.dv,
                                       .out = out.data() + t * out_row() + h * s.dv});
            }
    }
};

}  // namespace strata::cuda_test
