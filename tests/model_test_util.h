// Helpers for the tests that run a model: one place for feeding a token list in calls of a given size.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "model/model.h"

namespace strata::testing {

// The logits after each token, the tokens fed `per_call` at a time to one fresh sequence.
inline std::vector<float> logits_fed(const Model& m, const std::vector<int32_t>& tokens, size_t per_call) {
    auto seq = m.new_sequence(static_cast<int64_t>(tokens.size()) + 32);
    const size_t V = static_cast<size_t>(m.info().n_vocab);
    std::vector<float> logits(tokens.size() * V);
    for (size_t start = 0; start < tokens.size(); start += per_call) {
        const size_t n = std::min(per_call, tokens.size() - start);
        m.forward(*seq, std::span<const int32_t>(tokens).subspan(start, n),
                  std::span<float>(logits).subspan(start * V, n * V));
    }
    return logits;
}

}  // namespace strata::testing
