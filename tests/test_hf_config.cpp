// HF config.json import: the transformers fixtures in tests/data, the field-name variants real checkpoints use
// (nested text_config, legacy rope fields, full_attention_interval, eos lists), and malformed input.
#include <gtest/gtest.h>

#include <stdlib.h>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "core/error.h"
#include "format/hf_config.h"
#include "format/hf_tokenizer.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using strata::testing::TempDir;
using strata::testing::expect_error;
using nlohmann::json;

const std::string kData = STRATA_TEST_DATA;

json minimal_qwen35() {
    return json{{"architectures", {"Qwen3_5MoeForCausalLM"}},
                {"vocab_size", 512},
                {"hidden_size", 64},
                {"num_hidden_layers", 4},
                {"num_attention_heads", 4},
                {"num_experts", 8},
                {"num_experts_per_tok", 2},
                {"moe_intermediate_size", 32}};
}

TEST(HfConfig, Qwen4ExpFixture) {
    const std::string dir = kData + "/qwen4exp/hf";
    if (!fs::exists(dir + "/config.json")) GTEST_SKIP() << "fixture " << dir << " absent (tools/goldens makes it)";
    const HfConfig c = load_hf_config(dir);
    EXPECT_EQ(c.arch, HfArch::Qwen4Exp);
    EXPECT_STREQ(gguf_arch_name(c.arch), "qwen4exp");
    EXPECT_EQ(c.hidden_size, 64);
    EXPECT_EQ(c.num_hidden_layers, 4);
    EXPECT_EQ(c.hc_count, 3);
    EXPECT_EQ(c.hc_lowrank, 16);
    EXPECT_EQ(c.head_dim, 32);
    EXPECT_EQ(c.rope_dims(), 8);  // 32 x 0.25
    EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
    EXPECT_EQ(c.mrope_section, (std::vector<int64_t>{2, 1, 1}));
    EXPECT_EQ(c.is_attention, (std::vector<bool>{false, false, false, true}));  // qwen_sparse_attention
    EXPECT_EQ(c.ple_layer_ids, (std::vector<int64_t>{2}));
    EXPECT_EQ(c.ple_embed_dim, 64);
    EXPECT_EQ(c.ngram_size, 3);
    EXPECT_EQ(c.heads_per_ngram, 2);
    EXPECT_EQ(c.ngram_vocab_size_base, 1000);
    EXPECT_EQ(c.split_ngram_parts, 4);
    EXPECT_EQ(*c.indexer_n_heads, 4);
    EXPECT_EQ(*c.indexer_head_dim, 16);
    EXPECT_EQ(*c.indexer_budget, 8);
    EXPECT_EQ(*c.indexer_compress_ratio, 4);
    EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{509}));
    EXPECT_EQ(c.output_gate_type, "sigmoid");
    EXPECT_EQ(c.shared_expert_intermediate_size, 48);
    EXPECT_FALSE(c.bos_token_id.has_value());
}

TEST(HfConfig, Qwen35MoeAndQwen3NextFixtures) {
    for (const char* name : {"qwen35moe", "qwen3next"}) {
        const std::string dir = kData + "/" + name + "/hf";
        if (!fs::exists(dir + "/config.json")) GTEST_SKIP() << "fixture " << dir << " absent";
        const HfConfig c = load_hf_config(dir);
        EXPECT_STREQ(gguf_arch_name(c.arch), name);
        EXPECT_EQ(c.linear_num_key_heads, 2);
        EXPECT_EQ(c.linear_num_value_heads, 4);
        EXPECT_EQ(c.is_attention, (std::vector<bool>{false, false, false, true}));
        EXPECT_EQ(c.rope_dims(), 8);
        EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{5}));
        if (c.arch == HfArch::Qwen3Next) {
            EXPECT_EQ(c.intermediate_size, 96);
        }
    }
}

TEST(HfConfig, ConditionalGenerationNestsTextConfig) {
    json text = minimal_qwen35();
    text.erase("architectures");
    text["rope_parameters"] = {{"rope_theta", 1e7}, {"partial_rotary_factor", 0.25}, {"mrope_section", {11, 11, 10}}};
    json root = {{"architectures", {"Qwen3_5MoeForConditionalGeneration"}},
                 {"text_config", text},
                 {"image_token_id", 248056},
                 {"eos_token_id", {248046, 248044}}};
    const HfConfig c = parse_hf_config(root.dump());
    EXPECT_TRUE(c.conditional_generation);
    EXPECT_EQ(c.hidden_size, 64);
    EXPECT_DOUBLE_EQ(c.rope_theta, 1e7);
    EXPECT_EQ(c.mrope_section, (std::vector<int64_t>{11, 11, 10}));
    EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{248046, 248044}));  // from the top level
    EXPECT_EQ(*c.image_token_id, 248056);
}

TEST(HfConfig, LegacyFieldsAndInterval) {
    json j = minimal_qwen35();
    j["rope_theta"] = 5e6;
    j["partial_rotary_factor"] = 0.5;
    j["full_attention_interval"] = 2;
    j["head_dim"] = 64;
    const HfConfig c = parse_hf_config(j.dump());
    EXPECT_DOUBLE_EQ(c.rope_theta, 5e6);
    EXPECT_EQ(c.rope_dims(), 32);
    EXPECT_EQ(c.is_attention, (std::vector<bool>{false, true, false, true}));
}

TEST(HfConfig, Errors) {
    expect_error([] { parse_hf_config("{not json"); }, "not valid JSON");
    expect_error([] { parse_hf_config("[1, 2]"); }, "expected a JSON object");
    expect_error([] { parse_hf_config(R"({"vocab_size": 5})"); }, "architectures");
    expect_error([] { parse_hf_config(R"({"architectures": ["LlamaForCausalLM"]})"); }, "not supported");
    json j = minimal_qwen35();
    j.erase("hidden_size");
    expect_error([&] { parse_hf_config(j.dump()); }, "'hidden_size' is missing");
    j = minimal_qwen35();
    j["hidden_size"] = "64";
    expect_error([&] { parse_hf_config(j.dump()); }, "'hidden_size' must be an integer");
    j = minimal_qwen35();
    j["rms_norm_eps"] = "tiny";
    expect_error([&] { parse_hf_config(j.dump()); }, "'rms_norm_eps' must be a number");
    j = minimal_qwen35();
    j["layer_types"] = {"linear_attention", "full_attention"};
    expect_error([&] { parse_hf_config(j.dump()); }, "layer_types");
    j = minimal_qwen35();
    j["layer_types"] = {"linear_attention", "linear_attention", "linear_attention", "sliding_window"};
    expect_error([&] { parse_hf_config(j.dump()); }, "unsupported entry 'sliding_window'");
    j = minimal_qwen35();
    j["architectures"] = {"Qwen3_5MoeForConditionalGeneration"};
    expect_error([&] { parse_hf_config(j.dump()); }, "text_config");
    j = minimal_qwen35();
    j["architectures"] = {"Qwen4ExpForCausalLM"};
    j["hc_count"] = 1;
    expect_error([&] { parse_hf_config(j.dump()); }, "hc_count");
    j["hc_count"] = 4;
    j["ple_layer_ids"] = {4};  // layer 4 is the attention layer
    j["eos_token_id"] = 1;
    expect_error([&] { parse_hf_config(j.dump()); }, "not a linear_attention layer");
    j["ple_layer_ids"] = {2};
    j.erase("eos_token_id");
    expect_error([&] { parse_hf_config(j.dump()); }, "eos_token_id");
    expect_error([] { load_hf_config("/nonexistent/strata/dir"); }, "cannot open");
}

// ---- tokenizer.json import (gguf-qwen4exp.md section 5) ----

// The HF regexes of the two Qwen vocabularies (tokenizer.json spelling, with the (?i:...) group).
const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kQwen35Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

TEST(HfTokenizer, PreTokenizerDetection) {
    EXPECT_EQ(pre_tokenizer_name(kQwen2Regex), "qwen2");
    EXPECT_EQ(pre_tokenizer_name(kQwen35Regex), "qwen35");
}

TEST(HfTokenizer, HandWrittenQwen35Tokenizer) {
    TempDir dir;
    json tok = {
        {"model",
         {{"type", "BPE"},
          {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}, {"\xC4\xA0", 3}}},
          {"merges", {"a b", "\xC4\xA0 a"}}}},
        {"added_tokens",
         {{{"id", 6}, {"content", "<|im_end|>"}, {"special", true}},
          {{"id", 5}, {"content", "<tool_call>"}, {"special", false}}}},
        {"pre_tokenizer",
         {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"}, {"pattern", {{"Regex", kQwen35Regex}}}, {"behavior", "Isolated"}, {"invert", false}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}}};
    std::ofstream(dir.path() + "/tokenizer.json") << tok.dump();
    std::ofstream(dir.path() + "/tokenizer_config.json")
        << json{{"eos_token", {{"content", "<|im_end|>"}}}, {"pad_token", nullptr}}.dump();
    std::ofstream(dir.path() + "/chat_template.jinja") << "{{ messages }}";
    const auto v = load_hf_tokenizer({.dir = dir.path(), .vocab_size = 8, .fallback_eos = 0});
    ASSERT_TRUE(v.has_value());
    EXPECT_EQ(v->pre, "qwen35");
    EXPECT_EQ(v->tokens,
              (std::vector<std::string>{"a", "b", "ab", "\xC4\xA0", "[PAD4]", "<tool_call>", "<|im_end|>", "[PAD7]"}));
    EXPECT_EQ(v->token_types, (std::vector<int32_t>{1, 1, 1, 1, 5, 4, 3, 5}));
    EXPECT_EQ(v->merges, (std::vector<std::string>{"a b", "\xC4\xA0 a"}));
    EXPECT_EQ(v->eos_id, 6u);
    EXPECT_FALSE(v->pad_id.has_value());
    EXPECT_FALSE(v->add_bos);
    EXPECT_EQ(v->chat_template, "{{ messages }}");

    // an id past the model's vocab_size, and a folder without tokenizer.json
    expect_error([&] { load_hf_tokenizer({.dir = dir.path(), .vocab_size = 6}); }, "outside the model's vocab_size");
    TempDir empty;
    EXPECT_FALSE(load_hf_tokenizer({.dir = empty.path(), .vocab_size = 8}).has_value());
    std::ofstream(empty.path() + "/tokenizer.json") << "{\"model\": 3}";
    expect_error([&] { load_hf_tokenizer({.dir = empty.path(), .vocab_size = 8}); }, "no 'model' object");
}

TEST(HfTokenizer, Placeholder) {
    const HfVocab v = placeholder_vocab(300, 299);
    ASSERT_EQ(v.tokens.size(), 300u);
    // GPT-2 byte-to-unicode: printable bytes map to themselves, byte 0 to U+0100, space to U+0120
    EXPECT_EQ(v.tokens[0], "\xC4\x80");
    EXPECT_EQ(v.tokens[' '], "\xC4\xA0");
    EXPECT_EQ(v.tokens['~'], "~");
    EXPECT_EQ(v.tokens[0xAD], "\xC5\x83");  // soft hyphen is not printable: U+0143
    EXPECT_EQ(v.tokens[299], "<|endoftext|>");
    EXPECT_EQ(v.eos_id, 299u);
    EXPECT_EQ(v.token_types[10], 1);
    EXPECT_EQ(v.token_types[256], 3);
    EXPECT_TRUE(v.merges.empty());
    std::set<std::string> unique(v.tokens.begin(), v.tokens.end());
    EXPECT_EQ(unique.size(), v.tokens.size());
    expect_error([] { placeholder_vocab(100, std::nullopt); }, "vocab_size >= 256");
}

}  // namespace
}  // namespace strata
