// qwen35moe (Qwen3.5/3.6-MoE): the single-stream hybrid (single_stream.cpp). llama.cpp's converter reorders the GDN
// value heads of these files to the tiled order (gguf-qwen4exp.md 3.5), so value head h reads key head h % n_k.
// Its rope is IMRoPE; for text every section sees the same position, which makes it the plain NEOX rotation.
// Math: transformers Qwen3_5MoeTextModel; GGUF: gguf-qwen4exp.md sections 1.2, 2.3.
#include "model/hybrid.h"
#include "model/single_stream.h"

namespace strata {

std::unique_ptr<Model> load_qwen35moe(std::unique_ptr<gguf::File> file, const LoadOptions& options) {
    return load_single_stream(std::move(file), options, {.name = "qwen35moe", .tiled_value_heads = true});
}

}  // namespace strata
