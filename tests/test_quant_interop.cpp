// llama.cpp as the oracle for the quant formats (issue 5): small qwen4exp GGUFs whose routed-expert matrices are
// stored in each quant type load in llama.cpp (node-llama-cpp 3.21.1, prebuilt CPU build, driven by
// tests/interop/argmax.mjs as in test_interop.cpp), and llama.cpp's next-token argmax equals strata's at >= 99% of
// positions. strata dequantizes each weight row to f32 (the scalar reference) and computes in f32; llama.cpp runs its
// own quantized kernels, so agreement says that both read every block the same way.
//
// Types with a reference quantizer are written by `strata synth --preset small-k --type T` (the production path).
// GridExpertsInterop fills the grid types' (IQ2_XS, IQ3_XXS, IQ3_S, IQ1_M) expert tensors with random blocks (every
// bit pattern is a valid block), scaled to the magnitude of the f32 weights they replace: it checks the layouts
// independently of strata's grid quantizers, which QuantGridVsLlamaCpp compares with llama.cpp's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "convert/convert.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/quant_blocks.h"
#include "format/gguf.h"
#include "model/model.h"
#include "interop_util.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

using strata::DType;
using strata::testing::kInteropDir;
using strata::testing::run_shell;
using strata::testing::shell_quote;

// As in test_interop.cpp, a position agrees when llama.cpp's argmax is strata's maximum up to a relative margin; but
// here llama.cpp also rounds the activations to 8 bits (Q8_K for k- and i-quants, Q8_0 for Q4_0 / IQ4_NL) before
// its integer dot products, while strata keeps them in f32. Rounding a gaussian row to 8 bits (step max|x| / 127,
// max|x| ~ 3 sigma over a block) adds noise of 3 / 127 / sqrt(12) ~ 0.7% of the row's scale at every matmul, so logits
// that differ by less than ~1% of the top logit are ties that either engine may break either way. Exact matches must
// still be the rule (kMinExact): a misread block layout changes every position.
constexpr double kTieMargin = 1e-2;
constexpr double kMinAgreement = 0.99;
constexpr double kMinExact = 0.95;
constexpr int kPrompts = 4;         // prompts per type
constexpr int64_t kPromptLen = 16;  // within small-k's QSA budget, where llama.cpp and transformers keep the same cells

struct Agreement {
    size_t exact = 0, within_tie = 0, n = 0;
    std::string mismatches;
};

void compare(const std::vector<float>& logits, int64_t n_vocab, const std::vector<int32_t>& llama, Agreement* a) {
    for (size_t pos = 0; pos < llama.size(); ++pos) {
        const float* row = logits.data() + pos * static_cast<size_t>(n_vocab);
        const auto best = static_cast<int32_t>(std::max_element(row, row + n_vocab) - row);
        const int32_t other = llama[pos];
        ++a->n;
        if (other == best) {
            ++a->exact;
            ++a->within_tie;
            continue;
        }
        const bool in_range = other >= 0 && other < n_vocab;
        const double margin = kTieMargin * std::max(1.0, std::fabs(static_cast<double>(row[best])));
        if (in_range && row[best] - row[other] <= margin) {
            ++a->within_tie;
            continue;
        }
        if (a->mismatches.size() < 400)
            a->mismatches += " pos " + std::to_string(pos) + ": strata " + std::to_string(best) + " (" +
                             std::to_string(row[best]) + ") llama.cpp " + std::to_string(other) +
                             (in_range ? " (" + std::to_string(row[other]) + ")" : "") + ";";
    }
}

// strata's and llama.cpp's argmax over kPrompts fixed prompts of kPromptLen tokens.
void expect_llama_agrees(const fs::path& gguf, const std::string& what) {
    auto model = strata::load_model(gguf.string());
    const int64_t n_vocab = model->info().n_vocab;
    Agreement a;
    for (int p = 0; p < kPrompts; ++p) {
        std::vector<int32_t> prompt;
        for (int64_t i = 0; i < kPromptLen; ++i)
            prompt.push_back(static_cast<int32_t>((i * 7919 + p * 104729 + 3) % n_vocab));
        const strata::testing::LlamaResult llama_result = strata::testing::llama_argmax(gguf, prompt);
        ASSERT_TRUE(llama_result.error.empty()) << "llama.cpp refused the " << what << " file: " << llama_result.error;
        const std::vector<int32_t>& llama = llama_result.argmax;
        auto seq = model->new_sequence(kPromptLen);
        std::vector<float> logits(static_cast<size_t>(kPromptLen * n_vocab));
        model->forward(*seq, prompt, logits);
        compare(logits, n_vocab, llama, &a);
    }
    const double agreement = static_cast<double>(a.within_tie) / static_cast<double>(a.n);
    std::printf("[quant-interop] %s: argmax strata vs llama.cpp: %zu/%zu exact, %zu/%zu within ties -> %.1f%%\n",
                what.c_str(), a.exact, a.n, a.within_tie, a.n, 100.0 * agreement);
    EXPECT_GE(agreement, kMinAgreement) << what << ": argmax disagrees at" << a.mismatches;
    EXPECT_GE(static_cast<double>(a.exact) / static_cast<double>(a.n), kMinExact) << what;
}

void expect_expert_type(const fs::path& gguf, DType type) {
    auto file = strata::gguf::File::open(gguf.string());
    int n_experts = 0;
    for (const auto& t : file->tensors())
        if (t.name.find("_exps.") != std::string::npos) {
            ++n_experts;
            EXPECT_EQ(t.type, type) << t.name;
        }
    EXPECT_GT(n_experts, 0);
}

// ---- types strata quantizes: written by synth ----

class QuantizedExpertsInterop : public ::testing::TestWithParam<std::string> {};

TEST_P(QuantizedExpertsInterop, SynthFileArgmaxMatchesLlamaCpp) {
    REQUIRE_LLAMA_CPP();
    const DType type = *strata::dtype_from_name(GetParam());
    const strata::testing::TempDir scratch;
    const fs::path gguf = fs::path(scratch.path()) / ("small-k-" + GetParam() + ".gguf");
    strata::synth_model({.preset = "small-k", .expert_type = type, .out_path = gguf.string(), .seed = 7});
    expect_expert_type(gguf, type);
    expect_llama_agrees(gguf, "small-k experts " + GetParam());
}

INSTANTIATE_TEST_SUITE_P(Types, QuantizedExpertsInterop,
                         ::testing::Values("q4_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs", "iq2_xs",
                                           "iq3_xxs", "iq3_s", "iq1_m"));

// ---- grid types: random blocks in place of the f32 experts ----

// Stores the f16 super-block scale d into a block of grid type t.
void set_block_scale(DType t, uint8_t* block, uint16_t d) {
    if (t == DType::IQ1_M) {
        // The four top nibbles of the four uint16 of scales (first = lowest nibble of d).
        auto* b = reinterpret_cast<strata::BlockIQ1_M*>(block);
        for (int k = 0; k < 4; ++k) {
            uint16_t sc = 0;
            std::memcpy(&sc, b->scales + 2 * k, 2);
            sc = static_cast<uint16_t>((sc & 0x0FFF) | (((d >> (4 * k)) & 0xF) << 12));
            std::memcpy(b->scales + 2 * k, &sc, 2);
        }
        return;
    }
    std::memcpy(block, &d, 2);  // IQ2_XS, IQ3_XXS, IQ3_S: d is the first field
}

// Random blocks of type t for a tensor with `n_rows` rows of `width`, with d chosen so that the dequantized values
// have root mean square `target_rms`.
std::vector<uint8_t> random_grid_tensor(DType t, int64_t width, int64_t n_rows, double target_rms, uint64_t seed) {
    const auto& tr = strata::traits(t);
    const size_t rb = strata::row_bytes(t, width);
    std::vector<uint8_t> data(rb * static_cast<size_t>(n_rows));
    std::mt19937_64 rng(seed);
    for (auto& byte : data) byte = static_cast<uint8_t>(rng());
    const size_t n_blocks = data.size() / tr.block_bytes;
    for (size_t b = 0; b < n_blocks; ++b) set_block_scale(t, data.data() + b * tr.block_bytes, 0x3C00);  // d = 1
    double sum = 0;
    const int64_t probe_rows = std::min<int64_t>(n_rows, 16);
    std::vector<float> row(static_cast<size_t>(width));
    for (int64_t r = 0; r < probe_rows; ++r) {
        strata::dequantize_row(t, data.data() + static_cast<size_t>(r) * rb, row.data(), width);
        for (float v : row) sum += static_cast<double>(v) * v;
    }
    const double rms_at_one = std::sqrt(sum / static_cast<double>(probe_rows * width));
    const uint16_t d = strata::f32_to_f16(static_cast<float>(target_rms / rms_at_one));
    for (size_t b = 0; b < n_blocks; ++b) set_block_scale(t, data.data() + b * tr.block_bytes, d);
    return data;
}

uint32_t llama_ftype(DType t) {
    switch (t) {
        case DType::IQ2_XS:
            return 20;
        case DType::IQ3_XXS:
            return 23;
        case DType::IQ3_S:
            return 26;
        case DType::IQ1_M:
            return 31;
        default:
            return 0;
    }
}

// A copy of an f32 GGUF whose *_exps.* tensors become random blocks of type t.
void write_with_grid_experts(const fs::path& in, const fs::path& out, DType t) {
    auto file = strata::gguf::File::open(in.string());
    strata::gguf::Writer w;
    for (const auto& kv : file->kvs()) w.set(kv.key, kv.value);
    w.set("general.file_type", strata::gguf::Value::of_u32(llama_ftype(t)));
    uint64_t seed = 1;
    for (const auto& info : file->tensors()) {
        std::vector<int64_t> ne(info.ne, info.ne + info.n_dims);
        const uint8_t* src = info.data;
        const size_t n_bytes = info.n_bytes;
        if (info.name.find("_exps.") == std::string::npos || info.type != DType::F32) {
            w.add_tensor(info.name, info.type, ne, [src, n_bytes](uint8_t* dst, size_t n) {
                STRATA_ASSERT(n == n_bytes);
                std::memcpy(dst, src, n);
            });
            continue;
        }
        const int64_t width = info.ne[0];
        const int64_t n_rows = static_cast<int64_t>(n_bytes / sizeof(float)) / width;
        double sum = 0;
        const auto* f = reinterpret_cast<const float*>(src);
        for (size_t i = 0; i < n_bytes / sizeof(float); ++i) sum += static_cast<double>(f[i]) * f[i];
        const double rms = std::sqrt(sum / static_cast<double>(n_bytes / sizeof(float)));
        auto blocks = std::make_shared<std::vector<uint8_t>>(random_grid_tensor(t, width, n_rows, rms, seed++));
        w.add_tensor(info.name, t, ne, [blocks](uint8_t* dst, size_t n) {
            STRATA_ASSERT(n == blocks->size());
            std::memcpy(dst, blocks->data(), n);
        });
    }
    w.write(out.string());
}

class GridExpertsInterop : public ::testing::TestWithParam<std::string> {};

TEST_P(GridExpertsInterop, RandomBlocksArgmaxMatchesLlamaCpp) {
    REQUIRE_LLAMA_CPP();
    const DType type = *strata::dtype_from_name(GetParam());
    const strata::testing::TempDir scratch;
    const fs::path f32 = fs::path(scratch.path()) / "small-k-f32.gguf";
    const fs::path gguf = fs::path(scratch.path()) / ("small-k-" + GetParam() + ".gguf");
    strata::synth_model({.preset = "small-k", .out_path = f32.string(), .seed = 7});
    write_with_grid_experts(f32, gguf, type);
    expect_expert_type(gguf, type);
    expect_llama_agrees(gguf, "small-k random " + GetParam() + " experts");
}

INSTANTIATE_TEST_SUITE_P(Types, GridExpertsInterop, ::testing::Values("iq2_xs", "iq3_xxs", "iq3_s", "iq1_m"));

// ---- llama.cpp's own reference quantizers, compiled from the release node-llama-cpp bundles ----

const fs::path kBundle = kInteropDir / "node_modules" / "node-llama-cpp" / "llama" / "gitRelease.bundle";

// Extracts ggml-quants.c (and the headers it needs) from node-llama-cpp's llama.cpp bundle and compiles it with
// tests/interop/ggml_quants_oracle.c, once per process. Empty path and *why set when that cannot be done here.
fs::path ggml_quants_oracle(std::string* why) {
    static const strata::testing::TempDir dir;
    static std::string error;
    static const fs::path binary = [&]() -> fs::path {
        if (!fs::exists(kBundle)) {
            error = "node-llama-cpp's llama.cpp bundle is missing (" + kBundle.string() + ")";
            return {};
        }
        const fs::path src = fs::path(dir.path()) / "llama.cpp";
        const fs::path out = fs::path(dir.path()) / "ggml_quants_oracle";
        const std::string files =
            "ggml/include ggml/src/ggml-quants.c ggml/src/ggml-quants.h ggml/src/ggml-common.h ggml/src/ggml-impl.h "
            "ggml/src/ggml-cpu/ggml-cpu-impl.h";
        // ISO C (-std=c11) keeps floating-point contraction off, as strata's ISO C++ build does, so both compute
        // the scale searches with the same roundings.
        const std::string cc =
            "cc -std=c11 -O2 -w -I" + shell_quote(src / "ggml/include") + " -I" + shell_quote(src / "ggml/src");
        auto r = run_shell("git clone -q --no-checkout " + shell_quote(kBundle) + " " + shell_quote(src) +
                           " && git -C " + shell_quote(src) + " archive HEAD " + files + " | tar -x -C " +
                           shell_quote(src) + " && " + cc + " -c " + shell_quote(src / "ggml/src/ggml-quants.c") +
                           " -o " + shell_quote(src / "ggml-quants.o") + " && " + cc + " " +
                           shell_quote(kInteropDir / "ggml_quants_oracle.c") + " " +
                           shell_quote(src / "ggml-quants.o") + " -lm -o " + shell_quote(out));
        if (r.status != 0) {
            error = "cannot build llama.cpp's ggml-quants.c: " + r.err;
            return {};
        }
        return out;
    }();
    *why = error;
    return binary;
}

#define REQUIRE_GGML_QUANTS(var)                                                             \
    std::string var##_why;                                                                   \
    const fs::path var = ggml_quants_oracle(&var##_why);                                     \
    do {                                                                                     \
        if (var.empty()) {                                                                   \
            if (std::getenv("CI")) {                                                         \
                FAIL() << "llama.cpp reference quantizers unavailable in CI: " << var##_why; \
            }                                                                                \
            GTEST_SKIP() << "llama.cpp reference quantizers unavailable: " << var##_why;     \
        }                                                                                    \
    } while (0)

std::string run_oracle(const fs::path& oracle, DType t, int64_t n, char mode, const std::string& input) {
    auto r = run_shell(shell_quote(oracle) + " " + std::to_string(static_cast<uint32_t>(t)) + " " + std::to_string(n) +
                           " " + std::string(1, mode),
                       input);
    EXPECT_EQ(r.status, 0) << r.err;
    return r.out;
}

const DType kQuantizable[] = {DType::Q4_0, DType::Q2_K, DType::Q3_K,   DType::Q4_K,  DType::Q5_K,
                              DType::Q6_K, DType::Q8_K, DType::IQ4_NL, DType::IQ4_XS};

// Rows of different character: gaussian at magnitudes 1e-4..1e2, all positive, a third zeros, a heavy outlier.
std::vector<std::vector<float>> oracle_rows(int64_t n) {
    std::vector<std::vector<float>> rows;
    std::mt19937 rng(2024);
    std::normal_distribution<float> gauss;
    for (int kind = 0; kind < 8; ++kind) {
        std::vector<float> x(static_cast<size_t>(n));
        const float scale = std::pow(10.0f, static_cast<float>(kind % 4) * 2.0f - 4.0f);
        for (size_t i = 0; i < x.size(); ++i) {
            float v = gauss(rng) * scale;
            if (kind == 4 || kind == 5) v = std::fabs(v);
            if (kind == 6 && i % 3 == 0) v = 0.0f;
            if (kind == 7 && i % 97 == 5) v *= 50.0f;
            x[i] = v;
        }
        rows.push_back(std::move(x));
    }
    return rows;
}

TEST(QuantGgmlReference, QuantizedBytesAreIdentical) {
    REQUIRE_GGML_QUANTS(oracle);
    for (DType t : kQuantizable) {
        SCOPED_TRACE(strata::dtype_name(t));
        const int64_t n = strata::traits(t).block_size == 32 ? 32 * 41 : 256 * 9;  // odd numbers of blocks
        int row_index = 0;
        for (const std::vector<float>& x : oracle_rows(n)) {
            const std::string input(reinterpret_cast<const char*>(x.data()), x.size() * sizeof(float));
            const std::string theirs = run_oracle(oracle, t, n, 'q', input);
            std::string ours(strata::row_bytes(t, n), '\0');
            strata::quantize_row(t, x.data(), ours.data(), n);
            ASSERT_EQ(theirs.size(), ours.size());
            size_t first = 0;
            while (first < ours.size() && ours[first] == theirs[first]) ++first;
            EXPECT_EQ(first, ours.size()) << "row kind " << row_index << ": first differing byte " << first
                                          << " (block " << first / strata::traits(t).block_bytes << ")";
            ++row_index;
        }
    }
}

TEST(QuantGgmlReference, DequantizedValuesAreIdentical) {
    REQUIRE_GGML_QUANTS(oracle);
    const DType all[] = {DType::Q4_0,    DType::Q2_K,  DType::Q3_K,   DType::Q4_K,   DType::Q5_K,
                         DType::Q6_K,    DType::Q8_K,  DType::IQ4_NL, DType::IQ4_XS, DType::IQ2_XS,
                         DType::IQ3_XXS, DType::IQ3_S, DType::IQ1_M};
    std::mt19937_64 rng(77);
    for (DType t : all) {
        SCOPED_TRACE(strata::dtype_name(t));
        const auto& tr = strata::traits(t);
        const int64_t n = tr.block_size * 13;
        for (int trial = 0; trial < 4; ++trial) {
            // Random bytes exercise every field; the f16 scales are kept finite and moderate (exponent bits 0b0xxxx)
            // so that the comparison is about the layout, not about NaN payloads.
            std::string blocks(strata::row_bytes(t, n), '\0');
            for (char& c : blocks) c = static_cast<char>(rng());
            for (size_t b = 0; b < blocks.size(); b += tr.block_bytes) {
                uint8_t* block = reinterpret_cast<uint8_t*>(blocks.data() + b);
                if (t == DType::Q8_K) {
                    const float d = static_cast<float>(rng() % 1000) / 997.0f - 0.5f;
                    std::memcpy(block, &d, 4);
                } else if (t == DType::IQ1_M) {
                    block[55] &= 0xBF;  // top nibble of the last uint16 carries d's sign and high exponent bits
                } else {
                    const size_t d_at = t == DType::Q2_K ? 80 : t == DType::Q3_K ? 108 : t == DType::Q6_K ? 208 : 0;
                    block[d_at + 1] &= 0xBF;
                    if (t == DType::Q2_K || t == DType::Q4_K || t == DType::Q5_K) block[d_at + 3] &= 0xBF;  // dmin
                }
            }
            const std::string theirs = run_oracle(oracle, t, n, 'd', blocks);
            std::string ours(static_cast<size_t>(n) * sizeof(float), '\0');
            strata::dequantize_row(t, blocks.data(), reinterpret_cast<float*>(ours.data()), n);
            ASSERT_EQ(theirs.size(), ours.size());
            size_t first = 0;
            while (first < ours.size() && ours[first] == theirs[first]) ++first;
            EXPECT_EQ(first, ours.size()) << "trial " << trial << ": first differing element " << first / 4;
        }
    }
}

// Types synth cannot write for a shape say so rather than silently falling back to f16.
TEST(QuantInterop, SynthRefusesTypesThatDoNotFitThePreset) {
    const strata::testing::TempDir scratch;
    const std::string out = (fs::path(scratch.path()) / "x.gguf").string();
    try {
        strata::synth_model({.preset = "tiny", .expert_type = DType::Q4_K, .out_path = out});
        ADD_FAILURE() << "tiny's 64-wide experts cannot hold 256-element q4_k blocks";
    } catch (const strata::Error& e) {
        EXPECT_NE(std::string(e.what()).find("small-k"), std::string::npos) << e.what();
    }
    EXPECT_THROW(strata::synth_model({.preset = "small-k", .expert_type = DType::IQ2_XXS, .out_path = out}),
                 strata::Error);
}

// ---- grid types: strata's quantizers against llama.cpp's (uniform importance matrix) ----

// Gaussian rows with a few outliers, as weights look.
std::vector<float> weight_like_rows(int64_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> gauss;
    std::vector<float> x(static_cast<size_t>(n));
    for (size_t i = 0; i < x.size(); ++i) x[i] = gauss(rng) * (i % 211 == 7 ? 8.0f : 1.0f) * 0.02f;
    return x;
}

double rmse_of(DType t, const std::string& bytes, const std::vector<float>& x) {
    std::vector<float> y(x.size());
    strata::dequantize_row(t, bytes.data(), y.data(), static_cast<int64_t>(x.size()));
    double e = 0;
    for (size_t i = 0; i < x.size(); ++i) e += (static_cast<double>(y[i]) - x[i]) * (static_cast<double>(y[i]) - x[i]);
    return std::sqrt(e / static_cast<double>(x.size()));
}

// Our RMSE may exceed llama.cpp's (uniform importance, which is what ours uses without an imatrix) by at most 10%;
// and llama.cpp's dequantizer must read our bytes to exactly our floats.
constexpr double kMaxRmseRatio = 1.10;

TEST(QuantGridVsLlamaCpp, RoundTripRmseAndFormatAgreement) {
    REQUIRE_GGML_QUANTS(oracle);
    const int64_t n = 256 * 64;
    const std::vector<float> x = weight_like_rows(n, 99);
    const std::string input(reinterpret_cast<const char*>(x.data()), x.size() * sizeof(float));
    for (DType t : {DType::IQ2_XS, DType::IQ3_XXS, DType::IQ3_S, DType::IQ1_M}) {
        SCOPED_TRACE(strata::dtype_name(t));
        std::string ours(strata::row_bytes(t, n), '\0');
        strata::quantize_row(t, x.data(), ours.data(), n);
        const std::string theirs = run_oracle(oracle, t, n, 'w', input);
        ASSERT_EQ(theirs.size(), ours.size());
        const double e_ours = rmse_of(t, ours, x), e_theirs = rmse_of(t, theirs, x);
        std::printf("[quant-grid] %-8s RMSE strata %.6f  llama.cpp %.6f  ratio %.3f\n", strata::dtype_name(t), e_ours,
                    e_theirs, e_ours / e_theirs);
        EXPECT_LE(e_ours, kMaxRmseRatio * e_theirs);
        const std::string their_floats = run_oracle(oracle, t, n, 'd', ours);
        std::string our_floats(static_cast<size_t>(n) * sizeof(float), '\0');
        strata::dequantize_row(t, ours.data(), reinterpret_cast<float*>(our_floats.data()), n);
        EXPECT_TRUE(their_floats == our_floats) << "llama.cpp reads strata's bytes differently";
    }
}

}  // namespace
