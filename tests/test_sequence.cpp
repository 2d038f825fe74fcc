// Sequence state: feeding a prompt at once, token by token, or in chunks of any size gives the same logits; reset,
// last_only, overflow and bad tokens behave; loading refuses bad files with a message that names the problem.
// Models come from the transformers fixtures in tests/data/<name>/hf, converted with strata's converter.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>


#include "test_util.h"
#include "convert/convert.h"
#include "core/dtype.h"
#include "core/error.h"
#include "format/gguf.h"
#include "model/binding.h"
#include "model/model.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir() { return strata::testing::process_temp_dir().path(); }

// The fixture converted to f32 GGUF once per process, or "" when the fixture is absent.
std::string fixture_gguf(const std::string& name) {
    static std::map<std::string, std::string> cache;
    if (auto it = cache.find(name); it != cache.end()) return it->second;
    const fs::path hf = fs::path(STRATA_TEST_DATA) / name / "hf";
    std::string out;
    if (fs::exists(hf / "config.json")) {
        out = (temp_dir() / (name + ".gguf")).string();
        convert_hf_to_gguf({.hf_dir = hf.string(),
                            .out_path = out,
                            .out_type = DType::F32,
                            .vocab_placeholder = !fs::exists(hf / "tokenizer.json")});
    }
    cache[name] = out;
    return out;
}

std::vector<int32_t> prompt_of(const std::string& name) {
    std::ifstream f(fs::path(STRATA_TEST_DATA) / name / "prompt.txt");
    std::vector<int32_t> ids;
    int64_t v;
    while (f >> v) ids.push_back(static_cast<int32_t>(v));
    return ids;
}

// Logits after every token when the prompt is fed in pieces of `chunk` tokens (0: all at once).
std::vector<float> run_chunked(const Model& m, SequenceState& seq, const std::vector<int32_t>& tokens, size_t chunk) {
    const size_t V = static_cast<size_t>(m.info().n_vocab);
    std::vector<float> logits(tokens.size() * V);
    if (chunk == 0) chunk = tokens.size();
    for (size_t i = 0; i < tokens.size(); i += chunk) {
        const size_t n = std::min(chunk, tokens.size() - i);
        m.forward(seq, std::span<const int32_t>(tokens.data() + i, n), std::span<float>(logits.data() + i * V, n * V));
    }
    return logits;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double num = 0, den = 1e-30;
    for (size_t i = 0; i < a.size(); ++i) {
        num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
        den = std::max(den, std::fabs(static_cast<double>(b[i])));
    }
    return num / den;
}

class Sequence : public ::testing::TestWithParam<std::string> {
  protected:
    void SetUp() override {
        path_ = fixture_gguf(GetParam());
        if (path_.empty()) GTEST_SKIP() << "fixture tests/data/" << GetParam() << " is missing";
        model_ = load_model(path_, {.n_threads = 2});
        prompt_ = prompt_of(GetParam());
        ASSERT_FALSE(prompt_.empty());
    }
    std::string path_;
    std::unique_ptr<Model> model_;
    std::vector<int32_t> prompt_;
};

TEST_P(Sequence, PrefillEqualsIncrementalEqualsChunked) {
    auto seq = model_->new_sequence(static_cast<int64_t>(prompt_.size()));
    const std::vector<float> prefill = run_chunked(*model_, *seq, prompt_, 0);
    EXPECT_EQ(seq->n_past(), static_cast<int64_t>(prompt_.size()));
    for (size_t chunk : {1, 3, 7, 64}) {
        seq->reset();
        EXPECT_EQ(seq->n_past(), 0);
        const std::vector<float> chunked = run_chunked(*model_, *seq, prompt_, chunk);
        const double rel = max_rel_diff(chunked, prefill);
        EXPECT_LE(rel, 1e-4) << "chunks of " << chunk;
    }
}

TEST_P(Sequence, LastOnlyIsTheLastRowAndEmptyLogitsAdvance) {
    const size_t V = static_cast<size_t>(model_->info().n_vocab);
    auto seq = model_->new_sequence(static_cast<int64_t>(prompt_.size()));
    const std::vector<float> all = run_chunked(*model_, *seq, prompt_, 0);
    seq->reset();
    const size_t half = prompt_.size() / 2;
    model_->forward(*seq, std::span<const int32_t>(prompt_.data(), half), {});  // no logits wanted
    std::vector<float> last(V);
    model_->forward(*seq, std::span<const int32_t>(prompt_.data() + half, prompt_.size() - half), last, true);
    const std::vector<float> expect(all.end() - static_cast<std::ptrdiff_t>(V), all.end());
    EXPECT_LE(max_rel_diff(last, expect), 1e-4);
}

// Model::host_floats (heap memory on the CPU backend; the CUDA backend's page-locked memory is checked against a
// vector in test_cuda_model): zeros of the size asked for, movable, and forward() fills it as it fills a vector.
TEST_P(Sequence, HostFloatsTakeTheLogitsAVectorTakes) {
    const size_t V = static_cast<size_t>(model_->info().n_vocab);
    HostFloats given = model_->host_floats(V);
    ASSERT_EQ(given.size(), V);
    EXPECT_TRUE(std::all_of(given.data(), given.data() + V, [](float x) { return x == 0.0f; }));
    const HostFloats logits = std::move(given);
    EXPECT_EQ(given.size(), 0u);
    EXPECT_EQ(given.data(), nullptr);
    std::vector<float> expect(V);
    auto a = model_->new_sequence(static_cast<int64_t>(prompt_.size()));
    auto b = model_->new_sequence(static_cast<int64_t>(prompt_.size()));
    model_->forward(*a, prompt_, logits, true);
    model_->forward(*b, prompt_, expect, true);
    EXPECT_EQ(std::memcmp(logits.data(), expect.data(), V * sizeof(float)), 0);
}

TEST_P(Sequence, RefusesOverflowAndBadTokens) {
    auto seq = model_->new_sequence(4);
    const std::vector<int32_t> five(5, 1);
    EXPECT_THROW(model_->forward(*seq, five, {}), Error);
    const std::vector<int32_t> bad = {static_cast<int32_t>(model_->info().n_vocab)};
    EXPECT_THROW(model_->forward(*seq, bad, {}), Error);
    const std::vector<int32_t> negative = {-1};
    EXPECT_THROW(model_->forward(*seq, negative, {}), Error);
    EXPECT_EQ(seq->n_past(), 0);
    std::vector<float> small(3);
    const std::vector<int32_t> one = {1};
    EXPECT_THROW(model_->forward(*seq, one, small), Error);
    EXPECT_THROW(model_->new_sequence(0), Error);
    EXPECT_THROW(model_->new_sequence(int64_t{1} << 50), Error);
    EXPECT_GT(seq->memory_bytes(), 0u);
}

TEST_P(Sequence, PlanMemoryCoversWeightsAndState) {
    auto file = gguf::File::open(path_);
    uint64_t tensor_bytes = 0;
    for (const auto& t : file->tensors()) tensor_bytes += t.n_bytes;
    const auto plan = plan_memory(*file, 128);
    uint64_t weights = 0, state = 0;
    for (const auto& item : plan) {
        if (item.what.rfind("weights", 0) == 0) weights += item.bytes;
        if (item.what.rfind("sequence", 0) == 0) state += item.bytes;
    }
    EXPECT_EQ(weights, tensor_bytes);
    // The planned per-sequence state is what a sequence of that size allocates.
    auto seq = model_->new_sequence(128);
    EXPECT_EQ(state, seq->memory_bytes());
}

// The roofline's bytes per token with int8 KV cells (--kv-cache int8: a byte per value and an fp16 scale per 64)
// against fp16 cells: the same weights, a cache that grows by 66/128 of the fp16 cells' growth per token of depth
// (checked on the fixtures without QSA layers, whose caches grow with every token).
TEST_P(Sequence, DecodeTrafficCountsTheKvCellFormat) {
    auto file = gguf::File::open(path_);
    const DecodeTraffic f16 = decode_traffic(*file, 100), i8 = decode_traffic(*file, 100, KvCacheType::Int8);
    EXPECT_EQ(i8.weights, f16.weights);
    EXPECT_LT(i8.cache, f16.cache);
    EXPECT_GT(i8.cache, f16.cache / 2);
    const DecodeTraffic f16_deeper = decode_traffic(*file, 101);
    const DecodeTraffic i8_deeper = decode_traffic(*file, 101, KvCacheType::Int8);
    const uint64_t f16_growth = f16_deeper.cache - f16.cache, i8_growth = i8_deeper.cache - i8.cache;
    if (GetParam() == std::string("qwen4exp")) return;  // its QSA layers stop growing at the selection budget
    EXPECT_GT(f16_growth, 0u);
    if (f16_growth % 128 == 0) {
        EXPECT_EQ(i8_growth * 128, f16_growth * 66);
    }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Sequence, ::testing::Values("qwen4exp", "qwen35moe", "qwen3next"),
                         [](const auto& p) { return p.param; });

// Rewrites `src` without tensor `drop` (and with `reshape` given a wrong shape), to see what loading says.
std::string rewrite(const std::string& src, const std::string& drop, const std::string& reshape,
                    const std::string& arch = "") {
    auto in = gguf::File::open(src);
    gguf::Writer w;
    for (const auto& kv : in->kvs()) w.set(kv.key, kv.value);
    if (!arch.empty()) w.set("general.architecture", gguf::Value::of_str(arch));
    for (const auto& t : in->tensors()) {
        if (t.name == drop) continue;
        std::vector<int64_t> ne(t.ne, t.ne + t.n_dims);
        const uint8_t* data = t.data;
        size_t n = t.n_bytes;
        if (t.name == reshape) {  // drop the last row
            ne.back() -= 1;
            n -= n / static_cast<size_t>(t.ne[t.n_dims - 1]);
        }
        w.add_tensor(t.name, t.type, ne, [data, n](uint8_t* dst, size_t) { std::copy(data, data + n, dst); });
    }
    const std::string out = (temp_dir() / ("broken-" + drop + reshape + arch + ".gguf")).string();
    w.write(out);
    return out;
}

std::string load_error(const std::string& path) {
    try {
        load_model(path);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST(Loading, NamesMissingAndMisshapenTensorsAndUnknownArchitectures) {
    const std::string src = fixture_gguf("qwen4exp");
    if (src.empty()) GTEST_SKIP() << "fixture tests/data/qwen4exp is missing";
    const std::string missing = load_error(rewrite(src, "blk.3.indexer.k_proj.weight", ""));
    EXPECT_NE(missing.find("blk.3.indexer.k_proj.weight"), std::string::npos) << missing;
    EXPECT_NE(missing.find("missing"), std::string::npos) << missing;
    const std::string shape = load_error(rewrite(src, "", "blk.1.ple_value.weight"));
    EXPECT_NE(shape.find("blk.1.ple_value.weight"), std::string::npos) << shape;
    EXPECT_NE(shape.find("{64, 63}"), std::string::npos) << shape;
    EXPECT_NE(shape.find("expected {64, 64}"), std::string::npos) << shape;
    const std::string arch = load_error(rewrite(src, "", "", "llama"));
    EXPECT_NE(arch.find("'llama' is not supported"), std::string::npos) << arch;
}

// Rewrites a GGUF through `edit`, which may replace or add tensors given the original file (all F32 here).
struct OwnedTensor {
    std::string name;
    std::vector<int64_t> ne;
    std::vector<float> data;
};
std::string rewrite_with(const std::string& src, const std::string& tag,
                         const std::function<bool(const gguf::TensorInfo&)>& drop, const std::vector<OwnedTensor>& add,
                         const std::vector<gguf::KeyValue>& set = {}) {
    auto in = gguf::File::open(src);
    gguf::Writer w;
    for (const auto& kv : in->kvs()) w.set(kv.key, kv.value);
    for (const auto& kv : set) w.set(kv.key, kv.value);
    for (const auto& t : in->tensors()) {
        if (drop(t)) continue;
        const uint8_t* data = t.data;
        const size_t n = t.n_bytes;
        w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims),
                     [data, n](uint8_t* dst, size_t) { std::copy(data, data + n, dst); });
    }
    for (const auto& t : add) {
        const float* data = t.data.data();
        const size_t n = t.data.size() * sizeof(float);
        w.add_tensor(t.name, DType::F32, t.ne, [data, n](uint8_t* dst, size_t) {
            std::copy(reinterpret_cast<const uint8_t*>(data), reinterpret_cast<const uint8_t*>(data) + n, dst);
        });
    }
    const std::string out = (temp_dir() / ("rewritten-" + tag + ".gguf")).string();
    w.write(out);
    return out;
}

const float* f32_rows(const gguf::TensorInfo& t) {
    EXPECT_EQ(t.type, DType::F32) << t.name;
    return reinterpret_cast<const float*>(t.data);
}

std::vector<float> prefill_logits(const std::string& path, const std::vector<int32_t>& prompt) {
    auto m = load_model(path, {.n_threads = 2});
    auto seq = m->new_sequence(static_cast<int64_t>(prompt.size()));
    return run_chunked(*m, *seq, prompt, 0);
}

TEST(Layouts, FusedGateUpExpertsEqualSeparateOnes) {
    const std::string src = fixture_gguf("qwen35moe");
    if (src.empty()) GTEST_SKIP() << "fixture tests/data/qwen35moe is missing";
    auto in = gguf::File::open(src);
    std::vector<OwnedTensor> add;
    for (int64_t il = 0;; ++il) {
        const auto* gate = in->find_tensor("blk." + std::to_string(il) + ".ffn_gate_exps.weight");
        const auto* up = in->find_tensor("blk." + std::to_string(il) + ".ffn_up_exps.weight");
        if (!gate || !up) break;
        const int64_t H = gate->ne[0], F = gate->ne[1], E = gate->ne[2];
        OwnedTensor fused{"blk." + std::to_string(il) + ".ffn_gate_up_exps.weight", {H, 2 * F, E}, {}};
        for (int64_t e = 0; e < E; ++e) {  // per expert: the F gate rows, then the F up rows
            fused.data.insert(fused.data.end(), f32_rows(*gate) + e * F * H, f32_rows(*gate) + (e + 1) * F * H);
            fused.data.insert(fused.data.end(), f32_rows(*up) + e * F * H, f32_rows(*up) + (e + 1) * F * H);
        }
        add.push_back(std::move(fused));
    }
    ASSERT_FALSE(add.empty());
    const std::string fused = rewrite_with(
        src, "gate_up",
        [](const gguf::TensorInfo& t) {
            return t.name.find("ffn_gate_exps") != std::string::npos || t.name.find("ffn_up_exps") != std::string::npos;
        },
        add);
    const auto prompt = prompt_of("qwen35moe");
    EXPECT_EQ(prefill_logits(fused, prompt), prefill_logits(src, prompt));
}

TEST(Layouts, Qwen3NextLegacySsmInEqualsSplitProjections) {
    // Old qwen3next files carry ssm_in {H, 2KD + 2VD}: per key group [q | k | v (g value heads) | z (g value heads)].
    const std::string src = fixture_gguf("qwen3next");
    if (src.empty()) GTEST_SKIP() << "fixture tests/data/qwen3next is missing";
    auto in = gguf::File::open(src);
    const int64_t nk = in->get_u32("qwen3next.ssm.group_count");
    const int64_t nv = in->get_u32("qwen3next.ssm.time_step_rank");
    const int64_t dk = in->get_u32("qwen3next.ssm.state_size");
    const int64_t dv = in->get_u32("qwen3next.ssm.inner_size") / nv;
    const int64_t gv = nv / nk * dv;
    std::vector<OwnedTensor> add;
    for (int64_t il = 0;; ++il) {
        const std::string prefix = "blk." + std::to_string(il) + ".";
        if (!in->find_tensor(prefix + "attn_norm.weight")) break;
        const auto* qkv = in->find_tensor(prefix + "attn_qkv.weight");
        const auto* z = in->find_tensor(prefix + "attn_gate.weight");
        if (!qkv) continue;
        const int64_t H = qkv->ne[0];
        auto rows = [&](const gguf::TensorInfo& t, int64_t r0, int64_t n) {
            return std::vector<float>(f32_rows(t) + r0 * H, f32_rows(t) + (r0 + n) * H);
        };
        OwnedTensor fused{prefix + "ssm_in.weight", {H, 2 * nk * dk + 2 * nv * dv}, {}};
        for (int64_t g = 0; g < nk; ++g)
            for (const auto& part : {rows(*qkv, g * dk, dk), rows(*qkv, nk * dk + g * dk, dk),
                                     rows(*qkv, 2 * nk * dk + g * gv, gv), rows(*z, g * gv, gv)})
                fused.data.insert(fused.data.end(), part.begin(), part.end());
        add.push_back(std::move(fused));
    }
    ASSERT_FALSE(add.empty());
    const std::string legacy = rewrite_with(
        src, "ssm_in",
        [](const gguf::TensorInfo& t) {
            return t.name.find("attn_qkv") != std::string::npos || t.name.find("attn_gate") != std::string::npos;
        },
        add);
    const auto prompt = prompt_of("qwen3next");
    EXPECT_EQ(prefill_logits(legacy, prompt), prefill_logits(src, prompt));
}

TEST(Layouts, FusedAttentionQkvEqualsSeparateProjections) {
    const std::string src = fixture_gguf("qwen35moe");
    if (src.empty()) GTEST_SKIP() << "fixture tests/data/qwen35moe is missing";
    auto in = gguf::File::open(src);
    std::vector<OwnedTensor> add;
    std::vector<std::string> fused_blocks;
    for (int64_t il = 0;; ++il) {
        const std::string prefix = "blk." + std::to_string(il) + ".";
        if (!in->find_tensor(prefix + "attn_norm.weight")) break;
        const auto* q = in->find_tensor(prefix + "attn_q.weight");
        if (!q) continue;
        const auto* k = in->find_tensor(prefix + "attn_k.weight");
        const auto* v = in->find_tensor(prefix + "attn_v.weight");
        OwnedTensor qkv{prefix + "attn_qkv.weight", {q->ne[0], q->ne[1] + k->ne[1] + v->ne[1]}, {}};
        for (const auto* t : {q, k, v})
            qkv.data.insert(qkv.data.end(), f32_rows(*t), f32_rows(*t) + t->ne[0] * t->ne[1]);
        add.push_back(std::move(qkv));
        for (const char* n : {"attn_q.weight", "attn_k.weight", "attn_v.weight"}) fused_blocks.push_back(prefix + n);
    }
    ASSERT_FALSE(add.empty());
    const std::string fused = rewrite_with(
        src, "attn_qkv",
        [&](const gguf::TensorInfo& t) {
            return std::find(fused_blocks.begin(), fused_blocks.end(), t.name) != fused_blocks.end();
        },
        add);
    const auto prompt = prompt_of("qwen35moe");
    EXPECT_EQ(prefill_logits(fused, prompt), prefill_logits(src, prompt));
}

TEST(Layouts, MtpBlocksAreLeftOutOfTheTrunk) {
    // block_count counts the nextn blocks; the trunk is block_count - nextn_predict_layers and ignores them.
    const std::string src = fixture_gguf("qwen4exp");
    if (src.empty()) GTEST_SKIP() << "fixture tests/data/qwen4exp is missing";
    auto in = gguf::File::open(src);
    const int64_t n_block = in->get_u32("qwen4exp.block_count");
    const std::string last = "blk." + std::to_string(n_block - 1) + ".";
    const std::string mtp = "blk." + std::to_string(n_block) + ".";
    std::vector<OwnedTensor> add;
    for (const auto& t : in->tensors()) {
        if (t.name.rfind(last, 0) != 0 || t.type != DType::F32) continue;
        OwnedTensor copy{mtp + t.name.substr(last.size()), std::vector<int64_t>(t.ne, t.ne + t.n_dims), {}};
        copy.data.assign(f32_rows(t), f32_rows(t) + t.n_bytes / sizeof(float));
        add.push_back(std::move(copy));
    }
    std::vector<int64_t> ratios = in->get_int_array("qwen4exp.attention.compress_ratios");
    ratios.push_back(0);
    std::vector<int32_t> ratios32(ratios.begin(), ratios.end());
    const std::string with_mtp =
        rewrite_with(src, "mtp", [](const gguf::TensorInfo&) { return false; }, add,
                     {{"qwen4exp.block_count", gguf::Value::of_u32(static_cast<uint32_t>(n_block + 1))},
                      {"qwen4exp.nextn_predict_layers", gguf::Value::of_u32(1)},
                      {"qwen4exp.attention.compress_ratios", gguf::Value::of_i32_array(ratios32)}});
    auto m = load_model(with_mtp);
    EXPECT_EQ(m->info().n_layer, n_block);
    const auto prompt = prompt_of("qwen4exp");
    EXPECT_EQ(prefill_logits(with_mtp, prompt), prefill_logits(src, prompt));
}

TEST(Threads, LogitsDoNotDependOnTheThreadCount) {
    const std::string src = fixture_gguf("qwen4exp");
    if (src.empty()) GTEST_SKIP() << "fixture tests/data/qwen4exp is missing";
    const auto prompt = prompt_of("qwen4exp");
    std::vector<float> results[2];
    int i = 0;
    for (int threads : {1, 3}) {
        auto m = load_model(src, {.n_threads = threads});
        auto seq = m->new_sequence(static_cast<int64_t>(prompt.size()));
        results[i++] = run_chunked(*m, *seq, prompt, 0);
    }
    EXPECT_EQ(results[0], results[1]);
}

}  // namespace

// The MTP blocks follow the trunk's: "blk.N." with N >= the trunk's block count (gguf-qwen4exp.md 1.1).
TEST(Binding, MtpBlockTensorsAreThoseAtOrPastTheTrunk) {
    EXPECT_FALSE(strata::is_mtp_block_tensor("blk.3.attn_q.weight", 4));
    EXPECT_TRUE(strata::is_mtp_block_tensor("blk.4.nextn.eh_proj.weight", 4));
    EXPECT_TRUE(strata::is_mtp_block_tensor("blk.40.ffn_down_exps.weight", 4));
    EXPECT_FALSE(strata::is_mtp_block_tensor("blk.39.ffn_down_exps.weight", 48));
    EXPECT_TRUE(strata::is_mtp_block_tensor("blk.48.attn_norm.weight", 48));
    EXPECT_FALSE(strata::is_mtp_block_tensor("token_embd.weight", 4));
    EXPECT_FALSE(strata::is_mtp_block_tensor("blk.x.weight", 4));
    EXPECT_FALSE(strata::is_mtp_block_tensor("output_hc_norm.weight", 0));
}
