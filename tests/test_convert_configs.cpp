// Configs that transformers builds and runs beyond what llama.cpp's GGUF keys carry (issue 30): GDN value heads of
// another size than the key heads (all three architectures), a qwen4exp PLE embedding narrower than hidden_size, and
// rotary dims too few for transformers' default mrope sections. Here on the synth presets and HF folders built from
// synth's random tensors; the transformers goldens of the same cases are tools/goldens' *_uneven and qwen4exp_rope8
// fixtures (test_convert, test_model_parity, test_interop).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "model_test_util.h"
#include "test_util.h"
#include "convert/convert.h"
#include "convert/gguf_plan.h"
#include "convert/synth.h"
#include "format/gguf.h"
#include "format/hf_config.h"
#include "model/model.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using strata::testing::TempDir;

// ---- rope.dimension_sections ----------------------------------------------------------------------------------------

enum class Position { Time, Height, Width, Extra };

// transformers (Qwen4ExpTextRotaryEmbedding.recomposition_frequencies, the same in qwen3_5_moe): rotary pair i reads
// the height row for i in range(1, 3 s1, 3), the width row for i in range(2, 3 s2, 3), the time row otherwise.
Position transformers_position(int64_t i, const std::vector<int64_t>& s) {
    if (i % 3 == 1 && i < 3 * s[1]) return Position::Height;
    if (i % 3 == 2 && i < 3 * s[2]) return Position::Width;
    return Position::Time;
}

// llama.cpp (ggml-cpu ops.cpp, ggml_mrope_cache_init with is_imrope): sector = pair index modulo the sections' sum,
// tested against the sections in this order; the rest reads the fourth position row.
Position llama_cpp_position(int64_t i, const std::vector<int32_t>& s) {
    const int64_t sector = i % (s[0] + s[1] + s[2] + s[3]);
    if (sector % 3 == 1 && sector < 3 * s[1]) return Position::Height;
    if (sector % 3 == 2 && sector < 3 * s[2]) return Position::Width;
    if (sector % 3 == 0 && sector < 3 * s[0]) return Position::Time;
    return Position::Extra;
}

HfConfig rope_config(int64_t head_dim, double partial, std::vector<int64_t> mrope_section) {
    HfConfig c;
    c.head_dim = head_dim;
    c.partial_rotary_factor = partial;
    c.mrope_section = std::move(mrope_section);
    return c;
}

TEST(RopeSections, FitTheRotaryPairsAndKeepTransformersAssignment) {
    struct Case {
        int64_t head_dim;
        double partial;
        std::vector<int64_t> mrope_section;  // empty: absent from the config
    };
    const Case cases[] = {{32, 0.25, {}},      {32, 0.25, {2, 1, 1}}, {32, 0.25, {11, 11, 10}}, {32, 0.5, {}},
                          {128, 0.25, {}},     {256, 0.25, {}},       {256, 0.25, {11, 11, 10}}, {16, 0.5, {}},
                          {32, 0.25, {20, 1, 1}}, {64, 1.0, {3, 3, 2}}};
    for (const Case& k : cases) {
        const HfConfig c = rope_config(k.head_dim, k.partial, k.mrope_section);
        const std::vector<int32_t> s = rope_dimension_sections(c);
        const int64_t n_pairs = c.rope_dims() / 2;
        SCOPED_TRACE("head " + std::to_string(k.head_dim) + " x " + std::to_string(k.partial) + ", " +
                     std::to_string(k.mrope_section.size()) + " sections given");
        ASSERT_EQ(s.size(), 4u);
        const int64_t sum = s[0] + s[1] + s[2] + s[3];
        // llama.cpp asserts sum <= the row width of every rotated tensor, the narrowest of which may be n_rot wide
        EXPECT_GT(sum, 0);
        EXPECT_LE(sum, 2 * n_pairs);
        std::vector<int64_t> given = k.mrope_section.empty() ? std::vector<int64_t>{11, 11, 10} : k.mrope_section;
        given.resize(4, 0);
        int64_t given_sum = 0;
        for (int64_t v : given) given_sum += v;
        if (given_sum <= n_pairs) {  // fits: as llama.cpp's converter writes it
            EXPECT_EQ(std::vector<int64_t>(s.begin(), s.end()), given);
            continue;
        }
        // Cut: every rotary pair reads the position row transformers gives it (llama.cpp's fourth row is the time
        // position for text, and transformers has none: its "otherwise" is the time row).
        for (int64_t i = 0; i < n_pairs; ++i) {
            Position p = llama_cpp_position(i, s);
            if (p == Position::Extra) p = Position::Time;
            EXPECT_EQ(p, transformers_position(i, given)) << "rotary pair " << i;
        }
    }
    // The cases the issue names: 8 rotary dims without mrope_section, and Flash-Next (64 dims, default sections).
    EXPECT_EQ(rope_dimension_sections(rope_config(32, 0.25, {})), (std::vector<int32_t>{2, 1, 1, 0}));
    EXPECT_EQ(rope_dimension_sections(rope_config(256, 0.25, {})), (std::vector<int32_t>{11, 11, 10, 0}));
}

// ---- the uneven synth presets ---------------------------------------------------------------------------------------

using strata::testing::logits_fed;

double relative_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double diff = 0, ref = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
        ref = std::max(ref, std::fabs(static_cast<double>(b[i])));
    }
    return diff / ref;
}

struct UnevenPreset {
    const char* name;
    const char* arch;
    int64_t dk, dv, ple_width;  // ple_width 0: no strata PLE key
};
const UnevenPreset kUneven[] = {{"qwen4exp-uneven-tiny", "qwen4exp", 16, 32, 32},
                                {"qwen35moe-uneven-tiny", "qwen35moe", 32, 16, 0},
                                {"qwen3next-uneven-tiny", "qwen3next", 16, 32, 0}};

TEST(UnevenPresets, KeysShapesAndReadBack) {
    for (const UnevenPreset& p : kUneven) {
        SCOPED_TRACE(p.name);
        const SynthModel m = build_synth({.preset = p.name});
        EXPECT_EQ(m.plan.llama_cpp_unsupported.size(), p.ple_width ? 2u : 1u);
        const std::string warning = llama_cpp_warning(m.plan, "strata synth");
        EXPECT_EQ(warning.find('\n'), std::string::npos);
        EXPECT_NE(warning.find("llama.cpp cannot load this file"), std::string::npos) << warning;

        TempDir tmp;
        const std::string out = tmp / "m.gguf";
        synth_model({.preset = p.name, .out_path = out, .seed = 3});
        const auto f = gguf::File::open(out);
        const std::string A = p.arch;
        const int64_t nv = f->get_u32(A + ".ssm.time_step_rank");
        EXPECT_EQ(f->get_u32(A + ".ssm.state_size"), static_cast<uint32_t>(p.dk));
        EXPECT_EQ(f->get_u32("strata." + A + ".ssm.value_length"), static_cast<uint32_t>(p.dv));
        EXPECT_EQ(f->get_u32(A + ".ssm.inner_size"), static_cast<uint32_t>(p.dv * nv));
        EXPECT_EQ(f->find_tensor("blk.0.ssm_norm.weight")->ne[0], p.dv);
        EXPECT_EQ(f->find_tensor("blk.0.ssm_out.weight")->ne[0], p.dv * nv);
        const int64_t nk = f->get_u32(A + ".ssm.group_count");
        EXPECT_EQ(f->find_tensor("blk.0.attn_qkv.weight")->ne[1], 2 * p.dk * nk + p.dv * nv);
        if (p.ple_width) {
            EXPECT_EQ(f->get_u32("strata.qwen4exp.ple.embedding_length"), static_cast<uint32_t>(p.ple_width));
            const int64_t H = f->get_u32("qwen4exp.embedding_length");
            const int64_t HC = H * f->get_u32("qwen4exp.hyper_connection.count");
            const auto* key = f->find_tensor("blk.1.ple_key.weight");
            const auto* value = f->find_tensor("blk.1.ple_value.weight");
            EXPECT_EQ(key->ne[0], p.ple_width);
            EXPECT_EQ(key->ne[1], HC);
            EXPECT_EQ(value->ne[0], p.ple_width);
            EXPECT_EQ(value->ne[1], H);
        } else {
            EXPECT_EQ(f->find("strata." + A + ".ple.embedding_length"), nullptr);
        }

        // The loader reads the keys back; the forward pass is the same whether fed at once, token by token or in
        // chunks of 3 (DESIGN.md section 6).
        auto model = load_model(out, {.n_threads = 2});
        std::vector<int32_t> tokens;
        for (int i = 0; i < 20; ++i) tokens.push_back(static_cast<int32_t>((i * 131 + 7) % 511));
        tokens[9] = 511;  // the presets' EOS: cuts the PLE n-grams
        const std::vector<float> prefill = logits_fed(*model, tokens, tokens.size());
        for (float x : prefill) ASSERT_TRUE(std::isfinite(x));
        EXPECT_LE(relative_diff(logits_fed(*model, tokens, 1), prefill), 1e-5);
        EXPECT_LE(relative_diff(logits_fed(*model, tokens, 3), prefill), 1e-5);
    }
}

// A strata key that contradicts the tensors and llama.cpp's keys is an error that names it, not a misread.
TEST(UnevenPresets, ContradictingStrataKeysAreRefused) {
    for (const auto& [preset, key, value, what] :
         {std::tuple{"qwen35moe-uneven-tiny", "strata.qwen35moe.ssm.value_length", 32u, "ssm.inner_size"},
          std::tuple{"qwen4exp-uneven-tiny", "strata.qwen4exp.ple.embedding_length", 64u, "PLE heads"}}) {
        SCOPED_TRACE(preset);
        const SynthModel m = build_synth({.preset = preset});
        gguf::Writer w;
        add_synth_keys(w, m);
        w.set(key, gguf::Value::of_u32(value));
        add_planned_tensors(w, m.plan, m.types);
        TempDir tmp;
        w.write(tmp / "bad.gguf");
        testing::expect_error([&] { load_model(tmp / "bad.gguf"); }, std::string(key));
        testing::expect_error([&] { load_model(tmp / "bad.gguf"); }, what);
    }
}

// ---- `strata convert` on an HF folder of such a config ----------------------------------------------------------

// config.json plus model.safetensors (F32; the PLE hash buffers I64) of synth's random tensors for the config.
void write_hf_folder(const fs::path& dir, const json& config) {
    fs::create_directories(dir);
    std::ofstream(dir / "config.json") << config.dump(1);
    const auto source = synth_hf_source(parse_hf_config(config.dump()), 5);
    json header = json::object();
    std::string data;
    for (size_t i = 0; i < source->size(); ++i) {
        const std::string& name = source->name(i);
        const std::vector<int64_t>& shape = source->shape(i);
        const bool ints = name.ends_with("layer_multipliers") || name.ends_with("ngram_heads_offsets") ||
                          name.ends_with("ngram_heads_vocab_sizes");
        std::string bytes;
        if (ints) {
            const std::vector<int64_t> v = source->read_i64(i);
            bytes.assign(reinterpret_cast<const char*>(v.data()), v.size() * 8);
        } else {
            std::vector<float> v(static_cast<size_t>(row_count(shape) * row_width(shape)));
            source->read_rows(i, 0, row_count(shape), v.data());
            bytes.assign(reinterpret_cast<const char*>(v.data()), v.size() * 4);
        }
        header[name] = {{"dtype", ints ? "I64" : "F32"},
                        {"shape", shape},
                        {"data_offsets", {data.size(), data.size() + bytes.size()}}};
        data += bytes;
    }
    std::string h = header.dump();
    while (h.size() % 8) h += ' ';
    std::ofstream out(dir / "model.safetensors", std::ios::binary);
    const uint64_t n = h.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << h << data;
}

json qwen4exp_config(int64_t value_head_dim, int64_t ple_embed_dim) {
    return {{"architectures", {"Qwen4ExpForCausalLM"}},
            {"vocab_size", 256},
            {"hidden_size", 64},
            {"num_hidden_layers", 4},
            {"layer_types", {"linear_attention", "linear_attention", "linear_attention", "full_attention"}},
            {"num_attention_heads", 4},
            {"num_key_value_heads", 2},
            {"head_dim", 32},
            {"rope_parameters", {{"rope_theta", 1e6}, {"partial_rotary_factor", 0.25}}},
            {"linear_num_key_heads", 2},
            {"linear_num_value_heads", 4},
            {"linear_key_head_dim", 16},
            {"linear_value_head_dim", value_head_dim},
            {"num_experts", 4},
            {"num_experts_per_tok", 2},
            {"moe_intermediate_size", 32},
            {"shared_expert_intermediate_size", 32},
            {"hc_count", 2},
            {"hc_lowrank", 8},
            {"ple_layer_ids", {2}},
            {"ple_embed_dim", ple_embed_dim},
            {"ngram_size", 3},
            {"heads_per_ngram", 2},
            {"ngram_vocab_size_base", 300},
            {"split_ngram_parts", 2},
            {"indexer_n_heads", 2},
            {"indexer_kv_heads", 1},
            {"indexer_head_dim", 16},
            {"indexer_budget", 8},
            {"indexer_compress_ratio", 4},
            {"eos_token_id", 255},
            {"output_gate_type", "sigmoid"}};
}

TEST(ConvertCommand, WarnsInOneLineThatLlamaCppCannotLoadTheFile) {
    TempDir tmp;
    const fs::path hf = fs::path(tmp.path()) / "uneven";
    write_hf_folder(hf, qwen4exp_config(32, 32));
    const std::string out = tmp / "uneven.gguf";
    const auto r = testing::run_strata("convert --hf " + testing::shell_quote(hf.string()) + " --out " +
                                       testing::shell_quote(out) + " --outtype f32 --vocab-placeholder");
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.err_lines(), 1u) << r.err;
    EXPECT_EQ(r.err.rfind("strata convert: warning: llama.cpp cannot load this file: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find("linear_value_head_dim 32 differs from linear_key_head_dim 16"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("ple_embed_dim 32 differs from hidden_size 64"), std::string::npos) << r.err;
    const auto f = gguf::File::open(out);
    EXPECT_EQ(f->get_u32("strata.qwen4exp.ssm.value_length"), 32u);
    EXPECT_EQ(f->get_u32("strata.qwen4exp.ple.embedding_length"), 32u);
    EXPECT_EQ(f->get_int_array("qwen4exp.rope.dimension_sections"), (std::vector<int64_t>{2, 1, 1, 0}));
    auto model = load_model(out);
    std::vector<float> logits(static_cast<size_t>(3 * model->info().n_vocab));
    auto seq = model->new_sequence(3);
    model->forward(*seq, std::vector<int32_t>{1, 255, 7}, logits);
    for (float x : logits) ASSERT_TRUE(std::isfinite(x));

    // What llama.cpp's keys carry gets no warning and no strata key.
    const fs::path even = fs::path(tmp.path()) / "even";
    write_hf_folder(even, qwen4exp_config(16, 64));
    const auto e = testing::run_strata("convert --hf " + testing::shell_quote(even.string()) + " --out " +
                                       testing::shell_quote(tmp / "even.gguf") + " --outtype f32 --vocab-placeholder");
    ASSERT_EQ(e.status, 0) << e.err;
    EXPECT_EQ(e.err, "");
    const auto g = gguf::File::open(tmp / "even.gguf");
    for (const gguf::KeyValue& kv : g->kvs()) EXPECT_NE(kv.key.rfind("strata.", 0), 0u) << kv.key;
}

// qwen3next dense MLP layers and qwen4exp PLE on two layers from HF folders: one warning line each, naming why, and
// files strata loads and runs (test_convert_layers checks their values).
TEST(ConvertCommand, DenseMlpLayersAndSeveralPleLayersWarnInOneLine) {
    TempDir tmp;
    json dense = {{"architectures", {"Qwen3NextForCausalLM"}},
                  {"vocab_size", 256},
                  {"hidden_size", 64},
                  {"intermediate_size", 96},
                  {"num_hidden_layers", 4},
                  {"num_attention_heads", 4},
                  {"num_key_value_heads", 2},
                  {"head_dim", 32},
                  {"linear_num_key_heads", 2},
                  {"linear_num_value_heads", 4},
                  {"linear_key_head_dim", 16},
                  {"linear_value_head_dim", 16},
                  {"num_experts", 4},
                  {"num_experts_per_tok", 2},
                  {"moe_intermediate_size", 32},
                  {"shared_expert_intermediate_size", 32},
                  {"decoder_sparse_step", 2},
                  {"eos_token_id", 255}};
    json ple = qwen4exp_config(16, 64);
    ple["ple_layer_ids"] = {3, 1};  // transformers sorts them
    for (const auto& [name, config, reason] :
         {std::tuple{"dense", dense, "dense MLP layers (mlp_only_layers / decoder_sparse_step) at blocks 0, 2"},
          std::tuple{"ple", ple, "2 PLE layers"}}) {
        SCOPED_TRACE(name);
        const fs::path hf = fs::path(tmp.path()) / name;
        write_hf_folder(hf, config);
        const std::string out = tmp / (std::string(name) + ".gguf");
        const auto r = testing::run_strata("convert --hf " + testing::shell_quote(hf.string()) + " --out " +
                                           testing::shell_quote(out) + " --outtype f32 --vocab-placeholder");
        ASSERT_EQ(r.status, 0) << r.err;
        EXPECT_EQ(r.err_lines(), 1u) << r.err;
        EXPECT_EQ(r.err.rfind("strata convert: warning: llama.cpp cannot load this file: ", 0), 0u) << r.err;
        EXPECT_NE(r.err.find(reason), std::string::npos) << r.err;
        auto model = load_model(out);
        std::vector<float> logits(static_cast<size_t>(3 * model->info().n_vocab));
        auto seq = model->new_sequence(3);
        model->forward(*seq, std::vector<int32_t>{1, 255, 7}, logits);
        for (float x : logits) ASSERT_TRUE(std::isfinite(x));
    }
    const auto f = gguf::File::open(tmp / "ple.gguf");
    EXPECT_EQ(f->get_int_array("strata.qwen4exp.ple.layers"), (std::vector<int64_t>{0, 2}));
    EXPECT_NE(f->find_tensor("blk.2.per_layer_token_embd.weight"), nullptr);
}

// ple_embed_dim must split evenly over the n-gram heads (transformers' key_proj takes all of it, the table rows
// ple_embed_dim / heads each, so a remainder cannot run there either): one line naming it.
TEST(ConvertCommand, PleWidthThatDoesNotSplitOverTheHeadsIsRefused) {
    TempDir tmp;
    const fs::path hf = fs::path(tmp.path()) / "odd";
    json c = qwen4exp_config(16, 64);
    c["ple_embed_dim"] = 30;  // 4 heads
    write_hf_folder(hf, c);
    const auto r = testing::run_strata("convert --hf " + testing::shell_quote(hf.string()) + " --out " +
                                       testing::shell_quote(tmp / "odd.gguf") + " --vocab-placeholder");
    testing::expect_user_error(r, "ple_embed_dim 30");
}

}  // namespace
}  // namespace strata
