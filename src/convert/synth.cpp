// `strata synth`: random-weight GGUF files of named shapes. A preset is an HF config; a generator stands in for the
// safetensors checkpoint (same tensor names and shapes as transformers' save_pretrained), and the file is written
// through the converter's own plan, so synth files and converted files cannot drift apart.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>

#include <nlohmann/json.hpp>

#include "convert/convert.h"
#include "convert/gguf_plan.h"
#include "convert/synth.h"
#include "convert/tensor_source.h"
#include "core/error.h"
#include "format/gguf.h"
#include "format/hf_config.h"
#include "format/hf_tokenizer.h"

namespace strata {

namespace {

using nlohmann::json;

uint64_t mix64(uint64_t v) {
    v += 0x9E3779B97F4A7C15ull;
    v = (v ^ (v >> 30)) * 0xBF58476D1CE4E5B9ull;
    v = (v ^ (v >> 27)) * 0x94D049BB133111EBull;
    return v ^ (v >> 31);
}

// --router-skew (SynthOptions::router_skew). Scaling router rows cannot do it: top-k of scaled Gaussian logits gives
// a hot set and a tail that dies off like a Gaussian, so LRU jumps from ~67% at 64 slots to ~92% at 128. Popularity
// falling as a power of the rank (Zipf ~1.2 gives 67% / 81% by Che's approximation) needs per-expert biases, and a
// router has no bias: the hidden state must carry a constant direction for it, as real models' "massive activations"
// do. So synth plants one, d (a random unit vector from the seed), as a constant component of every token embedding
// holding kSkewShare of its energy, and gives router row e of layer l a bias along d:
//     w_e = base_e - (base_e . d) d - S * kSkewBias * sqrt((1 + kSkewDepth * l) * ln(1 + u_e * n_expert) / n_embd) d
// with u_e ~ U(0, 1) from the seed: expert e's logit is biased by -sqrt(ln(1 + its random rank)), which makes its
// popularity fall as a power of the rank. S = 1 is calibrated (bench/notes/expert-cache.md: pseudo-random ids as
// `strata bench` feeds) so that LRU with 64 / 128 of 512 slots a layer hits 67% / 80% on moe512-deep (48 layers,
// Flash-Next's depth and routing) and 62% / 78% on moe512-tiny, near llama.cpp#27861's 67% / 81% on a real
// Flash-Next. The routing then depends on the token stream no more than a random model's does: little locality.
constexpr double kSkewShare = 1.0 / 3.0;
constexpr double kSkewBias = 3.85;
// Each block adds to the residual, so the planted direction's share of a deeper layer's input is smaller: the bias
// grows as sqrt(1 + kSkewDepth * layer), which keeps the hit rates of layers 3..47 of moe512-deep level.
constexpr double kSkewDepth = 0.15;

// N of "model.layers.N.<rest>"; 0 for other names.
int64_t layer_of(const std::string& name) {
    const std::string prefix = "model.layers.";
    if (name.rfind(prefix, 0) != 0) return 0;
    return std::atoll(name.c_str() + prefix.size());
}
constexpr uint64_t kRouterSkewSalt = 0x5CE3D0A7E5ull;

bool is_router(const std::string& name) {
    const std::string suffix = ".mlp.gate.weight";
    return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// How a synthetic tensor's values are drawn.
enum class Init { Linear, Embedding, ZeroCentredNorm, PlainNorm, ALog, DtBias, Conv };

struct SynthTensor {
    std::string name;
    std::vector<int64_t> shape;
    Init init = Init::Linear;
    std::vector<int64_t> ints;  // integer buffers (PLE hash constants)
    bool is_int = false;
};

class SynthSource : public TensorSource {
  public:
    SynthSource(uint64_t seed, double router_skew) : seed_(seed), router_skew_(router_skew) {}

    void add(std::string name, std::vector<int64_t> shape, Init init = Init::Linear) {
        index_[name] = tensors_.size();
        tensors_.push_back(SynthTensor{std::move(name), std::move(shape), init, {}, false});
    }
    void add_ints(std::string name, const std::vector<uint64_t>& values) {
        index_[name] = tensors_.size();
        SynthTensor t{std::move(name), {static_cast<int64_t>(values.size())}, Init::Linear, {}, true};
        for (uint64_t v : values) t.ints.push_back(static_cast<int64_t>(v));
        tensors_.push_back(std::move(t));
    }

    size_t size() const override { return tensors_.size(); }
    const std::string& name(size_t i) const override { return tensors_.at(i).name; }
    const std::vector<int64_t>& shape(size_t i) const override { return tensors_.at(i).shape; }
    std::optional<size_t> find(const std::string& n) const override {
        auto it = index_.find(n);
        if (it == index_.end()) return std::nullopt;
        return it->second;
    }
    std::string origin(size_t) const override { return "synth"; }
    std::vector<int64_t> read_i64(size_t i) const override { return tensors_.at(i).ints; }

    // Every row has its own random stream, so rows can be produced in any order and any chunking.
    void read_rows(size_t i, int64_t row0, int64_t n_rows, float* out) const override {
        const SynthTensor& t = tensors_.at(i);
        STRATA_ASSERT(!t.is_int);
        const int64_t width = row_width(t.shape);
        const uint64_t base = mix64(seed_ ^ hash_name(t.name));
        for (int64_t r = 0; r < n_rows; ++r) {
            uint64_t state = mix64(base + static_cast<uint64_t>(row0 + r) * 0xD1B54A32D192ED03ull);
            auto uniform = [&state] {
                state = mix64(state);
                return (static_cast<double>(state >> 11) + 0.5) * (1.0 / 9007199254740992.0);  // (0, 1)
            };
            auto normal = [&] {
                return std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform());
            };
            float* o = out + r * width;
            for (int64_t k = 0; k < width; ++k) {
                double v = 0.0;
                switch (t.init) {
                    case Init::Linear:
                        v = normal() / std::sqrt(static_cast<double>(width));
                        break;  // N(0, 1/fan_in)
                    case Init::Embedding:
                        v = normal();
                        break;
                    case Init::ZeroCentredNorm:
                        v = 0.1 * normal();
                        break;  // stored as 1 + w
                    case Init::PlainNorm:
                        v = 1.0 + 0.1 * normal();
                        break;
                    case Init::ALog:
                        v = std::log(1.0 + 15.0 * uniform());
                        break;
                    case Init::DtBias:
                        v = 0.5 * normal();
                        break;
                    case Init::Conv:
                        v = normal() / std::sqrt(static_cast<double>(width));
                        break;
                }
                o[k] = static_cast<float>(v);
            }
            if (router_skew_ > 0.0 && t.init == Init::Embedding && t.name == "model.embed_tokens.weight")
                add_shared_direction(o, width);
            if (router_skew_ > 0.0 && is_router(t.name)) skew_router_row(t.name, row0 + r, o, width);
        }
    }

    // The skew's shared direction d of the hidden states, drawn from the seed (needs the hidden size).
    void set_skew_direction(int64_t n_embd) {
        if (router_skew_ <= 0.0) return;
        uint64_t state = mix64(seed_ ^ kRouterSkewSalt);
        std::vector<double> d(static_cast<size_t>(n_embd));
        double norm2 = 0.0;
        for (double& v : d) {
            state = mix64(state);
            const double u1 = (static_cast<double>(state >> 11) + 0.5) * (1.0 / 9007199254740992.0);
            state = mix64(state);
            const double u2 = (static_cast<double>(state >> 11) + 0.5) * (1.0 / 9007199254740992.0);
            v = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
            norm2 += v * v;
        }
        for (double& v : d) v /= std::sqrt(norm2);
        direction_ = std::move(d);
    }

  private:
    // An embedding row (elements N(0, 1), squared norm about H) plus c = sqrt(share / (1 - share) * H) d.
    void add_shared_direction(float* row, int64_t width) const {
        STRATA_ASSERT(static_cast<int64_t>(direction_.size()) == width);
        const double c = std::sqrt(kSkewShare / (1.0 - kSkewShare) * static_cast<double>(width));
        for (int64_t k = 0; k < width; ++k)
            row[k] = static_cast<float>(row[k] + c * direction_[static_cast<size_t>(k)]);
    }

    void skew_router_row(const std::string& name, int64_t expert, float* row, int64_t width) const {
        STRATA_ASSERT(static_cast<int64_t>(direction_.size()) == width);
        const uint64_t state = mix64(mix64(seed_ ^ hash_name(name) ^ kRouterSkewSalt) + static_cast<uint64_t>(expert));
        const double u = (static_cast<double>(mix64(state) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
        const double n_expert = static_cast<double>(tensors_.at(index_.at(name)).shape[0]);
        const double depth = std::sqrt(1.0 + kSkewDepth * static_cast<double>(layer_of(name)));
        const double bias =
            -router_skew_ * kSkewBias * depth * std::sqrt(std::log(1.0 + u * n_expert) / static_cast<double>(width));
        double along = 0.0;
        for (int64_t k = 0; k < width; ++k) along += row[k] * direction_[static_cast<size_t>(k)];
        for (int64_t k = 0; k < width; ++k)
            row[k] = static_cast<float>(row[k] + (bias - along) * direction_[static_cast<size_t>(k)]);
    }

    std::vector<double> direction_;
    uint64_t seed_;
    double router_skew_;
    std::vector<SynthTensor> tensors_;
    std::map<std::string, size_t> index_;
};

// The tensors transformers' save_pretrained writes for this config (experts in the fused in-memory layout, which
// the converter accepts as well as per-expert tensors).
void add_hf_tensors(SynthSource& s, const HfConfig& c) {
    const int64_t H = c.hidden_size, V = c.vocab_size, hc = c.hc_count, HC = hc * H, r = c.hc_lowrank;
    const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim;
    const int64_t E = c.num_experts, F = c.moe_intermediate_size, Fs = c.shared_expert_intermediate_size;
    const int64_t dk = c.linear_key_head_dim, dv = c.linear_value_head_dim, nk = c.linear_num_key_heads;
    const int64_t nv = c.linear_num_value_heads, KD = dk * nk, VD = dv * nv, CD = 2 * KD + VD;
    const bool q4 = c.arch == HfArch::Qwen4Exp;

    s.add("model.embed_tokens.weight", {V, H}, Init::Embedding);
    auto hyper = [&](const std::string& p, bool inject) {
        s.add(p + "hc_norm.weight", {HC}, Init::ZeroCentredNorm);
        s.add(p + "input_mix_weight_down.weight", {r, HC});
        s.add(p + "input_mix_weight_up.weight", {HC, r});
        if (inject) s.add(p + "block_inject_weight.weight", {hc, HC});
    };
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        if (q4) {
            hyper(p + "attn_hyper_connection.", true);
            hyper(p + "mlp_hyper_connection.", true);
        } else {
            s.add(p + "input_layernorm.weight", {H}, Init::ZeroCentredNorm);
            s.add(p + "post_attention_layernorm.weight", {H}, Init::ZeroCentredNorm);
        }
        if (c.is_attention[static_cast<size_t>(l)]) {
            const std::string a = p + "self_attn.";
            s.add(a + "q_proj.weight", {2 * nh * hd, H});
            s.add(a + "k_proj.weight", {nkv * hd, H});
            s.add(a + "v_proj.weight", {nkv * hd, H});
            s.add(a + "o_proj.weight", {H, nh * hd});
            s.add(a + "q_norm.weight", {hd}, Init::ZeroCentredNorm);
            s.add(a + "k_norm.weight", {hd}, Init::ZeroCentredNorm);
            if (q4) {
                const int64_t ni = *c.indexer_n_heads, di = *c.indexer_head_dim;
                s.add(a + "indexer.index_qk_proj.weight", {(ni + 1) * di, H});
                s.add(a + "indexer.q_layernorm.weight", {di}, Init::ZeroCentredNorm);
                s.add(a + "indexer.k_layernorm.weight", {di}, Init::ZeroCentredNorm);
            }
        } else {
            const std::string g = p + "linear_attn.";
            if (c.arch == HfArch::Qwen3Next) {
                s.add(g + "in_proj_qkvz.weight", {2 * KD + 2 * VD, H});
                s.add(g + "in_proj_ba.weight", {2 * nv, H});
            } else {
                s.add(g + "in_proj_qkv.weight", {CD, H});
                s.add(g + "in_proj_z.weight", {VD, H});
                s.add(g + "in_proj_b.weight", {nv, H});
                s.add(g + "in_proj_a.weight", {nv, H});
            }
            s.add(g + "conv1d.weight", {CD, 1, c.linear_conv_kernel_dim}, Init::Conv);
            s.add(g + "dt_bias", {nv}, Init::DtBias);
            s.add(g + "A_log", {nv}, Init::ALog);
            s.add(g + "norm.weight", {dv}, Init::PlainNorm);
            s.add(g + "out_proj.weight", {H, VD});
        }
        const auto ple_id = std::find(c.ple_layer_ids.begin(), c.ple_layer_ids.end(), l + 1);
        if (q4 && ple_id != c.ple_layer_ids.end()) {
            const std::string q = p + "ple.";
            const int64_t n_heads = (c.ngram_size - 1) * c.heads_per_ngram, P = c.ple_embed_dim / n_heads;
            s.add(q + "key_proj.weight", {HC, c.ple_embed_dim});
            s.add(q + "value_proj.weight", {H, c.ple_embed_dim});
            s.add(q + "norm_key.weight", {HC}, Init::ZeroCentredNorm);
            s.add(q + "norm_query.weight", {HC}, Init::ZeroCentredNorm);
            s.add(q + "norm_conv.weight", {HC}, Init::ZeroCentredNorm);
            s.add(q + "conv1d.weight", {HC, 1, c.ple_conv_kernel_size}, Init::Conv);
            const PleHash hash = compute_ple_hash(c, ple_id - c.ple_layer_ids.begin());
            const int64_t rows = static_cast<int64_t>(hash.padded_rows), parts = c.split_ngram_parts;
            const int64_t per = (rows + parts - 1) / parts;  // torch.chunk-style pieces
            for (int64_t k = 0; k < parts; ++k) {
                const int64_t n = std::max<int64_t>(0, std::min(per, rows - k * per));
                s.add(q + "ple_embedding.ngram_embedding.shard_" + std::to_string(k) + ".weight", {n, P},
                      Init::Embedding);
            }
            s.add_ints(q + "ple_embedding.layer_multipliers", hash.multipliers);
            s.add_ints(q + "ple_embedding.ngram_heads_offsets", hash.head_offsets);
            s.add_ints(q + "ple_embedding.ngram_heads_vocab_sizes", hash.head_vocab_sizes);
        }
        if (!c.is_dense_mlp.empty() && c.is_dense_mlp[static_cast<size_t>(l)]) {  // qwen3next's Qwen3NextMLP
            s.add(p + "mlp.gate_proj.weight", {c.intermediate_size, H});
            s.add(p + "mlp.up_proj.weight", {c.intermediate_size, H});
            s.add(p + "mlp.down_proj.weight", {H, c.intermediate_size});
            continue;
        }
        s.add(p + "mlp.gate.weight", {E, H});
        s.add(p + "mlp.experts.gate_up_proj", {E, 2 * F, H});
        s.add(p + "mlp.experts.down_proj", {E, H, F});
        s.add(p + "mlp.shared_expert_gate.weight", {1, H});
        s.add(p + "mlp.shared_expert.gate_proj.weight", {Fs, H});
        s.add(p + "mlp.shared_expert.up_proj.weight", {Fs, H});
        s.add(p + "mlp.shared_expert.down_proj.weight", {H, Fs});
    }
    if (q4)
        hyper("model.hyper_connection_mixer.", false);
    else
        s.add("model.norm.weight", {H}, Init::ZeroCentredNorm);
    s.add("lm_head.weight", {V, H});
}

struct Preset {
    const char* name;
    const char* description;
    json config;
    DType dense_type;
};

json qwen4exp_config(json fields) {
    json c = {
        {"architectures", {"Qwen4ExpForCausalLM"}},
        {"model_type", "qwen4_exp_text"},
        {"hidden_act", "silu"},
        {"output_gate_type", "sigmoid"},
        {"rms_norm_eps", 1e-6},
        {"tie_word_embeddings", false},
        {"linear_conv_kernel_dim", 4},
        {"ple_conv_kernel_size", 4},
        {"ngram_size", 3},
        {"indexer_kv_heads", 1},
        {"make_ngram_vocab_size_divisible_by", 128},
        {"seed", 1234},
    };
    c.update(fields);
    return c;
}

std::vector<Preset> presets() {
    std::vector<Preset> p;
    // The tiny presets share one small shape; each architecture adds its own parts.
    json moe_tiny = {{"vocab_size", 512},
                     {"hidden_size", 64},
                     {"num_hidden_layers", 4},
                     {"num_attention_heads", 4},
                     {"num_key_value_heads", 2},
                     {"head_dim", 32},
                     {"max_position_embeddings", 4096},
                     {"hidden_act", "silu"},
                     {"rms_norm_eps", 1e-6},
                     {"linear_conv_kernel_dim", 4},
                     {"linear_key_head_dim", 16},
                     {"linear_value_head_dim", 16},
                     {"linear_num_key_heads", 2},
                     {"linear_num_value_heads", 4},
                     {"num_experts", 8},
                     {"num_experts_per_tok", 2},
                     {"moe_intermediate_size", 32},
                     {"shared_expert_intermediate_size", 32},
                     {"eos_token_id", 511},
                     {"tie_word_embeddings", false},
                     {"full_attention_interval", 4}};
    const json tiny_rope = {{"rope_theta", 10000000.0}, {"partial_rotary_factor", 0.5}, {"mrope_section", {3, 3, 2}}};
    json tiny = moe_tiny;
    tiny.update({{"rope_parameters", tiny_rope},
                 {"hc_count", 2},
                 {"hc_lowrank", 16},
                 {"ple_layer_ids", {2}},
                 {"heads_per_ngram", 2},
                 {"ngram_vocab_size_base", 1000},
                 {"split_ngram_parts", 4},
                 {"indexer_n_heads", 2},
                 {"indexer_head_dim", 32},
                 {"indexer_budget", 16},
                 {"indexer_compress_ratio", 4}});
    p.push_back({"tiny", "qwen4exp: hidden 64, 4 layers (layer 3 QSA), vocab 512, 8 experts top-2, hc 2, PLE, budget 16",
                 qwen4exp_config(tiny), DType::F32});
    p.push_back(
        {"qwen4exp-mid", "qwen4exp: hidden 1024, 16 layers, 64 experts top-8, hc 4, ~4M-row PLE table",
         qwen4exp_config({{"vocab_size", 32768},
                          {"hidden_size", 1024},
                          {"num_hidden_layers", 16},
                          {"num_attention_heads", 8},
                          {"num_key_value_heads", 2},
                          {"head_dim", 128},
                          {"max_position_embeddings", 65536},
                          {"rope_parameters",
                           {{"rope_theta", 10000000.0}, {"partial_rotary_factor", 0.25}, {"mrope_section", {6, 5, 5}}}},
                          {"linear_key_head_dim", 64},
                          {"linear_value_head_dim", 64},
                          {"linear_num_key_heads", 8},
                          {"linear_num_value_heads", 16},
                          {"num_experts", 64},
                          {"num_experts_per_tok", 8},
                          {"moe_intermediate_size", 256},
                          {"shared_expert_intermediate_size", 256},
                          {"hc_count", 4},
                          {"hc_lowrank", 128},
                          {"ple_layer_ids", {2}},
                          {"heads_per_ngram", 8},
                          {"ngram_vocab_size_base", 250000},
                          {"split_ngram_parts", 16},
                          {"indexer_n_heads", 4},
                          {"indexer_head_dim", 64},
                          {"indexer_budget", 256},
                          {"indexer_compress_ratio", 4},
                          {"eos_token_id", 32767},
                          {"full_attention_interval", 4}}),
         DType::F16});
    p.push_back({"flash-next",
                 "qwen4exp: Qwen3.8-Flash-Next shapes (48 layers, hidden 2560, 512 experts top-10, "
                 "320M-row PLE table); hundreds of GB",
                 qwen4exp_config(
                     {{"vocab_size", 248320},
                      {"hidden_size", 2560},
                      {"num_hidden_layers", 48},
                      {"num_attention_heads", 24},
                      {"num_key_value_heads", 2},
                      {"head_dim", 256},
                      {"max_position_embeddings", 262144},
                      {"rope_parameters",
                       {{"rope_theta", 10000000.0}, {"partial_rotary_factor", 0.25}, {"mrope_section", {11, 11, 10}}}},
                      {"linear_key_head_dim", 128},
                      {"linear_value_head_dim", 128},
                      {"linear_num_key_heads", 16},
                      {"linear_num_value_heads", 48},
                      {"num_experts", 512},
                      {"num_experts_per_tok", 10},
                      {"moe_intermediate_size", 640},
                      {"shared_expert_intermediate_size", 640},
                      {"hc_count", 4},
                      {"hc_lowrank", 320},
                      {"ple_layer_ids", {2}},
                      {"heads_per_ngram", 8},
                      {"ngram_vocab_size_base", 20000000},
                      {"split_ngram_parts", 512},
                      {"indexer_n_heads", 4},
                      {"indexer_head_dim", 128},
                      {"indexer_budget", 2048},
                      {"indexer_compress_ratio", 4},
                      {"eos_token_id", 248046},
                      {"image_token_id", 248056},
                      {"full_attention_interval", 4}}),
                 DType::F16});
    // tiny's shape at hidden 256 and expert width 256: every expert row fills whole 256-element k-quant and i-quant
    // super-blocks, so `--type q4_k` etc. quantize the experts (tiny's 64-wide rows cannot hold one).
    json small_k = tiny;
    small_k.update({{"hidden_size", 256}, {"moe_intermediate_size", 256}, {"shared_expert_intermediate_size", 256}});
    p.push_back({"small-k", "qwen4exp: tiny at hidden 256 with 256-wide experts (whole k-quant blocks), vocab 512",
                 qwen4exp_config(small_k), DType::F32});
    // Flash-Next's routing shape (512 experts, top-10) on a tiny trunk: expert cache replays and the --router-skew
    // calibration run it in seconds.
    json moe512 = tiny;
    moe512.update({{"hidden_size", 128},
                   {"num_hidden_layers", 8},
                   {"num_experts", 512},
                   {"num_experts_per_tok", 10},
                   {"moe_intermediate_size", 16},
                   {"shared_expert_intermediate_size", 16}});
    p.push_back({"moe512-tiny", "qwen4exp: tiny at hidden 128, 8 layers, with Flash-Next's 512 experts top-10",
                 qwen4exp_config(moe512), DType::F32});
    // ... and at Flash-Next's depth (48 layers, hc 4): where --router-skew is calibrated.
    json moe512_deep = moe512;
    moe512_deep.update({{"hidden_size", 256}, {"num_hidden_layers", 48}, {"hc_count", 4}});
    p.push_back({"moe512-deep", "qwen4exp: moe512-tiny at hidden 256, 48 layers, hc 4 (Flash-Next's depth; 1.2 GB)",
                 qwen4exp_config(moe512_deep), DType::F32});
    json q35 = moe_tiny;
    q35["architectures"] = {"Qwen3_5MoeForCausalLM"};
    q35["rope_parameters"] = tiny_rope;
    p.push_back({"qwen35moe-tiny", "qwen35moe: hidden 64, 4 layers, vocab 512, 8 experts top-2", q35, DType::F32});
    json q3n = moe_tiny;
    q3n["architectures"] = {"Qwen3NextForCausalLM"};
    q3n["intermediate_size"] = 128;
    q3n["rope_parameters"] = {{"rope_theta", 10000000.0}, {"partial_rotary_factor", 0.5}};
    p.push_back({"qwen3next-tiny", "qwen3next: hidden 64, 4 layers, vocab 512, 8 experts top-2", q3n, DType::F32});
    // The single-stream architectures at small-k's widths, so every quant type reaches their experts too.
    const json widths_256 = {{"hidden_size", 256}, {"moe_intermediate_size", 256}, {"shared_expert_intermediate_size", 256}};
    json q35_k = q35, q3n_k = q3n;
    q35_k.update(widths_256);
    q3n_k.update(widths_256);
    p.push_back({"qwen35moe-small-k", "qwen35moe: qwen35moe-tiny at hidden 256 with 256-wide experts", q35_k, DType::F32});
    p.push_back({"qwen3next-small-k", "qwen3next: qwen3next-tiny at hidden 256 with 256-wide experts", q3n_k, DType::F32});
    // Widths that 16 does not divide (hidden 72, experts 40, shared expert 24), as small models have: float rows that
    // the matrix-vector kernels' pieces of 16 do not cover, and rows that fall back from a quant type to f16.
    const json odd_widths = {{"hidden_size", 72}, {"moe_intermediate_size", 40}, {"shared_expert_intermediate_size", 24}};
    json tiny_odd = tiny, q35_odd = q35, q3n_odd = q3n;
    tiny_odd.update(odd_widths);
    q35_odd.update(odd_widths);
    q3n_odd.update(odd_widths);
    p.push_back({"tiny-odd", "qwen4exp: tiny at hidden 72 with 40-wide experts (widths 16 does not divide)",
                 qwen4exp_config(tiny_odd), DType::F32});
    p.push_back({"qwen35moe-odd", "qwen35moe: qwen35moe-tiny at hidden 72 with 40-wide experts", q35_odd, DType::F32});
    p.push_back({"qwen3next-odd", "qwen3next: qwen3next-tiny at hidden 72 with 40-wide experts", q3n_odd, DType::F32});
    // Configs transformers runs and llama.cpp's keys cannot carry (the file says them in strata.* keys): GDN value
    // heads of another size than the key heads, and a PLE embedding narrower than the hidden size.
    json uneven = tiny;
    uneven.update({{"linear_key_head_dim", 16}, {"linear_value_head_dim", 32}, {"ple_embed_dim", 32}});
    p.push_back({"qwen4exp-uneven-tiny",
                 "qwen4exp: tiny with GDN value heads 32 / key heads 16 and PLE width 32 (llama.cpp cannot load it)",
                 qwen4exp_config(uneven), DType::F32});
    json q35_uneven = q35;
    q35_uneven.update({{"linear_key_head_dim", 32}, {"linear_value_head_dim", 16}});
    p.push_back({"qwen35moe-uneven-tiny",
                 "qwen35moe: tiny with GDN value heads 16 / key heads 32 (llama.cpp cannot load it)", q35_uneven,
                 DType::F32});
    json q3n_uneven = q3n;
    q3n_uneven.update({{"linear_key_head_dim", 16}, {"linear_value_head_dim", 32}});
    p.push_back({"qwen3next-uneven-tiny",
                 "qwen3next: tiny with GDN value heads 32 / key heads 16 (llama.cpp cannot load it)", q3n_uneven,
                 DType::F32});
    // 8 rotary dims and no mrope_section: transformers' default sections [11, 11, 10] name more pairs than there are
    // (llama.cpp's rope aborted on them, the 16-wide indexer heads being the narrowest rotated rows).
    json rope8 = tiny;
    rope8.update({{"rope_parameters", {{"rope_theta", 10000000.0}, {"partial_rotary_factor", 0.25}}},
                  {"indexer_head_dim", 16}});
    // qwen3next with dense MLP layers (transformers' mlp_only_layers / decoder_sparse_step): blocks 0-2 dense
    // SwiGLU of intermediate_size, block 3 MoE. llama.cpp's loader wants the MoE tensors in every block.
    json q3n_dense = q3n;
    q3n_dense.update({{"mlp_only_layers", {1}}, {"decoder_sparse_step", 2}});
    p.push_back({"qwen3next-dense-tiny",
                 "qwen3next: tiny with dense MLP blocks 0-2 (mlp_only_layers [1], decoder_sparse_step 2; llama.cpp "
                 "cannot load it)",
                 q3n_dense, DType::F32});
    // PLE on all three GDN layers, each with its own table and hashes (llama.cpp has one PLE layer).
    json ple3 = tiny;
    ple3.update({{"ple_layer_ids", {1, 2, 3}}});
    p.push_back({"qwen4exp-ple3-tiny", "qwen4exp: tiny with PLE on layers 1, 2 and 3 (llama.cpp cannot load it)",
                 qwen4exp_config(ple3), DType::F32});
    p.push_back({"qwen4exp-rope8-tiny",
                 "qwen4exp: tiny with head 32, partial rotary 0.25 (8 dims), no mrope_section, indexer heads 16",
                 qwen4exp_config(rope8), DType::F32});
    return p;
}

// llama_ftype (llama.h) of a file whose experts are quantized to t, for the quant types synth writes beyond the
// converter's own (f32, f16, bf16, q8_0); nullopt for those.
std::optional<uint32_t> quant_ftype(DType t) {
    switch (t) {
        case DType::Q4_0: return 2;
        case DType::Q2_K: return 10;
        case DType::Q3_K: return 12;  // Q3_K_M
        case DType::Q4_K: return 15;  // Q4_K_M
        case DType::Q5_K: return 17;  // Q5_K_M
        case DType::Q6_K: return 18;
        case DType::IQ4_NL: return 25;
        case DType::IQ4_XS: return 30;
        case DType::IQ2_XS: return 20;
        case DType::IQ3_XXS: return 23;
        case DType::IQ3_S: return 26;
        case DType::IQ1_M: return 31;
        default: return std::nullopt;
    }
}

// llama-quantize's type for expert rows that hold no whole block of t (llama_tensor_get_type's fallback), as far as
// this build writes it: its Q5_0 / Q5_1 (for Q4_K / Q5_K) are not written here, Q8_0 stands in.
std::optional<DType> expert_fallback(DType t) {
    switch (t) {
        case DType::IQ2_XS:
        case DType::IQ3_XXS:
        case DType::IQ3_S:
        case DType::IQ1_M:
        case DType::Q2_K:
        case DType::Q3_K:
        case DType::IQ4_XS: return DType::IQ4_NL;
        case DType::Q4_K:
        case DType::Q5_K:
        case DType::Q6_K: return DType::Q8_0;
        default: return std::nullopt;
    }
}

// An expert type synth can write for this shape: the converter's types, or a quant type with a reference quantizer
// whose block divides at least one expert row width (hidden size for gate/up, expert intermediate size for down).
void check_expert_type(DType t, const HfConfig& c, const std::string& preset) {
    if (!quant_ftype(t)) {
        if (traits(t).can_compute && t != DType::F32 && t != DType::F16 && t != DType::BF16 && t != DType::Q8_0)
            throw Error(std::string("synth: expert type ") + dtype_name(t) +
                        " is not supported yet: strata can read it but has no quantizer for it (writable: f32, f16, "
                        "bf16, q8_0, q4_0, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs, iq2_xs, iq3_xxs, iq3_s, iq1_m)");
        return check_output_type(t);
    }
    // A matrix whose rows do not fill whole blocks falls back (expert_fallback, else f16, as llama-quantize does);
    // when that would leave no expert matrix in the requested type, the file would not be what was asked for.
    const int64_t block = traits(t).block_size;
    if (c.hidden_size % block != 0 && c.moe_intermediate_size % block != 0)
        throw Error(std::string("synth: expert type ") + dtype_name(t) + " is not supported for preset '" + preset +
                    "': its expert rows (" + std::to_string(c.hidden_size) + " and " +
                    std::to_string(c.moe_intermediate_size) + " wide) hold no whole " + std::to_string(block) +
                    "-element block (use a preset with wider rows, e.g. small-k)");
}

// --ple-vocab-base: per-head table sizes are the primes at or above the base, so the table has about
// n_heads * base rows; the plan refuses a table past int32 rows, this refuses it before the prime search.
void apply_ple_vocab_base(json& config, int64_t base, const std::string& preset) {
    if (!config.contains("ple_layer_ids") || config["ple_layer_ids"].empty())
        throw Error("synth: --ple-vocab-base: preset '" + preset + "' has no PLE table");
    const int64_t n_heads = (config.value("ngram_size", int64_t{3}) - 1) * config.value("heads_per_ngram", int64_t{8});
    const int64_t max_base = 0x7FFFFFFFll / std::max<int64_t>(n_heads, 1) - 4096;
    if (base < 1 || base > max_base)
        throw Error("synth: --ple-vocab-base must be between 1 and " + std::to_string(max_base) + " for preset '" +
                    preset + "' (" + std::to_string(n_heads) + " heads), got " + std::to_string(base));
    config["ngram_vocab_size_base"] = base;
}

}  // namespace

uint64_t hash_name(const std::string& s) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
    return h;
}

std::unique_ptr<TensorSource> synth_hf_source(const HfConfig& config, uint64_t seed, double router_skew) {
    auto source = std::make_unique<SynthSource>(seed, router_skew);
    source->set_skew_direction(config.hidden_size);
    add_hf_tensors(*source, config);
    return source;
}

SynthModel build_synth(const SynthOptions& o) {
    const std::vector<Preset> all = presets();
    const Preset* preset = nullptr;
    std::string names;
    for (const Preset& p : all) {
        names += std::string(names.empty() ? "" : ", ") + p.name;
        if (o.preset == p.name) preset = &p;
    }
    if (!preset) throw Error("synth: unknown preset '" + o.preset + "' (known: " + names + ")");
    SynthModel m;
    json config = preset->config;
    if (o.ple_vocab_base) apply_ple_vocab_base(config, *o.ple_vocab_base, preset->name);
    m.config = parse_hf_config(config.dump(), std::string("synth preset ") + preset->name);
    if (!o.arch.empty() && o.arch != gguf_arch_name(m.config.arch))
        throw Error("synth: preset '" + o.preset + "' is " + gguf_arch_name(m.config.arch) + ", not " + o.arch +
                    " (known presets: " + names + ")");
    if (o.expert_type) check_expert_type(*o.expert_type, m.config, preset->name);

    if (!(o.router_skew >= 0.0 && o.router_skew <= 8.0))
        throw Error("synth: --router-skew must be between 0 and 8, got " + std::to_string(o.router_skew));
    m.source = synth_hf_source(m.config, o.seed, o.router_skew);
    m.router_skew = o.router_skew;
    // A synth file is for llama.cpp v0.4.0 as well: no MTP block.
    m.plan = plan_conversion(m.config, *m.source, {.include_mtp = false});
    // The PLE table follows the requested (expert) type, else the dense type of a big preset; tiny keeps it F32.
    std::optional<DType> table_type = o.expert_type;
    if (!table_type && preset->dense_type != DType::F32) table_type = preset->dense_type;
    m.types = TensorTypes{.out_type = preset->dense_type, .expert_type = o.expert_type, .table_type = table_type};
    // A quantized-expert file gets the rest by `strata quantize`'s default mix, as llama.cpp's presets would.
    if (o.expert_type && quant_ftype(*o.expert_type)) {
        m.types.mix = "default";
        m.types.expert_fallback = expert_fallback(*o.expert_type);
    }
    m.name = std::string("strata-synth-") + preset->name;
    return m;
}

void add_synth_keys(gguf::Writer& writer, const SynthModel& m) {
    const std::optional<uint32_t> quant_file_type =
        m.types.expert_type ? quant_ftype(*m.types.expert_type) : std::nullopt;
    if (quant_file_type) {
        // The converter's key writer knows the plain output types only; a quantized-expert file names its expert type.
        add_model_keys(writer, m.plan, m.name, m.types.out_type);
        writer.set("general.file_type", gguf::Value::of_u32(*quant_file_type));
    } else {
        add_model_keys(writer, m.plan, m.name, m.types.expert_type ? *m.types.expert_type : m.types.out_type);
    }
    std::optional<int64_t> eos;
    if (!m.config.eos_token_ids.empty()) eos = m.config.eos_token_ids.front();
    add_vocab_keys(writer, placeholder_vocab(m.config.vocab_size, eos));
}

void synth_model(const SynthOptions& o) {
    if (o.out_path.empty()) throw Error("synth: no output file given (--out FILE.gguf)");
    const SynthModel m = build_synth(o);
    if (const std::string warning = llama_cpp_warning(m.plan, "strata synth"); !warning.empty())
        std::fprintf(stderr, "%s\n", warning.c_str());
    gguf::Writer writer;
    add_synth_keys(writer, m);
    writer.set_data_holes(o.shapes_only);
    if (o.fast || o.shapes_only)
        add_fast_tensors(writer, m, o.seed, o.threads);  // with holes no tensor is filled
    else
        add_planned_tensors(writer, m.plan, m.types);
    writer.write(o.out_path);
}

std::vector<std::string> synth_preset_names() {
    std::vector<std::string> out;
    for (const Preset& p : presets()) out.push_back(std::string(p.name) + ": " + p.description);
    return out;
}

}  // namespace strata
