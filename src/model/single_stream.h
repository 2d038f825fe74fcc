// The single-stream hybrid trunk shared by qwen35moe and qwen3next (single_stream.cpp).
#pragma once

#include <memory>

#include "model/model.h"

namespace strata {

namespace gguf {
class File;
}

// What one single-stream architecture fixes.
struct SingleStreamArch {
    const char* name;        // the GGUF architecture, prefix of its `{arch}.*` keys
    bool tiled_value_heads;  // GDN value head h reads key head h % n_k (llama.cpp's reordered files), else h / (nv/nk)
};

std::unique_ptr<Model> load_single_stream(std::unique_ptr<gguf::File> file, const LoadOptions& options,
                                          const SingleStreamArch& arch);

}  // namespace strata
