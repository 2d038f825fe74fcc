// The bundled model (assets/strata-code-19m.gguf, docs/bundled-model.md) against the oracle that trained it:
// tests/data/bundled/goldens.bin holds transformers 5.17's own Qwen4Exp forward (its looping QSA selection, f32
// arithmetic) over the first 192 tokens of the held-out split, with the shipped bf16 weights; greedy.json holds the
// training code's greedy continuation of a prompt. Both were written by tools/train/train.py on the GPU machine.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "model/model.h"
#include "interop_util.h"
#include "model_test_util.h"
#include "test_util.h"

namespace fs = std::filesystem;
using strata::testing::read_text;
using strata::testing::run_shell;
using strata::testing::shell_quote;

namespace {

const fs::path kSource = STRATA_SOURCE_DIR;
const fs::path kModel = kSource / "assets" / "strata-code-19m.gguf";
const fs::path kData = fs::path(STRATA_TEST_DATA) / "bundled";

using Goldens = strata::testing::BundledGoldens;
using strata::testing::read_bundled_goldens;

struct Comparison {
    double max_relative = 0;  // max |strata - oracle| / max |oracle|
    double top1 = 0;          // share of positions where the argmax agrees with the oracle's
};

Comparison compare(const std::vector<float>& ours, const Goldens& g) {
    const size_t v = static_cast<size_t>(g.n_vocab);
    double max_abs = 0, max_diff = 0;
    size_t agree = 0;
    for (size_t pos = 0; pos < g.ids.size(); ++pos) {
        const float* row = ours.data() + pos * v;
        for (size_t j = 0; j < v; ++j) {
            max_abs = std::max(max_abs, std::fabs(static_cast<double>(g.logits[pos * v + j])));
            max_diff = std::max(max_diff, std::fabs(static_cast<double>(row[j]) - g.logits[pos * v + j]));
        }
        agree += (std::max_element(row, row + v) - row) == g.argmax[pos];
    }
    return {max_diff / max_abs, static_cast<double>(agree) / static_cast<double>(g.ids.size())};
}

std::vector<float> strata_logits(const strata::Model& model, const std::vector<int32_t>& ids, size_t chunk) {
    return strata::testing::logits_fed(model, ids, chunk);
}

TEST(BundledModel, LogitsMatchTheTrainingCodesForward) {
    const Goldens g = read_bundled_goldens();
    ASSERT_GT(g.n_tokens, 64) << "the goldens must reach past the QSA selection budget (64 tokens)";
    auto model = strata::load_model(kModel.string());
    ASSERT_EQ(model->info().n_vocab, g.n_vocab);
    for (size_t chunk : {g.ids.size(), size_t{1}, size_t{7}}) {
        const Comparison c = compare(strata_logits(*model, g.ids, chunk), g);
        std::printf("[bundled] %zu tokens in chunks of %zu: max |strata - transformers| / max |logit| = %.3g, "
                    "top-1 agreement %.4f\n",
                    g.ids.size(), chunk, c.max_relative, c.top1);
        // f32 arithmetic on both sides over the same bf16 weights: only summation order differs.
        EXPECT_LE(c.max_relative, 1e-3) << "chunk " << chunk;
        // The bar for the shipped quantization (bf16 here).
        EXPECT_GE(c.top1, 0.97) << "chunk " << chunk;
    }
}

TEST(BundledModel, GreedyContinuationMatchesTheTrainingCode) {
    const nlohmann::json expected = nlohmann::json::parse(read_text(kData / "greedy.json"));
    const std::string prompt = expected.at("prompt"), text = expected.at("text");
    ASSERT_EQ(text.rfind(prompt, 0), 0u) << "greedy.json text must start with the prompt";
    // No --model, run from the repository root: the bundled model is the default.
    const auto r = run_shell("cd " + shell_quote(kSource) + " && " + shell_quote(STRATA_BINARY) + " generate --greedy -n " +
                             std::to_string(expected.at("greedy_tokens").get<int>()) + " --prompt " + shell_quote(prompt));
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(prompt + r.out, text + "\n");  // generate ends its output with a newline
}

// strata perplexity's NLL of the goldens' ids against the NLL computed here from transformers' logits (the oracle):
// the same targets (token i + 1 from the logits after token i), the same top-1 tokens, and chunking changes nothing
// beyond rounding.
TEST(BundledModel, PerplexityMatchesTheOracle) {
    const Goldens g = read_bundled_goldens();
    ASSERT_GT(g.ids.size(), 2u);
    const size_t v = static_cast<size_t>(g.n_vocab);
    double oracle_sum = 0;
    for (size_t pos = 0; pos + 1 < g.ids.size(); ++pos) {
        const float* row = g.logits.data() + pos * v;
        const double top = *std::max_element(row, row + v);
        double sum = 0;
        for (size_t j = 0; j < v; ++j) sum += std::exp(row[j] - top);
        oracle_sum += std::log(sum) - (row[static_cast<size_t>(g.ids[pos + 1])] - top);
    }
    const strata::testing::TempDir dir;
    const std::string ids = dir / "ids.txt";
    {
        std::ofstream out(ids);
        for (int32_t id : g.ids) out << id << "\n";
    }
    double sums[2] = {0, 0};
    for (int run = 0; run < 2; ++run) {
        const std::string jsonl = dir / ("run" + std::to_string(run) + ".jsonl");
        const auto r = run_shell(shell_quote(STRATA_BINARY) + " perplexity --model " + shell_quote(kModel.string()) +
                                 " --ids --threads 2 --chunk " + (run == 0 ? "512" : "7") + " --jsonl " +
                                 shell_quote(jsonl) + " " + shell_quote(ids));
        ASSERT_EQ(r.status, 0) << r.err;
        const nlohmann::json line = nlohmann::json::parse(read_text(jsonl));
        ASSERT_EQ(line.at("tokens").get<size_t>(), g.ids.size() - 1);
        sums[run] = line.at("nll_sum").get<double>();
        const auto argmax = line.at("argmax").get<std::vector<int32_t>>();
        ASSERT_EQ(argmax.size(), g.ids.size() - 1);
        size_t agree = 0;
        for (size_t pos = 0; pos < argmax.size(); ++pos) agree += argmax[pos] == g.argmax[pos];
        EXPECT_GE(agree, 0.97 * argmax.size()) << "top-1 agreement with transformers (the bar of the logits test)";
    }
    // The logits agree to ~1e-5 of their scale (LogitsMatchTheTrainingCodesForward), so the NLL sums to ~1e-4.
    EXPECT_NEAR(sums[0], oracle_sum, 1e-3 * oracle_sum) << "oracle mean NLL " << oracle_sum / (g.ids.size() - 1);
    EXPECT_NEAR(sums[1], sums[0], 1e-5 * sums[0]);
}

TEST(BundledModel, IsTheDefaultModelFromAnotherFolder) {
    // From elsewhere, the model beside the build folder of the executable is found.
    const fs::path beside = fs::path(STRATA_BINARY).parent_path().parent_path() / "assets" / "strata-code-19m.gguf";
    if (!fs::exists(beside))
        GTEST_SKIP() << "the build folder is not in the repository (no " << beside.string()
                     << "): there is no bundled model beside it to find";
    const strata::testing::TempDir dir;
    const auto r = run_shell("cd " + shell_quote(dir.path()) + " && " + shell_quote(STRATA_BINARY) +
                             " run --raw --greedy -n 8 'import os'");
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_FALSE(r.out.empty());
}

TEST(BundledModel, CopyWithoutMtpKeepsTheTrunk) {
    const strata::testing::TempDir dir;
    const fs::path copy = fs::path(dir / "no-mtp.gguf");
    const auto r = strata::testing::run_strata("convert --gguf " + shell_quote(kModel) + " --no-mtp --out " +
                                               shell_quote(copy));
    ASSERT_EQ(r.status, 0) << r.err;
    auto shipped = strata::gguf::File::open(kModel.string());
    auto stripped = strata::gguf::File::open(copy.string());
    const uint32_t n_mtp = shipped->get_u32("qwen4exp.nextn_predict_layers");
    EXPECT_GE(n_mtp, 1u);
    EXPECT_EQ(stripped->get_u32("qwen4exp.block_count"), shipped->get_u32("qwen4exp.block_count") - n_mtp);
    EXPECT_EQ(stripped->find("qwen4exp.nextn_predict_layers"), nullptr);
    EXPECT_EQ(stripped->get_int_array("qwen4exp.attention.compress_ratios").size(),
              stripped->get_u32("qwen4exp.block_count"));
    size_t kept = 0;
    for (const auto& t : shipped->tensors()) {
        const auto* other = stripped->find_tensor(t.name);
        if (!other) continue;
        ++kept;
        ASSERT_EQ(other->n_bytes, t.n_bytes) << t.name;
        EXPECT_EQ(std::memcmp(other->data, t.data, t.n_bytes), 0) << t.name;
    }
    EXPECT_EQ(kept, stripped->tensors().size());
    EXPECT_LT(kept, shipped->tensors().size());
    // Same logits: the trunk does not read the MTP block.
    const std::vector<int32_t> ids = {1, 100, 2000, 3000, 4000, 5000, 6000, 7000};
    auto a = strata::load_model(kModel.string());
    auto b = strata::load_model(copy.string());
    EXPECT_EQ(strata_logits(*a, ids, ids.size()), strata_logits(*b, ids, ids.size()));
    // A file without an MTP block is refused with one line.
    strata::testing::expect_user_error(strata::testing::run_strata("convert --gguf " + shell_quote(copy) +
                                                                   " --no-mtp --out " + shell_quote(dir / "again.gguf")),
                                       "has no MTP block");
}

TEST(BundledModel, FitsTheRepositoryBudget) {
    // The issue caps the shipped file at 40 MB.
    EXPECT_LE(fs::file_size(kModel), 40'000'000u);
}

}  // namespace
