// qwen4exp's hyperparameters and per-block weights as both forward passes read them: the CPU trunk (qwen4exp.cpp)
// and the CUDA one (cuda/qwen4exp_cuda.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
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

// The MTP draft layer (llama.cpp's nextn block `blk.{n_layer}`, strata-architecture.md 1.7). The math is the one it
// was trained with (tools/train/model.py, MTPHead): e = enorm(embed(t[i+1])); h = hnorm(R_i), one RMS over all hc
// streams at once (not per stream as llama.cpp's graph has it); each stream s gets eh_proj [e ; h_s] (fc_embedding e +
// fc_hidden h_s); then a trunk attention block attending densely over the layer's own cells, and its own final mixer;
// the trunk's head reads the mixer's output.
struct Qwen4ExpMtp {
    std::vector<float> enorm;  // {H}, 1 + w
    std::vector<float> hnorm;  // {HC}, 1 + w
    Tensor eh_proj;            // {2H, H}: inputs [embedding | hidden]
    HyperConnectionWeights hc_attn, hc_ffn;
    AttentionWeights attention;  // dense: the layer has no compress ratio
    MoeWeights moe;
    HyperConnectionWeights head_hc;  // nextn.hc_head_*
    int64_t block = 0;               // n_layer
};

// A block's two halves over the hyper-connected residual: hc_attn's read into mixed, the mixer (mixed -> out), the
// write back; hc_ffn's read, the MoE, the write back. The trunk's blocks and the MTP layer both run it.
struct Qwen4ExpBlockArgs {
    const Qwen4ExpHparams& h;
    const HyperConnectionWeights& hc_attn;
    const HyperConnectionWeights& hc_ffn;
    const MoeWeights& moe;
    int64_t layer = 0;               // the block index, for routing
    RoutingSink* routing = nullptr;  // moe_forward's
    float* residual;                 // [n_tokens x HC], updated in place
    float* mixed;                    // [n_tokens x H] scratch: each half's input
    float* out;                      // [n_tokens x H] scratch: each half's output
    float* inject;                   // [n_tokens x hc] scratch
    int64_t n_tokens = 1;
    Scratch& scratch;
    ThreadPool* pool = nullptr;
};
void qwen4exp_block(const Qwen4ExpBlockArgs& args, const std::function<void()>& mixer);

// nullopt when the file has no MTP block (no nextn_predict_layers); an Error naming the tensor when one is missing.
std::optional<Qwen4ExpMtp> bind_qwen4exp_mtp(const TensorBinder& binder, const Qwen4ExpHparams& h, int64_t n_layer,
                                             int64_t n_block_all);

struct Qwen4ExpMtpArgs {
    const Qwen4ExpHparams& h;
    const Qwen4ExpMtp& w;
    AttentionCache& cache;    // the layer's cells; cells from pos0 on are written
    int64_t pos0 = 0;         // the first cell (its rope position)
    const float* residual;    // [n x HC]: the trunk's final residual (or a chained cell's output residual)
    const float* embeddings;  // [n x H]: token_embd rows of the tokens paired with them
    int64_t n = 1;
    float* hidden;        // [n x H] out: the head's input
    float* residual_out;  // [n x HC] out (the block's output residual, before the mixer), or null
    Scratch& scratch;
    ThreadPool* pool = nullptr;
};
void qwen4exp_mtp_forward(const Qwen4ExpMtpArgs& args);

// The MTP draft layer as either trunk runs it, on the host: its cells (a DraftState of the model `owner`) and
// Model::draft_forward's checks and pass up to the head's input. The head is the caller's: the CPU trunk multiplies on
// the CPU, the CUDA trunk on the device, where its head lives.
class Qwen4ExpDraftLayer {
  public:
    Qwen4ExpDraftLayer(const void* owner, const Qwen4ExpHparams& h, Qwen4ExpMtp w, Tensor token_embd, int64_t n_vocab);
    int64_t width() const { return h_.hc.n_streams * h_.hc.n_embd; }
    std::unique_ptr<DraftState> new_state(int64_t capacity) const;
    // draft_forward's checks (Error naming what is wrong, logits included), then the layer over the cells: the last
    // cell's head input into `hidden` (n_embd floats from scratch) and, when residual_out is not empty, its output
    // residual there. Returns `hidden`.
    const float* run(DraftState& state, int64_t pos0, std::span<const float> residual, std::span<const int32_t> tokens,
                     std::span<float> logits, std::span<float> residual_out, Scratch& scratch, ThreadPool* pool) const;

  private:
    const void* owner_;
    Qwen4ExpHparams h_;
    Qwen4ExpMtp w_;
    Tensor token_embd_;
    int64_t n_vocab_;
};

}  // namespace strata
