// HF -> GGUF conversion against shared/reference/gguf-qwen4exp.md: the transformers fixtures in tests/data are
// converted and read back with the GGUF reader; every tensor name, shape and type is checked against the tables of
// the spec (written out below from the spec, not from the converter), key types against section 1, and the
// transforms (value-head reorder, -exp(A_log), +1 norms, qkvz split, expert stacking, PLE shard order, hash buffers)
// against the HF tensors read directly with the safetensors reader.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "convert/convert.h"
#include "convert/gguf_plan.h"
#include "convert/synth.h"
#include "core/error.h"
#include "format/gguf.h"
#include "format/hf_config.h"
#include "format/safetensors.h"
#include "model/model.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using strata::testing::TempDir;
using strata::testing::expect_error;
using gguf::ValueType;
using nlohmann::json;

const std::string kData = STRATA_TEST_DATA;

json read_json(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return json::parse(ss.str());
}

std::string fixture_dir(const std::string& name) {
    return kData + "/" + name + "/hf";
}
bool have_fixture(const std::string& name) {
    return fs::exists(fixture_dir(name) + "/model.safetensors");
}

// ---- The expected tensor table, from gguf-qwen4exp.md section 2 ----

enum class Kind { Matrix, F32 };  // Matrix: follows the output type; F32: stays F32 (section 6)
struct Expected {
    std::vector<int64_t> ne;
    Kind kind;
};
using Table = std::map<std::string, Expected>;

Table expected_table(const json& c, const std::string& arch, int64_t n_mtp) {
    const int64_t H = c["hidden_size"], V = c["vocab_size"], L = c["num_hidden_layers"];
    const int64_t nh = c["num_attention_heads"], nkv = c["num_key_value_heads"], hd = c["head_dim"];
    const int64_t E = c["num_experts"], F = c["moe_intermediate_size"], Fs = c["shared_expert_intermediate_size"];
    const int64_t dk = c["linear_key_head_dim"], nk = c["linear_num_key_heads"], nv = c["linear_num_value_heads"];
    const int64_t dv = c.value("linear_value_head_dim", dk);
    const int64_t KD = dk * nk, VD = dv * nv, CD = 2 * KD + VD, Kc = c["linear_conv_kernel_dim"];
    const bool q4 = arch == "qwen4exp";
    const int64_t hc = q4 ? c["hc_count"].get<int64_t>() : 1, HC = hc * H, r = q4 ? c["hc_lowrank"].get<int64_t>() : 0;
    Table t;
    auto M = [&](const std::string& n, std::vector<int64_t> ne) { t[n] = {ne, Kind::Matrix}; };
    auto K = [&](const std::string& n, std::vector<int64_t> ne) { t[n] = {ne, Kind::F32}; };
    auto blk = [](int64_t b, const std::string& n) { return "blk." + std::to_string(b) + "." + n; };

    M("token_embd.weight", {H, V});
    M("output.weight", {H, V});
    if (q4) {
        K("output_hc_norm.weight", {HC});
        M("output_hc_down.weight", {HC, r});
        M("output_hc_up.weight", {r, HC});
    } else {
        K("output_norm.weight", {H});
    }
    auto block = [&](int64_t b, bool attn) {
        if (q4) {
            for (const char* w : {"attn", "ffn"}) {
                const std::string p = std::string("hc_") + w + "_";
                K(blk(b, p + "norm.weight"), {HC});
                M(blk(b, p + "down.weight"), {HC, r});
                M(blk(b, p + "up.weight"), {r, HC});
                M(blk(b, p + "inject.weight"), {HC, hc});
            }
        } else {
            K(blk(b, "attn_norm.weight"), {H});
            K(blk(b, "post_attention_norm.weight"), {H});
        }
        K(blk(b, "ffn_gate_inp.weight"), {H, E});
        M(blk(b, "ffn_gate_exps.weight"), {H, F, E});
        M(blk(b, "ffn_up_exps.weight"), {H, F, E});
        M(blk(b, "ffn_down_exps.weight"), {F, H, E});
        K(blk(b, "ffn_gate_inp_shexp.weight"), {H});
        M(blk(b, "ffn_gate_shexp.weight"), {H, Fs});
        M(blk(b, "ffn_up_shexp.weight"), {H, Fs});
        M(blk(b, "ffn_down_shexp.weight"), {Fs, H});
        if (attn) {
            M(blk(b, "attn_q.weight"), {H, 2 * hd * nh});
            M(blk(b, "attn_k.weight"), {H, hd * nkv});
            M(blk(b, "attn_v.weight"), {H, hd * nkv});
            M(blk(b, "attn_output.weight"), {hd * nh, H});
            K(blk(b, "attn_q_norm.weight"), {hd});
            K(blk(b, "attn_k_norm.weight"), {hd});
            if (q4) {
                const int64_t ni = c["indexer_n_heads"], di = c["indexer_head_dim"];
                M(blk(b, "indexer.q_proj.weight"), {H, ni * di});
                M(blk(b, "indexer.k_proj.weight"), {H, di});
                K(blk(b, "indexer.q_norm.weight"), {di});
                K(blk(b, "indexer.k_norm.weight"), {di});
            }
        } else {
            M(blk(b, "attn_qkv.weight"), {H, CD});
            M(blk(b, "attn_gate.weight"), {H, VD});
            K(blk(b, "ssm_conv1d.weight"), {Kc, CD});
            K(blk(b, "ssm_dt.bias"), {nv});
            K(blk(b, "ssm_a"), {nv});
            K(blk(b, "ssm_norm.weight"), {dv});
            M(blk(b, "ssm_out.weight"), {VD, H});
            if (arch == "qwen3next") {
                M(blk(b, "ssm_ba.weight"), {H, 2 * nv});
            } else {
                M(blk(b, "ssm_beta.weight"), {H, nv});
                M(blk(b, "ssm_alpha.weight"), {H, nv});
            }
        }
    };
    const auto& types = c["layer_types"];
    for (int64_t l = 0; l < L; ++l) block(l, types[static_cast<size_t>(l)] != "linear_attention");
    if (q4 && c.contains("ple_layer_ids") && !c["ple_layer_ids"].empty()) {
        const int64_t b = c["ple_layer_ids"][0].get<int64_t>() - 1, Kp = c["ple_conv_kernel_size"];
        const int64_t P = c.value("ple_embed_dim", H);  // the n-gram embedding's width
        M(blk(b, "ple_key.weight"), {P, HC});
        M(blk(b, "ple_value.weight"), {P, H});
        K(blk(b, "ple_norm_key.weight"), {HC});
        K(blk(b, "ple_norm_query.weight"), {HC});
        K(blk(b, "ple_norm_conv.weight"), {HC});
        K(blk(b, "ple_conv1d.weight"), {Kp, HC});
        const int64_t heads = (c["ngram_size"].get<int64_t>() - 1) * c["heads_per_ngram"].get<int64_t>();
        K("per_layer_token_embd.weight", {P / heads, -1});  // rows checked separately
    }
    for (int64_t i = 0; i < n_mtp; ++i) block(L + i, true);
    if (n_mtp > 0) {
        const int64_t b = L;
        K(blk(b, "nextn.enorm.weight"), {H});
        K(blk(b, "nextn.hnorm.weight"), {q4 ? HC : H});
        M(blk(b, "nextn.eh_proj.weight"), {2 * H, H});
        if (q4) {
            K(blk(b, "nextn.hc_head_norm.weight"), {HC});
            M(blk(b, "nextn.hc_head_down.weight"), {HC, r});
            M(blk(b, "nextn.hc_head_up.weight"), {r, HC});
        }
    }
    return t;
}

void check_table(const gguf::File& f, const Table& want, DType out_type) {
    std::set<std::string> got_names, want_names;
    for (const auto& t : f.tensors()) got_names.insert(t.name);
    for (const auto& [n, e] : want) want_names.insert(n);
    EXPECT_EQ(got_names, want_names);
    for (const auto& [name, e] : want) {
        const gguf::TensorInfo* t = f.find_tensor(name);
        if (!t) continue;
        EXPECT_EQ(t->n_dims, static_cast<int>(e.ne.size())) << name;
        for (size_t d = 0; d < e.ne.size(); ++d)
            if (e.ne[d] >= 0) {
                EXPECT_EQ(t->ne[d], e.ne[d]) << name << " dim " << d;
            }
        DType want_type = DType::F32;
        if (e.kind == Kind::Matrix) want_type = e.ne[0] % traits(out_type).block_size == 0 ? out_type : DType::F16;
        EXPECT_EQ(t->type, want_type) << name << " is " << dtype_name(t->type);
    }
}

void expect_key_type(const gguf::File& f, const std::string& key, ValueType type,
                     std::optional<ValueType> elem = std::nullopt) {
    const gguf::Value* v = f.find(key);
    ASSERT_NE(v, nullptr) << key << " missing";
    EXPECT_EQ(v->type, type) << key << " has type " << gguf::value_type_name(v->type);
    if (elem) {
        EXPECT_EQ(v->elem_type, *elem) << key << " element type " << gguf::value_type_name(v->elem_type);
    }
}

// Key types llama.cpp checks strictly (section 0/1): scalars u32, floats f32, hash arrays u64.
void check_common_keys(const gguf::File& f, const std::string& A) {
    EXPECT_EQ(f.get_str("general.architecture"), A);
    for (const char* k :
         {"context_length", "embedding_length", "block_count", "vocab_size", "expert_count", "expert_used_count",
          "attention.head_count", "attention.head_count_kv", "attention.key_length", "attention.value_length",
          "rope.dimension_count", "expert_feed_forward_length", "expert_shared_feed_forward_length", "ssm.conv_kernel",
          "ssm.state_size", "ssm.group_count", "ssm.time_step_rank", "ssm.inner_size", "full_attention_interval"})
        expect_key_type(f, A + "." + k, ValueType::U32);
    expect_key_type(f, A + ".attention.layer_norm_rms_epsilon", ValueType::F32);
    expect_key_type(f, A + ".rope.freq_base", ValueType::F32);
    expect_key_type(f, "general.file_type", ValueType::U32);
    expect_key_type(f, "general.quantization_version", ValueType::U32);
    expect_key_type(f, "tokenizer.ggml.tokens", ValueType::ARRAY, ValueType::STRING);
    expect_key_type(f, "tokenizer.ggml.merges", ValueType::ARRAY, ValueType::STRING);
    expect_key_type(f, "tokenizer.ggml.token_type", ValueType::ARRAY, ValueType::I32);
    EXPECT_EQ(f.get_str("tokenizer.ggml.model"), "gpt2");
    EXPECT_EQ(f.get_u32(A + ".full_attention_interval"), 4u);
    // value heads of the key heads' size unless a strata key says otherwise
    const uint32_t dv = f.get_u32_opt("strata." + A + ".ssm.value_length").value_or(f.get_u32(A + ".ssm.state_size"));
    EXPECT_EQ(f.get_u32(A + ".ssm.inner_size"), dv * f.get_u32(A + ".ssm.time_step_rank"));
}

// Element (row, col) of an F32 GGUF tensor viewed as rows of ne0.
float at(const gguf::TensorInfo* t, int64_t row, int64_t col) {
    STRATA_ASSERT(t && t->type == DType::F32 && col < t->ne[0]);
    float v;
    std::memcpy(&v, t->data + (static_cast<size_t>(row * t->ne[0] + col)) * 4, 4);
    return v;
}

// HF tensor as rows of its last dimension.
struct HfRows {
    std::vector<float> v;
    int64_t width;
    float operator()(int64_t row, int64_t col) const { return v[static_cast<size_t>(row * width + col)]; }
};
HfRows hf(const SafetensorsSet& st, const std::string& name) {
    const StInfo& i = st.get(name);
    return {st.read_f32(name), i.shape.empty() ? 1 : i.shape.back()};
}

std::string convert_fixture(const TempDir& tmp, const std::string& name, DType out, bool placeholder,
                            bool include_mtp = true, const std::string& dir_override = "") {
    const std::string out_path = tmp / (name + "-" + dtype_name(out) + ".gguf");
    convert_hf_to_gguf({.hf_dir = dir_override.empty() ? fixture_dir(name) : dir_override,
                        .out_path = out_path,
                        .out_type = out,
                        .vocab_placeholder = placeholder,
                        .include_mtp = include_mtp});
    return out_path;
}

// GGUF value head v' (tiled) holds HF value head (v' % nk) * (nv / nk) + v' / nk (section 3.5).
int64_t hf_head(int64_t v, int64_t nk, int64_t nv) {
    return (v % nk) * (nv / nk) + v / nk;
}

// The transforms of section 3 for one GDN block with the value-head reorder.
void check_gdn_reordered(const gguf::File& f, const SafetensorsSet& st, const json& c, int64_t l) {
    const int64_t dk = c["linear_key_head_dim"], nk = c["linear_num_key_heads"], nv = c["linear_num_value_heads"];
    const int64_t dv = c.value("linear_value_head_dim", dk);
    const int64_t H = c["hidden_size"], KD = dk * nk;
    ASSERT_NE(nk, nv) << "fixture should have grouped GDN heads";
    const std::string p = "model.layers." + std::to_string(l) + ".linear_attn.";
    const std::string b = "blk." + std::to_string(l) + ".";
    const HfRows qkv = hf(st, p + "in_proj_qkv.weight"), z = hf(st, p + "in_proj_z.weight");
    const HfRows conv = hf(st, p + "conv1d.weight"), out = hf(st, p + "out_proj.weight");
    const HfRows a = hf(st, p + "in_proj_a.weight"), beta = hf(st, p + "in_proj_b.weight");
    const HfRows alog = hf(st, p + "A_log"), dt = hf(st, p + "dt_bias"), norm = hf(st, p + "norm.weight");
    const auto* g_qkv = f.find_tensor(b + "attn_qkv.weight");
    const auto* g_z = f.find_tensor(b + "attn_gate.weight");
    const auto* g_conv = f.find_tensor(b + "ssm_conv1d.weight");
    const auto* g_out = f.find_tensor(b + "ssm_out.weight");
    const auto* g_alpha = f.find_tensor(b + "ssm_alpha.weight");
    const auto* g_beta = f.find_tensor(b + "ssm_beta.weight");
    const auto* g_a = f.find_tensor(b + "ssm_a");
    const auto* g_dt = f.find_tensor(b + "ssm_dt.bias");
    const auto* g_norm = f.find_tensor(b + "ssm_norm.weight");
    for (int64_t row = 0; row < 2 * KD; ++row)  // q and k rows untouched
        for (int64_t col = 0; col < H; col += 7) ASSERT_EQ(at(g_qkv, row, col), qkv(row, col));
    for (int64_t v = 0; v < nv; ++v) {
        const int64_t s = hf_head(v, nk, nv);
        for (int64_t d = 0; d < dv; ++d) {
            for (int64_t col = 0; col < H; ++col) {
                ASSERT_EQ(at(g_qkv, 2 * KD + v * dv + d, col), qkv(2 * KD + s * dv + d, col)) << v << " " << d;
                ASSERT_EQ(at(g_z, v * dv + d, col), z(s * dv + d, col));
            }
            for (int64_t k = 0; k < conv.width; ++k)
                ASSERT_EQ(at(g_conv, 2 * KD + v * dv + d, k), conv(2 * KD + s * dv + d, k));
            for (int64_t row = 0; row < H; ++row) ASSERT_EQ(at(g_out, row, v * dv + d), out(row, s * dv + d));
        }
        for (int64_t col = 0; col < H; ++col) {
            ASSERT_EQ(at(g_alpha, v, col), a(s, col));
            ASSERT_EQ(at(g_beta, v, col), beta(s, col));
        }
        EXPECT_FLOAT_EQ(at(g_a, 0, v), -std::exp(alog(0, s)));
        EXPECT_LT(at(g_a, 0, v), 0.0f);
        EXPECT_EQ(at(g_dt, 0, v), dt(0, s));
    }
    for (int64_t row = 0; row < 2 * KD; ++row)
        for (int64_t k = 0; k < conv.width; ++k) ASSERT_EQ(at(g_conv, row, k), conv(row, k));
    for (int64_t d = 0; d < dv; ++d) EXPECT_EQ(at(g_norm, 0, d), norm(0, d)) << "ssm_norm must not get +1";
}

void check_plus_one(const gguf::File& f, const SafetensorsSet& st, const std::string& gguf_name,
                    const std::string& hf_name) {
    const auto* g = f.find_tensor(gguf_name);
    ASSERT_NE(g, nullptr) << gguf_name;
    const HfRows h = hf(st, hf_name);
    for (int64_t i = 0; i < g->ne[0]; ++i) ASSERT_FLOAT_EQ(at(g, 0, i), h(0, i) + 1.0f) << gguf_name << " " << i;
}

void check_experts(const gguf::File& f, const SafetensorsSet& st, const json& c, int64_t l) {
    const int64_t E = c["num_experts"], F = c["moe_intermediate_size"], H = c["hidden_size"];
    const std::string b = "blk." + std::to_string(l) + ".";
    const auto* gate = f.find_tensor(b + "ffn_gate_exps.weight");
    const auto* up = f.find_tensor(b + "ffn_up_exps.weight");
    const auto* down = f.find_tensor(b + "ffn_down_exps.weight");
    for (int64_t e = 0; e < E; ++e) {
        const std::string p = "model.layers." + std::to_string(l) + ".mlp.experts." + std::to_string(e) + ".";
        const HfRows hg = hf(st, p + "gate_proj.weight"), hu = hf(st, p + "up_proj.weight");
        const HfRows hd = hf(st, p + "down_proj.weight");
        for (int64_t row = 0; row < F; ++row)
            for (int64_t col = 0; col < H; col += 5) {
                ASSERT_EQ(at(gate, e * F + row, col), hg(row, col));
                ASSERT_EQ(at(up, e * F + row, col), hu(row, col));
            }
        for (int64_t row = 0; row < H; row += 3)
            for (int64_t col = 0; col < F; ++col) ASSERT_EQ(at(down, e * H + row, col), hd(row, col));
    }
}

TEST(Convert, Qwen4ExpFixture) {
    if (!have_fixture("qwen4exp")) GTEST_SKIP() << "fixture tests/data/qwen4exp absent (tools/goldens makes it)";
    TempDir tmp;
    const json c = read_json(fixture_dir("qwen4exp") + "/config.json");
    const auto st = SafetensorsSet::open_dir(fixture_dir("qwen4exp"));
    const auto f = gguf::File::open(convert_fixture(tmp, "qwen4exp", DType::F32, false));
    check_table(*f, expected_table(c, "qwen4exp", 0), DType::F32);
    check_common_keys(*f, "qwen4exp");
    const std::string A = "qwen4exp.";

    // qwen4exp keys (section 1.4)
    for (const char* k :
         {"hyper_connection.count", "hyper_connection.low_rank", "attention.indexer.head_count",
          "attention.indexer.key_length", "attention.indexer.top_k", "ple.ngram_size", "ple.heads_per_ngram",
          "ple.conv_kernel", "ple.eos_token_id", "embedding_length_per_layer_input"})
        expect_key_type(*f, A + k, ValueType::U32);
    EXPECT_EQ(f->get_u32(A + "hyper_connection.count"), 3u);
    EXPECT_EQ(f->get_u32(A + "attention.indexer.top_k"), 8u);
    EXPECT_EQ(f->get_u32(A + "block_count"), 4u);
    EXPECT_EQ(f->get_u32(A + "rope.dimension_count"), 8u);
    EXPECT_EQ(f->get_u32(A + "ple.eos_token_id"), 509u);
    EXPECT_EQ(f->get_u32(A + "embedding_length_per_layer_input"), 16u);
    EXPECT_EQ(f->find(A + "nextn_predict_layers"), nullptr);
    EXPECT_EQ(f->get_int_array(A + "attention.compress_ratios"), (std::vector<int64_t>{0, 0, 0, 4}));
    EXPECT_EQ(f->get_int_array(A + "ple.layers"), (std::vector<int64_t>{1}));
    EXPECT_EQ(f->get_int_array(A + "rope.dimension_sections"), (std::vector<int64_t>{2, 1, 1, 0}));
    for (const char* k : {"ple.layer_multipliers", "ple.head_offsets", "ple.head_vocab_sizes"})
        expect_key_type(*f, A + k, ValueType::ARRAY, ValueType::U64);

    // hash arrays: exactly the HF int64 buffers; the recomputation agrees with transformers' buffers too
    const std::string pe = "model.layers.1.ple.ple_embedding.";
    auto as_u64 = [](const std::vector<int64_t>& v) { return std::vector<uint64_t>(v.begin(), v.end()); };
    const auto mult = as_u64(st->read_i64(pe + "layer_multipliers"));
    const auto offs = as_u64(st->read_i64(pe + "ngram_heads_offsets"));
    const auto sizes = as_u64(st->read_i64(pe + "ngram_heads_vocab_sizes"));
    EXPECT_EQ(f->get_u64_array(A + "ple.layer_multipliers"), mult);
    EXPECT_EQ(f->get_u64_array(A + "ple.head_offsets"), offs);
    EXPECT_EQ(f->get_u64_array(A + "ple.head_vocab_sizes"), sizes);
    const PleHash recomputed = compute_ple_hash(load_hf_config(fixture_dir("qwen4exp")), 0);
    EXPECT_EQ(recomputed.multipliers, mult);
    EXPECT_EQ(recomputed.head_offsets, offs);
    EXPECT_EQ(recomputed.head_vocab_sizes, sizes);

    // PLE table: shards concatenated in numeric order
    const auto* table = f->find_tensor("per_layer_token_embd.weight");
    ASSERT_NE(table, nullptr);
    int64_t row = 0;
    for (int k = 0; k < 4; ++k) {
        const HfRows shard = hf(*st, pe + "ngram_embedding.shard_" + std::to_string(k) + ".weight");
        const int64_t n = static_cast<int64_t>(shard.v.size()) / shard.width;
        for (int64_t r = 0; r < n; r += 13, row += 0)
            for (int64_t col = 0; col < shard.width; ++col) ASSERT_EQ(at(table, row + r, col), shard(r, col));
        row += n;
    }
    EXPECT_EQ(table->ne[1], row);
    EXPECT_GE(static_cast<uint64_t>(row), offs.back() + sizes.back());

    for (int64_t l = 0; l < 3; ++l) check_gdn_reordered(*f, *st, c, l);
    check_experts(*f, *st, c, 0);
    check_plus_one(*f, *st, "blk.0.hc_attn_norm.weight", "model.layers.0.attn_hyper_connection.hc_norm.weight");
    check_plus_one(*f, *st, "blk.2.hc_ffn_norm.weight", "model.layers.2.mlp_hyper_connection.hc_norm.weight");
    check_plus_one(*f, *st, "output_hc_norm.weight", "model.hyper_connection_mixer.hc_norm.weight");
    check_plus_one(*f, *st, "blk.3.attn_q_norm.weight", "model.layers.3.self_attn.q_norm.weight");
    check_plus_one(*f, *st, "blk.3.indexer.k_norm.weight", "model.layers.3.self_attn.indexer.k_layernorm.weight");
    check_plus_one(*f, *st, "blk.1.ple_norm_key.weight", "model.layers.1.ple.norm_key.weight");
    check_plus_one(*f, *st, "blk.1.ple_norm_conv.weight", "model.layers.1.ple.norm_conv.weight");

    // indexer split: q rows first, then the one key head
    const HfRows qk = hf(*st, "model.layers.3.self_attn.indexer.index_qk_proj.weight");
    const auto* iq = f->find_tensor("blk.3.indexer.q_proj.weight");
    const auto* ik = f->find_tensor("blk.3.indexer.k_proj.weight");
    const int64_t q_rows = c["indexer_n_heads"].get<int64_t>() * c["indexer_head_dim"].get<int64_t>();
    for (int64_t r = 0; r < q_rows; ++r) ASSERT_EQ(at(iq, r, 5), qk(r, 5));
    for (int64_t r = 0; r < c["indexer_head_dim"].get<int64_t>(); ++r) ASSERT_EQ(at(ik, r, 9), qk(q_rows + r, 9));
    // conv squeeze of the PLE conv: [HC, 1, Kp] -> {Kp, HC}
    const HfRows pc = hf(*st, "model.layers.1.ple.conv1d.weight");
    for (int64_t ch = 0; ch < 192; ch += 11)
        for (int64_t k = 0; k < 4; ++k) ASSERT_EQ(at(f->find_tensor("blk.1.ple_conv1d.weight"), ch, k), pc(ch, k));

    // tokenizer (section 5)
    const json tok = read_json(fixture_dir("qwen4exp") + "/tokenizer.json");
    const json tcfg = read_json(fixture_dir("qwen4exp") + "/tokenizer_config.json");
    const auto tokens = f->get_str_array("tokenizer.ggml.tokens");
    ASSERT_EQ(tokens.size(), 512u);
    for (auto it = tok["model"]["vocab"].begin(); it != tok["model"]["vocab"].end(); ++it)
        ASSERT_EQ(tokens[it->get<size_t>()], it.key());
    const auto types = f->get_int_array("tokenizer.ggml.token_type");
    for (const json& a : tok["added_tokens"]) {
        EXPECT_EQ(tokens[a["id"].get<size_t>()], a["content"].get<std::string>());
        EXPECT_EQ(types[a["id"].get<size_t>()], a["special"].get<bool>() ? 3 : 4);
    }
    EXPECT_EQ(types[0], 1);
    const auto merges = f->get_str_array("tokenizer.ggml.merges");
    ASSERT_EQ(merges.size(), tok["model"]["merges"].size());
    const json& m0 = tok["model"]["merges"][0];
    EXPECT_EQ(merges[0],
              m0.is_string() ? m0.get<std::string>() : m0[0].get<std::string>() + " " + m0[1].get<std::string>());
    EXPECT_EQ(f->get_str("tokenizer.ggml.pre"), "qwen2");        // the fixture's regex has no \p{M}
    EXPECT_EQ(f->get_u32("tokenizer.ggml.eos_token_id"), 509u);  // "<|endoftext|>"
    EXPECT_EQ(tokens[509], tcfg["eos_token"].get<std::string>());
    EXPECT_EQ(f->get_u32("tokenizer.ggml.padding_token_id"), 509u);
    expect_key_type(*f, "tokenizer.ggml.eos_token_id", ValueType::U32);
    const gguf::Value* add_bos = f->find("tokenizer.ggml.add_bos_token");
    ASSERT_NE(add_bos, nullptr);
    EXPECT_FALSE(add_bos->b);
    EXPECT_EQ(f->get_str("tokenizer.chat_template"), tcfg["chat_template"].get<std::string>());
}

TEST(Convert, Qwen4ExpQ8_0Types) {
    if (!have_fixture("qwen4exp")) GTEST_SKIP() << "fixture tests/data/qwen4exp absent";
    TempDir tmp;
    const json c = read_json(fixture_dir("qwen4exp") + "/config.json");
    const auto f = gguf::File::open(convert_fixture(tmp, "qwen4exp", DType::Q8_0, false));
    check_table(*f, expected_table(c, "qwen4exp", 0), DType::Q8_0);
    EXPECT_EQ(f->get_u32("general.file_type"), 7u);
    // a Q8_0 row dequantizes close to the HF row
    const auto st = SafetensorsSet::open_dir(fixture_dir("qwen4exp"));
    const HfRows e = hf(*st, "model.embed_tokens.weight");
    const auto* t = f->find_tensor("token_embd.weight");
    std::vector<float> row(64);
    dequantize_row(DType::Q8_0, t->data + 7 * row_bytes(DType::Q8_0, 64), row.data(), 64);
    for (int b = 0; b < 2; ++b) {
        float amax = 0;
        for (int i = 32 * b; i < 32 * b + 32; ++i) amax = std::max(amax, std::fabs(e(7, i)));
        const float half_step = amax / 127.0f * 0.5f;  // round to nearest of 255 levels (plus the f16 scale's rounding)
        for (int i = 32 * b; i < 32 * b + 32; ++i)
            EXPECT_NEAR(row[static_cast<size_t>(i)], e(7, i), half_step * 1.01f + 1e-6f) << i;
    }
}

TEST(Convert, Qwen35MoeFixture) {
    if (!have_fixture("qwen35moe")) GTEST_SKIP() << "fixture tests/data/qwen35moe absent";
    TempDir tmp;
    const json c = read_json(fixture_dir("qwen35moe") + "/config.json");
    const auto st = SafetensorsSet::open_dir(fixture_dir("qwen35moe"));
    expect_error([&] { convert_fixture(tmp, "qwen35moe", DType::F32, false); }, "--vocab-placeholder");
    const auto f = gguf::File::open(convert_fixture(tmp, "qwen35moe", DType::F32, true));
    check_table(*f, expected_table(c, "qwen35moe", 0), DType::F32);
    check_common_keys(*f, "qwen35moe");
    EXPECT_EQ(f->get_int_array("qwen35moe.rope.dimension_sections"), (std::vector<int64_t>{2, 1, 1, 0}));
    for (int64_t l = 0; l < 3; ++l) check_gdn_reordered(*f, *st, c, l);
    check_experts(*f, *st, c, 1);
    check_plus_one(*f, *st, "output_norm.weight", "model.norm.weight");
    check_plus_one(*f, *st, "blk.0.attn_norm.weight", "model.layers.0.input_layernorm.weight");
    check_plus_one(*f, *st, "blk.3.post_attention_norm.weight", "model.layers.3.post_attention_layernorm.weight");
    check_plus_one(*f, *st, "blk.3.attn_k_norm.weight", "model.layers.3.self_attn.k_norm.weight");
    // placeholder vocabulary: 256 GPT-2 byte tokens, unique fillers, no merges
    const auto tokens = f->get_str_array("tokenizer.ggml.tokens");
    ASSERT_EQ(tokens.size(), 512u);
    EXPECT_EQ(tokens['A'], "A");
    EXPECT_EQ(tokens[' '], "\xC4\xA0");  // U+0120
    EXPECT_EQ(std::set<std::string>(tokens.begin(), tokens.end()).size(), tokens.size());
    EXPECT_TRUE(f->get_str_array("tokenizer.ggml.merges").empty());
    EXPECT_EQ(f->get_str("tokenizer.ggml.pre"), "qwen2");
}

// in_proj_qkvz [q k v z] per key-head group -> all q, all k, all v | all z (section 3.6); no value reorder.
void check_qkvz_split(const gguf::File& f, const SafetensorsSet& st, const json& c, int64_t l) {
    const int64_t dk = c["linear_key_head_dim"], nk = c["linear_num_key_heads"], nv = c["linear_num_value_heads"];
    const int64_t H = c["hidden_size"], vg = nv / nk * c.value("linear_value_head_dim", dk), group = 2 * dk + 2 * vg;
    const HfRows qkvz = hf(st, "model.layers." + std::to_string(l) + ".linear_attn.in_proj_qkvz.weight");
    const auto* qkv = f.find_tensor("blk." + std::to_string(l) + ".attn_qkv.weight");
    const auto* z = f.find_tensor("blk." + std::to_string(l) + ".attn_gate.weight");
    for (int64_t k = 0; k < nk; ++k)
        for (int64_t col = 0; col < H; col += 3) {
            for (int64_t d = 0; d < dk; ++d) {
                ASSERT_EQ(at(qkv, k * dk + d, col), qkvz(k * group + d, col));
                ASSERT_EQ(at(qkv, nk * dk + k * dk + d, col), qkvz(k * group + dk + d, col));
            }
            for (int64_t d = 0; d < vg; ++d) {
                ASSERT_EQ(at(qkv, 2 * nk * dk + k * vg + d, col), qkvz(k * group + 2 * dk + d, col));
                ASSERT_EQ(at(z, k * vg + d, col), qkvz(k * group + 2 * dk + vg + d, col));
            }
        }
}

TEST(Convert, Qwen3NextFixture) {
    if (!have_fixture("qwen3next")) GTEST_SKIP() << "fixture tests/data/qwen3next absent";
    TempDir tmp;
    const json c = read_json(fixture_dir("qwen3next") + "/config.json");
    const auto st = SafetensorsSet::open_dir(fixture_dir("qwen3next"));
    const auto f = gguf::File::open(convert_fixture(tmp, "qwen3next", DType::F32, true));
    check_table(*f, expected_table(c, "qwen3next", 0), DType::F32);
    check_common_keys(*f, "qwen3next");
    EXPECT_EQ(f->find("qwen3next.rope.dimension_sections"), nullptr);
    EXPECT_EQ(f->get_u32("qwen3next.feed_forward_length"), 96u);
    check_qkvz_split(*f, *st, c, 0);
    const HfRows ba = hf(*st, "model.layers.0.linear_attn.in_proj_ba.weight");
    for (int64_t r = 0; r < 8; ++r) ASSERT_EQ(at(f->find_tensor("blk.0.ssm_ba.weight"), r, 2), ba(r, 2));
    const HfRows out = hf(*st, "model.layers.0.linear_attn.out_proj.weight");
    for (int64_t r = 0; r < 64; ++r) ASSERT_EQ(at(f->find_tensor("blk.0.ssm_out.weight"), r, 17), out(r, 17));
    const HfRows alog = hf(*st, "model.layers.2.linear_attn.A_log");
    for (int64_t v = 0; v < 4; ++v) EXPECT_FLOAT_EQ(at(f->find_tensor("blk.2.ssm_a"), 0, v), -std::exp(alog(0, v)));
    check_plus_one(*f, *st, "blk.1.attn_norm.weight", "model.layers.1.input_layernorm.weight");
}

// ---- Configs transformers runs that llama.cpp's keys cannot carry (tools/goldens' *_uneven fixtures): GDN value
// heads of another size than the key heads, a PLE embedding narrower than hidden_size. The converter writes them with
// strata.{arch}.* keys and says llama.cpp cannot load the file. ----

void check_uneven_fixture(const std::string& name, const std::string& arch) {
    TempDir tmp;
    const json c = read_json(fixture_dir(name) + "/config.json");
    const auto st = SafetensorsSet::open_dir(fixture_dir(name));
    const std::string out = tmp / (name + ".gguf");
    const ConvertReport report =
        convert_hf_to_gguf({.hf_dir = fixture_dir(name),
                            .out_path = out,
                            .out_type = DType::F32,
                            .vocab_placeholder = !fs::exists(fixture_dir(name) + "/tokenizer.json")});
    const auto f = gguf::File::open(out);
    check_table(*f, expected_table(c, arch, 0), DType::F32);
    check_common_keys(*f, arch);
    const int64_t dk = c["linear_key_head_dim"], dv = c["linear_value_head_dim"];
    ASSERT_NE(dk, dv) << name << " should have value heads of another size than its key heads";
    EXPECT_EQ(f->get_u32(arch + ".ssm.state_size"), static_cast<uint32_t>(dk));  // what llama.cpp reads as both
    EXPECT_EQ(f->get_u32("strata." + arch + ".ssm.value_length"), static_cast<uint32_t>(dv));
    size_t reasons = 1;
    if (arch == "qwen3next") {
        check_qkvz_split(*f, *st, c, 0);
    } else {
        check_gdn_reordered(*f, *st, c, 0);
    }
    if (arch == "qwen4exp") {
        const int64_t P = c["ple_embed_dim"], H = c["hidden_size"];
        const int64_t heads = (c["ngram_size"].get<int64_t>() - 1) * c["heads_per_ngram"].get<int64_t>();
        ASSERT_NE(P, H) << name << " should have a PLE width other than hidden_size";
        EXPECT_EQ(f->get_u32("strata.qwen4exp.ple.embedding_length"), static_cast<uint32_t>(P));
        EXPECT_EQ(f->get_u32("qwen4exp.embedding_length_per_layer_input"), static_cast<uint32_t>(P / heads));
        const std::string b = "blk." + std::to_string(c["ple_layer_ids"][0].get<int64_t>() - 1) + ".";
        const std::string q = "model.layers." + std::to_string(c["ple_layer_ids"][0].get<int64_t>() - 1) + ".ple.";
        const HfRows key = hf(*st, q + "key_proj.weight"), value = hf(*st, q + "value_proj.weight");
        for (int64_t row = 0; row < H; row += 5)
            for (int64_t col = 0; col < P; ++col) {
                ASSERT_EQ(at(f->find_tensor(b + "ple_key.weight"), row, col), key(row, col));
                ASSERT_EQ(at(f->find_tensor(b + "ple_value.weight"), row, col), value(row, col));
            }
        ++reasons;
    }
    EXPECT_EQ(report.llama_cpp_unsupported.size(), reasons);
    auto model = load_model(out);  // reads the strata keys back
    EXPECT_EQ(model->info().arch, arch);
}

#define REQUIRE_CONFIG_FIXTURE(name)                                                                            \
    if (!have_fixture(name))                                                                                    \
    GTEST_SKIP() << "fixture tests/data/" name " absent (make it on the GPU machine: tools/goldens/make_goldens.py " \
                    "--only " name ")"

TEST(Convert, Qwen4ExpUnevenFixture) {
    REQUIRE_CONFIG_FIXTURE("qwen4exp_uneven");
    check_uneven_fixture("qwen4exp_uneven", "qwen4exp");
}

TEST(Convert, Qwen3NextUnevenFixture) {
    REQUIRE_CONFIG_FIXTURE("qwen3next_uneven");
    check_uneven_fixture("qwen3next_uneven", "qwen3next");
}

TEST(Synth, TinyLoadsWithTheConverterLayout) {
    TempDir tmp;
    const std::string path = tmp / "tiny.gguf";
    synth_model({.preset = "tiny", .out_path = path});
    const auto f = gguf::File::open(path);
    // the preset config, spelled out from the preset's description (DESIGN/brief), not from the code
    json c = {{"hidden_size", 64},
              {"vocab_size", 512},
              {"num_hidden_layers", 4},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"head_dim", 32},
              {"num_experts", 8},
              {"moe_intermediate_size", 32},
              {"shared_expert_intermediate_size", 32},
              {"linear_key_head_dim", 16},
              {"linear_num_key_heads", 2},
              {"linear_num_value_heads", 4},
              {"linear_conv_kernel_dim", 4},
              {"hc_count", 2},
              {"hc_lowrank", 16},
              {"indexer_n_heads", 2},
              {"indexer_head_dim", 32},
              {"ple_layer_ids", {2}},
              {"ple_conv_kernel_size", 4},
              {"ngram_size", 3},
              {"heads_per_ngram", 2},
              {"layer_types", {"linear_attention", "linear_attention", "linear_attention", "full_attention"}}};
    check_table(*f, expected_table(c, "qwen4exp", 0), DType::F32);
    check_common_keys(*f, "qwen4exp");
    EXPECT_EQ(f->find("qwen4exp.nextn_predict_layers"), nullptr);  // llama.cpp v0.4.0 refuses MTP blocks
    EXPECT_EQ(f->get_u32("qwen4exp.expert_used_count"), 2u);
    EXPECT_EQ(f->get_u32("qwen4exp.attention.indexer.top_k"), 16u);
    for (const char* k : {"ple.layer_multipliers", "ple.head_offsets", "ple.head_vocab_sizes"})
        expect_key_type(*f, std::string("qwen4exp.") + k, ValueType::ARRAY, ValueType::U64);
    // head sizes are the primes >= ngram_vocab_size_base (1000): 1009, 1013, 1019, 1021
    EXPECT_EQ(f->get_u64_array("qwen4exp.ple.head_vocab_sizes"), (std::vector<uint64_t>{1009, 1013, 1019, 1021}));
    EXPECT_EQ(f->get_u64_array("qwen4exp.ple.head_offsets"), (std::vector<uint64_t>{0, 1009, 2022, 3041}));
    EXPECT_EQ(f->get_str_array("tokenizer.ggml.tokens").size(), 512u);
    // weights are random with the fan-in scale, not constant; ssm_a negative; norms near 1
    const auto* q = f->find_tensor("blk.3.attn_q.weight");
    double sum2 = 0;
    for (int64_t i = 0; i < 64; ++i) sum2 += static_cast<double>(at(q, 5, i)) * at(q, 5, i);
    EXPECT_NEAR(sum2 / 64.0, 1.0 / 64.0, 0.6 / 64.0);
    for (int64_t v = 0; v < 4; ++v) EXPECT_LT(at(f->find_tensor("blk.0.ssm_a"), 0, v), 0.0f);
    EXPECT_NEAR(at(f->find_tensor("blk.0.hc_attn_norm.weight"), 0, 3), 1.0f, 0.5f);

    // the same seed gives the same bytes; a Q8_0 expert type changes only the expert tensors
    const std::string path_q8 = tmp / "tiny-q8.gguf";
    synth_model({.preset = "tiny", .expert_type = DType::Q8_0, .out_path = path_q8});
    const auto g = gguf::File::open(path_q8);
    EXPECT_EQ(g->find_tensor("blk.0.ffn_up_exps.weight")->type, DType::Q8_0);
    EXPECT_EQ(g->find_tensor("blk.0.attn_qkv.weight")->type, DType::F32);
    EXPECT_EQ(g->find_tensor("blk.0.ffn_gate_inp.weight")->type, DType::F32);
}

TEST(Synth, OtherPresetsAndErrors) {
    TempDir tmp;
    for (const char* preset : {"qwen35moe-tiny", "qwen3next-tiny"}) {
        const std::string path = tmp / (std::string(preset) + ".gguf");
        synth_model({.preset = preset, .out_path = path});
        const auto f = gguf::File::open(path);
        const std::string arch = f->get_str("general.architecture");
        json c = {{"hidden_size", 64},
                  {"vocab_size", 512},
                  {"num_hidden_layers", 4},
                  {"num_attention_heads", 4},
                  {"num_key_value_heads", 2},
                  {"head_dim", 32},
                  {"num_experts", 8},
                  {"moe_intermediate_size", 32},
                  {"shared_expert_intermediate_size", 32},
                  {"linear_key_head_dim", 16},
                  {"linear_num_key_heads", 2},
                  {"linear_num_value_heads", 4},
                  {"linear_conv_kernel_dim", 4},
                  {"layer_types", {"linear_attention", "linear_attention", "linear_attention", "full_attention"}}};
        check_table(*f, expected_table(c, arch, 0), DType::F32);
        check_common_keys(*f, arch);
    }
    expect_error([&] { synth_model({.preset = "nope", .out_path = tmp / "x.gguf"}); }, "unknown preset 'nope'");
    expect_error([&] { synth_model({.preset = "tiny", .expert_type = DType::Q4_K, .out_path = tmp / "x.gguf"}); },
                 "not supported");
    expect_error([&] { synth_model({.preset = "tiny", .arch = "qwen3next", .out_path = tmp / "x.gguf"}); },
                 "is qwen4exp");
}

// ---- MTP: real checkpoints carry mtp.* (transformers does not write them); a fixture copy gets an MTP head ----

struct StEntry {
    std::string name, dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
};

void write_safetensors(const std::string& path, const std::vector<StEntry>& entries) {
    json header = json::object();
    size_t offset = 0;
    for (const StEntry& e : entries) {
        header[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {offset, offset + e.bytes.size()}}};
        offset += e.bytes.size();
    }
    std::string h = header.dump();
    while (h.size() % 8) h += ' ';
    std::ofstream out(path, std::ios::binary);
    const uint64_t n = h.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(h.data(), static_cast<std::streamsize>(h.size()));
    for (const StEntry& e : entries)
        out.write(reinterpret_cast<const char*>(e.bytes.data()), static_cast<std::streamsize>(e.bytes.size()));
}

StEntry f32_entry(const std::string& name, std::vector<int64_t> shape, float base) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = base + 0.001f * static_cast<float>(i % 997);
    StEntry e{name, "F32", shape, std::vector<uint8_t>(v.size() * 4)};
    std::memcpy(e.bytes.data(), v.data(), e.bytes.size());
    return e;
}

// Copies a fixture into dir with its tensors renamed by `rename` (empty: dropped), plus `extra`.
template <typename Rename>
void copy_fixture(const std::string& name, const std::string& dir, Rename rename, const std::vector<StEntry>& extra) {
    fs::create_directories(dir);
    for (const auto& file : fs::directory_iterator(fixture_dir(name)))
        if (file.path().extension() == ".json") fs::copy_file(file.path(), fs::path(dir) / file.path().filename());
    const auto st = SafetensorsSet::open_dir(fixture_dir(name));
    std::vector<StEntry> entries;
    for (const std::string& n : st->names()) {
        const StInfo& i = st->get(n);
        for (const std::string& new_name : rename(n))
            entries.push_back(StEntry{new_name, i.dtype, i.shape, std::vector<uint8_t>(i.data, i.data + i.n_bytes)});
    }
    entries.insert(entries.end(), extra.begin(), extra.end());
    write_safetensors(dir + "/model.safetensors", entries);
}

// The fixture plus mtp.layers.0.* (a copy of attention layer 3) and the head tensors `extra`.
void fixture_with_mtp(const std::string& name, const std::string& dir, const std::vector<StEntry>& extra) {
    copy_fixture(
        name, dir,
        [](const std::string& n) {
            std::vector<std::string> out{n};
            const std::string l3 = "model.layers.3.";
            if (n.rfind(l3, 0) == 0) out.push_back("mtp.layers.0." + n.substr(l3.size()));
            return out;
        },
        extra);
}

TEST(Convert, Qwen4ExpMtpHead) {
    if (!have_fixture("qwen4exp")) GTEST_SKIP() << "fixture tests/data/qwen4exp absent";
    TempDir tmp;
    const json c = read_json(fixture_dir("qwen4exp") + "/config.json");
    const int64_t H = 64, HC = 192, r = 16;
    const std::string dir = tmp / "q4mtp";
    fixture_with_mtp(
        "qwen4exp", dir,
        {f32_entry("mtp.pre_fc_norm_embedding.weight", {H}, 0.1f),
         f32_entry("mtp.pre_fc_norm_hidden.weight", {HC}, 0.2f), f32_entry("mtp.fc_embedding.weight", {H, H}, 1.0f),
         f32_entry("mtp.fc_hidden.weight", {H, H}, 2.0f),
         f32_entry("mtp.hyper_connection_mixer.hc_norm.weight", {HC}, 0.3f),
         f32_entry("mtp.hyper_connection_mixer.input_mix_weight_down.weight", {r, HC}, 0.4f),
         f32_entry("mtp.hyper_connection_mixer.input_mix_weight_up.weight", {HC, r}, 0.5f)});
    const auto f = gguf::File::open(convert_fixture(tmp, "qwen4exp", DType::F32, false, true, dir));
    check_table(*f, expected_table(c, "qwen4exp", 1), DType::F32);
    EXPECT_EQ(f->get_u32("qwen4exp.block_count"), 5u);
    EXPECT_EQ(f->get_u32("qwen4exp.nextn_predict_layers"), 1u);
    expect_key_type(*f, "qwen4exp.nextn_predict_layers", ValueType::U32);
    EXPECT_EQ(f->get_int_array("qwen4exp.attention.compress_ratios"), (std::vector<int64_t>{0, 0, 0, 4, 0}));
    // eh_proj row o = [fc_embedding row o | fc_hidden row o]
    const auto* eh = f->find_tensor("blk.4.nextn.eh_proj.weight");
    for (int64_t o = 0; o < H; o += 9) {
        EXPECT_FLOAT_EQ(at(eh, o, 3), 1.0f + 0.001f * static_cast<float>((o * H + 3) % 997));
        EXPECT_FLOAT_EQ(at(eh, o, H + 3), 2.0f + 0.001f * static_cast<float>((o * H + 3) % 997));
    }
    EXPECT_FLOAT_EQ(at(f->find_tensor("blk.4.nextn.enorm.weight"), 0, 5), 1.1f + 0.005f);
    EXPECT_FLOAT_EQ(at(f->find_tensor("blk.4.nextn.hc_head_norm.weight"), 0, 5), 1.3f + 0.005f);
    // the MTP block is a copy of layer 3: same tensors after the same mapping
    const auto* a = f->find_tensor("blk.3.indexer.q_proj.weight");
    const auto* b = f->find_tensor("blk.4.indexer.q_proj.weight");
    EXPECT_EQ(std::memcmp(a->data, b->data, a->n_bytes), 0);

    // --no-mtp: a file llama.cpp v0.4.0 loads
    const auto g = gguf::File::open(convert_fixture(tmp, "qwen4exp", DType::F32, false, false, dir));
    check_table(*g, expected_table(c, "qwen4exp", 0), DType::F32);
    EXPECT_EQ(g->find("qwen4exp.nextn_predict_layers"), nullptr);
    EXPECT_EQ(g->get_u32("qwen4exp.block_count"), 4u);
}

TEST(Convert, Qwen35MoeMtpHead) {
    if (!have_fixture("qwen35moe")) GTEST_SKIP() << "fixture tests/data/qwen35moe absent";
    TempDir tmp;
    const json c = read_json(fixture_dir("qwen35moe") + "/config.json");
    const int64_t H = 64;
    const std::string dir = tmp / "q35mtp";
    fixture_with_mtp(
        "qwen35moe", dir,
        {f32_entry("mtp.fc.weight", {H, 2 * H}, 1.0f), f32_entry("mtp.pre_fc_norm_embedding.weight", {H}, 0.1f),
         f32_entry("mtp.pre_fc_norm_hidden.weight", {H}, 0.2f), f32_entry("mtp.norm.weight", {H}, 0.3f)});
    const auto f = gguf::File::open(convert_fixture(tmp, "qwen35moe", DType::F32, true, true, dir));
    Table want = expected_table(c, "qwen35moe", 1);
    want["blk.4.nextn.shared_head_norm.weight"] = {{H}, Kind::F32};
    check_table(*f, want, DType::F32);
    EXPECT_EQ(f->get_u32("qwen35moe.block_count"), 5u);
    EXPECT_EQ(f->get_u32("qwen35moe.nextn_predict_layers"), 1u);
    EXPECT_FLOAT_EQ(at(f->find_tensor("blk.4.nextn.shared_head_norm.weight"), 0, 2), 1.3f + 0.002f);
    EXPECT_FLOAT_EQ(at(f->find_tensor("blk.4.nextn.eh_proj.weight"), 1, 100), 1.0f + 0.001f * ((128 + 100) % 997));
}

// flash-next's file is hundreds of GB: check its plan (names, shapes, types) and its keys without writing tensors.
TEST(Synth, FlashNextPlanAndKeys) {
    const SynthModel m = build_synth({.preset = "flash-next", .expert_type = DType::Q8_0});
    // DESIGN.md section 1: 48 layers (l % 4 == 3 QSA), hidden 2560, vocab 248320, hc 4 / low rank 320, GDN 16 q/k x
    // 128 and 48 v heads, QSA 24 q / 2 kv heads x 256, indexer 4 x 128, 512 experts top-10 width 640, PLE layer 1
    // with 16 heads x 160.
    json types = json::array();
    for (int l = 0; l < 48; ++l) types.push_back(l % 4 == 3 ? "full_attention" : "linear_attention");
    json c = {{"hidden_size", 2560},
              {"vocab_size", 248320},
              {"num_hidden_layers", 48},
              {"num_attention_heads", 24},
              {"num_key_value_heads", 2},
              {"head_dim", 256},
              {"num_experts", 512},
              {"moe_intermediate_size", 640},
              {"shared_expert_intermediate_size", 640},
              {"linear_key_head_dim", 128},
              {"linear_num_key_heads", 16},
              {"linear_num_value_heads", 48},
              {"linear_conv_kernel_dim", 4},
              {"hc_count", 4},
              {"hc_lowrank", 320},
              {"indexer_n_heads", 4},
              {"indexer_head_dim", 128},
              {"ple_layer_ids", {2}},
              {"ple_conv_kernel_size", 4},
              {"ngram_size", 3},
              {"heads_per_ngram", 8},
              {"layer_types", types}};
    const Table want = expected_table(c, "qwen4exp", 0);
    std::set<std::string> got;
    for (const PlannedTensor& t : m.plan.tensors) {
        got.insert(t.name);
        auto it = want.find(t.name);
        ASSERT_NE(it, want.end()) << t.name;
        ASSERT_EQ(t.ne.size(), it->second.ne.size()) << t.name;
        for (size_t d = 0; d < t.ne.size(); ++d)
            if (it->second.ne[d] >= 0) {
                EXPECT_EQ(t.ne[d], it->second.ne[d]) << t.name;
            }
        DType type = planned_type(t, m.types);
        if (t.name == "per_layer_token_embd.weight") {
            EXPECT_EQ(type, DType::Q8_0);  // the table follows --type
            EXPECT_GE(t.ne[1], 320000000);
        } else if (t.name.find("_exps.") != std::string::npos) {
            EXPECT_EQ(type, DType::Q8_0) << t.name;
        } else {
            EXPECT_EQ(type, it->second.kind == Kind::F32 ? DType::F32 : DType::F16) << t.name;
        }
    }
    EXPECT_EQ(got.size(), want.size());

    TempDir tmp;
    gguf::Writer w;
    add_synth_keys(w, m);
    w.write(tmp / "keys.gguf");
    const auto f = gguf::File::open(tmp / "keys.gguf");
    check_common_keys(*f, "qwen4exp");
    EXPECT_EQ(f->get_u32("qwen4exp.rope.dimension_count"), 64u);
    EXPECT_EQ(f->get_int_array("qwen4exp.rope.dimension_sections"), (std::vector<int64_t>{11, 11, 10, 0}));
    EXPECT_FLOAT_EQ(f->get_f32("qwen4exp.rope.freq_base"), 1e7f);
    EXPECT_EQ(f->get_u32("qwen4exp.attention.indexer.top_k"), 2048u);
    EXPECT_EQ(f->get_u32("qwen4exp.embedding_length_per_layer_input"), 160u);
    EXPECT_EQ(f->get_u32("qwen4exp.ple.eos_token_id"), 248046u);
    EXPECT_EQ(f->get_int_array("qwen4exp.ple.layers"), (std::vector<int64_t>{1}));
    EXPECT_EQ(f->get_u64_array("qwen4exp.ple.head_vocab_sizes").size(), 16u);
    EXPECT_EQ(f->get_u32("general.file_type"), 7u);
    std::vector<int64_t> ratios;
    for (int l = 0; l < 48; ++l) ratios.push_back(l % 4 == 3 ? 4 : 0);
    EXPECT_EQ(f->get_int_array("qwen4exp.attention.compress_ratios"), ratios);
    EXPECT_EQ(f->get_str_array("tokenizer.ggml.tokens").size(), 248320u);
    EXPECT_EQ(f->get_str_array("tokenizer.ggml.tokens")[248046], "<|endoftext|>");
}

// A Qwen4ExpForConditionalGeneration checkpoint: text weights under model.language_model., a vision tower under
// model.visual. (skipped), the text config nested in text_config, image_token_id at the top level.
TEST(Convert, ConditionalGenerationLayout) {
    if (!have_fixture("qwen4exp")) GTEST_SKIP() << "fixture tests/data/qwen4exp absent";
    TempDir tmp;
    const std::string dir = tmp / "vl";
    copy_fixture("qwen4exp", dir,
                 [](const std::string& n) {
                     if (n.rfind("model.", 0) == 0)
                         return std::vector<std::string>{"model.language_model." + n.substr(6)};
                     return std::vector<std::string>{n};
                 },
                 {f32_entry("model.visual.blocks.0.attn.qkv.weight", {48, 16}, 0.0f),
                  f32_entry("model.visual.merger.linear_fc2.weight", {64, 32}, 0.0f)});
    json text = read_json(fixture_dir("qwen4exp") + "/config.json");
    text.erase("architectures");
    const json root = {{"architectures", {"Qwen4ExpForConditionalGeneration"}},
                       {"text_config", text},
                       {"vision_config", {{"depth", 1}}},
                       {"image_token_id", 300}};
    std::ofstream(dir + "/config.json") << root.dump();
    const auto f = gguf::File::open(convert_fixture(tmp, "qwen4exp", DType::F32, false, true, dir));
    check_table(*f, expected_table(text, "qwen4exp", 0), DType::F32);
    EXPECT_EQ(f->get_u32("qwen4exp.ple.image_token_id"), 300u);
    // same bytes as the plain CausalLM conversion
    const auto g = gguf::File::open(convert_fixture(tmp, "qwen4exp", DType::F32, false));
    for (const auto& t : g->tensors()) {
        const auto* o = f->find_tensor(t.name);
        ASSERT_NE(o, nullptr);
        ASSERT_EQ(o->n_bytes, t.n_bytes);
        EXPECT_EQ(std::memcmp(o->data, t.data, t.n_bytes), 0) << t.name;
    }
}

TEST(Convert, OutputTypes) {
    if (!have_fixture("qwen4exp")) GTEST_SKIP() << "fixture tests/data/qwen4exp absent";
    TempDir tmp;
    const json c = read_json(fixture_dir("qwen4exp") + "/config.json");
    for (DType t : {DType::F16, DType::BF16}) {
        const auto f = gguf::File::open(convert_fixture(tmp, "qwen4exp", t, false));
        check_table(*f, expected_table(c, "qwen4exp", 0), t);
        EXPECT_EQ(f->get_u32("general.file_type"), t == DType::F16 ? 1u : 32u);
    }
}

TEST(Convert, Errors) {
    TempDir tmp;
    expect_error([&] { convert_hf_to_gguf({.hf_dir = "/nonexistent/dir", .out_path = tmp / "x.gguf"}); },
                 "not a directory");
    expect_error([&] { convert_hf_to_gguf({.hf_dir = tmp / "", .out_path = tmp / "x.gguf", .out_type = DType::Q4_K}); },
                 "not supported");
    if (!have_fixture("qwen35moe")) return;
    // a config that does not match the weights: the error names the tensor
    const std::string dir = tmp / "bad";
    fs::create_directories(dir);
    fs::copy_file(fixture_dir("qwen35moe") + "/model.safetensors", dir + "/model.safetensors");
    json c = read_json(fixture_dir("qwen35moe") + "/config.json");
    c["moe_intermediate_size"] = 48;
    std::ofstream(dir + "/config.json") << c.dump();
    expect_error([&] { convert_hf_to_gguf({.hf_dir = dir, .out_path = tmp / "x.gguf", .vocab_placeholder = true}); },
                 "model.layers.0.mlp.experts.0.gate_proj.weight");

    const std::string dir2 = tmp / "stray";
    copy_fixture("qwen35moe", dir2, [](const std::string& n) { return std::vector<std::string>{n}; },
                 {f32_entry("model.layers.0.mlp.mystery.weight", {4, 4}, 0.0f)});
    expect_error([&] { convert_hf_to_gguf({.hf_dir = dir2, .out_path = tmp / "x.gguf", .vocab_placeholder = true}); },
                 "unexpected tensor 'model.layers.0.mlp.mystery.weight'");
    const std::string dir3 = tmp / "missing";
    copy_fixture("qwen35moe", dir3,
                 [](const std::string& n) {
                     return n == "model.layers.2.linear_attn.A_log" ? std::vector<std::string>{}
                                                                    : std::vector<std::string>{n};
                 },
                 {});
    expect_error([&] { convert_hf_to_gguf({.hf_dir = dir3, .out_path = tmp / "x.gguf", .vocab_placeholder = true}); },
                 "missing tensor 'layers.2.linear_attn.A_log'");
}

// ---- synth --fast (random quant blocks) and --ple-vocab-base ----

// Every element of a tensor of any type this build dequantizes, rows of ne0.
std::vector<float> dequantized(const gguf::TensorInfo& t) {
    int64_t n = 1;
    for (int d = 0; d < t.n_dims; ++d) n *= t.ne[d];
    std::vector<float> out(static_cast<size_t>(n));
    const size_t rb = row_bytes(t.type, t.ne[0]);
    for (int64_t r = 0; r < n / t.ne[0]; ++r)
        dequantize_row(t.type, t.data + static_cast<size_t>(r) * rb, out.data() + r * t.ne[0], t.ne[0]);
    return out;
}

double rms_of(const std::vector<float>& v) {
    double s = 0;
    for (float x : v) s += static_cast<double>(x) * x;
    return std::sqrt(s / static_cast<double>(v.size()));
}

bool same_bytes(const gguf::TensorInfo& a, const gguf::TensorInfo& b) {
    return a.type == b.type && a.n_bytes == b.n_bytes && std::memcmp(a.data, b.data, a.n_bytes) == 0;
}

// Logits of a few tokens: all finite, not all equal.
void expect_runs(const std::string& path) {
    const auto model = load_model(path);
    const int64_t V = model->info().n_vocab;
    const std::vector<int32_t> ids = {1, 7, 100, 42, 300, 5};
    auto seq = model->new_sequence(static_cast<int64_t>(ids.size()));
    std::vector<float> logits(ids.size() * static_cast<size_t>(V));
    model->forward(*seq, ids, logits);
    float lo = logits[0], hi = logits[0];
    for (float x : logits) {
        ASSERT_TRUE(std::isfinite(x)) << path;
        lo = std::min(lo, x);
        hi = std::max(hi, x);
    }
    EXPECT_GT(hi - lo, 1e-3f) << path;
}

// The float generator's values (the f32 file) are the oracle for the scale of the random blocks; float tensors are
// the float generator's bytes as they are without --fast.
TEST(SynthFast, EveryQuantTypeGivesFiniteValuesAtTheFloatScale) {
    TempDir tmp;
    const std::string ref_path = tmp / "ref.gguf";
    synth_model({.preset = "small-k", .out_path = ref_path, .seed = 5});
    const auto ref = gguf::File::open(ref_path);
    const DType all[] = {DType::Q8_0,    DType::Q4_0,  DType::IQ4_NL, DType::Q2_K,   DType::Q3_K,
                         DType::Q4_K,    DType::Q5_K,  DType::Q6_K,   DType::IQ4_XS, DType::IQ2_XS,
                         DType::IQ3_XXS, DType::IQ3_S, DType::IQ1_M};
    for (DType type : all) {
        SCOPED_TRACE(dtype_name(type));
        EXPECT_TRUE(synth_fast_fills(type));
        const std::string path = tmp / (std::string(dtype_name(type)) + ".gguf");
        synth_model({.preset = "small-k", .expert_type = type, .out_path = path, .seed = 5, .fast = true});
        const auto f = gguf::File::open(path);
        ASSERT_EQ(f->tensors().size(), ref->tensors().size());
        int n_experts = 0;
        for (const auto& t : f->tensors()) {
            const auto* r = ref->find_tensor(t.name);
            ASSERT_NE(r, nullptr) << t.name;
            if (t.type == DType::F32) {
                EXPECT_TRUE(same_bytes(t, *r)) << t.name;
                continue;
            }
            const std::vector<float> v = dequantized(t);
            for (float x : v) ASSERT_TRUE(std::isfinite(x)) << t.name;
            const double ratio = rms_of(v) / rms_of(dequantized(*r));
            EXPECT_GT(ratio, 0.5) << t.name;
            EXPECT_LT(ratio, 2.0) << t.name;
            if (t.name.find("_exps.") != std::string::npos) {
                EXPECT_EQ(t.type, type) << t.name;
                ++n_experts;
            }
        }
        EXPECT_EQ(n_experts, 12);  // 4 layers x gate, up, down
        expect_runs(path);
    }
}

TEST(SynthFast, DeterministicAndFloatOnlyFilesUnchanged) {
    TempDir tmp;
    const SynthOptions iq2{.preset = "small-k", .expert_type = DType::IQ2_XS, .seed = 9, .fast = true};
    SynthOptions a = iq2, b = iq2, c = iq2;
    a.out_path = tmp / "a.gguf";
    b.out_path = tmp / "b.gguf";
    b.threads = 1;  // another chunking of the same streams
    c.out_path = tmp / "c.gguf";
    c.seed = 10;
    synth_model(a);
    synth_model(b);
    synth_model(c);
    const std::string bytes_a = strata::testing::read_text(a.out_path);
    EXPECT_EQ(bytes_a, strata::testing::read_text(b.out_path));
    const auto fa = gguf::File::open(a.out_path), fc = gguf::File::open(c.out_path);
    EXPECT_FALSE(
        same_bytes(*fa->find_tensor("blk.0.ffn_up_exps.weight"), *fc->find_tensor("blk.0.ffn_up_exps.weight")));
    // two expert tensors of one file are different streams
    const auto* up = fa->find_tensor("blk.0.ffn_up_exps.weight");
    const auto* gate = fa->find_tensor("blk.0.ffn_gate_exps.weight");
    EXPECT_NE(std::memcmp(up->data, gate->data, up->n_bytes), 0);

    // a file without quantized tensors is the normal path's file, byte for byte
    synth_model({.preset = "tiny", .out_path = tmp / "tiny.gguf", .seed = 3});
    synth_model({.preset = "tiny", .out_path = tmp / "tiny-fast.gguf", .seed = 3, .fast = true});
    EXPECT_EQ(strata::testing::read_text(tmp / "tiny.gguf"), strata::testing::read_text(tmp / "tiny-fast.gguf"));
}

// Primes at or above base, as many as heads: the PLE head table sizes (transformers' definition).
std::vector<uint64_t> primes_from(uint64_t base, int n) {
    std::vector<uint64_t> out;
    for (uint64_t p = base; static_cast<int>(out.size()) < n; ++p) {
        bool prime = p >= 2;
        for (uint64_t k = 2; k * k <= p && prime; ++k) prime = p % k != 0;
        if (prime) out.push_back(p);
    }
    return out;
}

TEST(SynthFast, PleVocabBaseShrinksOnlyThePleTable) {
    TempDir tmp;
    const std::string path = tmp / "tiny-ple.gguf";
    synth_model({.preset = "tiny", .out_path = path, .fast = true, .ple_vocab_base = 100});
    const auto f = gguf::File::open(path);
    const std::vector<uint64_t> sizes = primes_from(100, 4);  // tiny: 2 x 2 heads
    EXPECT_EQ(f->get_u64_array("qwen4exp.ple.head_vocab_sizes"), sizes);
    uint64_t total = 0;
    for (uint64_t s : sizes) total += s;
    const auto* table = f->find_tensor("per_layer_token_embd.weight");
    ASSERT_NE(table, nullptr);
    EXPECT_EQ(table->ne[1], static_cast<int64_t>((total + 127) / 128 * 128));  // make_ngram_vocab_size_divisible_by
    expect_runs(path);

    // flash-next: the table comes down to ~1 GB, every other tensor keeps the preset's shape
    const SynthModel full = build_synth({.preset = "flash-next", .expert_type = DType::IQ2_XS});
    const SynthModel small =
        build_synth({.preset = "flash-next", .expert_type = DType::IQ2_XS, .ple_vocab_base = 200000});
    ASSERT_EQ(full.plan.tensors.size(), small.plan.tensors.size());
    for (size_t i = 0; i < full.plan.tensors.size(); ++i) {
        const PlannedTensor& a = full.plan.tensors[i];
        const PlannedTensor& b = small.plan.tensors[i];
        ASSERT_EQ(a.name, b.name);
        if (a.name == "per_layer_token_embd.weight") {
            uint64_t rows = 0;
            for (uint64_t s : primes_from(200000, 16)) rows += s;
            EXPECT_EQ(b.ne[1], static_cast<int64_t>((rows + 127) / 128 * 128));
            EXPECT_GE(a.ne[1], 320000000);
        } else {
            EXPECT_EQ(a.ne, b.ne) << a.name;
            EXPECT_EQ(planned_type(a, full.types), planned_type(b, small.types)) << a.name;
        }
    }
    EXPECT_LT(synth_planned_bytes(small), synth_planned_bytes(full) - (uint64_t{90} << 30));
    // the 640-wide ffn_down_exps rows hold no 256-element block: llama-quantize's fallback for IQ2_XS is IQ4_NL
    // (llama_tensor_get_type), not F16; gate and up (2560 wide) stay IQ2_XS
    for (const PlannedTensor& t : small.plan.tensors) {
        if (t.name.find("_exps.") == std::string::npos) continue;
        const bool down = t.name.find("ffn_down_exps") != std::string::npos;
        EXPECT_EQ(planned_type(t, small.types), down ? DType::IQ4_NL : DType::IQ2_XS) << t.name;
    }
    EXPECT_LT(synth_planned_bytes(small), uint64_t{56} << 30);  // fits the GPU machine's 64 GB disk

    expect_error([&] { build_synth({.preset = "tiny", .ple_vocab_base = 0}); }, "--ple-vocab-base must be between");
    expect_error([&] { build_synth({.preset = "tiny", .ple_vocab_base = int64_t{1} << 40}); },
                 "--ple-vocab-base must be between");
    expect_error([&] { build_synth({.preset = "qwen35moe-tiny", .ple_vocab_base = 100}); }, "has no PLE table");
}

TEST(SynthFast, CommandLine) {
    TempDir tmp;
    const std::string out = tmp / "k.gguf";
    auto r = strata::testing::run_strata(
        "synth --preset small-k --type q4_k --fast --threads 2 --ple-vocab-base 300 "
        "--out " +
        strata::testing::shell_quote(out));
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find("random quant blocks"), std::string::npos) << r.out;
    EXPECT_EQ(gguf::File::open(out)->find_tensor("blk.0.ffn_down_exps.weight")->type, DType::Q4_K);
    r = strata::testing::run_strata("synth --preset flash-next --type iq2_xs --ple-vocab-base 200000 --dry-run");
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find("iq2_xs"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("GiB"), std::string::npos) << r.out;
    for (const char* bad : {"--ple-vocab-base 0", "--ple-vocab-base x", "--threads 2", "--fast --threads 0"}) {
        r = strata::testing::run_strata(std::string("synth --preset tiny ") + bad + " --out " +
                                        strata::testing::shell_quote(tmp / "x.gguf"));
        strata::testing::expect_user_error(r);
    }
    r = strata::testing::run_strata("synth --preset qwen3next-tiny --ple-vocab-base 100 --out " +
                                    strata::testing::shell_quote(tmp / "x.gguf"));
    strata::testing::expect_user_error(r, "has no PLE table");
}

}  // namespace
}  // namespace strata
