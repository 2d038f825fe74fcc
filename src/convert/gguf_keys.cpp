// Metadata keys with the exact types llama.cpp checks (shared/reference/gguf-qwen4exp.md section 1), and the
// streaming of planned tensors into the GGUF writer.
#include <algorithm>
#include <cstring>

#include "convert/gguf_plan.h"
#include "convert/quantize.h"
#include "core/error.h"
#include "format/gguf_names.h"

namespace strata {

using gguf::Value;

void check_output_type(DType t) {
    if (t != DType::F32 && t != DType::F16 && t != DType::BF16 && t != DType::Q8_0)
        throw Error(std::string("type ") + dtype_name(t) + " is not supported yet (use f32, f16, bf16 or q8_0)");
}

DType planned_type(const PlannedTensor& t, DType out_type) {
    if (t.keep_f32 || t.ne.size() < 2) return DType::F32;
    if (t.ne[0] % traits(out_type).block_size != 0) return DType::F16;  // llama-quantize's fallback for odd rows
    return out_type;
}

DType planned_type(const PlannedTensor& t, const TensorTypes& types) {
    if (types.table_type && is_ple_table(t.name)) {
        PlannedTensor as_matrix{t.name, t.ne, false, nullptr};
        return planned_type(as_matrix, *types.table_type);
    }
    if (types.expert_type && t.name.find("_exps.") != std::string::npos) {
        if (types.expert_fallback && !t.ne.empty() && t.ne[0] % traits(*types.expert_type).block_size != 0)
            return planned_type(t, *types.expert_fallback);
        return planned_type(t, *types.expert_type);
    }
    const DType plain = planned_type(t, types.out_type);
    if (types.mix.empty() || !types.expert_type || plain == DType::F32) return plain;
    const DType wanted = quantize_choose_type(t.name, static_cast<int>(t.ne.size()), plain,
                                              *types.expert_type, types.mix);
    return quantize_fit_type(wanted, t.ne.empty() ? 1 : t.ne[0]);
}

uint32_t file_type_of(DType out_type) {
    switch (out_type) {
        case DType::F32:
            return 0;
        case DType::F16:
            return 1;
        case DType::Q8_0:
            return 7;
        case DType::BF16:
            return 32;
        default:
            throw Error(std::string("output type ") + dtype_name(out_type) +
                        " is not supported (f32, f16, bf16, q8_0)");
    }
}

namespace {

uint32_t u32(int64_t v, const char* what) {
    if (v < 0 || v > 0xFFFFFFFFll) throw Error(std::string("config value for ") + what + " does not fit u32");
    return static_cast<uint32_t>(v);
}

// trunk block i is attention iff (i + 1) % interval == 0; returns the interval when layer_types follow that rule.
std::optional<int64_t> attention_interval(const std::vector<bool>& is_attention) {
    for (int64_t k = 1; k <= static_cast<int64_t>(is_attention.size()) + 1; ++k) {
        bool ok = true;
        for (size_t i = 0; i < is_attention.size() && ok; ++i)
            ok = is_attention[i] == ((static_cast<int64_t>(i) + 1) % k == 0);
        if (ok) return k;
    }
    return std::nullopt;
}

}  // namespace

std::vector<int32_t> rope_dimension_sections(const HfConfig& c) {
    // transformers' Qwen4Exp / Qwen3.5 rotary embedding defaults to [11, 11, 10] (as llama.cpp's converter writes)
    std::vector<int64_t> sections = c.mrope_section.empty() ? std::vector<int64_t>{11, 11, 10} : c.mrope_section;
    sections.resize(4, 0);
    // Rotary pair i takes the height position when i % 3 == 1 and i < 3 s1, the width one when i % 3 == 2 and
    // i < 3 s2, else the time one (transformers' recomposition); llama.cpp's imrope applies the same tests to i modulo
    // the sections' sum, and asserts that the sum fits the rotated head (it aborted on [11, 11, 10] with 8 rotary
    // dims). When the sections name more pairs than there are, they are cut to the pairs: height and width keep the
    // pairs i < n_pairs they had, time takes the rest, so the sum is n_pairs, i mod the sum is i, and every pair keeps
    // its position (for text all three positions are equal anyway).
    const int64_t n_pairs = c.rope_dims() / 2;
    int64_t sum = 0;
    for (int64_t s : sections) sum += s;
    if (sum > n_pairs) {
        auto pairs_at_residue = [&](int64_t k) { return k < n_pairs ? (n_pairs - 1 - k) / 3 + 1 : 0; };
        sections[1] = std::min(sections[1], pairs_at_residue(1));
        sections[2] = std::min(sections[2], pairs_at_residue(2));
        sections[0] = n_pairs - sections[1] - sections[2];
        sections[3] = 0;
    }
    std::vector<int32_t> out;
    for (int64_t s : sections) out.push_back(static_cast<int32_t>(s));
    return out;
}

void add_model_keys(gguf::Writer& w, const ConversionPlan& plan, const std::string& model_name, DType out_type) {
    const HfConfig& c = plan.config;
    const std::string A = gguf_arch_name(c.arch);
    auto key = [&](const std::string& k) { return A + "." + k; };
    const int64_t L = c.num_hidden_layers;
    const int64_t blocks = L + plan.n_mtp_layers;

    w.set("general.architecture", Value::of_str(A));
    w.set("general.name", Value::of_str(model_name));
    w.set("general.alignment", Value::of_u32(32));
    w.set("general.file_type", Value::of_u32(file_type_of(out_type)));
    w.set("general.quantization_version", Value::of_u32(2));

    w.set(key("context_length"), Value::of_u32(u32(c.max_position_embeddings, "max_position_embeddings")));
    w.set(key("embedding_length"), Value::of_u32(u32(c.hidden_size, "hidden_size")));
    w.set(key("block_count"), Value::of_u32(u32(blocks, "num_hidden_layers")));
    w.set(key("vocab_size"), Value::of_u32(u32(c.vocab_size, "vocab_size")));
    if (c.arch == HfArch::Qwen3Next && c.intermediate_size > 0)
        w.set(key("feed_forward_length"), Value::of_u32(u32(c.intermediate_size, "intermediate_size")));
    w.set(key("attention.head_count"), Value::of_u32(u32(c.num_attention_heads, "num_attention_heads")));
    w.set(key("attention.head_count_kv"), Value::of_u32(u32(c.num_key_value_heads, "num_key_value_heads")));
    w.set(key("attention.key_length"), Value::of_u32(u32(c.head_dim, "head_dim")));
    w.set(key("attention.value_length"), Value::of_u32(u32(c.head_dim, "head_dim")));
    w.set(key("attention.layer_norm_rms_epsilon"), Value::of_f32(static_cast<float>(c.rms_norm_eps)));
    w.set(key("rope.freq_base"), Value::of_f32(static_cast<float>(c.rope_theta)));
    w.set(key("rope.dimension_count"), Value::of_u32(u32(c.rope_dims(), "rotary dims")));
    w.set(key("expert_count"), Value::of_u32(u32(c.num_experts, "num_experts")));
    w.set(key("expert_used_count"), Value::of_u32(u32(c.num_experts_per_tok, "num_experts_per_tok")));
    w.set(key("expert_feed_forward_length"), Value::of_u32(u32(c.moe_intermediate_size, "moe_intermediate_size")));
    w.set(key("expert_shared_feed_forward_length"),
          Value::of_u32(u32(c.shared_expert_intermediate_size, "shared_expert_intermediate_size")));

    w.set(key("ssm.conv_kernel"), Value::of_u32(u32(c.linear_conv_kernel_dim, "linear_conv_kernel_dim")));
    w.set(key("ssm.state_size"), Value::of_u32(u32(c.linear_key_head_dim, "linear_key_head_dim")));
    w.set(key("ssm.group_count"), Value::of_u32(u32(c.linear_num_key_heads, "linear_num_key_heads")));
    w.set(key("ssm.time_step_rank"), Value::of_u32(u32(c.linear_num_value_heads, "linear_num_value_heads")));
    w.set(key("ssm.inner_size"),
          Value::of_u32(u32(c.linear_value_head_dim * c.linear_num_value_heads, "linear value dims")));
    if (auto interval = attention_interval(c.is_attention)) {
        w.set(key("full_attention_interval"), Value::of_u32(u32(*interval, "full_attention_interval")));
    } else {
        // No single interval describes layer_types: the explicit per-block map (MTP blocks are attention).
        std::vector<bool> recurrent;
        for (bool a : c.is_attention) recurrent.push_back(!a);
        recurrent.resize(static_cast<size_t>(blocks), false);
        w.set(key("attention.recurrent_layers"), Value::of_bool_array(recurrent));
    }

    // What llama.cpp's keys cannot say (plan.llama_cpp_unsupported names the files it then refuses); written only
    // when it departs from what they imply, so every file llama.cpp loads stays as its converter writes it.
    auto strata_key = [&](const std::string& k) { return "strata." + A + "." + k; };
    if (c.linear_value_head_dim != c.linear_key_head_dim)
        w.set(strata_key("ssm.value_length"), Value::of_u32(u32(c.linear_value_head_dim, "linear_value_head_dim")));
    // qwen3next blocks whose MLP is dense (ffn_gate / ffn_up / ffn_down, feed_forward_length wide), 0-based.
    if (c.n_dense_mlp_layers() > 0) {
        std::vector<int32_t> dense;
        for (int64_t l = 0; l < L; ++l)
            if (c.is_dense_mlp[static_cast<size_t>(l)]) dense.push_back(static_cast<int32_t>(l));
        w.set(strata_key("dense_mlp_layers"), Value::of_i32_array(dense));
    }

    if (c.arch != HfArch::Qwen3Next) {
        w.set(key("rope.dimension_sections"), Value::of_i32_array(rope_dimension_sections(c)));
        if (plan.n_mtp_layers > 0)
            w.set(key("nextn_predict_layers"), Value::of_u32(u32(plan.n_mtp_layers, "MTP layers")));
    }

    if (c.arch != HfArch::Qwen4Exp) return;
    w.set(key("hyper_connection.count"), Value::of_u32(u32(c.hc_count, "hc_count")));
    w.set(key("hyper_connection.low_rank"), Value::of_u32(u32(c.hc_lowrank, "hc_lowrank")));
    w.set(key("attention.indexer.head_count"), Value::of_u32(u32(*c.indexer_n_heads, "indexer_n_heads")));
    w.set(key("attention.indexer.key_length"), Value::of_u32(u32(*c.indexer_head_dim, "indexer_head_dim")));
    w.set(key("attention.indexer.top_k"), Value::of_u32(u32(*c.indexer_budget, "indexer_budget")));
    std::vector<int32_t> ratios;
    for (bool a : c.is_attention) ratios.push_back(a ? static_cast<int32_t>(*c.indexer_compress_ratio) : 0);
    ratios.resize(static_cast<size_t>(blocks), 0);  // MTP blocks attend densely
    w.set(key("attention.compress_ratios"), Value::of_i32_array(ratios));

    if (plan.ple_layers.empty()) return;
    // llama.cpp's keys carry the first PLE block; with more, strata.qwen4exp.ple.layers lists them all and each
    // further one has its hash arrays under strata.qwen4exp.ple.blk.N.* (its table: blk.N.per_layer_token_embd).
    const ConversionPlan::PleLayer& first = plan.ple_layers.front();
    w.set(key("ple.layers"), Value::of_i32_array({static_cast<int32_t>(first.block)}));
    if (plan.ple_layers.size() > 1) {
        std::vector<int32_t> blocks_with_ple;
        for (const auto& p : plan.ple_layers) blocks_with_ple.push_back(static_cast<int32_t>(p.block));
        w.set(strata_key("ple.layers"), Value::of_i32_array(blocks_with_ple));
        for (size_t i = 1; i < plan.ple_layers.size(); ++i) {
            const auto& p = plan.ple_layers[i];
            const std::string b = "ple.blk." + std::to_string(p.block) + ".";
            w.set(strata_key(b + "layer_multipliers"), Value::of_u64_array(p.multipliers));
            w.set(strata_key(b + "head_offsets"), Value::of_u64_array(p.head_offsets));
            w.set(strata_key(b + "head_vocab_sizes"), Value::of_u64_array(p.head_vocab_sizes));
        }
    }
    w.set(key("ple.ngram_size"), Value::of_u32(u32(c.ngram_size, "ngram_size")));
    w.set(key("ple.heads_per_ngram"), Value::of_u32(u32(c.heads_per_ngram, "heads_per_ngram")));
    w.set(key("ple.conv_kernel"), Value::of_u32(u32(c.ple_conv_kernel_size, "ple_conv_kernel_size")));
    // transformers' n-gram cut uses the first eos id (Qwen4ExpTextNGramEmbedding: eos_token_id[0])
    w.set(key("ple.eos_token_id"), Value::of_u32(u32(c.eos_token_ids.at(0), "eos_token_id")));
    if (c.image_token_id) w.set(key("ple.image_token_id"), Value::of_u32(u32(*c.image_token_id, "image_token_id")));
    w.set(key("embedding_length_per_layer_input"), Value::of_u32(u32(plan.ple_row_width, "PLE row width")));
    if (c.ple_embed_dim != c.hidden_size)
        w.set(strata_key("ple.embedding_length"), Value::of_u32(u32(c.ple_embed_dim, "ple_embed_dim")));
    w.set(key("ple.layer_multipliers"), Value::of_u64_array(first.multipliers));
    w.set(key("ple.head_offsets"), Value::of_u64_array(first.head_offsets));
    w.set(key("ple.head_vocab_sizes"), Value::of_u64_array(first.head_vocab_sizes));
}

void add_planned_tensors(gguf::Writer& w, const ConversionPlan& plan, const TensorTypes& types) {
    for (const PlannedTensor& t : plan.tensors) {
        const DType type = planned_type(t, types);
        const int64_t width = t.ne[0];
        const int64_t n_rows = t.n_rows();
        const size_t rb = row_bytes(type, width);
        RowFn rows = t.rows;
        w.add_tensor(t.name, type, t.ne, [rows, type, width, n_rows, rb](uint8_t* dst, size_t n_bytes) {
            STRATA_ASSERT(n_bytes == rb * static_cast<size_t>(n_rows));
            // Bounded chunks of rows: memory stays small however large the tensor is.
            const int64_t chunk = std::max<int64_t>(1, (int64_t{1} << 22) / width);
            std::vector<float> buf(static_cast<size_t>(std::min(chunk, n_rows) * width));
            for (int64_t r0 = 0; r0 < n_rows; r0 += chunk) {
                const int64_t n = std::min(chunk, n_rows - r0);
                rows(r0, n, buf.data());
                uint8_t* out = dst + static_cast<size_t>(r0) * rb;
                if (type == DType::F32) {
                    std::memcpy(out, buf.data(), static_cast<size_t>(n * width) * sizeof(float));
                } else {
                    for (int64_t i = 0; i < n; ++i)
                        quantize_row(type, buf.data() + i * width, out + static_cast<size_t>(i) * rb, width);
                }
            }
        });
    }
}

}  // namespace strata
