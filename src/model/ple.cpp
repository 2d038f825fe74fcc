#include "model/ple.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cpu/ops.h"
#include "core/error.h"

namespace strata {

PleWeights bind_ple(const TensorBinder& binder, int64_t block, const PleShape& s) {
    auto name = [&](const char* n) { return block_tensor(block, n); };
    const int64_t HC = s.n_streams * s.n_embd;
    const int64_t width = s.n_heads() * s.row_width;
    PleWeights w;
    w.table = binder.require_width("per_layer_token_embd.weight", s.row_width);
    for (int64_t h = 0; h < s.n_heads(); ++h)
        if (const uint64_t rows = static_cast<uint64_t>(w.table.ne[1]);
            s.sizes[h] == 0 || s.offsets[h] > rows || s.sizes[h] > rows - s.offsets[h])
            throw Error("PLE head " + std::to_string(h) + " reads " + std::to_string(s.sizes[h]) + " rows from row " +
                        std::to_string(s.offsets[h]) + " but per_layer_token_embd.weight has " +
                        std::to_string(w.table.ne[1]) + " rows");
    w.key = binder.require(name("ple_key.weight"), {width, HC});
    w.value = binder.require(name("ple_value.weight"), {width, s.n_embd});
    w.norm_key = binder.require_f32(name("ple_norm_key.weight"), {HC});
    w.norm_query = binder.require_f32(name("ple_norm_query.weight"), {HC});
    w.norm_conv = binder.require_f32(name("ple_norm_conv.weight"), {HC});
    w.conv = binder.require_f32(name("ple_conv1d.weight"), {s.conv_kernel, HC});
    return w;
}

void PleState::init(const PleShape& s) {
    tokens.assign(static_cast<size_t>(s.ngram - 1), s.eos);
    conv_history.assign(static_cast<size_t>(s.history_rows() * s.n_streams * s.n_embd), 0.0f);
}

std::vector<int64_t> ple_rows(const PleShape& s, const int32_t* history, int32_t token) {
    const int64_t N = s.ngram;
    // shifted[j]: the token j places back, or EOS once an EOS lies between it and the current token (inclusive of
    // the predecessor itself, exclusive of the current token).
    std::vector<uint64_t> shifted(static_cast<size_t>(N));
    shifted[0] = static_cast<uint64_t>(token);
    bool cut = false;
    for (int64_t j = 1; j < N; ++j) {
        const int32_t prev = history[N - 1 - j];
        shifted[j] = static_cast<uint64_t>(cut ? s.eos : prev);
        if (prev == s.eos) cut = true;
    }
    std::vector<int64_t> rows;
    uint64_t mixed = shifted[0] * s.multipliers[0];
    for (int64_t n = 2; n <= N; ++n) {
        mixed ^= shifted[n - 1] * s.multipliers[n - 1];  // u64 wrap-around
        for (int64_t g = 0; g < s.heads_per_ngram; ++g) {
            const int64_t h = (n - 2) * s.heads_per_ngram + g;
            rows.push_back(static_cast<int64_t>(mixed % s.sizes[h] + s.offsets[h]));
        }
    }
    return rows;
}

void ple_forward(const PleForwardArgs& a) {
    const PleShape& s = a.shape;
    const PleWeights& w = a.weights;
    const int64_t T = a.n_tokens, H = s.n_embd, hc = s.n_streams, HC = hc * H;
    const int64_t P = s.row_width, width = s.n_heads() * P, N = s.ngram;

    std::vector<float> emb(static_cast<size_t>(T * width));
    for (int64_t t = 0; t < T; ++t) {
        const std::vector<int64_t> rows = ple_rows(s, a.state.tokens.data(), a.tokens[t]);
        for (int64_t h = 0; h < s.n_heads(); ++h) cpu::get_row(w.table, rows[h], emb.data() + t * width + h * P);
        if (N > 1) {
            std::copy(a.state.tokens.begin() + 1, a.state.tokens.end(), a.state.tokens.begin());
            a.state.tokens.back() = a.tokens[t];
        }
    }
    std::vector<float> key(static_cast<size_t>(T * HC)), value(static_cast<size_t>(T * H));
    cpu::matmul({.w = w.key, .x = emb.data(), .y = key.data(), .n_tokens = T, .pool = a.pool});
    cpu::matmul({.w = w.value, .x = emb.data(), .y = value.data(), .n_tokens = T, .pool = a.pool});

    std::vector<float> query(static_cast<size_t>(HC)), gated(static_cast<size_t>(HC)), normed(static_cast<size_t>(HC)),
        conv(static_cast<size_t>(HC));
    const float inv_sqrt_h = 1.0f / std::sqrt(static_cast<float>(H));
    for (int64_t t = 0; t < T; ++t) {
        float* k = key.data() + t * HC;
        float* res = a.residual + t * HC;
        cpu::rms_norm_grouped(k, hc, H, w.norm_key.data(), s.eps, k);
        cpu::rms_norm_grouped(res, hc, H, w.norm_query.data(), s.eps, query.data());
        for (int64_t st = 0; st < hc; ++st) {
            float g = cpu::dot(k + st * H, query.data() + st * H, H) * inv_sqrt_h;
            g = std::sqrt(std::max(std::fabs(g), 1e-6f)) * (g > 0.0f ? 1.0f : (g < 0.0f ? -1.0f : 0.0f));
            const float gate = cpu::sigmoid(g);
            for (int64_t j = 0; j < H; ++j) gated[st * H + j] = gate * value[t * H + j];
        }
        cpu::rms_norm_grouped(gated.data(), hc, H, w.norm_conv.data(), s.eps, normed.data());
        cpu::causal_conv_step({.x = normed.data(),
                               .w = w.conv.data(),
                               .history = a.state.conv_history.data(),
                               .out = conv.data(),
                               .channels = HC,
                               .kernel = s.conv_kernel,
                               .dilation = N});
        for (int64_t i = 0; i < HC; ++i) res[i] += gated[i] + cpu::silu(conv[i]);
    }
}

}  // namespace strata
