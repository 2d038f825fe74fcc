// HF transformers config.json -> typed hyperparameters for the three text architectures strata converts
// (Qwen4Exp = GGUF qwen4exp, Qwen3.5-MoE = qwen35moe, Qwen3-Next = qwen3next). Field names and defaults follow
// transformers 5.17's configuration_*.py; a field that is absent takes the class default, a field of the wrong JSON
// type is an Error naming it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace strata {

enum class HfArch { Qwen4Exp, Qwen35Moe, Qwen3Next };

const char* gguf_arch_name(HfArch arch);  // "qwen4exp", "qwen35moe", "qwen3next"

struct HfConfig {
    HfArch arch = HfArch::Qwen4Exp;
    std::string hf_architecture;          // architectures[0]
    bool conditional_generation = false;  // ...ForConditionalGeneration (text_config nested, vision tower present)

    int64_t vocab_size = 0;
    int64_t hidden_size = 0;
    int64_t num_hidden_layers = 0;
    int64_t num_attention_heads = 0;
    int64_t num_key_value_heads = 0;
    int64_t head_dim = 0;
    int64_t max_position_embeddings = 0;
    int64_t intermediate_size = 0;  // qwen3next only (0: absent): the dense MLP's width
    double rms_norm_eps = 1e-6;
    std::string hidden_act;
    bool tie_word_embeddings = false;

    // rope_parameters (or the legacy top-level fields)
    double rope_theta = 10000.0;
    double partial_rotary_factor = 1.0;  // transformers' default when the config does not say
    std::vector<int64_t> mrope_section;  // empty when absent

    // Gated DeltaNet
    int64_t linear_conv_kernel_dim = 0;
    int64_t linear_key_head_dim = 0;
    int64_t linear_value_head_dim = 0;
    int64_t linear_num_key_heads = 0;
    int64_t linear_num_value_heads = 0;

    // MoE
    int64_t num_experts = 0;
    int64_t num_experts_per_tok = 0;
    int64_t moe_intermediate_size = 0;
    int64_t shared_expert_intermediate_size = 0;

    // true: attention (full / QSA) layer; false: linear attention (GDN). num_hidden_layers entries.
    std::vector<bool> is_attention;
    // qwen3next only, num_hidden_layers entries (empty for the others): true where the layer's MLP is a dense SwiGLU
    // of intermediate_size (Qwen3NextMLP) instead of the MoE. transformers: layer i (0-based) is sparse iff
    // i is not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0.
    std::vector<bool> is_dense_mlp;
    int64_t n_dense_mlp_layers() const;

    std::vector<int64_t> eos_token_ids;  // int or list in the JSON; empty when null/absent
    std::optional<int64_t> bos_token_id;
    std::optional<int64_t> pad_token_id;
    std::optional<int64_t> image_token_id;  // top level of a ConditionalGeneration config
    int64_t mtp_num_hidden_layers = 0;      // qwen35moe checkpoints with an MTP head

    // qwen4exp only
    int64_t hc_count = 0;
    int64_t hc_lowrank = 0;
    std::vector<int64_t> ple_layer_ids;  // one-based, sorted, unique
    int64_t ple_embed_dim = 0;
    int64_t ple_conv_kernel_size = 0;
    int64_t ngram_size = 0;
    int64_t heads_per_ngram = 0;
    int64_t ngram_vocab_size_base = 0;
    int64_t make_ngram_vocab_size_divisible_by = 0;
    int64_t seed = 0;
    int64_t split_ngram_parts = 0;
    std::optional<int64_t> indexer_n_heads;
    std::optional<int64_t> indexer_kv_heads;
    std::optional<int64_t> indexer_head_dim;
    std::optional<int64_t> indexer_budget;
    std::optional<int64_t> indexer_compress_ratio;
    std::string output_gate_type;  // empty: hidden_act

    int64_t n_attention_layers() const;
    int64_t rope_dims() const { return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor); }
};

// Parses config.json text. `source` names the file in messages. Throws Error on malformed JSON, an unknown
// architecture, a missing required field or a field of the wrong type.
HfConfig parse_hf_config(const std::string& json_text, const std::string& source = "config.json");
// Reads DIR/config.json.
HfConfig load_hf_config(const std::string& dir);

}  // namespace strata
