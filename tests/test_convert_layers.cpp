// Issue 30, item 2's remainder: per-layer structure transformers builds and llama.cpp's keys cannot carry. qwen3next
// with dense MLP layers (mlp_only_layers / decoder_sparse_step) and qwen4exp with PLE on several layers, each with
// its own table and hashes. On the synth presets (qwen3next-dense-tiny, qwen4exp-ple3-tiny) the oracles are
// equivalences and known numbers: a dense block computes what a MoE block whose every expert is that MLP computes,
// PLE tables of zeros add nothing, the head sizes are the primes after ngram_vocab_size_base. On the transformers
// goldens (tools/goldens: qwen3next_dense, qwen4exp_ple3) the checkpoint's own tensors and hash buffers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model_test_util.h"
#include "test_util.h"
#include "convert/convert.h"
#include "convert/gguf_plan.h"
#include "convert/synth.h"
#include "format/gguf.h"
#include "format/hf_config.h"
#include "format/safetensors.h"
#include "model/model.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using strata::testing::logits_fed;
using strata::testing::TempDir;

double relative_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double diff = 0, ref = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
        ref = std::max(ref, std::fabs(static_cast<double>(b[i])));
    }
    return diff / ref;
}

std::vector<int32_t> prompt_tokens() {
    std::vector<int32_t> tokens;
    for (int i = 0; i < 20; ++i) tokens.push_back(static_cast<int32_t>((i * 131 + 7) % 511));
    tokens[9] = 511;  // the presets' EOS: cuts the PLE n-grams
    return tokens;
}

std::vector<float> prefill_of(const std::string& path) {
    auto model = load_model(path, {.n_threads = 2});
    const std::vector<int32_t> tokens = prompt_tokens();
    return logits_fed(*model, tokens, tokens.size());
}

// A SynthModel of the preset with `edit` applied to its config, the random tensors drawn again for it (the same
// names get the same values for a seed, whatever else the config holds).
SynthModel synth_with(const std::string& preset, void (*edit)(HfConfig&), uint64_t seed) {
    SynthModel m = build_synth({.preset = preset});
    if (edit) edit(m.config);
    m.source = synth_hf_source(m.config, seed);
    m.plan = plan_conversion(m.config, *m.source, {});
    return m;
}

// Every planned tensor as f32, except those `replace` takes: it gets the name and the planned rows and returns
// whether it wrote the tensor (or its stand-ins) itself.
using Replace = std::function<bool(gguf::Writer&, const PlannedTensor&)>;
void write_f32(const SynthModel& m, const std::string& path, const Replace& replace = nullptr,
               bool keep_dense_key = true) {
    gguf::Writer w;
    add_synth_keys(w, m);
    if (!keep_dense_key) w.set("strata.qwen3next.dense_mlp_layers", gguf::Value::of_i32_array({}));
    for (const PlannedTensor& t : m.plan.tensors) {
        if (replace && replace(w, t)) continue;
        const RowFn rows = t.rows;
        const int64_t n = t.n_rows();
        w.add_tensor(t.name, DType::F32, t.ne, [rows, n](uint8_t* dst, size_t) {
            rows(0, n, reinterpret_cast<float*>(dst));
        });
    }
    w.write(path);
}

std::vector<float> rows_of(const PlannedTensor& t) {
    std::vector<float> v(static_cast<size_t>(t.n_rows() * t.ne[0]));
    t.rows(0, t.n_rows(), v.data());
    return v;
}

void add_floats(gguf::Writer& w, const std::string& name, std::vector<int64_t> ne, std::vector<float> values) {
    w.add_tensor(name, DType::F32, std::move(ne), [values = std::move(values)](uint8_t* dst, size_t n) {
        std::memcpy(dst, values.data(), n);
    });
}

// ---- qwen3next dense MLP layers -------------------------------------------------------------------------------------

HfConfig qwen3next_config(const json& fields) {
    json c = {{"architectures", {"Qwen3NextForCausalLM"}},
              {"vocab_size", 64},
              {"hidden_size", 32},
              {"num_hidden_layers", 6},
              {"num_attention_heads", 2},
              {"num_experts", 4},
              {"num_experts_per_tok", 2},
              {"moe_intermediate_size", 16}};
    if (fields.is_object()) c.update(fields);
    return parse_hf_config(c.dump());
}

// Qwen3NextDecoderLayer: layer i is sparse iff i is not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0.
TEST(DenseMlpLayers, FollowTransformersRule) {
    EXPECT_EQ(qwen3next_config({}).is_dense_mlp, std::vector<bool>(6, false));  // step 1, no mlp_only_layers
    EXPECT_EQ(qwen3next_config({{"decoder_sparse_step", 2}, {"mlp_only_layers", {1}}}).is_dense_mlp,
              (std::vector<bool>{true, true, true, false, true, false}));
    EXPECT_EQ(qwen3next_config({{"decoder_sparse_step", 3}}).is_dense_mlp,
              (std::vector<bool>{true, true, false, true, true, false}));
    // entries that name no layer match none there either
    EXPECT_EQ(qwen3next_config({{"mlp_only_layers", {0, 9, -1}}}).is_dense_mlp,
              (std::vector<bool>{true, false, false, false, false, false}));
    testing::expect_error([] { qwen3next_config({{"decoder_sparse_step", 0}}); }, "decoder_sparse_step");
    // Qwen3.5-MoE's config deletes both fields: every layer is MoE whatever the JSON says.
    json q35 = {{"architectures", {"Qwen3_5MoeForCausalLM"}}, {"vocab_size", 64}, {"hidden_size", 32},
                {"num_hidden_layers", 4}, {"num_attention_heads", 2}, {"num_experts", 4},
                {"num_experts_per_tok", 2}, {"moe_intermediate_size", 16}, {"mlp_only_layers", {0}}};
    EXPECT_TRUE(parse_hf_config(q35.dump()).is_dense_mlp.empty());
}

TEST(DenseMlpLayers, PresetKeysShapesAndWarning) {
    const SynthModel m = build_synth({.preset = "qwen3next-dense-tiny"});
    ASSERT_EQ(m.plan.llama_cpp_unsupported.size(), 1u);
    const std::string warning = llama_cpp_warning(m.plan, "strata synth");
    EXPECT_EQ(warning.find('\n'), std::string::npos);
    EXPECT_NE(warning.find("dense MLP layers (mlp_only_layers / decoder_sparse_step) at blocks 0, 1, 2"),
              std::string::npos)
        << warning;
    TempDir tmp;
    const std::string out = tmp / "dense.gguf";
    synth_model({.preset = "qwen3next-dense-tiny", .out_path = out, .seed = 3});
    const auto f = gguf::File::open(out);
    EXPECT_EQ(f->get_int_array("strata.qwen3next.dense_mlp_layers"), (std::vector<int64_t>{0, 1, 2}));
    const int64_t H = 64, I = f->get_u32("qwen3next.feed_forward_length");
    EXPECT_EQ(I, 128);
    for (int b = 0; b < 3; ++b) {
        const std::string p = "blk." + std::to_string(b) + ".";
        EXPECT_EQ(f->find_tensor(p + "ffn_gate.weight")->ne[0], H);
        EXPECT_EQ(f->find_tensor(p + "ffn_gate.weight")->ne[1], I);
        EXPECT_EQ(f->find_tensor(p + "ffn_up.weight")->ne[1], I);
        EXPECT_EQ(f->find_tensor(p + "ffn_down.weight")->ne[0], I);
        EXPECT_EQ(f->find_tensor(p + "ffn_gate_inp.weight"), nullptr);
        EXPECT_EQ(f->find_tensor(p + "ffn_gate_shexp.weight"), nullptr);
    }
    EXPECT_NE(f->find_tensor("blk.3.ffn_gate_inp.weight"), nullptr);
    EXPECT_EQ(f->find_tensor("blk.3.ffn_gate.weight"), nullptr);

    auto model = load_model(out, {.n_threads = 2});
    const std::vector<int32_t> tokens = prompt_tokens();
    const std::vector<float> prefill = logits_fed(*model, tokens, tokens.size());
    for (float x : prefill) ASSERT_TRUE(std::isfinite(x));
    EXPECT_LE(relative_diff(logits_fed(*model, tokens, 1), prefill), 1e-5);
    EXPECT_LE(relative_diff(logits_fed(*model, tokens, 3), prefill), 1e-5);
}

// The oracle for the dense path: a MoE block whose experts are all that MLP (and whose router is zero, so the
// normalised weights of the chosen experts sum to one) and whose shared expert is zero computes the same output. The
// MoE path is the one test_model_parity holds to transformers.
TEST(DenseMlpLayers, DenseBlockEqualsMoeOfCopiesOfIt) {
    // expert width = dense width, so the file's one expert_feed_forward_length fits both
    const SynthModel m =
        synth_with("qwen3next-dense-tiny", [](HfConfig& c) { c.intermediate_size = c.moe_intermediate_size; }, 5);
    const int64_t H = m.config.hidden_size, F = m.config.moe_intermediate_size, E = m.config.num_experts;
    const int64_t Fs = m.config.shared_expert_intermediate_size;
    TempDir tmp;
    write_f32(m, tmp / "dense.gguf");
    write_f32(
        m, tmp / "moe.gguf",
        [&](gguf::Writer& w, const PlannedTensor& t) {
            const size_t dot = t.name.find('.', 4);
            const std::string block = t.name.substr(0, dot + 1), what = t.name.substr(dot + 1);
            if (what != "ffn_gate.weight" && what != "ffn_up.weight" && what != "ffn_down.weight") return false;
            const std::vector<float> v = rows_of(t);
            std::vector<float> stacked;
            for (int64_t e = 0; e < E; ++e) stacked.insert(stacked.end(), v.begin(), v.end());
            if (what == "ffn_down.weight") {
                add_floats(w, block + "ffn_down_exps.weight", {F, H, E}, stacked);
                add_floats(w, block + "ffn_gate_inp.weight", {H, E}, std::vector<float>(H * E, 0.0f));
                add_floats(w, block + "ffn_gate_inp_shexp.weight", {H}, std::vector<float>(H, 0.0f));
                add_floats(w, block + "ffn_gate_shexp.weight", {H, Fs}, std::vector<float>(H * Fs, 0.0f));
                add_floats(w, block + "ffn_up_shexp.weight", {H, Fs}, std::vector<float>(H * Fs, 0.0f));
                add_floats(w, block + "ffn_down_shexp.weight", {Fs, H}, std::vector<float>(H * Fs, 0.0f));
            } else {
                add_floats(w, block + (what == "ffn_gate.weight" ? "ffn_gate_exps.weight" : "ffn_up_exps.weight"),
                           {H, F, E}, stacked);
            }
            return true;
        },
        false);
    const std::vector<float> dense = prefill_of(tmp / "dense.gguf"), moe = prefill_of(tmp / "moe.gguf");
    EXPECT_LE(relative_diff(dense, moe), 1e-5);
    // ... and the dense blocks matter: the same file with them read as zero MLPs is another model.
    write_f32(m, tmp / "zero.gguf", [&](gguf::Writer& w, const PlannedTensor& t) {
        if (t.name.find(".ffn_down.weight") == std::string::npos) return false;
        add_floats(w, t.name, t.ne, std::vector<float>(static_cast<size_t>(t.n_rows() * t.ne[0]), 0.0f));
        return true;
    });
    EXPECT_GT(relative_diff(prefill_of(tmp / "zero.gguf"), dense), 1e-3);
}

// ---- qwen4exp with PLE on several layers ----------------------------------------------------------------------------

// The preset: tiny (ngram 3, 2 heads per ngram, base 1000, tables padded to 128 rows) with PLE on layers 1, 2, 3.
// transformers: head g of PLE layer k takes the (4 k + g + 1)-th prime from 1000.
TEST(SeveralPleLayers, PresetKeysTablesAndHeadSizes) {
    const SynthModel m = build_synth({.preset = "qwen4exp-ple3-tiny"});
    ASSERT_EQ(m.plan.llama_cpp_unsupported.size(), 1u);
    EXPECT_NE(llama_cpp_warning(m.plan, "strata synth").find("3 PLE layers"), std::string::npos);
    TempDir tmp;
    const std::string out = tmp / "ple3.gguf";
    synth_model({.preset = "qwen4exp-ple3-tiny", .out_path = out, .seed = 3});
    const auto f = gguf::File::open(out);
    EXPECT_EQ(f->get_int_array("qwen4exp.ple.layers"), (std::vector<int64_t>{0}));  // what llama.cpp's key can say
    EXPECT_EQ(f->get_int_array("strata.qwen4exp.ple.layers"), (std::vector<int64_t>{0, 1, 2}));
    const std::vector<std::vector<uint64_t>> primes = {
        {1009, 1013, 1019, 1021}, {1031, 1033, 1039, 1049}, {1051, 1061, 1063, 1069}};
    std::vector<std::vector<uint64_t>> multipliers;
    for (int k = 0; k < 3; ++k) {
        SCOPED_TRACE(k);
        const std::string keys = k == 0 ? "qwen4exp.ple." : "strata.qwen4exp.ple.blk." + std::to_string(k) + ".";
        EXPECT_EQ(f->get_u64_array(keys + "head_vocab_sizes"), primes[static_cast<size_t>(k)]);
        std::vector<uint64_t> offsets{0};
        for (int g = 0; g < 3; ++g) offsets.push_back(offsets.back() + primes[static_cast<size_t>(k)][g]);
        EXPECT_EQ(f->get_u64_array(keys + "head_offsets"), offsets);
        multipliers.push_back(f->get_u64_array(keys + "layer_multipliers"));
        EXPECT_EQ(multipliers.back().size(), 3u);
        for (uint64_t x : multipliers.back()) EXPECT_EQ(x % 2, 1u);  // odd, as transformers draws them
        uint64_t total = 0;
        for (uint64_t p : primes[static_cast<size_t>(k)]) total += p;
        const std::string table =
            k == 0 ? "per_layer_token_embd.weight" : "blk." + std::to_string(k) + ".per_layer_token_embd.weight";
        ASSERT_NE(f->find_tensor(table), nullptr) << table;
        EXPECT_EQ(f->find_tensor(table)->ne[1], static_cast<int64_t>((total + 127) / 128 * 128));
        EXPECT_NE(f->find_tensor("blk." + std::to_string(k) + ".ple_key.weight"), nullptr);
    }
    EXPECT_NE(multipliers[0], multipliers[1]);  // seeded per PLE layer
    EXPECT_NE(multipliers[1], multipliers[2]);

    auto model = load_model(out, {.n_threads = 2});
    const std::vector<int32_t> tokens = prompt_tokens();
    const std::vector<float> prefill = logits_fed(*model, tokens, tokens.size());
    for (float x : prefill) ASSERT_TRUE(std::isfinite(x));
    EXPECT_LE(relative_diff(logits_fed(*model, tokens, 1), prefill), 1e-5);
    EXPECT_LE(relative_diff(logits_fed(*model, tokens, 3), prefill), 1e-5);
}

// A PLE layer whose table is zero adds exactly nothing (zero key and value, so a zero gated value and conv): with the
// extra layers' tables zeroed the model is the one-PLE-layer model of the same weights; with them it is not.
TEST(SeveralPleLayers, ZeroTablesOfTheExtraLayersGiveTheOneLayerModel) {
    const SynthModel three = synth_with("qwen4exp-ple3-tiny", nullptr, 9);
    const SynthModel one = synth_with("qwen4exp-ple3-tiny", [](HfConfig& c) { c.ple_layer_ids = {1}; }, 9);
    ASSERT_EQ(one.plan.ple_layers.size(), 1u);
    TempDir tmp;
    write_f32(one, tmp / "one.gguf");
    write_f32(three, tmp / "three.gguf");
    write_f32(three, tmp / "zeroed.gguf", [](gguf::Writer& w, const PlannedTensor& t) {
        if (t.name.rfind("blk.", 0) != 0 || !t.name.ends_with(".per_layer_token_embd.weight")) return false;
        add_floats(w, t.name, t.ne, std::vector<float>(static_cast<size_t>(t.n_rows() * t.ne[0]), 0.0f));
        return true;
    });
    const std::vector<float> reference = prefill_of(tmp / "one.gguf");
    EXPECT_LE(relative_diff(prefill_of(tmp / "zeroed.gguf"), reference), 1e-6);
    EXPECT_GT(relative_diff(prefill_of(tmp / "three.gguf"), reference), 1e-3);
}

// A strata.qwen4exp.ple.layers that does not start where llama.cpp's key does is refused with a message naming it.
TEST(SeveralPleLayers, InconsistentKeysAreRefused) {
    const SynthModel m = build_synth({.preset = "qwen4exp-ple3-tiny"});
    gguf::Writer w;
    add_synth_keys(w, m);
    w.set("strata.qwen4exp.ple.layers", gguf::Value::of_i32_array({1, 2}));
    add_planned_tensors(w, m.plan, m.types);
    TempDir tmp;
    w.write(tmp / "bad.gguf");
    testing::expect_error([&] { load_model(tmp / "bad.gguf"); }, "strata.qwen4exp.ple.layers");
}

// ---- the transformers goldens ---------------------------------------------------------------------------------------

fs::path fixture(const std::string& name) {
    return strata::testing::fixtures_root() / name;
}

#define REQUIRE_GOLDEN(name)                                                                                  \
    if (!fs::exists(fixture(name) / "hf" / "config.json"))                                                    \
    GTEST_SKIP() << "fixture " << fixture(name).string() << " absent (make it on the GPU machine: "            \
                 << "tools/goldens/make_goldens.py --only qwen3next_dense,qwen4exp_ple3)"

TEST(Goldens, Qwen3NextDenseConvertsTheCheckpointsMlps) {
    REQUIRE_GOLDEN("qwen3next_dense");
    const fs::path hf = fixture("qwen3next_dense") / "hf";
    TempDir tmp;
    const ConvertReport report = convert_hf_to_gguf(
        {.hf_dir = hf.string(), .out_path = tmp / "d.gguf", .out_type = DType::F32, .vocab_placeholder = true});
    EXPECT_EQ(report.llama_cpp_unsupported.size(), 1u);
    const auto f = gguf::File::open(tmp / "d.gguf");
    // the layers transformers built as Qwen3NextMLP (meta.json's expect_modules, checked when the fixture was made)
    EXPECT_EQ(f->get_int_array("strata.qwen3next.dense_mlp_layers"), (std::vector<int64_t>{0, 1, 2}));
    const auto st = SafetensorsSet::open_dir(hf.string());
    for (int b = 0; b < 3; ++b)
        for (const auto& [gguf_name, hf_name] : {std::pair{"ffn_gate.weight", "gate_proj.weight"},
                                                 std::pair{"ffn_up.weight", "up_proj.weight"},
                                                 std::pair{"ffn_down.weight", "down_proj.weight"}}) {
            const auto* t = f->find_tensor("blk." + std::to_string(b) + "." + gguf_name);
            ASSERT_NE(t, nullptr);
            const std::vector<float> want = st->read_f32("model.layers." + std::to_string(b) + ".mlp." + hf_name);
            ASSERT_EQ(t->n_bytes, want.size() * sizeof(float));
            EXPECT_EQ(std::memcmp(t->data, want.data(), t->n_bytes), 0) << gguf_name << " of block " << b;
        }
}

TEST(Goldens, Qwen4ExpPle3HashesAreTheCheckpoints) {
    REQUIRE_GOLDEN("qwen4exp_ple3");
    const fs::path hf = fixture("qwen4exp_ple3") / "hf";
    TempDir tmp;
    convert_hf_to_gguf(
        {.hf_dir = hf.string(), .out_path = tmp / "p.gguf", .out_type = DType::F32, .vocab_placeholder = true});
    const auto f = gguf::File::open(tmp / "p.gguf");
    const auto st = SafetensorsSet::open_dir(hf.string());
    const HfConfig c = load_hf_config(hf.string());
    EXPECT_EQ(f->get_int_array("strata.qwen4exp.ple.layers"), (std::vector<int64_t>{0, 1, 3}));
    const std::vector<int64_t> blocks = {0, 1, 3};
    for (size_t k = 0; k < blocks.size(); ++k) {
        SCOPED_TRACE(k);
        const std::string b = std::to_string(blocks[k]);
        const std::string keys = k == 0 ? "qwen4exp.ple." : "strata.qwen4exp.ple.blk." + b + ".";
        const std::string buffers = "model.layers." + b + ".ple.ple_embedding.";
        for (const auto& [key, buffer] : {std::pair{"layer_multipliers", "layer_multipliers"},
                                          std::pair{"head_offsets", "ngram_heads_offsets"},
                                          std::pair{"head_vocab_sizes", "ngram_heads_vocab_sizes"}}) {
            std::vector<uint64_t> want;
            for (int64_t v : st->read_i64(buffers + buffer)) want.push_back(static_cast<uint64_t>(v));
            EXPECT_EQ(f->get_u64_array(keys + key), want) << key;
        }
        // strata's recomputation (for checkpoints without the buffers) agrees with transformers' buffers
        const PleHash h = compute_ple_hash(c, static_cast<int64_t>(k));
        EXPECT_EQ(f->get_u64_array(keys + "layer_multipliers"), h.multipliers);
        EXPECT_EQ(f->get_u64_array(keys + "head_vocab_sizes"), h.head_vocab_sizes);
    }
}

}  // namespace
}  // namespace strata
