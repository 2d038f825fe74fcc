// The conversion plan: every GGUF tensor (llama.cpp name, ggml shape, whether it stays F32) with a function that
// produces its rows as f32 from HF-named source tensors, after the converter transforms of
// shared/reference/gguf-qwen4exp.md section 3 (norm +1, -exp(A_log), conv squeeze, value-head reorder, qkvz split,
// expert stacking, indexer split, PLE shard concatenation, MTP renames and fusion). Plus the metadata keys.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "convert/tensor_source.h"
#include "core/dtype.h"
#include "format/gguf.h"
#include "format/hf_config.h"

namespace strata {

// Produces n_rows rows (ne0 values each) starting at row0; rows run over ne1, ne2, ... flattened.
using RowFn = std::function<void(int64_t row0, int64_t n_rows, float* out)>;

struct PlannedTensor {
    std::string name;
    std::vector<int64_t> ne;  // ggml order, ne0 first
    bool keep_f32 = false;    // norms, 1-D, conv kernels, ssm_a/ssm_dt, routers, the PLE table
    RowFn rows;

    int64_t n_rows() const;
};

struct PlanOptions {
    bool include_mtp = true;  // mtp.* as nextn blocks (when the checkpoint has them)
};

struct ConversionPlan {
    HfConfig config;
    std::vector<PlannedTensor> tensors;
    int64_t n_mtp_layers = 0;  // nextn blocks written after the trunk
    // PLE (qwen4exp with ple_layer_ids): one entry per PLE block, in block order. The first is what llama.cpp's
    // ple.* keys and per_layer_token_embd.weight carry; the others go under strata keys (add_model_keys).
    struct PleLayer {
        int64_t block = 0;  // 0-based
        int64_t rows = 0;   // table rows
        std::vector<uint64_t> multipliers;
        std::vector<uint64_t> head_offsets;
        std::vector<uint64_t> head_vocab_sizes;
    };
    std::vector<PleLayer> ple_layers;
    int64_t ple_row_width = 0;              // the same for every PLE block
    bool ple_hash_from_checkpoint = false;  // false: recomputed as transformers does
    // Why llama.cpp cannot load the file (one reason each, e.g. a value head size other than the key head size);
    // empty when it can. The hyperparameters its keys cannot carry go under strata.{arch}.* keys (add_model_keys).
    std::vector<std::string> llama_cpp_unsupported;
};

// "strata convert: warning: llama.cpp cannot load this file: ...": one line, or empty when llama.cpp can.
std::string llama_cpp_warning(const ConversionPlan& plan, const std::string& tool);

// rope.dimension_sections for the config: its mrope_section (or transformers' default [11, 11, 10]) padded to four,
// cut to the rotary pairs when it names more of them than there are (llama.cpp's rope asserts that the sections fit
// the rotated head); the cut keeps transformers' interleaved assignment of every rotary pair.
std::vector<int32_t> rope_dimension_sections(const HfConfig& config);

// Maps every source tensor (vision tensors skipped, mtp.* dropped unless include_mtp) and checks shapes against the
// config. Throws Error naming the tensor on a missing, misshapen or unexpected tensor.
ConversionPlan plan_conversion(const HfConfig& config, const TensorSource& source, const PlanOptions& options);

// Type a planned tensor gets for a requested output type (F32 for keep_f32 and for rows that are not a block
// multiple of a quantized type, where F16 is used).
DType planned_type(const PlannedTensor& t, DType out_type);

// llama_ftype for general.file_type.
uint32_t file_type_of(DType out_type);

// Architecture keys ({arch}.*) and the general.* keys.
void add_model_keys(gguf::Writer& writer, const ConversionPlan& plan, const std::string& model_name, DType out_type);

// Throws Error unless t is an output type this build writes (F32, F16, BF16, Q8_0).
void check_output_type(DType t);

// Streams every planned tensor into the writer, converting rows in bounded chunks. Routed-expert tensors
// (ffn_*_exps) take expert_type when given; the PLE table takes table_type when given (else it stays F32). With a
// mix named (quantize.h: "default"), every other tensor gets the type `strata quantize --type expert_type --mix`
// would give it (attention and GDN matrices q8_0, output head and embeddings q6_k, routers and hc tensors f32).
struct TensorTypes {
    DType out_type = DType::F16;
    std::optional<DType> expert_type;
    std::optional<DType> table_type;
    std::string mix;
    // Routed experts whose rows hold no whole expert_type block take this type instead of F16 (llama-quantize's
    // fallback: IQ4_NL for the 2- and 3-bit types, e.g. flash-next's 640-wide ffn_down_exps); F16 if it misfits too.
    std::optional<DType> expert_fallback;
};
DType planned_type(const PlannedTensor& t, const TensorTypes& types);
void add_planned_tensors(gguf::Writer& writer, const ConversionPlan& plan, const TensorTypes& types);

// PLE hash constants the way transformers' Qwen4ExpTextNGramEmbedding builds them.
struct PleHash {
    std::vector<uint64_t> multipliers;  // ngram_size entries
    std::vector<uint64_t> head_offsets;
    std::vector<uint64_t> head_vocab_sizes;
    uint64_t padded_rows = 0;  // table rows: total rounded up to make_ngram_vocab_size_divisible_by
};
PleHash compute_ple_hash(const HfConfig& config, int64_t ple_layer_index);

}  // namespace strata
