// GGUF tensor names that more than one layer of strata treats specially.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace strata {

// The PLE n-gram table of a PLE block: llama.cpp's one `per_layer_token_embd.weight` for the first PLE block (the
// one its `ple.layers` key names), `blk.N.per_layer_token_embd.weight` for each further one (strata keys; a file
// llama.cpp cannot load).
inline std::string ple_table_name(int64_t block, bool first_ple_block) {
    const std::string base = "per_layer_token_embd.weight";
    return first_ple_block ? base : "blk." + std::to_string(block) + "." + base;
}

// Whether a tensor is a PLE table: read a few rows per token, never packed, possibly larger than RAM.
inline bool is_ple_table(std::string_view name) {
    constexpr std::string_view base = "per_layer_token_embd.weight";
    return name == base || (name.starts_with("blk.") && name.ends_with(std::string(".") + std::string(base)));
}

// "blk.N.*" -> N; -1 for any other name.
inline int64_t block_of(std::string_view name) {
    if (!name.starts_with("blk.")) return -1;
    const size_t dot = name.find('.', 4);
    if (dot == std::string_view::npos || dot == 4) return -1;
    int64_t n = 0;
    for (size_t i = 4; i < dot; ++i) {
        if (name[i] < '0' || name[i] > '9') return -1;
        n = n * 10 + (name[i] - '0');
    }
    return n;
}

}  // namespace strata
