// `strata quantize`: rewrite a GGUF with its matrices in a smaller element type, chosen per tensor by a named mix.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace strata {

struct QuantizeOptions {
    std::string in_path;
    std::string out_path;
    std::string type;             // "q4_k", "q8_0", ... (the routed experts' type)
    std::string mix = "default";  // see quantize_mix_help()
    int threads = 1;              // rows are (de)quantized in parallel
};

struct QuantizeReport {
    struct TypeTotal {
        int64_t tensors = 0;
        uint64_t bytes = 0;
    };
    std::map<std::string, TypeTotal> input_types;   // by dtype name
    std::map<std::string, TypeTotal> output_types;  // by dtype name
    uint64_t bytes_in = 0;
    uint64_t bytes_out = 0;
    int64_t copied = 0;                  // tensors whose bytes were copied unchanged
    std::vector<std::string> fallbacks;  // "NAME: q4_k -> q8_0 (row of 80)"
    uint32_t file_type = 0;              // the general.file_type written
};

// The type a tensor gets under a mix (before the block-size fallback). Throws Error on an unknown mix.
DType quantize_choose_type(const std::string& name, int n_dims, DType input, DType target, const std::string& mix);
// A type for rows of ne0 elements: `wanted` when its block fits, else q8_0, else f16.
DType quantize_fit_type(DType wanted, int64_t ne0);
// llama.cpp's llama_ftype code for a --type (Q4_K -> 15, LLAMA_FTYPE_MOSTLY_Q4_K_M).
uint32_t quantize_file_type(DType target);
// The --type names accepted, and the --mix names with what they do (for --help).
std::string quantize_type_names();
std::string quantize_mix_help();

// Throws Error (one line) for an unknown or unwritable type, an unknown mix, IN == OUT or an unreadable input.
QuantizeReport quantize_gguf(const QuantizeOptions& options);

}  // namespace strata
