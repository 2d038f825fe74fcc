// HF tensor names -> llama.cpp GGUF tensors for qwen4exp, qwen35moe and qwen3next (shared/reference/gguf-qwen4exp.md
// sections 2-4). The plan pulls: for every GGUF tensor the architecture needs, it looks up its HF sources, checks
// their shapes and records how to produce its rows. Source tensors that nothing pulled are an error.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "convert/gguf_plan.h"
#include "convert/row_ops.h"
#include "core/error.h"
#include "format/gguf_names.h"

namespace strata {

int64_t PlannedTensor::n_rows() const {
    int64_t n = 1;
    for (size_t i = 1; i < ne.size(); ++i) n *= ne[i];
    return n;
}

namespace {

std::string shape_text(const std::vector<int64_t>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
}

std::vector<int64_t> squeezed(const std::vector<int64_t>& s) {
    std::vector<int64_t> out;
    for (int64_t d : s)
        if (d != 1) out.push_back(d);
    return out;
}

// HF checkpoint names -> names relative to the text model ("layers.3.mlp.gate.weight", "lm_head.weight", "mtp.*").
// Empty: a tensor the text GGUF never holds (the vision tower).
std::string normalize_name(const std::string& name) {
    std::string n = name;
    for (const char* prefix : {"model.language_model.", "language_model.model.", "language_model.", "model."}) {
        const std::string p = prefix;
        if (n.rfind(p, 0) == 0) {
            n = n.substr(p.size());
            break;
        }
    }
    if (n.rfind("visual.", 0) == 0 || n.rfind("model.visual.", 0) == 0 || n.rfind("vision_tower.", 0) == 0) return "";
    return n;
}

float plus_one(float x) {
    return x + 1.0f;
}
float neg_exp(float x) {
    return -std::exp(x);
}

class Planner {
  public:
    Planner(const HfConfig& c, const TensorSource& s, const PlanOptions& o) : c_(c), s_(s), o_(o) {
        used_.assign(s.size(), false);
        for (size_t i = 0; i < s.size(); ++i) {
            const std::string n = normalize_name(s.name(i));
            if (n.empty()) {
                used_[i] = true;  // vision: skipped
                continue;
            }
            by_name_[n] = i;
        }
        H = c.hidden_size;
        V = c.vocab_size;
        hc = c.hc_count;
        HC = hc * H;
        r = c.hc_lowrank;
        nh = c.num_attention_heads;
        nkv = c.num_key_value_heads;
        hd = c.head_dim;
        E = c.num_experts;
        F = c.moe_intermediate_size;
        Fs = c.shared_expert_intermediate_size;
        dk = c.linear_key_head_dim;
        dv = c.linear_value_head_dim;
        nk = c.linear_num_key_heads;
        nv = c.linear_num_value_heads;
        KD = dk * nk;
        VD = dv * nv;
        CD = 2 * KD + VD;
        Kc = c.linear_conv_kernel_dim;
        plan_.config = c;
    }

    ConversionPlan run();

  private:
    const HfConfig& c_;
    const TensorSource& s_;
    PlanOptions o_;
    std::map<std::string, size_t> by_name_;
    std::vector<bool> used_;
    ConversionPlan plan_;
    int64_t H, V, hc, HC, r, nh, nkv, hd, E, F, Fs, dk, dv, nk, nv, KD, VD, CD, Kc;

    bool has(const std::string& n) const { return by_name_.count(n) != 0; }

    size_t need(const std::string& n, const std::vector<int64_t>& shape) {
        auto it = by_name_.find(n);
        if (it == by_name_.end())
            throw Error("checkpoint is missing tensor '" + n + "' (expected shape " + shape_text(shape) + " for " +
                        gguf_arch_name(c_.arch) + " with this config.json)");
        const std::vector<int64_t>& got = s_.shape(it->second);
        if (squeezed(got) != squeezed(shape))
            throw Error(s_.origin(it->second) + ": tensor '" + s_.name(it->second) + "' has shape " + shape_text(got) +
                        ", config.json implies " + shape_text(shape));
        used_[it->second] = true;
        return it->second;
    }

    void add(std::string name, std::vector<int64_t> ne, bool keep_f32, RowFn rows) {
        plan_.tensors.push_back(PlannedTensor{std::move(name), std::move(ne), keep_f32, std::move(rows)});
    }

    // A tensor copied as it is (rows of the source are the GGUF rows).
    RowFn rows_of(size_t src) {
        return segment_rows(&s_, {RowSegment{src, 0, row_count(s_.shape(src))}}, row_width(s_.shape(src)));
    }

    void plain(const std::string& gguf, std::vector<int64_t> ne, const std::string& hf, bool keep_f32 = false) {
        std::vector<int64_t> torch(ne.rbegin(), ne.rend());
        add(gguf, ne, keep_f32, rows_of(need(hf, torch)));
    }

    // Zero-centred RMSNorm gamma stored as 1 + w.
    void norm_plus_one(const std::string& gguf, int64_t n, const std::string& hf) {
        add(gguf, {n}, true, map_values(rows_of(need(hf, {n})), n, plus_one));
    }

    static std::string blk(int64_t bid, const std::string& what) { return "blk." + std::to_string(bid) + "." + what; }

    // GDN value head v' of the GGUF (tiled order) reads HF value head (v' % nk) * g + v' / nk (grouped order).
    // qwen3next keeps HF's order.
    int64_t hf_value_head(int64_t v) const {
        if (c_.arch == HfArch::Qwen3Next || nk == nv) return v;
        const int64_t g = nv / nk;
        return (v % nk) * g + v / nk;
    }
    void add_value_head_rows(std::vector<RowSegment>& segs, size_t src, int64_t base, int64_t head_rows) const {
        for (int64_t v = 0; v < nv; ++v)
            segs.push_back(RowSegment{src, base + hf_value_head(v) * head_rows, head_rows});
    }
    std::vector<int64_t> value_head_columns(int64_t head_cols) const {
        std::vector<int64_t> perm;
        for (int64_t v = 0; v < nv; ++v)
            for (int64_t d = 0; d < head_cols; ++d) perm.push_back(hf_value_head(v) * head_cols + d);
        return perm;
    }

    void hyper_connection(int64_t bid, const std::string& hf, const std::string& gguf_prefix, bool inject) {
        norm_plus_one(blk(bid, gguf_prefix + "norm.weight"), HC, hf + "hc_norm.weight");
        plain(blk(bid, gguf_prefix + "down.weight"), {HC, r}, hf + "input_mix_weight_down.weight");
        plain(blk(bid, gguf_prefix + "up.weight"), {r, HC}, hf + "input_mix_weight_up.weight");
        if (inject) plain(blk(bid, gguf_prefix + "inject.weight"), {HC, hc}, hf + "block_inject_weight.weight");
    }

    void moe(int64_t bid, const std::string& p) {
        plain(blk(bid, "ffn_gate_inp.weight"), {H, E}, p + "mlp.gate.weight", true);
        const std::string fused = p + "mlp.experts.gate_up_proj";
        const std::string fused_name = has(fused) ? fused : fused + ".weight";
        if (has(fused_name)) {
            // transformers-5 in-memory layout: [E, 2F, H] (gate = first F rows of each expert), down [E, H, F]
            const size_t gu = need(fused_name, {E, 2 * F, H});
            std::vector<RowSegment> gate, up;
            for (int64_t e = 0; e < E; ++e) {
                gate.push_back(RowSegment{gu, e * 2 * F, F});
                up.push_back(RowSegment{gu, e * 2 * F + F, F});
            }
            add(blk(bid, "ffn_gate_exps.weight"), {H, F, E}, false, segment_rows(&s_, gate, H));
            add(blk(bid, "ffn_up_exps.weight"), {H, F, E}, false, segment_rows(&s_, up, H));
            const std::string down =
                has(p + "mlp.experts.down_proj") ? p + "mlp.experts.down_proj" : p + "mlp.experts.down_proj.weight";
            add(blk(bid, "ffn_down_exps.weight"), {F, H, E}, false, rows_of(need(down, {E, H, F})));
        } else {
            // save_pretrained layout: one tensor per expert, stacked on a new outer dimension
            std::vector<RowSegment> gate, up, down;
            for (int64_t e = 0; e < E; ++e) {
                const std::string ep = p + "mlp.experts." + std::to_string(e) + ".";
                gate.push_back(RowSegment{need(ep + "gate_proj.weight", {F, H}), 0, F});
                up.push_back(RowSegment{need(ep + "up_proj.weight", {F, H}), 0, F});
                down.push_back(RowSegment{need(ep + "down_proj.weight", {H, F}), 0, H});
            }
            add(blk(bid, "ffn_gate_exps.weight"), {H, F, E}, false, segment_rows(&s_, gate, H));
            add(blk(bid, "ffn_up_exps.weight"), {H, F, E}, false, segment_rows(&s_, up, H));
            add(blk(bid, "ffn_down_exps.weight"), {F, H, E}, false, segment_rows(&s_, down, F));
        }
        add(blk(bid, "ffn_gate_inp_shexp.weight"), {H}, true,
            rows_of(need(p + "mlp.shared_expert_gate.weight", {1, H})));
        plain(blk(bid, "ffn_gate_shexp.weight"), {H, Fs}, p + "mlp.shared_expert.gate_proj.weight");
        plain(blk(bid, "ffn_up_shexp.weight"), {H, Fs}, p + "mlp.shared_expert.up_proj.weight");
        plain(blk(bid, "ffn_down_shexp.weight"), {Fs, H}, p + "mlp.shared_expert.down_proj.weight");
    }

    // qwen3next's Qwen3NextMLP (mlp_only_layers / decoder_sparse_step): down(silu(gate x) * up x), intermediate_size
    // wide, under llama.cpp's dense names (its qwen3next graph has a branch for them, its loader requires the MoE).
    void dense_mlp(int64_t bid, const std::string& p) {
        const int64_t I = c_.intermediate_size;
        plain(blk(bid, "ffn_gate.weight"), {H, I}, p + "mlp.gate_proj.weight");
        plain(blk(bid, "ffn_up.weight"), {H, I}, p + "mlp.up_proj.weight");
        plain(blk(bid, "ffn_down.weight"), {I, H}, p + "mlp.down_proj.weight");
    }

    void attention(int64_t bid, const std::string& p) {
        const std::string a = p + "self_attn.";
        plain(blk(bid, "attn_q.weight"), {H, 2 * hd * nh}, a + "q_proj.weight");
        plain(blk(bid, "attn_k.weight"), {H, hd * nkv}, a + "k_proj.weight");
        plain(blk(bid, "attn_v.weight"), {H, hd * nkv}, a + "v_proj.weight");
        plain(blk(bid, "attn_output.weight"), {hd * nh, H}, a + "o_proj.weight");
        norm_plus_one(blk(bid, "attn_q_norm.weight"), hd, a + "q_norm.weight");
        norm_plus_one(blk(bid, "attn_k_norm.weight"), hd, a + "k_norm.weight");
        if (c_.arch != HfArch::Qwen4Exp) return;
        const int64_t ni = *c_.indexer_n_heads, di = *c_.indexer_head_dim;
        const size_t qk = need(a + "indexer.index_qk_proj.weight", {(ni + 1) * di, H});
        add(blk(bid, "indexer.q_proj.weight"), {H, ni * di}, false, segment_rows(&s_, {RowSegment{qk, 0, ni * di}}, H));
        add(blk(bid, "indexer.k_proj.weight"), {H, di}, false, segment_rows(&s_, {RowSegment{qk, ni * di, di}}, H));
        norm_plus_one(blk(bid, "indexer.q_norm.weight"), di, a + "indexer.q_layernorm.weight");
        norm_plus_one(blk(bid, "indexer.k_norm.weight"), di, a + "indexer.k_layernorm.weight");
    }

    void gated_delta_net(int64_t bid, const std::string& p) {
        const std::string g = p + "linear_attn.";
        if (c_.arch == HfArch::Qwen3Next) {
            // in_proj_qkvz stores [q | k | v | z] per key-head group; GGUF wants all q, all k, all v, then z apart.
            const int64_t vg = nv / nk * dv, group = 2 * dk + 2 * vg;
            const size_t qkvz = need(g + "in_proj_qkvz.weight", {nk * group, H});
            std::vector<RowSegment> qkv, z;
            for (int64_t k = 0; k < nk; ++k) qkv.push_back(RowSegment{qkvz, k * group, dk});
            for (int64_t k = 0; k < nk; ++k) qkv.push_back(RowSegment{qkvz, k * group + dk, dk});
            for (int64_t k = 0; k < nk; ++k) qkv.push_back(RowSegment{qkvz, k * group + 2 * dk, vg});
            for (int64_t k = 0; k < nk; ++k) z.push_back(RowSegment{qkvz, k * group + 2 * dk + vg, vg});
            add(blk(bid, "attn_qkv.weight"), {H, CD}, false, segment_rows(&s_, qkv, H));
            add(blk(bid, "attn_gate.weight"), {H, VD}, false, segment_rows(&s_, z, H));
            plain(blk(bid, "ssm_ba.weight"), {H, 2 * nv}, g + "in_proj_ba.weight");
        } else {
            const size_t qkv_src = need(g + "in_proj_qkv.weight", {CD, H});
            std::vector<RowSegment> qkv{RowSegment{qkv_src, 0, 2 * KD}};
            add_value_head_rows(qkv, qkv_src, 2 * KD, dv);
            add(blk(bid, "attn_qkv.weight"), {H, CD}, false, segment_rows(&s_, qkv, H));
            const size_t z_src = need(g + "in_proj_z.weight", {VD, H});
            std::vector<RowSegment> z;
            add_value_head_rows(z, z_src, 0, dv);
            add(blk(bid, "attn_gate.weight"), {H, VD}, false, segment_rows(&s_, z, H));
            for (const auto& [hf, gguf] : {std::pair{"in_proj_b.weight", "ssm_beta.weight"},
                                           std::pair{"in_proj_a.weight", "ssm_alpha.weight"}}) {
                const size_t src = need(g + hf, {nv, H});
                std::vector<RowSegment> rows;
                add_value_head_rows(rows, src, 0, 1);
                add(blk(bid, gguf), {H, nv}, false, segment_rows(&s_, rows, H));
            }
        }
        // conv1d [CD, 1, Kc] -> rows of Kc taps per channel; the V channels follow the value-head order.
        const size_t conv = need(g + "conv1d.weight", {CD, 1, Kc});
        std::vector<RowSegment> conv_rows{RowSegment{conv, 0, 2 * KD}};
        add_value_head_rows(conv_rows, conv, 2 * KD, dv);
        add(blk(bid, "ssm_conv1d.weight"), {Kc, CD}, true, segment_rows(&s_, conv_rows, Kc));
        add(blk(bid, "ssm_dt.bias"), {nv}, true,
            permute_columns(rows_of(need(g + "dt_bias", {nv})), value_head_columns(1)));
        add(blk(bid, "ssm_a"), {nv}, true,
            map_values(permute_columns(rows_of(need(g + "A_log", {nv})), value_head_columns(1)), nv, neg_exp));
        plain(blk(bid, "ssm_norm.weight"), {dv}, g + "norm.weight", true);  // the gated norm: no +1
        const size_t out = need(g + "out_proj.weight", {H, VD});
        add(blk(bid, "ssm_out.weight"), {VD, H}, false, permute_columns(rows_of(out), value_head_columns(dv)));
    }

    void ple(int64_t bid, const std::string& p, int64_t ple_index);
    void mtp_qwen4exp(int64_t first);
    void mtp_qwen35(int64_t first);
    int64_t count_mtp_layers() const;
};

void Planner::ple(int64_t bid, const std::string& p, int64_t ple_index) {
    const std::string q = p + "ple.";
    const int64_t Kp = c_.ple_conv_kernel_size;
    const int64_t n_heads = (c_.ngram_size - 1) * c_.heads_per_ngram;
    const int64_t P = c_.ple_embed_dim;  // the n-gram embedding's width: n_heads table rows side by side
    plain(blk(bid, "ple_key.weight"), {P, HC}, q + "key_proj.weight");
    plain(blk(bid, "ple_value.weight"), {P, H}, q + "value_proj.weight");
    norm_plus_one(blk(bid, "ple_norm_key.weight"), HC, q + "norm_key.weight");
    norm_plus_one(blk(bid, "ple_norm_query.weight"), HC, q + "norm_query.weight");
    norm_plus_one(blk(bid, "ple_norm_conv.weight"), HC, q + "norm_conv.weight");
    add(blk(bid, "ple_conv1d.weight"), {Kp, HC}, true, rows_of(need(q + "conv1d.weight", {HC, 1, Kp})));

    // The table: shard_K pieces concatenated by rows in numeric K order (or one unsharded table).
    const std::string emb = q + "ple_embedding.ngram_embedding.";
    std::map<int64_t, size_t> shards;
    for (const auto& [name, idx] : by_name_) {
        if (name.rfind(emb + "shard_", 0) != 0) continue;
        const std::string rest = name.substr(emb.size() + 6);
        const size_t dot = rest.find('.');
        if (dot == std::string::npos || rest.substr(dot) != ".weight" || dot == 0 ||
            rest.find_first_not_of("0123456789") != dot)
            throw Error(s_.origin(idx) + ": unexpected PLE tensor name '" + s_.name(idx) + "'");
        shards[std::stoll(rest.substr(0, dot))] = idx;
    }
    std::vector<RowSegment> segs;
    int64_t width = -1, rows = 0;
    auto take = [&](size_t idx) {
        const auto& shape = s_.shape(idx);
        if (shape.size() != 2) throw Error(s_.origin(idx) + ": PLE table '" + s_.name(idx) + "' is not 2-D");
        if (width >= 0 && shape[1] != width)
            throw Error(s_.origin(idx) + ": PLE shard '" + s_.name(idx) + "' has row width " +
                        std::to_string(shape[1]) + ", the others " + std::to_string(width));
        width = shape[1];
        segs.push_back(RowSegment{idx, 0, shape[0]});
        rows += shape[0];
        used_[idx] = true;
    };
    if (!shards.empty()) {
        int64_t expect = 0;
        for (const auto& [k, idx] : shards) {
            if (k != expect)
                throw Error("PLE table: shard_" + std::to_string(expect) + " is missing (found shard_" +
                            std::to_string(k) + ")");
            ++expect;
        }
        if (expect != c_.split_ngram_parts)
            throw Error("PLE table: " + std::to_string(expect) + " shards, config split_ngram_parts is " +
                        std::to_string(c_.split_ngram_parts));
        for (const auto& [k, idx] : shards) take(idx);
    } else if (has(emb + "weight")) {
        take(by_name_.at(emb + "weight"));
    } else {
        throw Error("checkpoint is missing the PLE table '" + emb + "shard_0.weight' ... (layer " +
                    std::to_string(bid) + ")");
    }
    // transformers gives each head ple_embed_dim / n_heads columns (rounded down); key_proj and value_proj take all
    // ple_embed_dim, so a remainder would not run there either.
    if (width * n_heads != P)
        throw Error("PLE table row width " + std::to_string(width) + " x " + std::to_string(n_heads) +
                    " heads must equal ple_embed_dim " + std::to_string(P) +
                    " (ple_embed_dim must be a multiple of (ngram_size - 1) x heads_per_ngram)");
    plan_.ple_row_width = width;
    add(ple_table_name(bid, ple_index == 0), {width, rows}, true, segment_rows(&s_, segs, width));
    ConversionPlan::PleLayer& layer = plan_.ple_layers.emplace_back();
    layer.block = bid;
    layer.rows = rows;

    // Hash constants: copied exactly from the checkpoint's int64 buffers, else recomputed as transformers does.
    const std::string buf = q + "ple_embedding.";
    const PleHash computed = compute_ple_hash(c_, ple_index);
    auto constants = [&](const char* name, const std::vector<uint64_t>& fallback, size_t min_len) {
        auto it = by_name_.find(buf + name);
        if (it == by_name_.end()) return fallback;
        used_[it->second] = true;
        plan_.ple_hash_from_checkpoint = true;
        std::vector<uint64_t> out;
        for (int64_t v : s_.read_i64(it->second)) {
            if (v < 0) throw Error(s_.origin(it->second) + ": '" + s_.name(it->second) + "' has a negative entry");
            out.push_back(static_cast<uint64_t>(v));
        }
        if (out.size() < min_len)
            throw Error(s_.origin(it->second) + ": '" + s_.name(it->second) + "' has " + std::to_string(out.size()) +
                        " entries, expected " + std::to_string(min_len));
        return out;
    };
    layer.multipliers = constants("layer_multipliers", computed.multipliers, static_cast<size_t>(c_.ngram_size));
    layer.head_offsets = constants("ngram_heads_offsets", computed.head_offsets, static_cast<size_t>(n_heads));
    layer.head_vocab_sizes =
        constants("ngram_heads_vocab_sizes", computed.head_vocab_sizes, static_cast<size_t>(n_heads));
    for (int64_t h = 0; h < n_heads; ++h) {
        const uint64_t end =
            layer.head_offsets[static_cast<size_t>(h)] + layer.head_vocab_sizes[static_cast<size_t>(h)];
        if (layer.head_vocab_sizes[static_cast<size_t>(h)] == 0 || end > static_cast<uint64_t>(rows) ||
            end > 0x7FFFFFFFull)
            throw Error("PLE head " + std::to_string(h) + " of layer " + std::to_string(bid) + " ends at row " +
                        std::to_string(end) + ", the table has " + std::to_string(rows) + " rows");
    }
}

int64_t Planner::count_mtp_layers() const {
    std::set<int64_t> ids;
    for (const auto& [name, idx] : by_name_) {
        if (name.rfind("mtp.layers.", 0) != 0) continue;
        const std::string rest = name.substr(11);
        const size_t dot = rest.find('.');
        if (dot == 0 || dot == std::string::npos || rest.find_first_not_of("0123456789") != dot) continue;
        ids.insert(std::stoll(rest.substr(0, dot)));
    }
    int64_t n = 0;
    while (ids.count(n)) ++n;
    return n;
}

void Planner::mtp_qwen4exp(int64_t first) {
    for (int64_t i = 0; i < plan_.n_mtp_layers; ++i) {
        const int64_t bid = first + i;
        const std::string p = "mtp.layers." + std::to_string(i) + ".";
        hyper_connection(bid, p + "attn_hyper_connection.", "hc_attn_", true);
        hyper_connection(bid, p + "mlp_hyper_connection.", "hc_ffn_", true);
        attention(bid, p);
        moe(bid, p);
    }
    norm_plus_one(blk(first, "nextn.enorm.weight"), H, "mtp.pre_fc_norm_embedding.weight");
    norm_plus_one(blk(first, "nextn.hnorm.weight"), HC, "mtp.pre_fc_norm_hidden.weight");
    // eh_proj = [fc_embedding | fc_hidden] along the input dimension (the graph concatenates the embedding first)
    const size_t fe = need("mtp.fc_embedding.weight", {H, H});
    const size_t fh = need("mtp.fc_hidden.weight", {H, H});
    add(blk(first, "nextn.eh_proj.weight"), {2 * H, H}, false, concat_columns(rows_of(fe), H, rows_of(fh), H));
    norm_plus_one(blk(first, "nextn.hc_head_norm.weight"), HC, "mtp.hyper_connection_mixer.hc_norm.weight");
    plain(blk(first, "nextn.hc_head_down.weight"), {HC, r}, "mtp.hyper_connection_mixer.input_mix_weight_down.weight");
    plain(blk(first, "nextn.hc_head_up.weight"), {r, HC}, "mtp.hyper_connection_mixer.input_mix_weight_up.weight");
}

void Planner::mtp_qwen35(int64_t first) {
    for (int64_t i = 0; i < plan_.n_mtp_layers; ++i) {
        const int64_t bid = first + i;
        const std::string p = "mtp.layers." + std::to_string(i) + ".";
        norm_plus_one(blk(bid, "attn_norm.weight"), H, p + "input_layernorm.weight");
        norm_plus_one(blk(bid, "post_attention_norm.weight"), H, p + "post_attention_layernorm.weight");
        attention(bid, p);
        moe(bid, p);
    }
    plain(blk(first, "nextn.eh_proj.weight"), {2 * H, H}, "mtp.fc.weight");
    norm_plus_one(blk(first, "nextn.enorm.weight"), H, "mtp.pre_fc_norm_embedding.weight");
    norm_plus_one(blk(first, "nextn.hnorm.weight"), H, "mtp.pre_fc_norm_hidden.weight");
    if (has("mtp.norm.weight")) norm_plus_one(blk(first, "nextn.shared_head_norm.weight"), H, "mtp.norm.weight");
}

ConversionPlan Planner::run() {
    const bool q4 = c_.arch == HfArch::Qwen4Exp;
    const int64_t L = c_.num_hidden_layers;
    if (dv != dk)
        plan_.llama_cpp_unsupported.push_back("linear_value_head_dim " + std::to_string(dv) +
                                              " differs from linear_key_head_dim " + std::to_string(dk) +
                                              " (llama.cpp takes both GDN head sizes from ssm.state_size)");
    if (const int64_t n_dense = c_.n_dense_mlp_layers(); n_dense > 0) {
        std::string blocks;
        for (int64_t l = 0; l < L; ++l)
            if (c_.is_dense_mlp[static_cast<size_t>(l)]) blocks += (blocks.empty() ? "" : ", ") + std::to_string(l);
        plan_.llama_cpp_unsupported.push_back(
            "dense MLP layers (mlp_only_layers / decoder_sparse_step) at block" + std::string(n_dense > 1 ? "s " : " ") +
            blocks + " (llama.cpp's qwen3next loader requires the MoE tensors in every block)");
    }
    if (q4) {
        if (!c_.indexer_n_heads || !c_.indexer_head_dim || !c_.indexer_budget || !c_.indexer_compress_ratio)
            throw Error(
                "config.json: qwen4exp needs indexer_n_heads, indexer_head_dim, indexer_budget and "
                "indexer_compress_ratio (llama.cpp requires the QSA indexer keys)");
        if (*c_.indexer_n_heads <= 0 || *c_.indexer_head_dim <= 0 || *c_.indexer_budget <= 0 ||
            *c_.indexer_compress_ratio <= 0)
            throw Error("config.json: the indexer_* fields must be positive");
        if (c_.indexer_kv_heads && *c_.indexer_kv_heads != 1)
            throw Error("config.json: indexer_kv_heads must be 1 (one shared indexer key head)");
        if (c_.rope_dims() > *c_.indexer_head_dim)
            throw Error("config.json: rotary dims " + std::to_string(c_.rope_dims()) + " exceed indexer_head_dim");
        if (c_.ple_layer_ids.size() > 1)
            plan_.llama_cpp_unsupported.push_back(std::to_string(c_.ple_layer_ids.size()) +
                                                  " PLE layers (llama.cpp's qwen4exp has one PLE table and takes "
                                                  "exactly one entry in ple.layers)");
        if (!c_.ple_layer_ids.empty() && c_.ple_embed_dim != H)
            plan_.llama_cpp_unsupported.push_back("ple_embed_dim " + std::to_string(c_.ple_embed_dim) +
                                                  " differs from hidden_size " + std::to_string(H) +
                                                  " (llama.cpp's ple_key and ple_value take hidden_size inputs)");
    }

    plain("token_embd.weight", {H, V}, "embed_tokens.weight");
    for (int64_t l = 0; l < L; ++l) {
        const std::string p = "layers." + std::to_string(l) + ".";
        const bool attn = c_.is_attention[static_cast<size_t>(l)];
        if (q4) {
            // transformers: the k-th entry of the sorted ple_layer_ids hashes with PLE layer index k
            const auto id = std::find(c_.ple_layer_ids.begin(), c_.ple_layer_ids.end(), l + 1);
            if (id != c_.ple_layer_ids.end()) ple(l, p, id - c_.ple_layer_ids.begin());
            hyper_connection(l, p + "attn_hyper_connection.", "hc_attn_", true);
            hyper_connection(l, p + "mlp_hyper_connection.", "hc_ffn_", true);
        } else {
            norm_plus_one(blk(l, "attn_norm.weight"), H, p + "input_layernorm.weight");
            norm_plus_one(blk(l, "post_attention_norm.weight"), H, p + "post_attention_layernorm.weight");
        }
        if (attn)
            attention(l, p);
        else
            gated_delta_net(l, p);
        if (!c_.is_dense_mlp.empty() && c_.is_dense_mlp[static_cast<size_t>(l)])
            dense_mlp(l, p);
        else
            moe(l, p);
    }

    // MTP head (not written by transformers; real checkpoints carry it). qwen3next's converter drops it.
    const int64_t n_mtp = count_mtp_layers();
    if (o_.include_mtp && n_mtp > 0 && c_.arch != HfArch::Qwen3Next) {
        plan_.n_mtp_layers = n_mtp;
        if (q4)
            mtp_qwen4exp(L);
        else
            mtp_qwen35(L);
    }
    for (const auto& [name, idx] : by_name_)
        if (name.rfind("mtp.", 0) == 0 && (plan_.n_mtp_layers == 0)) used_[idx] = true;

    if (q4) {
        norm_plus_one("output_hc_norm.weight", HC, "hyper_connection_mixer.hc_norm.weight");
        plain("output_hc_down.weight", {HC, r}, "hyper_connection_mixer.input_mix_weight_down.weight");
        plain("output_hc_up.weight", {r, HC}, "hyper_connection_mixer.input_mix_weight_up.weight");
    } else {
        norm_plus_one("output_norm.weight", H, "norm.weight");
    }
    if (has("lm_head.weight") || !c_.tie_word_embeddings) plain("output.weight", {H, V}, "lm_head.weight");

    for (size_t i = 0; i < used_.size(); ++i)
        if (!used_[i])
            throw Error(s_.origin(i) + ": unexpected tensor '" + s_.name(i) + "' (not part of the " +
                        gguf_arch_name(c_.arch) + " layout for this config.json)");
    return std::move(plan_);
}

}  // namespace

ConversionPlan plan_conversion(const HfConfig& config, const TensorSource& source, const PlanOptions& options) {
    return Planner(config, source, options).run();
}

std::string llama_cpp_warning(const ConversionPlan& plan, const std::string& tool) {
    if (plan.llama_cpp_unsupported.empty()) return "";
    std::string reasons;
    for (const std::string& r : plan.llama_cpp_unsupported) reasons += (reasons.empty() ? "" : "; ") + r;
    return tool + ": warning: llama.cpp cannot load this file: " + reasons + "; strata reads it through its strata." +
           gguf_arch_name(plan.config.arch) + ".* keys";
}

}  // namespace strata
