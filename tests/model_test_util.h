// Helpers for the tests that run a model: feeding a token list in calls of a given size, plain greedy decoding.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "convert/convert.h"
#include "model/model.h"
#include "test_util.h"

namespace strata::testing {

// A transformers golden (fixtures_root()/name/hf) converted at f32 into the process's temp folder, once per process.
inline std::string converted_golden(const std::string& name) {
    static std::map<std::string, std::string> cache;
    if (auto it = cache.find(name); it != cache.end()) return it->second;
    const std::filesystem::path dir = fixtures_root() / name;
    const std::string out = (std::filesystem::path(process_temp_dir().path()) / (name + ".gguf")).string();
    convert_hf_to_gguf({.hf_dir = (dir / "hf").string(),
                        .out_path = out,
                        .out_type = DType::F32,
                        .vocab_placeholder = !std::filesystem::exists(dir / "hf" / "tokenizer.json")});
    return cache[name] = out;
}

// n pseudo-random token ids below V (a fixed seed gives the same list).
inline std::vector<int32_t> random_tokens(int64_t V, int n, unsigned seed) {
    std::vector<int32_t> tokens;
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(V - 1));
    for (int i = 0; i < n; ++i) tokens.push_back(pick(rng));
    return tokens;
}

// The floats that differ bit for bit (every one of them when the sizes differ).
inline size_t bit_mismatches(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return std::max(a.size(), b.size());
    size_t n = 0;
    for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], 4) != 0;
    return n;
}

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

// Plain greedy decoding: the prompt in one call, then n tokens one a step, each the argmax (lowest id on a tie) of the
// previous step's logits.
inline std::vector<int32_t> plain_greedy(const Model& m, const std::vector<int32_t>& prompt, int64_t n) {
    const int64_t vocab = m.info().n_vocab;
    auto seq = m.new_sequence(static_cast<int64_t>(prompt.size()) + n + 8);
    std::vector<float> logits(static_cast<size_t>(vocab));
    m.forward(*seq, prompt, logits, true);
    std::vector<int32_t> out;
    for (int64_t i = 0; i < n; ++i) {
        const auto t = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
        out.push_back(t);
        m.forward(*seq, std::vector<int32_t>{t}, logits, true);
    }
    return out;
}

}  // namespace strata::testing
