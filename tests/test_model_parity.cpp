// Model parity against transformers goldens (tests/data/<name>/, made by tools/goldens/make_goldens.py): the HF folder
// is converted to GGUF with strata's converter, loaded, and its logits compared with the recorded ones.
//  - f32 weights: max |strata - transformers| over all prefill logits <= 1e-3 * max |logit|;
//  - greedy continuation (incremental decode) identical to transformers' 24 ids;
//  - q8_0 weights: top-1 agreement with f32 >= 98% and mean KL(f32 || q8_0) < 0.01 over the prompt positions.
//    Random-weight GDN models can be far more sensitive to weight rounding than trained ones: early tokens' GDN
//    outputs come from nearly orthogonal q/k (o ~ (k.q) v), and the gated RMSNorm rescales that small value to unit
//    size, so rounding noise in the q/k rows is amplified. A fixture that fails here while its f32 parity holds is
//    ill-conditioned for this check rather than wrong; compare its f16 conversion to see the scale of the effect.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <cstdlib>
#include <vector>


#include <nlohmann/json.hpp>

#include "convert/convert.h"
#include "test_util.h"
#include "core/dtype.h"
#include "core/error.h"
#include "model/model.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

struct Golden {
    fs::path dir;
    std::vector<int32_t> prompt;
    std::vector<int32_t> greedy;
    std::vector<float> logits;  // [prompt x vocab]
};

std::optional<Golden> load_golden(const std::string& name) {
    Golden g;
    g.dir = strata::testing::fixtures_root() / name;
    if (!fs::exists(g.dir / "hf" / "config.json") || !fs::exists(g.dir / "logits.f32")) return std::nullopt;
    g.prompt = strata::testing::read_ids(g.dir / "prompt.txt");
    g.greedy = strata::testing::read_ids(g.dir / "greedy.txt");
    g.logits = strata::testing::read_floats(g.dir / "logits.f32");
    return g;
}

// One conversion per fixture and type per test process, in a private temp dir.
std::string converted(const Golden& g, DType type) {
    static std::map<std::string, std::string> cache;
    const std::string key = g.dir.string() + "|" + dtype_name(type);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
    const fs::path dir = strata::testing::process_temp_dir().path();
    const std::string out = (dir / (g.dir.filename().string() + "-" + dtype_name(type) + ".gguf")).string();
    convert_hf_to_gguf({.hf_dir = (g.dir / "hf").string(),
                        .out_path = out,
                        .out_type = type,
                        .vocab_placeholder = !fs::exists(g.dir / "hf" / "tokenizer.json")});
    cache[key] = out;
    return out;
}

std::vector<float> prefill(const Model& m, const std::vector<int32_t>& tokens) {
    auto seq = m.new_sequence(static_cast<int64_t>(tokens.size()) + 64);
    std::vector<float> logits(tokens.size() * static_cast<size_t>(m.info().n_vocab));
    m.forward(*seq, tokens, logits);
    return logits;
}

int32_t argmax(const float* x, int64_t n) {
    return static_cast<int32_t>(std::max_element(x, x + n) - x);
}

class Parity : public ::testing::TestWithParam<std::string> {
  protected:
    void SetUp() override {
        golden_ = load_golden(GetParam());
        if (!golden_)
            GTEST_SKIP() << "fixture " << (strata::testing::fixtures_root() / GetParam()).string() << " is missing (tools/goldens/make_goldens.py)";
        // The extra fixtures probe configurations that GGUF files may not be able to express (several PLE layers, a
        // SiLU GDN gate in qwen4exp, ...): when the converter refuses one, say why and skip it.
        if (GetParam().rfind("extra_", 0) == 0) {
            try {
                converted(*golden_, DType::F32);
            } catch (const Error& e) {
                GTEST_SKIP() << GetParam() << " cannot be converted to GGUF: " << e.what();
            }
        }
    }
    std::optional<Golden> golden_;
};

TEST_P(Parity, F32PrefillLogitsMatchTransformers) {
    const Golden& g = *golden_;
    auto model = load_model(converted(g, DType::F32), {.n_threads = 2});
    const int64_t V = model->info().n_vocab;
    ASSERT_EQ(g.logits.size(), g.prompt.size() * static_cast<size_t>(V));
    const std::vector<float> ours = prefill(*model, g.prompt);
    double max_diff = 0, max_ref = 0;
    int64_t worst = 0;
    for (size_t i = 0; i < ours.size(); ++i) {
        ASSERT_TRUE(std::isfinite(ours[i])) << "logit " << i;
        const double d = std::fabs(static_cast<double>(ours[i]) - g.logits[i]);
        if (d > max_diff) worst = static_cast<int64_t>(i);
        max_diff = std::max(max_diff, d);
        max_ref = std::max(max_ref, std::fabs(static_cast<double>(g.logits[i])));
    }
    std::printf("[ %s ] max |diff| %.3g, max |logit| %.3g, relative %.3g (worst at token %lld)\n", GetParam().c_str(),
                max_diff, max_ref, max_diff / max_ref, static_cast<long long>(worst / V));
    EXPECT_LE(max_diff, 1e-3 * max_ref);
    int agree = 0;
    for (size_t t = 0; t < g.prompt.size(); ++t)
        agree += argmax(ours.data() + t * V, V) == argmax(g.logits.data() + t * V, V);
    EXPECT_EQ(agree, static_cast<int>(g.prompt.size()));
}

TEST_P(Parity, GreedyContinuationMatchesTransformers) {
    const Golden& g = *golden_;
    auto model = load_model(converted(g, DType::F32), {.n_threads = 2});
    const int64_t V = model->info().n_vocab;
    auto seq = model->new_sequence(static_cast<int64_t>(g.prompt.size() + g.greedy.size()));
    std::vector<float> logits(static_cast<size_t>(V));
    model->forward(*seq, g.prompt, logits, /*last_only=*/true);
    std::vector<int32_t> ours;
    for (size_t i = 0; i < g.greedy.size(); ++i) {
        const int32_t next = argmax(logits.data(), V);
        ours.push_back(next);
        if (i + 1 < g.greedy.size()) model->forward(*seq, std::span<const int32_t>(&next, 1), logits, true);
    }
    EXPECT_EQ(ours, g.greedy);
}

TEST_P(Parity, Q8_0StaysCloseToF32) {
    const Golden& g = *golden_;
    auto f32 = load_model(converted(g, DType::F32), {.n_threads = 2});
    auto q8 = load_model(converted(g, DType::Q8_0), {.n_threads = 2});
    const int64_t V = f32->info().n_vocab;
    // The prompt and its greedy continuation: 64 positions, so one near-tie flip does not decide the 98% bar.
    std::vector<int32_t> tokens = g.prompt;
    tokens.insert(tokens.end(), g.greedy.begin(), g.greedy.end());
    const std::vector<float> a = prefill(*f32, tokens), b = prefill(*q8, tokens);
    int agree = 0;
    double kl_sum = 0;
    const int64_t T = static_cast<int64_t>(tokens.size());
    for (int64_t t = 0; t < T; ++t) {
        const float* p = a.data() + t * V;
        const float* q = b.data() + t * V;
        agree += argmax(p, V) == argmax(q, V);
        const double mp = *std::max_element(p, p + V), mq = *std::max_element(q, q + V);
        double zp = 0, zq = 0;
        for (int64_t i = 0; i < V; ++i) {
            zp += std::exp(p[i] - mp);
            zq += std::exp(q[i] - mq);
        }
        double kl = 0;
        for (int64_t i = 0; i < V; ++i) {
            const double lp = p[i] - mp - std::log(zp), lq = q[i] - mq - std::log(zq);
            kl += std::exp(lp) * (lp - lq);
        }
        kl_sum += kl;
    }
    const double top1 = static_cast<double>(agree) / static_cast<double>(T);
    // The bar is 98%, or, where transformers itself measured a Q8_0-rounded copy of the fixture to flip some of the
    // prompt's argmax (meta.json's q8_0_sensitivity below 1: QSA selections decided by ties at zero flip when rounding
    // moves a score across 0, and some random GDN fixtures amplify rounding), that figure less three flips.
    double bar = 0.98;
    std::ifstream meta_file(g.dir / "meta.json");
    const nlohmann::json meta = nlohmann::json::parse(meta_file, nullptr, /*allow_exceptions=*/false);
    if (meta.is_object() && meta.contains("q8_0_sensitivity")) {
        const double theirs = meta["q8_0_sensitivity"].value("top1", 1.0);
        if (theirs < 1.0) bar = std::min(bar, theirs - 3.0 / static_cast<double>(T));
    }
    std::printf("[ %s ] q8_0 vs f32: top-1 agreement %.4f (bar %.4f), mean KL %.3g\n", GetParam().c_str(), top1,
                bar, kl_sum / static_cast<double>(T));
    EXPECT_GE(top1, bar);
    EXPECT_LT(kl_sum / static_cast<double>(T), 0.01);
}

// A fixture converted by llama.cpp's own converter (tools/goldens/llamacpp_convert.py, on the GPU machine): a file
// strata did not write (llama.cpp's value-head order, norm offsets and metadata) must give transformers' logits.
// Committed for qwen35moe (tests/data/qwen35moe/llamacpp-f32.gguf). llama.cpp's converter of this release cannot make
// a faithful qwen4exp file from transformers 5.17's configs (bench/NOTES.md, 2026-12-04), so there is none for it.
std::vector<std::string> llamacpp_converted_names() {
    return strata::testing::fixtures_with({"llamacpp-f32.gguf", "logits.f32"});
}

class LlamaCppConverted : public ::testing::TestWithParam<std::string> {};

TEST_P(LlamaCppConverted, FileMatchesTransformers) {
    const std::optional<Golden> golden = load_golden(GetParam());
    ASSERT_TRUE(golden);
    const Golden& g = *golden;
    const fs::path file = g.dir / "llamacpp-f32.gguf";
    auto model = load_model(file.string(), {.n_threads = 2});
    const int64_t V = model->info().n_vocab;
    ASSERT_EQ(g.logits.size(), g.prompt.size() * static_cast<size_t>(V));
    const std::vector<float> ours = prefill(*model, g.prompt);
    double max_diff = 0, max_ref = 0;
    for (size_t i = 0; i < ours.size(); ++i) {
        max_diff = std::max(max_diff, std::fabs(static_cast<double>(ours[i]) - g.logits[i]));
        max_ref = std::max(max_ref, std::fabs(static_cast<double>(g.logits[i])));
    }
    std::printf("[ %s ] llama.cpp-converted: max |diff| %.3g, relative %.3g\n", GetParam().c_str(), max_diff,
                max_diff / max_ref);
    EXPECT_LE(max_diff, 1e-3 * max_ref);
    int agree = 0;
    for (size_t t = 0; t < g.prompt.size(); ++t)
        agree += argmax(ours.data() + t * V, V) == argmax(g.logits.data() + t * V, V);
    EXPECT_EQ(agree, static_cast<int>(g.prompt.size()));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LlamaCppConverted, ::testing::ValuesIn(llamacpp_converted_names()),
                         [](const auto& p) { return p.param; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(LlamaCppConverted);

std::vector<std::string> fixture_names() {
    std::vector<std::string> names;
    // Listed so that a missing one shows as skipped: the three architectures, then issue 30's configs (GDN value
    // heads of another size than the key heads with a PLE width other than hidden_size; the same in qwen3next's fused
    // layout; qwen3next with dense MLP layers; qwen4exp with PLE on three layers), which llama.cpp's keys cannot carry.
    if (!strata::testing::fixtures_overridden())
        names = {"qwen4exp",        "qwen35moe",       "qwen3next",     "qwen4exp_uneven",
                 "qwen3next_uneven", "qwen3next_dense", "qwen4exp_ple3"};
    const fs::path root = strata::testing::fixtures_root();
    if (fs::is_directory(root))
        for (const auto& e : fs::directory_iterator(root)) {
            const std::string n = e.path().filename().string();
            if (std::find(names.begin(), names.end(), n) == names.end() && fs::exists(e.path() / "hf" / "config.json"))
                names.push_back(n);
        }
    return names;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Parity, ::testing::ValuesIn(fixture_names()), [](const auto& p) { return p.param; });

}  // namespace
