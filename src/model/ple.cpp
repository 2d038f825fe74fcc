#include "model/ple.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cpu/ops.h"
#include "core/error.h"

namespace strata {

PleWeights bind_ple(const TensorBinder& binder, int64_t block, const PleShape& s, const std::string& table) {
    auto name = [&](const char* n) { return block_tensor(block, n); };
    const int64_t HC = s.n_streams * s.n_embd;
    const int64_t width = s.n_heads() * s.row_width;
    PleWeights w;
    w.table = binder.require_width(table, s.row_width);
    for (int64_t h = 0; h < s.n_heads(); ++h)
        if (const uint64_t rows = static_cast<uint64_t>(w.table.ne[1]);
            s.sizes[h] == 0 || s.offsets[h] > rows || s.sizes[h] > rows - s.offsets[h])
            throw Error("PLE head " + std::to_string(h) + " reads " + std::to_string(s.sizes[h]) + " rows from row " +
                        std::to_string(s.offsets[h]) + " but " + table + " has " +
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

void ple_rows_into(const PleShape& s, const int32_t* history, int32_t token, int64_t* rows) {
    const int64_t N = s.ngram;
    // shifted[j]: the token j places back, or EOS once an EOS lies between it and the current token (inclusive of
    // the predecessor itself, exclusive of the current token).
    uint64_t shifted[8];
    STRATA_ASSERT(N >= 1 && N <= 8);
    shifted[0] = static_cast<uint64_t>(token);
    bool cut = false;
    for (int64_t j = 1; j < N; ++j) {
        const int32_t prev = history[N - 1 - j];
        shifted[j] = static_cast<uint64_t>(cut ? s.eos : prev);
        if (prev == s.eos) cut = true;
    }
    uint64_t mixed = shifted[0] * s.multipliers[0];
    for (int64_t n = 2; n <= N; ++n) {
        mixed ^= shifted[n - 1] * s.multipliers[n - 1];  // u64 wrap-around
        for (int64_t g = 0; g < s.heads_per_ngram; ++g) {
            const int64_t h = (n - 2) * s.heads_per_ngram + g;
            rows[h] = static_cast<int64_t>(mixed % s.sizes[h] + s.offsets[h]);
        }
    }
}

std::vector<int64_t> ple_rows(const PleShape& s, const int32_t* history, int32_t token) {
    std::vector<int64_t> rows(static_cast<size_t>(s.n_heads()));
    ple_rows_into(s, history, token, rows.data());
    return rows;
}

void ple_forward(const PleForwardArgs& a) {
    const PleShape& s = a.shape;
    const PleWeights& w = a.weights;
    const int64_t T = a.n_tokens, H = s.n_embd, hc = s.n_streams, HC = hc * H;
    const int64_t P = s.row_width, width = s.n_heads() * P, N = s.ngram;
    const int64_t n_seq = static_cast<int64_t>(a.sequences.size());
    STRATA_ASSERT(a.states.size() == a.sequences.size());

    float* emb = a.scratch.take<float>(T * width);
    int64_t* rows = a.scratch.take<int64_t>(s.n_heads());
    auto window = [&](int64_t i) { return a.windows.empty() ? nullptr : a.windows[static_cast<size_t>(i)]; };
    for (int64_t i = 0; i < n_seq; ++i)
        if (PleWindow* wl = window(i)) {
            const SequenceRows& seq = a.sequences[static_cast<size_t>(i)];
            wl->count = seq.count;
            wl->tokens.assign(a.tokens + seq.begin, a.tokens + seq.begin + seq.count);
            wl->conv.resize(static_cast<size_t>(seq.count * HC));
        }
    for (int64_t i = 0; i < n_seq; ++i) {
        const SequenceRows& seq = a.sequences[static_cast<size_t>(i)];
        std::vector<int32_t>& history = a.states[static_cast<size_t>(i)]->tokens;
        for (int64_t t = seq.begin; t < seq.begin + seq.count; ++t) {
            ple_rows_into(s, history.data(), a.tokens[t], rows);
            for (int64_t h = 0; h < s.n_heads(); ++h) cpu::get_row(w.table, rows[h], emb + t * width + h * P);
            if (N > 1) {
                std::copy(history.begin() + 1, history.end(), history.begin());
                history.back() = a.tokens[t];
            }
        }
    }
    float* key = a.scratch.take<float>(T * HC);
    float* value = a.scratch.take<float>(T * H);
    cpu::matmul({.w = w.key, .x = emb, .y = key, .n_tokens = T, .pool = a.pool});
    cpu::matmul({.w = w.value, .x = emb, .y = value, .n_tokens = T, .pool = a.pool});

    // Gate and conv, one sequence at a time through its conv history (sequences in parallel).
    float* work = a.scratch.take<float>(n_seq * 4 * HC);
    const float inv_sqrt_h = 1.0f / std::sqrt(static_cast<float>(H));
    auto gate_and_conv = [&](int64_t seq_begin, int64_t seq_end) {
        for (int64_t i = seq_begin; i < seq_end; ++i) {
            const SequenceRows& seq = a.sequences[static_cast<size_t>(i)];
            PleState& state = *a.states[static_cast<size_t>(i)];
            float* query = work + i * 4 * HC;
            float* gated = query + HC;
            float* normed = gated + HC;
            float* conv = normed + HC;
            for (int64_t t = seq.begin; t < seq.begin + seq.count; ++t) {
                float* k = key + t * HC;
                float* res = a.residual + t * HC;
                cpu::rms_norm_grouped(k, hc, H, w.norm_key.data(), s.eps, k);
                cpu::rms_norm_grouped(res, hc, H, w.norm_query.data(), s.eps, query);
                for (int64_t st = 0; st < hc; ++st) {
                    float g = cpu::dot(k + st * H, query + st * H, H) * inv_sqrt_h;
                    g = std::sqrt(std::max(std::fabs(g), 1e-6f)) * (g > 0.0f ? 1.0f : (g < 0.0f ? -1.0f : 0.0f));
                    const float gate = cpu::sigmoid(g);
                    for (int64_t j = 0; j < H; ++j) gated[st * H + j] = gate * value[t * H + j];
                }
                cpu::rms_norm_grouped(gated, hc, H, w.norm_conv.data(), s.eps, normed);
                if (PleWindow* wl = window(i)) std::copy_n(normed, HC, wl->conv.data() + (t - seq.begin) * HC);
                cpu::causal_conv_step({.x = normed,
                                       .w = w.conv.data(),
                                       .history = state.conv_history.data(),
                                       .out = conv,
                                       .channels = HC,
                                       .kernel = s.conv_kernel,
                                       .dilation = N});
                for (int64_t j = 0; j < HC; ++j) res[j] += gated[j] + cpu::silu(conv[j]);
            }
        }
    };
    if (a.pool && n_seq > 1)
        a.pool->parallel_for(n_seq, gate_and_conv);
    else
        gate_and_conv(0, n_seq);
}

void ple_commit(PleState& state, const PleWindow& wl, int64_t n_keep) {
    STRATA_ASSERT(n_keep >= 0 && n_keep <= wl.count);
    const int64_t HC = wl.count > 0 ? std::ssize(wl.conv) / wl.count : 0;
    for (int64_t t = 0; t < n_keep; ++t) {
        if (!state.tokens.empty()) {
            std::copy(state.tokens.begin() + 1, state.tokens.end(), state.tokens.begin());
            state.tokens.back() = wl.tokens[static_cast<size_t>(t)];
        }
    }
    if (HC > 0)
        cpu::conv_history_push(state.conv_history.data(), std::ssize(state.conv_history) / HC, HC, wl.conv.data(),
                               n_keep);
}

}  // namespace strata
