// The single-stream hybrid trunk shared by qwen35moe and qwen3next (single_stream.cpp).
#pragma once

#include <memory>
#include <vector>

#include "model/attention.h"
#include "model/binding.h"
#include "model/dense_ffn.h"
#include "model/gdn.h"
#include "model/model.h"
#include "model/moe.h"

namespace strata {

namespace gguf {
class File;
}

// What one single-stream architecture fixes.
struct SingleStreamArch {
    const char* name;        // the GGUF architecture, prefix of its `{arch}.*` keys
    bool tiled_value_heads;  // GDN value head h reads key head h % n_k (llama.cpp's reordered files), else h / (nv/nk)
};

struct SingleStreamHparams {
    float eps = 1e-6f;
    std::vector<bool> recurrent;
    AttentionShape attention;
    GdnShape gdn;
    MoeShape moe;
    // Blocks whose MLP is a dense SwiGLU (strata.{arch}.dense_mlp_layers: qwen3next's mlp_only_layers /
    // decoder_sparse_step), n_layer entries, and its width (feed_forward_length).
    std::vector<bool> dense_mlp;
    int64_t n_ff_dense = 0;
};

struct SingleStreamBlock {
    bool recurrent = true;
    std::vector<float> attn_norm, post_attention_norm;
    GdnWeights gdn;
    AttentionWeights attention;
    MoeWeights moe;        // unless dense
    bool dense = false;
    DenseFfnWeights ffn;   // when dense
};

// The {arch}.* keys, checked, and every trunk block's weights (the CPU trunk and the CUDA one read them alike).
SingleStreamHparams read_single_stream_hparams(const gguf::File& file, const SingleStreamArch& arch,
                                               const ModelInfo& info, int64_t n_block_all);
std::vector<SingleStreamBlock> bind_single_stream_blocks(const TensorBinder& binder, const SingleStreamHparams& h,
                                                         int64_t n_layer);

// With options.backend == Backend::Cuda, the CUDA trunk (cuda/single_stream_cuda.cpp).
std::unique_ptr<Model> load_single_stream(std::unique_ptr<gguf::File> file, const LoadOptions& options,
                                          const SingleStreamArch& arch);
#if STRATA_HAS_CUDA
std::unique_ptr<Model> load_single_stream_cuda(std::unique_ptr<gguf::File> file, const LoadOptions& options,
                                               const SingleStreamArch& arch);
#endif

}  // namespace strata
