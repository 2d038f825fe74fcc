// Interop with llama.cpp (DESIGN.md sections 5-6): the GGUF files strata writes load in llama.cpp, and llama.cpp's
// next-token argmax matches strata's at (nearly) every position of the fixture prompts. llama.cpp is the prebuilt CPU
// build inside node-llama-cpp 3.21.1 (tests/interop/), driven by tests/interop/argmax.mjs.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "interop_util.h"
#include "test_util.h"
#include "convert/convert.h"
#include "convert/synth.h"
#include "format/gguf.h"
#include "model/model.h"

namespace fs = std::filesystem;

namespace {

using strata::testing::LlamaResult;
using strata::testing::llama_argmax;
using strata::testing::parse_ids;
using strata::testing::read_text;
using strata::testing::shell_quote;

// A position agrees when llama.cpp's argmax is also strata's maximum up to this relative rounding margin; exact
// matches are counted separately. Both engines compute in float32 from the same f32 weights, but in different
// orders, so a true near-tie may flip.
constexpr double kTieMargin = 1e-4;
constexpr double kMinAgreement = 0.99;

std::vector<float> strata_logits(const fs::path& model_path, const std::vector<int32_t>& ids, int64_t* n_vocab) {
    auto model = strata::load_model(model_path.string());
    *n_vocab = model->info().n_vocab;
    auto seq = model->new_sequence(static_cast<int64_t>(ids.size()));
    std::vector<float> logits(ids.size() * static_cast<size_t>(*n_vocab));
    model->forward(*seq, ids, logits);
    return logits;
}

struct Agreement {
    size_t exact = 0;
    size_t within_tie = 0;     // exact included
    size_t llama_departs = 0;  // llama.cpp differs from transformers there, strata does not
    size_t n = 0;
    std::string first_mismatches;
};

std::vector<int32_t> row_argmax(const std::vector<float>& logits, int64_t n_vocab) {
    std::vector<int32_t> out;
    for (size_t pos = 0; pos * static_cast<size_t>(n_vocab) < logits.size(); ++pos) {
        const float* row = logits.data() + pos * static_cast<size_t>(n_vocab);
        out.push_back(static_cast<int32_t>(std::max_element(row, row + n_vocab) - row));
    }
    return out;
}

// hf_argmax (the transformers golden's argmax per position, or empty): transformers is the authority on the math
// (DESIGN.md section 4). Where llama.cpp departs from it and strata does not, the position is counted apart rather
// than as a disagreement: llama.cpp v0.4.0's qwen4exp keeps top_k + ratio - 1 QSA cells where transformers keeps
// top_k plus the partial tail block (shared/reference/gguf-qwen4exp.md), so once selection is active the two can
// pick different cells.
// first_selecting: the first position whose QSA selection may differ between the two (below it every cell is
// visible to both); a departure before it has no such explanation and counts as a disagreement.
Agreement compare(const std::vector<float>& logits, int64_t n_vocab, const std::vector<int32_t>& llama,
                  const std::vector<int32_t>& hf_argmax, size_t first_selecting = SIZE_MAX) {
    Agreement a;
    a.n = llama.size();
    for (size_t pos = 0; pos < llama.size(); ++pos) {
        const float* row = logits.data() + pos * static_cast<size_t>(n_vocab);
        const auto best = static_cast<int32_t>(std::max_element(row, row + n_vocab) - row);
        const int32_t other = llama[pos];
        if (other == best) {
            ++a.exact;
            ++a.within_tie;
            continue;
        }
        const bool in_range = other >= 0 && other < n_vocab;
        const double margin = kTieMargin * std::max(1.0, std::fabs(static_cast<double>(row[best])));
        if (in_range && row[best] - row[other] <= margin) {
            ++a.within_tie;
            continue;
        }
        if (pos >= first_selecting && pos < hf_argmax.size() && hf_argmax[pos] == best && hf_argmax[pos] != other) {
            ++a.llama_departs;
            continue;
        }
        if (a.first_mismatches.size() < 400)
            a.first_mismatches += " pos " + std::to_string(pos) + ": strata " + std::to_string(best) + " (" +
                                  std::to_string(row[best]) + ") llama.cpp " + std::to_string(other) +
                                  (in_range ? " (strata logit " + std::to_string(row[other]) + ")" : "") + ";";
    }
    return a;
}

void expect_agreement(const std::string& what, const Agreement& a) {
    const double agreement = a.n ? static_cast<double>(a.within_tie + a.llama_departs) / static_cast<double>(a.n) : 0.0;
    std::printf(
        "[interop] %s: argmax strata vs llama.cpp: %zu/%zu exact, %zu/%zu within ties, %zu where llama.cpp "
        "departs from transformers and strata does not -> %.1f%% agreement\n",
        what.c_str(), a.exact, a.n, a.within_tie, a.n, a.llama_departs, 100.0 * agreement);
    EXPECT_GE(agreement, kMinAgreement) << what << ": argmax disagrees at" << a.first_mismatches;
    if (!a.first_mismatches.empty()) std::printf("[interop] %s: disagreements:%s\n", what.c_str(), a.first_mismatches.c_str());
}

// From a golden's config.json: the first position at which transformers drops QSA blocks, pos + 1 = budget + ratio
// (for a budget of whole blocks; llama.cpp's budget + ratio - 1 cells then stop covering every visible cell too).
// SIZE_MAX without QSA layers: then every departure from transformers counts against llama.cpp's agreement.
size_t first_selecting_position(int64_t budget, int64_t ratio) {
    return static_cast<size_t>(budget / ratio * ratio + ratio - 1);
}

size_t first_selecting_position(const fs::path& config_json) {
    std::ifstream in(config_json);
    nlohmann::json c = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (c.is_object() && c.contains("text_config")) c = c["text_config"];
    if (!c.is_object() || !c.contains("indexer_budget") || !c["indexer_budget"].is_number_integer()) return SIZE_MAX;
    const int64_t budget = c["indexer_budget"].get<int64_t>();
    const int64_t ratio = c.value("indexer_compress_ratio", int64_t{1});
    if (budget <= 0 || ratio <= 0) return SIZE_MAX;
    return first_selecting_position(budget, ratio);
}

// tests/data/<name>/ with hf/ and prompt.txt (tools/goldens).
std::vector<std::string> fixture_names() {
    return strata::testing::fixtures_with({"hf", "prompt.txt"});
}

// gtest names allow only letters, digits and '_'.
std::string test_name(const ::testing::TestParamInfo<std::string>& param_info) {
    std::string name = param_info.param;
    for (char& c : name)
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
    return name;
}

class FixtureInterop : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureInterop, ConvertedFileLoadsAndArgmaxAgrees) {
    REQUIRE_LLAMA_CPP();
    const fs::path dir = strata::testing::fixtures_root() / GetParam();
    const std::vector<int32_t> prompt = parse_ids(read_text(dir / "prompt.txt"));
    ASSERT_FALSE(prompt.empty()) << dir / "prompt.txt"
                                 << " holds no token ids";

    const strata::testing::TempDir scratch_dir;
    const fs::path scratch(scratch_dir.path());
    const fs::path gguf = scratch / (GetParam() + ".gguf");
    const strata::ConvertReport report = strata::convert_hf_to_gguf({
        .hf_dir = (dir / "hf").string(),
        .out_path = gguf.string(),
        .out_type = strata::DType::F32,
        .vocab_placeholder = !fs::exists(dir / "hf" / "tokenizer.json"),
        .include_mtp = false,  // llama.cpp v0.4.0 has no MTP graph and refuses qwen4exp files that carry one
    });

    LlamaResult llama = llama_argmax(gguf, prompt);
    if (!report.llama_cpp_unsupported.empty()) {
        // A config llama.cpp's keys cannot carry (GDN value heads of another size than the key heads, a PLE width
        // other than hidden_size): the converter warned that llama.cpp cannot load the file, and it must refuse it
        // with its own error (argmax.mjs exits 1), neither running it nor aborting. The goldens check strata on it.
        std::printf("[interop] %s: llama.cpp refuses it, as the converter warned (%s)\n", GetParam().c_str(),
                    report.llama_cpp_unsupported.front().c_str());
        EXPECT_TRUE(llama.argmax.empty()) << "llama.cpp ran " << GetParam() << ", which the converter said it cannot";
        EXPECT_NE(llama.error.find("exit status 1:"), std::string::npos)
            << "llama.cpp did not refuse " << GetParam() << " with an error: " << llama.error;
        return;
    }
    ASSERT_TRUE(llama.error.empty()) << "llama.cpp refused strata's conversion of " << GetParam() << ": "
                                     << llama.error;

    int64_t n_vocab = 0;
    const std::vector<float> logits = strata_logits(gguf, prompt, &n_vocab);
    std::vector<int32_t> hf_argmax;
    if (fs::exists(dir / "logits.f32")) {
        const std::string bytes = read_text(dir / "logits.f32");
        std::vector<float> hf(bytes.size() / sizeof(float));
        std::memcpy(hf.data(), bytes.data(), hf.size() * sizeof(float));
        ASSERT_EQ(hf.size(), logits.size()) << "logits.f32 is not [n_tokens x n_vocab]";
        hf_argmax = row_argmax(hf, n_vocab);
    }
    const size_t first_selecting = first_selecting_position(dir / "hf" / "config.json");
    expect_agreement(GetParam(), compare(logits, n_vocab, llama.argmax, hf_argmax, first_selecting));

    // The file llama.cpp's own converter wrote (tools/goldens/llamacpp_convert.py): both engines on it.
    const fs::path foreign = dir / "llamacpp-f32.gguf";
    if (!fs::exists(foreign)) return;
    LlamaResult llama_foreign = llama_argmax(foreign, prompt);
    ASSERT_TRUE(llama_foreign.error.empty()) << "llama.cpp refused its own conversion of " << GetParam() << ": "
                                             << llama_foreign.error;
    const std::vector<float> foreign_logits = strata_logits(foreign, prompt, &n_vocab);
    expect_agreement(GetParam() + " (llama.cpp's conversion)",
                     compare(foreign_logits, n_vocab, llama_foreign.argmax, hf_argmax, first_selecting));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureInterop, ::testing::ValuesIn(fixture_names()), test_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(FixtureInterop);

// The committed fixtures of issue 30's configs (tools/goldens: --only qwen4exp_uneven,qwen3next_uneven), loaded
// above with the others.
TEST(Interop, ConfigFixturesPresent) {
    std::string missing;
    const std::vector<std::string> present = fixture_names();
    for (const char* name : {"qwen4exp_uneven", "qwen3next_uneven", "qwen3next_dense", "qwen4exp_ple3"})
        if (std::find(present.begin(), present.end(), name) == present.end()) missing += std::string(" ") + name;
    if (!missing.empty())
        GTEST_SKIP() << "fixtures missing from " << strata::testing::fixtures_root().string() << ":" << missing
                     << " (tools/goldens/make_goldens.py --only NAME on the GPU machine)";
}

TEST(Interop, FixturesPresent) {
    if (fixture_names().empty()) GTEST_SKIP() << "no fixtures in " << strata::testing::fixtures_root().string() << " (tools/goldens makes them)";
}

// The small synth presets ("tiny" is what newcomers run first, and what tests use): llama.cpp must accept them and
// agree on them, or, for the *-uneven-tiny presets that llama.cpp's keys cannot describe, refuse them cleanly.
std::vector<std::string> small_synth_presets() {
    std::vector<std::string> names;
    for (const std::string& line : strata::synth_preset_names()) {
        std::string name = line.substr(0, line.find(':'));
        if (name.ends_with("tiny")) names.push_back(name);
    }
    return names;
}

class SynthInterop : public ::testing::TestWithParam<std::string> {};

TEST_P(SynthInterop, LoadsInLlamaCppAndArgmaxAgrees) {
    REQUIRE_LLAMA_CPP();
    const strata::testing::TempDir scratch_dir;
    const fs::path scratch(scratch_dir.path());
    const fs::path gguf = scratch / (GetParam() + ".gguf");
    strata::synth_model({.preset = GetParam(), .out_path = gguf.string(), .seed = 7});

    int64_t n_vocab = 0;
    {
        auto model = strata::load_model(gguf.string());
        n_vocab = model->info().n_vocab;
    }
    // No transformers golden here, so the prompt stays within the QSA budget, where llama.cpp and transformers keep
    // the same cells (see compare()).
    int64_t n_prompt = 24;
    auto file = strata::gguf::File::open(gguf.string());
    if (auto top_k = file->get_u32_opt(file->get_str("general.architecture") + ".attention.indexer.top_k"))
        n_prompt = std::min<int64_t>(n_prompt, *top_k);
    std::vector<int32_t> prompt;
    for (int64_t i = 0; i < n_prompt; ++i) prompt.push_back(static_cast<int32_t>((i * 7919 + 3) % n_vocab));

    LlamaResult llama = llama_argmax(gguf, prompt);
    if (const auto m = strata::build_synth({.preset = GetParam()}); !m.plan.llama_cpp_unsupported.empty()) {
        std::printf("[interop] synth %s: llama.cpp refuses it, as synth warned (%s)\n", GetParam().c_str(),
                    m.plan.llama_cpp_unsupported.front().c_str());
        EXPECT_NE(llama.error.find("exit status 1:"), std::string::npos)
            << "llama.cpp did not refuse synth preset " << GetParam() << " with an error: " << llama.error;
        return;
    }
    ASSERT_TRUE(llama.error.empty()) << "llama.cpp refused synth preset " << GetParam() << ": " << llama.error;
    const std::vector<float> logits = strata_logits(gguf, prompt, &n_vocab);
    expect_agreement("synth " + GetParam(), compare(logits, n_vocab, llama.argmax, {}));
}

INSTANTIATE_TEST_SUITE_P(Presets, SynthInterop, ::testing::ValuesIn(small_synth_presets()), test_name);

TEST(Interop, TinyPresetExists) {
    const auto presets = small_synth_presets();
    EXPECT_NE(std::find(presets.begin(), presets.end(), "tiny"), presets.end()) << "strata synth --preset tiny";
}

}  // namespace

// The bundled model (docs/bundled-model.md): the shipped file keeps its MTP block, which llama.cpp v0.4.0 refuses, so
// the check runs on the copy `strata convert --gguf ... --no-mtp` writes, over the held-out tokens of
// tests/data/bundled/goldens.bin (transformers' argmax there decides where llama.cpp's QSA selection departs).
TEST(Interop, BundledModelWithoutMtpLoadsAndArgmaxAgrees) {
    REQUIRE_LLAMA_CPP();
    const fs::path shipped = fs::path(STRATA_SOURCE_DIR) / "assets" / "strata-code-19m.gguf";
    const strata::testing::BundledGoldens g = strata::testing::read_bundled_goldens();
    ASSERT_GT(g.n_tokens, 0);
    const std::vector<int32_t>& ids = g.ids;
    const std::vector<int32_t>& hf_argmax = g.argmax;

    const strata::testing::TempDir scratch_dir;
    const fs::path copy = fs::path(scratch_dir.path()) / "no-mtp.gguf";
    const auto converted = strata::testing::run_strata("convert --gguf " + shell_quote(shipped) + " --no-mtp --out " +
                                                       shell_quote(copy));
    ASSERT_EQ(converted.status, 0) << converted.err;

    LlamaResult llama = llama_argmax(copy, ids);
    ASSERT_TRUE(llama.error.empty()) << "llama.cpp refused the bundled model without MTP: " << llama.error;
    int64_t n_vocab = 0;
    const std::vector<float> logits = strata_logits(shipped, ids, &n_vocab);
    // Its QSA layers: a budget of 64 cells in blocks of 4 (docs/bundled-model.md), so selection starts at position 67.
    const auto f = strata::gguf::File::open(shipped.string());
    const int64_t budget = static_cast<int64_t>(f->get_u32("qwen4exp.attention.indexer.top_k"));
    const std::vector<int64_t> ratios = f->get_int_array("qwen4exp.attention.compress_ratios");
    const int64_t ratio = *std::max_element(ratios.begin(), ratios.end());
    ASSERT_GT(ratio, 0);
    const size_t first_selecting = first_selecting_position(budget, ratio);
    expect_agreement("bundled strata-code-19m", compare(logits, n_vocab, llama.argmax, hf_argmax, first_selecting));
}
