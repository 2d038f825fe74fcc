// `strata quantize`: reads a GGUF, copies every KV (general.file_type set to llama.cpp's code for --type), and writes
// each tensor in the type its mix gives it: dequantized to f32 row by row, then quantized with core/dtype's reference
// quantizers. A tensor already in its chosen type is copied byte for byte.
//
// Mix `default` (in the spirit of llama.cpp's Q*_K_M presets; the routed experts dominate an MoE's size, so the dense
// part can afford more bits):
//
//   tensor                                              --type f32/f16/bf16/q8_0   q6_k   q5_k q4_k q3_k q2_k q4_0
//                                                                                          iq4_nl iq4_xs
//   routed experts  *_exps.weight                       T                          q6_k   T
//   attention (q/k/v/o, gate), GDN ssm_* matrices       T                          q8_0   q8_0
//     (incl. ssm_out), shared experts *_shexp,
//     indexer/PLE/MTP projections, hyper-connection
//     hc_* matrices, other matrices
//   output head, token embeddings                       T                          q8_0   q6_k
//   PLE table per_layer_token_embd                      its input type
//   norms (incl. hc_*_norm), conv kernels, routers      f32
//     ffn_gate_inp*, ssm_a, ssm_dt, 1-D tensors
//
// The hyper-connection matrices (hc_*_down/up/inject: 4 x hidden wide) are read for every token twice per layer; in
// f32 they would be a third of what a Q4_K decode step reads, so they get q8_0 like the attention matrices.
//
// Mix `experts-only`: the routed experts get --type, every other tensor is copied as it is.
//
// A row length that is not a multiple of the chosen type's block falls back to q8_0 (32), then f16.
#include "convert/quantize.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "core/error.h"
#include "core/thread_pool.h"
#include "format/gguf.h"
#include "format/gguf_names.h"

namespace strata {

namespace {

namespace fs = std::filesystem;

struct TargetType {
    DType type;
    uint32_t file_type;  // llama.cpp's llama_ftype (the _M variant where llama.cpp has S/M/L presets)
};

// llama_ftype values: include/llama.h of llama.cpp (LLAMA_FTYPE_ALL_F32 = 0 ... LLAMA_FTYPE_MOSTLY_BF16 = 32).
constexpr TargetType kTargets[] = {
    {DType::F32, 0},   {DType::F16, 1},   {DType::BF16, 32}, {DType::Q8_0, 7}, {DType::Q6_K, 18},   {DType::Q5_K, 17},
    {DType::Q4_K, 15}, {DType::Q3_K, 12}, {DType::Q2_K, 10}, {DType::Q4_0, 2}, {DType::IQ4_NL, 25}, {DType::IQ4_XS, 30},
    {DType::IQ2_XS, 20}, {DType::IQ3_XXS, 23}, {DType::IQ3_S, 26}, {DType::IQ1_M, 31},
};

// Types this build reads but cannot write (their quantizers need importance-matrix search not written yet).
constexpr DType kGridTypes[] = {DType::IQ2_XXS, DType::IQ2_S, DType::IQ1_S};

bool ends_with(const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The name without its "blk.N." prefix.
std::string base_name(const std::string& name) {
    if (name.rfind("blk.", 0) != 0) return name;
    const size_t dot = name.find('.', 4);
    return dot == std::string::npos ? name : name.substr(dot + 1);
}

bool is_routed_expert(const std::string& name) {
    return ends_with(name, "_exps.weight") || ends_with(name, "_exps");
}

bool stays_f32(const std::string& name, int n_dims) {
    const std::string base = base_name(name);
    return n_dims < 2 || ends_with(base, "norm.weight") || base.find("conv1d") != std::string::npos ||
           base.find("ffn_gate_inp") != std::string::npos || base == "ssm_a" ||
           base.rfind("ssm_dt", 0) == 0;
}

bool is_head_or_embedding(const std::string& name) {
    return name == "token_embd.weight" || name == "output.weight" || ends_with(name, "nextn.embed_tokens.weight") ||
           ends_with(name, "nextn.shared_head_head.weight");
}

bool is_float_type(DType t) {
    return t == DType::F32 || t == DType::F16 || t == DType::BF16;
}

DType dense_type(DType target) {
    return is_float_type(target) || target == DType::Q8_0 ? target : DType::Q8_0;
}

DType head_type(DType target) {
    if (is_float_type(target) || target == DType::Q8_0 || target == DType::Q6_K) return dense_type(target);
    return DType::Q6_K;
}

const TargetType* find_target(DType t) {
    for (const TargetType& tt : kTargets)
        if (tt.type == t) return &tt;
    return nullptr;
}

DType parse_target(const std::string& name) {
    const std::optional<DType> t = dtype_from_name(name);
    if (!t) throw Error("unknown type '" + name + "' (known: " + quantize_type_names() + ")");
    if (std::find(std::begin(kGridTypes), std::end(kGridTypes), *t) != std::end(kGridTypes))
        throw Error(std::string(dtype_name(*t)) +
                    ": no quantizer yet (strata reads it but cannot write it; use one of " + quantize_type_names() +
                    ")");
    if (!find_target(*t))
        throw Error(std::string("type ") + dtype_name(*t) + " cannot be a quantize target (use one of " +
                    quantize_type_names() + ")");
    return *t;
}

void check_mix(const std::string& mix) {
    if (mix != "default" && mix != "experts-only")
        throw Error("unknown mix '" + mix + "' (known: default, experts-only)");
}

void check_paths(const QuantizeOptions& o) {
    std::error_code ec;
    if (!fs::is_regular_file(o.in_path, ec) || !std::ifstream(o.in_path, std::ios::binary))
        throw Error("cannot read input file '" + o.in_path + "'");
    if (o.out_path.empty()) throw Error("no output file given");
    const bool same = fs::exists(o.out_path, ec)
                          ? fs::equivalent(o.in_path, o.out_path, ec)
                          : fs::weakly_canonical(o.in_path, ec) == fs::weakly_canonical(o.out_path, ec);
    if (same) throw Error("input and output are the same file ('" + o.out_path + "'); choose another output name");
}

int64_t element_count(const gguf::TensorInfo& t) {
    int64_t n = 1;
    for (int d = 0; d < t.n_dims; ++d) n *= t.ne[d];
    return n;
}

// Converts rows of ne0 elements from `in_type` to `out_type` in parallel; each worker owns an f32 row buffer.
void convert_rows(ThreadPool& pool, DType in_type, const uint8_t* src, DType out_type, uint8_t* dst, int64_t ne0,
                  int64_t n_rows) {
    const size_t in_row = row_bytes(in_type, ne0);
    const size_t out_row = row_bytes(out_type, ne0);
    pool.parallel_for(n_rows, [&](int64_t begin, int64_t end) {
        std::vector<float> row(static_cast<size_t>(ne0));
        for (int64_t r = begin; r < end; ++r) {
            dequantize_row(in_type, src + static_cast<size_t>(r) * in_row, row.data(), ne0);
            quantize_row(out_type, row.data(), dst + static_cast<size_t>(r) * out_row, ne0);
        }
    });
}

}  // namespace

DType quantize_choose_type(const std::string& name, int n_dims, DType input, DType target, const std::string& mix) {
    check_mix(mix);
    if (is_routed_expert(name) && n_dims >= 2) return target;
    if (mix == "experts-only") return input;
    if (stays_f32(name, n_dims)) return DType::F32;
    if (is_ple_table(name)) return input;
    if (is_head_or_embedding(name)) return head_type(target);
    return dense_type(target);
}

DType quantize_fit_type(DType wanted, int64_t ne0) {
    if (ne0 % traits(wanted).block_size == 0) return wanted;
    if (ne0 % traits(DType::Q8_0).block_size == 0) return DType::Q8_0;
    return DType::F16;
}

uint32_t quantize_file_type(DType target) {
    const TargetType* t = find_target(target);
    STRATA_ASSERT(t != nullptr);
    return t->file_type;
}

std::string quantize_type_names() {
    std::string out;
    for (const TargetType& t : kTargets) out += (out.empty() ? "" : ", ") + std::string(dtype_name(t.type));
    return out;
}

std::string quantize_mix_help() {
    return "mixes:\n"
           "  default       routed experts (*_exps) at --type; attention, GDN ssm_* matrices, shared experts,\n"
           "                hyper-connection hc_* matrices and other matrices at q8_0 (--type when it is\n"
           "                f32/f16/bf16/q8_0); output head and token embeddings at q6_k (q8_0 for --type q6_k, --type\n"
           "                itself for f32/f16/bf16/q8_0); the PLE table keeps its type; norms, conv kernels,\n"
           "                routers, ssm_a, ssm_dt and 1-D tensors are f32\n"
           "  experts-only  only the routed experts change; everything else is copied as it is\n"
           "A row length that is not a multiple of the chosen type's block falls back to q8_0, then f16.";
}

QuantizeReport quantize_gguf(const QuantizeOptions& o) {
    const DType target = parse_target(o.type);
    check_mix(o.mix);
    check_paths(o);
    const std::unique_ptr<gguf::File> in = gguf::File::open(o.in_path);

    QuantizeReport report;
    report.file_type = quantize_file_type(target);
    gguf::Writer out;
    out.set_alignment(in->alignment());
    for (const gguf::KeyValue& kv : in->kvs()) {
        if (kv.key.rfind("split.", 0) == 0) continue;  // the output is one file
        out.set(kv.key, kv.value);
    }
    out.set("general.file_type", gguf::Value::of_u32(report.file_type));

    auto pool = std::make_shared<ThreadPool>(std::max(1, o.threads));
    bool any_quantized = false;
    for (const gguf::TensorInfo& t : in->tensors()) {
        const int64_t ne0 = t.ne[0];
        const DType wanted = quantize_choose_type(t.name, t.n_dims, t.type, target, o.mix);
        DType type = wanted == t.type ? wanted : quantize_fit_type(wanted, ne0);
        if (type != wanted)
            report.fallbacks.push_back(t.name + ": " + dtype_name(wanted) + " -> " + dtype_name(type) + " (rows of " +
                                       std::to_string(ne0) + ")");
        if (type != t.type && !traits(t.type).can_compute)
            throw Error(o.in_path + ": tensor " + t.name + " has type " + dtype_name(t.type) +
                        ", which this build cannot dequantize");
        any_quantized = any_quantized || !is_float_type(type);
        const std::vector<int64_t> ne(t.ne, t.ne + t.n_dims);
        const int64_t n_rows = element_count(t) / std::max<int64_t>(ne0, 1);
        const size_t out_bytes = row_bytes(type, ne0) * static_cast<size_t>(n_rows);

        auto& in_total = report.input_types[dtype_name(t.type)];
        ++in_total.tensors;
        in_total.bytes += t.n_bytes;
        auto& out_total = report.output_types[dtype_name(type)];
        ++out_total.tensors;
        out_total.bytes += out_bytes;
        report.bytes_in += t.n_bytes;
        report.bytes_out += out_bytes;

        const uint8_t* src = t.data;
        if (type == t.type) {
            ++report.copied;
            out.add_tensor(t.name, type, ne, [src](uint8_t* dst, size_t n) { std::memcpy(dst, src, n); });
        } else {
            const DType in_type = t.type;
            out.add_tensor(t.name, type, ne, [=](uint8_t* dst, size_t n) {
                STRATA_ASSERT(n == out_bytes);
                convert_rows(*pool, in_type, src, type, dst, ne0, n_rows);
            });
        }
    }
    if (any_quantized) out.set("general.quantization_version", gguf::Value::of_u32(2));  // ggml's GGML_QNT_VERSION
    out.write(o.out_path);
    return report;
}

}  // namespace strata
