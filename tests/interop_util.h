// llama.cpp as an oracle from gtest: the prebuilt CPU llama.cpp inside node-llama-cpp 3.21.1 (tests/interop/), driven
// by tests/interop/argmax.mjs. Shared by the interop, quant-interop and quantize tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace strata::testing {

inline const std::filesystem::path kInteropDir = std::filesystem::path(STRATA_SOURCE_DIR) / "tests" / "interop";

// Why llama.cpp cannot be asked here, or empty when it can.
inline std::string llama_oracle_missing() {
    if (std::system("node --version >/dev/null 2>&1") != 0) return "node is not installed";
    if (!std::filesystem::exists(kInteropDir / "node_modules" / "node-llama-cpp" / "package.json"))
        return "tests/interop/node_modules is missing (run: cd tests/interop && npm ci --omit=optional "
               "--ignore-scripts)";
    return "";
}

// CI installs node and node-llama-cpp (.ci/run), so there a missing oracle is a failure, not a skip.
#define REQUIRE_LLAMA_CPP()                                                                       \
    do {                                                                                          \
        if (std::string why = strata::testing::llama_oracle_missing(); !why.empty()) {            \
            if (std::getenv("CI")) {                                                              \
                FAIL() << "llama.cpp interop oracle unavailable in CI: " << why;                  \
            }                                                                                     \
            GTEST_SKIP() << "llama.cpp interop oracle unavailable: " << why;                      \
        }                                                                                         \
    } while (0)

// Token ids separated by spaces, commas or brackets.
inline std::vector<int32_t> parse_ids(const std::string& text) {
    std::vector<int32_t> ids;
    std::string cleaned = text;
    std::replace_if(
        cleaned.begin(), cleaned.end(), [](char c) { return c == ',' || c == '[' || c == ']'; }, ' ');
    std::istringstream in(cleaned);
    long long v = 0;
    while (in >> v) ids.push_back(static_cast<int32_t>(v));
    return ids;
}

inline std::string join_ids(const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t id : ids) {
        if (!s.empty()) s += ' ';
        s += std::to_string(id);
    }
    return s;
}

struct LlamaResult {
    std::vector<int32_t> argmax;  // per position
    std::string error;            // llama.cpp's own words when it refused the file
};

// llama.cpp's argmax after each of `ids`, or the error.
inline LlamaResult llama_argmax(const std::filesystem::path& model, const std::vector<int32_t>& ids) {
    auto r = run_shell("node " + shell_quote(kInteropDir / "argmax.mjs") + " " + shell_quote(model) + " " +
                       shell_quote(join_ids(ids)));
    LlamaResult result;
    if (r.status != 0) {
        result.error = "exit status " + std::to_string(r.status) + ": " + r.err;
        return result;
    }
    result.argmax = parse_ids(r.out);
    if (result.argmax.size() != ids.size())
        result.error = "expected " + std::to_string(ids.size()) + " argmax lines, got: " + r.out + r.err;
    return result;
}

// tests/data/bundled/goldens.bin (tools/train/train.py): "STGL", n_tokens, n_vocab (i32), then n_tokens ids, n_tokens
// argmax ids (i32) and the n_tokens x n_vocab f32 logits of transformers' forward on the bundled model.
struct BundledGoldens {
    int32_t n_tokens = 0, n_vocab = 0;
    std::vector<int32_t> ids, argmax;
    std::vector<float> logits;
};

inline BundledGoldens read_bundled_goldens() {
    const std::string raw = read_text(std::filesystem::path(STRATA_TEST_DATA) / "bundled" / "goldens.bin");
    BundledGoldens g;
    if (raw.size() < 12 || raw.compare(0, 4, "STGL") != 0) {
        ADD_FAILURE() << "goldens.bin: not a golden file";
        return g;
    }
    std::memcpy(&g.n_tokens, raw.data() + 4, 4);
    std::memcpy(&g.n_vocab, raw.data() + 8, 4);
    const size_t n = static_cast<size_t>(g.n_tokens), v = static_cast<size_t>(g.n_vocab);
    if (raw.size() != 12 + 8 * n + 4 * n * v) {
        ADD_FAILURE() << "goldens.bin size " << raw.size() << " does not match " << n << " x " << v;
        return BundledGoldens{};
    }
    g.ids.resize(n);
    g.argmax.resize(n);
    g.logits.resize(n * v);
    std::memcpy(g.ids.data(), raw.data() + 12, 4 * n);
    std::memcpy(g.argmax.data(), raw.data() + 12 + 4 * n, 4 * n);
    std::memcpy(g.logits.data(), raw.data() + 12 + 8 * n, 4 * n * v);
    return g;
}

}  // namespace strata::testing
