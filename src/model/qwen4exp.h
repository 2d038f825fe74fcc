// qwen4exp's hyperparameters and per-block weights as both forward passes read them: the CPU trunk (qwen4exp.cpp)
// and the CUDA one (cuda/qwen4exp_cuda.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "format/gguf.h"
#include "model/attention.h"
#include "model/binding.h"
#include "model/gdn.h"
#include "model/hyper_connection.h"
#include "model/model.h"
#include "model/moe.h"
#include "model/ple.h"

namespace strata {

struct Qwen4ExpHparams {
    float eps = 1e-6f;
    std::vector<bool> recurrent;          // per trunk block
    std::vector<int64_t> compress_ratio;  // per trunk block; 0: dense attention
    HyperConnectionShape hc;
    AttentionShape attention;
    IndexerShape indexer;  // ratio filled in per block
    GdnShape gdn;
    MoeShape moe;
    // The PLE blocks (0-based, ascending) and the shape of each: they share everything but the hash arrays (and
    // their tables). ple is the first one's (empty when there is no PLE block).
    std::vector<int64_t> ple_blocks;
    std::vector<PleShape> ple_shapes;
    PleShape ple;
};

struct Qwen4ExpBlock {
    bool recurrent = true;
    HyperConnectionWeights hc_attn, hc_ffn;
    GdnWeights gdn;
    AttentionWeights attention;
    IndexerShape indexer;
    MoeWeights moe;
    bool has_ple = false;
    PleShape ple_shape;  // its hash arrays
    PleWeights ple;
};

// The {qwen4exp}.* keys, checked (gguf-qwen4exp.md 1.4).
Qwen4ExpHparams read_qwen4exp_hparams(const gguf::File& file, const ModelInfo& info, int64_t n_block_all);
// Every trunk block's weights, by GGUF name, with shape checks.
std::vector<Qwen4ExpBlock> bind_qwen4exp_blocks(const TensorBinder& binder, const Qwen4ExpHparams& h, int64_t n_layer);

}  // namespace strata
