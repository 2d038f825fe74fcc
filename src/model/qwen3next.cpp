// qwen3next (Qwen3-Next): the single-stream hybrid (single_stream.cpp). Its files keep HF's GDN value-head order
// (value head h reads key head h / (nv / nk); gguf-qwen4exp.md 3.6), and beta and alpha come fused per key group in
// ssm_ba (or, in old files, everything in ssm_in): bind_gdn() reads either layout.
// Math: transformers Qwen3NextModel; GGUF: gguf-qwen4exp.md sections 1.3, 2.4, 3.6.
#include "model/hybrid.h"
#include "model/single_stream.h"

namespace strata {

std::unique_ptr<Model> load_qwen3next(std::unique_ptr<gguf::File> file, const LoadOptions& options) {
    return load_single_stream(std::move(file), options, {.name = "qwen3next", .tiled_value_heads = false});
}

}  // namespace strata
