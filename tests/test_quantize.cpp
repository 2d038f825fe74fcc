// `strata quantize` (convert/quantize.h): tensor types follow the documented mix, every KV is copied, the output loads
// and predicts what the input predicts, requantizing to the same type copies bytes, bad requests are one-line user
// errors, and llama.cpp (tests/interop) reads the q4_k file and agrees with strata on it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "convert/quantize.h"
#include "core/dtype.h"
#include "format/gguf.h"
#include "model/model.h"
#include "interop_util.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

using strata::DType;
using strata::testing::read_text;
using strata::testing::run_shell;
using strata::testing::run_strata;
using strata::testing::shell_quote;

const fs::path kBundled = fs::path(STRATA_SOURCE_DIR) / "assets" / "strata-code-19m.gguf";
constexpr size_t kPositions = 32;

std::string tmp(const std::string& name) {
    return strata::testing::process_temp_dir() / name;
}

void quantize(const std::string& in, const std::string& out, const std::string& type, const std::string& mix = "") {
    if (fs::exists(out)) return;  // shared between tests of one program
    // The form, IN OUT positional (QuantizeMix.BlockMisfitFallsBackAndIsReported uses --out).
    const auto r = run_strata("quantize " + shell_quote(in) + " " + shell_quote(out) + " --type " + type +
                              (mix.empty() ? "" : " --mix " + mix));
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find("before:"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("after:"), std::string::npos) << r.out;
}

const std::string& synth_f32() {
    static const std::string path = [] {
        const std::string p = tmp("small-k.gguf");
        const auto r = run_strata("synth --preset small-k --out " + shell_quote(p));
        EXPECT_EQ(r.status, 0) << r.err;
        return p;
    }();
    return path;
}

// The held-out token ids of tests/data/bundled/goldens.bin (i32 magic, n, vocab, then n ids ...).
std::vector<int32_t> golden_ids(int64_t n_vocab) {
    std::vector<int32_t> ids = strata::testing::read_bundled_goldens().ids;
    ids.resize(std::min(kPositions, ids.size()));
    for (int32_t& id : ids) id = static_cast<int32_t>(id % n_vocab);  // the synth vocabulary is smaller
    return ids;
}

// Per position: the argmax and how decided it is, the gap between the two best logits over the logits' standard
// deviation at that position.
struct Top1 {
    std::vector<int32_t> ids;
    std::vector<double> margin;
};

Top1 strata_argmax(const std::string& path, const std::vector<int32_t>& ids) {
    auto model = strata::load_model(path);
    const int64_t n_vocab = model->info().n_vocab;
    auto seq = model->new_sequence(static_cast<int64_t>(ids.size()));
    std::vector<float> logits(ids.size() * static_cast<size_t>(n_vocab));
    model->forward(*seq, ids, logits);
    Top1 out;
    for (size_t pos = 0; pos < ids.size(); ++pos) {
        const float* row = logits.data() + pos * static_cast<size_t>(n_vocab);
        std::vector<float> sorted(row, row + n_vocab);
        std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
        double mean = 0, var = 0;
        for (int64_t i = 0; i < n_vocab; ++i) mean += row[i];
        mean /= static_cast<double>(n_vocab);
        for (int64_t i = 0; i < n_vocab; ++i) var += (row[i] - mean) * (row[i] - mean);
        const double sd = std::sqrt(var / static_cast<double>(n_vocab));
        out.ids.push_back(static_cast<int32_t>(std::max_element(row, row + n_vocab) - row));
        out.margin.push_back(sd > 0 ? (sorted[0] - sorted[1]) / sd : 0.0);
    }
    return out;
}

double agreement(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    EXPECT_EQ(a.size(), b.size());
    size_t same = 0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) same += a[i] == b[i];
    return a.empty() ? 0.0 : static_cast<double>(same) / static_cast<double>(a.size());
}

int64_t vocab_of(const std::string& path) {
    return strata::load_model(path)->info().n_vocab;
}

bool ends_with(const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The mix `default` as documented in quantize.cpp and `strata quantize --help`, restated independently.
DType expected_default(const strata::gguf::TensorInfo& t, DType target) {
    const std::string& n = t.name;
    const bool float_target = target == DType::F32 || target == DType::F16 || target == DType::BF16;
    DType want;
    if (ends_with(n, "_exps.weight"))
        want = target;
    else if (t.n_dims < 2 || ends_with(n, "norm.weight") || n.find("conv1d") != std::string::npos ||
             n.find("ffn_gate_inp") != std::string::npos)
        return DType::F32;
    else if (n == "per_layer_token_embd.weight")
        return t.type;
    else if (n == "token_embd.weight" || n == "output.weight")
        want = float_target || target == DType::Q8_0 || target == DType::Q6_K ? (float_target ? target : DType::Q8_0)
                                                                              : DType::Q6_K;
    else
        want = float_target ? target : DType::Q8_0;
    if (t.ne[0] % strata::traits(want).block_size == 0) return want;
    return t.ne[0] % 32 == 0 ? DType::Q8_0 : DType::F16;
}

uint32_t expected_file_type(DType t) {
    // llama.cpp include/llama.h: LLAMA_FTYPE_MOSTLY_Q8_0 = 7, _Q4_K_M = 15, _IQ4_XS = 30.
    switch (t) {
        case DType::Q8_0:
            return 7;
        case DType::Q4_K:
            return 15;
        case DType::IQ4_XS:
            return 30;
        default:
            return 0;
    }
}

void check_types_and_kvs(const std::string& in_path, const std::string& out_path, DType target) {
    const auto in = strata::gguf::File::open(in_path);
    const auto out = strata::gguf::File::open(out_path);
    ASSERT_EQ(in->tensors().size(), out->tensors().size());
    int64_t experts = 0;
    for (const auto& t : in->tensors()) {
        const auto* q = out->find_tensor(t.name);
        ASSERT_NE(q, nullptr) << t.name;
        EXPECT_EQ(q->type, expected_default(t, target)) << t.name << " got " << strata::dtype_name(q->type);
        EXPECT_EQ(q->n_dims, t.n_dims) << t.name;
        for (int d = 0; d < 4; ++d) EXPECT_EQ(q->ne[d], t.ne[d]) << t.name;
        experts += ends_with(t.name, "_exps.weight") && q->type == target;
    }
    EXPECT_GT(experts, 0) << "no routed expert got " << strata::dtype_name(target);
    for (const auto& kv : in->kvs()) {
        if (kv.key == "general.file_type") continue;
        const auto* v = out->find(kv.key);
        ASSERT_NE(v, nullptr) << kv.key;
        EXPECT_TRUE(*v == kv.value) << kv.key;
    }
    EXPECT_EQ(out->get_u32("general.file_type"), expected_file_type(target));
}

struct Case {
    std::string model;  // "synth" or "bundled"
    std::string type;
};

std::string input_of(const Case& c) {
    return c.model == "synth" ? synth_f32() : kBundled.string();
}
std::string output_of(const Case& c) {
    return tmp(c.model + "-" + c.type + ".gguf");
}

class Quantize : public ::testing::TestWithParam<Case> {};

TEST_P(Quantize, TypesFollowTheMixAndKvsAreCopied) {
    const Case& c = GetParam();
    quantize(input_of(c), output_of(c), c.type);
    check_types_and_kvs(input_of(c), output_of(c), *strata::dtype_from_name(c.type));
}

// Top-1 agreement with the unquantized model over 32 positions. The matmuls quantize activations as llama.cpp does
// (8 bits: Q8_0 / Q8_K), so even q8_0 perturbs every logit a little. Thresholds: the bundled model is trained, its
// top-1 is usually decided by a wide gap: >= 95% for q8_0, >= 90% for 4-bit experts. The synth model has random
// weights: its logits at a position are near-Gaussian over 32,768 ids, where the gap between the two largest is
// typically ~1/sqrt(2 ln V) = 0.22 standard deviations, i.e. every position is a near-tie; there the test only guards
// against a broken type (which agrees at chance level, ~0%): >= 75%. The flipped positions and their margins are
// printed.
TEST_P(Quantize, ArgmaxAgreesWithTheInput) {
    const Case& c = GetParam();
    quantize(input_of(c), output_of(c), c.type);
    const auto ids = golden_ids(vocab_of(input_of(c)));
    ASSERT_EQ(ids.size(), kPositions);
    const Top1 want = strata_argmax(input_of(c), ids), got = strata_argmax(output_of(c), ids);
    const double a = agreement(want.ids, got.ids);
    std::printf("[quantize] %s %s: top-1 agreement %.1f%% over %zu positions\n", c.model.c_str(), c.type.c_str(),
                100 * a, ids.size());
    for (size_t i = 0; i < ids.size(); ++i)
        if (want.ids[i] != got.ids[i]) std::printf("  flip at %zu, margin %.4f sd\n", i, want.margin[i]);
    EXPECT_GE(a, c.model == "synth" ? 0.75 : c.type == "q8_0" ? 0.95 : 0.90);
}

INSTANTIATE_TEST_SUITE_P(All, Quantize,
                         ::testing::Values(Case{"synth", "q8_0"}, Case{"synth", "q4_k"}, Case{"synth", "iq4_xs"},
                                           Case{"bundled", "q8_0"}, Case{"bundled", "q4_k"}, Case{"bundled", "iq4_xs"}),
                         [](const ::testing::TestParamInfo<Case>& p) { return p.param.model + "_" + p.param.type; });

TEST(QuantizeAgain, SameTypeCopiesBytes) {
    for (const std::string model : {"synth", "bundled"}) {
        const Case c{model, "q8_0"};
        quantize(input_of(c), output_of(c), "q8_0");
        const std::string again = tmp(model + "-q8_0-again.gguf");
        quantize(output_of(c), again, "q8_0");
        const auto a = strata::gguf::File::open(output_of(c));
        const auto b = strata::gguf::File::open(again);
        ASSERT_EQ(a->tensors().size(), b->tensors().size());
        int64_t q8 = 0;
        for (const auto& t : a->tensors()) {
            const auto* u = b->find_tensor(t.name);
            ASSERT_NE(u, nullptr) << t.name;
            EXPECT_EQ(u->type, t.type) << t.name;
            ASSERT_EQ(u->n_bytes, t.n_bytes) << t.name;
            EXPECT_EQ(std::memcmp(u->data, t.data, t.n_bytes), 0) << t.name;
            q8 += t.type == DType::Q8_0;
        }
        EXPECT_GT(q8, 0) << model;
    }
}

TEST(QuantizeMix, ExpertsOnlyChangesOnlyRoutedExperts) {
    const std::string out = tmp("synth-q4_k-experts-only.gguf");
    quantize(synth_f32(), out, "q4_k", "experts-only");
    const auto in = strata::gguf::File::open(synth_f32());
    const auto q = strata::gguf::File::open(out);
    for (const auto& t : in->tensors()) {
        const auto* u = q->find_tensor(t.name);
        ASSERT_NE(u, nullptr) << t.name;
        if (ends_with(t.name, "_exps.weight")) {
            EXPECT_EQ(u->type, DType::Q4_K) << t.name;
        } else {
            EXPECT_EQ(u->type, t.type) << t.name;
            ASSERT_EQ(u->n_bytes, t.n_bytes) << t.name;
            EXPECT_EQ(std::memcmp(u->data, t.data, t.n_bytes), 0) << t.name;
        }
    }
}

TEST(QuantizeMix, BlockMisfitFallsBackAndIsReported) {
    // The bundled model's ffn_down_exps rows hold 80 values: neither a 256 (q4_k) nor a 32 (q8_0) multiple.
    const auto r = run_strata("quantize " + shell_quote(kBundled.string()) + " --out " +
                              shell_quote(tmp("fallback.gguf")) + " --type q4_k");
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find("blk.0.ffn_down_exps.weight: q4_k -> f16"), std::string::npos) << r.out;
    EXPECT_EQ(strata::quantize_fit_type(DType::Q4_K, 96), DType::Q8_0);
    EXPECT_EQ(strata::quantize_fit_type(DType::Q4_K, 512), DType::Q4_K);
}

TEST(QuantizeErrors, AreOneLineUserErrors) {
    const std::string in = synth_f32();
    const std::string out = tmp("never.gguf");
    strata::testing::expect_user_error(
        run_strata("quantize " + shell_quote(in) + " --out " + shell_quote(out) + " --type q9_9"),
        "unknown type 'q9_9'");
    strata::testing::expect_user_error(
        run_strata("quantize " + shell_quote(in) + " --out " + shell_quote(out) + " --type iq2_xxs"),
        "no quantizer yet");
    strata::testing::expect_user_error(
        run_strata("quantize " + shell_quote(in) + " --out " + shell_quote(in) + " --type q4_k"), "same file");
    strata::testing::expect_user_error(
        run_strata("quantize " + shell_quote(tmp("missing.gguf")) + " --out " + shell_quote(out) + " --type q4_k"),
        "cannot read input");
    strata::testing::expect_user_error(
        run_strata("quantize " + shell_quote(in) + " --out " + shell_quote(out) + " --type q4_k --mix nonsense"),
        "unknown mix");
    strata::testing::expect_user_error(
        run_strata("quantize " + shell_quote(in) + " " + shell_quote(out) + " --out " + shell_quote(out) + " --type q4_k"),
        "given twice");
    strata::testing::expect_user_error(run_strata("quantize " + shell_quote(in) + " --type q4_k"), "no output file");
    EXPECT_FALSE(fs::exists(out));
}

// llama.cpp as the oracle: the q4_k file (bundled model without its MTP block, which llama.cpp v0.4.0 refuses) loads
// there, and its argmax matches strata's on the same file. Both engines read identical quantized weights, so only
// accumulation order (and llama.cpp quantizing activations to q8 for its k-quant dot products) differs: >= 95%.
TEST(QuantizeInterop, LlamaCppLoadsTheQ4KFileAndAgrees) {
    REQUIRE_LLAMA_CPP();
    const std::string stripped = tmp("bundled-no-mtp.gguf");
    const auto s =
        run_strata("convert --gguf " + shell_quote(kBundled.string()) + " --no-mtp --out " + shell_quote(stripped));
    ASSERT_EQ(s.status, 0) << s.err;
    const std::string q4 = tmp("bundled-no-mtp-q4_k.gguf");
    quantize(stripped, q4, "q4_k");

    const auto ids = golden_ids(vocab_of(q4));
    const strata::testing::LlamaResult llama_result = strata::testing::llama_argmax(q4, ids);
    ASSERT_TRUE(llama_result.error.empty()) << "llama.cpp refused the q4_k file: " << llama_result.error;
    const std::vector<int32_t>& llama = llama_result.argmax;
    ASSERT_EQ(llama.size(), ids.size());
    const double a = agreement(strata_argmax(q4, ids).ids, llama);
    std::printf("[quantize] llama.cpp vs strata on the q4_k bundled model: %.1f%% over %zu positions\n", 100 * a,
                ids.size());
    EXPECT_GE(a, 0.95);
}

}  // namespace
