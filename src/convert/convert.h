// HF save_pretrained folders to GGUF with llama.cpp's names and keys (qwen4exp, qwen35moe, qwen3next), and random
// models of named shapes (`strata synth`) written through the same naming.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace strata {

struct ConvertOptions {
    std::string hf_dir;
    std::string out_path;
    DType out_type = DType::F16;     // matrices; norms, conv and routers stay F32 (llama.cpp convention)
    bool vocab_placeholder = false;  // byte-level placeholder vocabulary when there is no tokenizer.json
    bool include_mtp = true;         // mtp.* tensors as nextn blocks when present
    uint64_t split_max_bytes = 0;    // 0: one file
};

struct ConvertReport {
    // Why llama.cpp cannot load the file written (one reason each; a warning on stderr says so); empty when it can.
    std::vector<std::string> llama_cpp_unsupported;
};

// Throws Error with one line naming the problem (missing config, unknown architecture, missing tensor, shape ...).
ConvertReport convert_hf_to_gguf(const ConvertOptions& options);

// A copy of a GGUF without its MTP (nextn) blocks: block_count and per-block arrays shortened, nextn_predict_layers
// dropped, tensors copied byte for byte. Throws Error when the file has no MTP block.
void strip_mtp_gguf(const std::string& in_path, const std::string& out_path);

struct SynthOptions {
    std::string preset = "tiny";
    std::string arch;                  // empty: the preset's own
    std::optional<DType> expert_type;  // --type
    std::string out_path;
    uint64_t seed = 1;
    // Quantized tensors get random quant blocks (scaled to the float generator's RMS) instead of quantized random
    // floats: disk speed instead of quantizer speed. Float tensors are the same as without it.
    bool fast = false;
    // The PLE table's ngram_vocab_size_base (every head's table size is a prime at or above it); nullopt: the
    // preset's. Only for presets with a PLE table; shrinks the table while every other tensor keeps its shape.
    std::optional<int64_t> ple_vocab_base;
    int threads = 0;  // --fast: threads per tensor (0: all cores)
    // --shapes-only: the tensor directory and keys of the file, its tensor data left a hole (gguf::Writer's
    // set_data_holes: reads as zeros, takes no disk space), with the types --fast would write. For memory plans.
    bool shapes_only = false;
    // --router-skew: 0 keeps the routers' rows N(0, 1/H); S > 0 scales expert e's row by exp(S * sigma * g_e - (S *
    // sigma)^2) with g_e ~ N(0, 1) drawn from the seed (synth.cpp's kRouterSkewSigma: S = 1 is the calibrated skew).
    double router_skew = 0.0;
};
// Throws Error (one line) on a bad option.
void synth_model(const SynthOptions& options);
// "name: description" of every synth preset, for --help.
std::vector<std::string> synth_preset_names();

}  // namespace strata
