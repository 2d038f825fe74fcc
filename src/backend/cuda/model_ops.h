// The model-level ops of the CUDA backend (issue 7, slice 4): the MoE layer at decode, the hyper-connection read and
// write, the PLE table rows gathered from mapped host memory, and sampling. Each computes what the CPU reference of
// the same name computes (model/moe.cpp, model/hyper_connection.cpp, model/ple.cpp, runtime/sampler.cpp), the oracle
// of tests/test_cuda_model_ops.cpp. Like cuda_backend.h this header needs no CUDA headers.
//
// Everything that changes per token (expert ids, routing weights, the PLE n-gram history, the sampler's random number
// and its result) lives in device memory, and launch shapes depend only on the call's sizes, so a captured CUDA graph
// replays the same launches for every token without host edits.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cuda/cuda_backend.h"

struct CUevent_st;  // cudaEvent_t is CUevent_st*

namespace strata::cuda {

// ---- MoE (model/moe.cpp's moe_forward, decode: 1..kMaxMatvecTokens tokens) -----------------------------------------
//
// Router logits by matmul; per token, in one thread block: softmax as cpu::softmax (float max, float exp, double sum,
// float 1/sum), the top n_expert_used by probability with ties to the lower expert id, weights p / sum(p) of the
// chosen (normalize_weights) or p. The experts then run as gathered matrix-vector products: one launch for the gate and
// up rows of all (token, slot) pairs (fused or two stacked tensors), each pair reading its expert's slice through the
// id on the device; SwiGLU fused into the quantization of the down products' activations; one launch for the down
// products; the shared expert (gate_proj, up, SwiGLU, down, on a second stream beside the router and routed experts)
// scaled by sigmoid(shared_gate . x); out[t] = sum_k w[t,k] * y[t,k] (k in top-k order) + gate[t] * shared[t].
// The ids never go to the host.
struct MoeLayerWeights {
    const Tensor* router = nullptr;    // {H, E}
    const Tensor* gate_up = nullptr;   // {H, 2F, E} fused (gate rows first), or
    const Tensor* gate = nullptr;      // {H, F, E}
    const Tensor* up = nullptr;        // {H, F, E}
    const Tensor* down = nullptr;      // {F, H, E}
    const float* shared_gate = nullptr;  // {H} f32 on the device; null: no shared expert
    // {H, Fs}, {H, Fs}, {Fs, H}
    const Tensor* shared_gate_proj = nullptr, *shared_up = nullptr, *shared_down = nullptr;
    // Experts in host RAM (issue 25): device arrays of n_expert addresses, where each expert's slice of gate_up (or
    // gate and up) and down starts now: a VRAM cache slot, or the mapped address of its pages in host RAM (read over
    // PCIe). The caller rewrites them between windows; the expert tensors then give types and strides only and may
    // be host tensors. All null: the experts lie in the device tensors.
    const uint8_t* const* gate_up_at = nullptr;
    const uint8_t* const* gate_at = nullptr;
    const uint8_t* const* up_at = nullptr;
    const uint8_t* const* down_at = nullptr;
};

struct MoeLayerShape {
    int64_t n_embd = 0;
    int64_t n_expert = 0;
    int64_t n_expert_used = 0;
    int64_t n_ff = 0;
    int64_t n_ff_shared = 0;
    bool normalize_weights = true;
};

inline bool same_shape(const MoeLayerShape& a, const MoeLayerShape& b) {
    return a.n_embd == b.n_embd && a.n_expert == b.n_expert && a.n_expert_used == b.n_expert_used &&
           a.n_ff == b.n_ff && a.n_ff_shared == b.n_ff_shared;
}

struct MoeLayerArgs;

// Device buffers of one MoE call for up to kMaxMatvecTokens tokens of a shape ("scratch"), and a second stream with
// three events: the shared expert (and the quantization of x) run beside the router and the routed experts, joined
// before the combine (in a captured graph: two parallel branches). The routing results stay readable after the call:
// expert_ids()[t * K + k] and expert_weights()[t * K + k].
class MoeWorkspace {
public:
    MoeWorkspace(Context& ctx, const MoeLayerShape& shape, const MoeLayerWeights& weights);
    ~MoeWorkspace();
    MoeWorkspace(const MoeWorkspace&) = delete;
    MoeWorkspace& operator=(const MoeWorkspace&) = delete;
    const int32_t* expert_ids() const { return ids_; }
    const float* expert_weights() const { return weights_; }

private:
    friend void moe_layer(Context& ctx, const MoeLayerArgs& args);
    DeviceBuffer buffer_;
    MoeLayerShape shape_;
    CUstream_st* side_ = nullptr;
    CUevent_st* fork_ = nullptr;
    CUevent_st* x_ready_ = nullptr;
    CUevent_st* shared_done_ = nullptr;
    float* logits_ = nullptr;
    int32_t* ids_ = nullptr;
    float* weights_ = nullptr;
    void* x_act_ = nullptr;         // x quantized for the expert gate/up products
    float* gate_out_ = nullptr;     // [pairs][2F] (fused) or gate [pairs][F] then up [pairs][F]
    float* hidden_ = nullptr;       // [pairs][F] silu(gate) * up (float down weights read it)
    void* hidden_act_ = nullptr;    // hidden quantized for the down products
    float* expert_out_ = nullptr;   // [pairs][H]
    void* shared_x_act_ = nullptr;  // x quantized for the shared expert (when its format differs)
    float* shared_g_ = nullptr, *shared_u_ = nullptr, *shared_h_ = nullptr, *shared_out_ = nullptr;
    void* shared_h_act_ = nullptr;
};

// The MoE layer's last step, out[t][j] = sum_k weights[t k] * expert_out[t k][j] (k in top-k order) +
// sigmoid(shared_gate . x[t]) * shared[t][j], as its buffers hold it after the experts: moe_combine runs it, and a
// hyper-connection read with it as its pending write forms each value where it needs it (one launch fewer a MoE layer
// at decode).
struct MoeCombine {
    const float* expert_out = nullptr;  // [n_tokens x n_used x H]
    const float* weights = nullptr;     // [n_tokens x n_used]
    int n_used = 0;
    const float* shared_gate = nullptr;  // [H], or null: no shared expert
    const float* x = nullptr;            // [n_tokens x H]: the layer's input (for the shared expert's gate)
    const float* shared = nullptr;       // [n_tokens x H]: the shared expert's output
    float* out = nullptr;                // [n_tokens x H]: where moe_combine writes
    int64_t H = 0;
    int64_t n_tokens = 0;
};
void moe_combine(Context& ctx, const MoeCombine& combine);

class Doorbell;  // doorbell_wait.h

// CPU expert workers compute part of a window's pairs (issue 25): those whose expert's down_at entry is null (and
// whose gate_up / gate / up entries are null as well: the GPU skips them). After the router the layer publishes its
// expert ids and input to mapped host memory on the doorbell's slot; after its own experts it waits for the slot's
// ring and takes the host's rows (pair p's at rows + p * H) into the pairs that were the host's, then combines. A wait
// that gives up leaves those rows unwritten and the window marked as given up (Doorbell::check_window).
struct MoeHostShare {
    Doorbell* doorbell = nullptr;
    int slot = 0;
    int layer = 0;
    int32_t* ids = nullptr;      // mapped (device address): [n_tokens x K]
    float* x = nullptr;          // mapped (device address): [n_tokens x H]
    const float* rows = nullptr;  // mapped (device address): [n_tokens x K x H], written by the host
};

struct MoeLayerArgs {
    const MoeLayerShape& shape;
    const MoeLayerWeights& weights;
    const float* x;  // [n_tokens x H], device, 16-byte aligned; with deferred_combine, unchanged until the combine
    float* out;      // [n_tokens x H]
    int64_t n_tokens = 1;
    MoeWorkspace& workspace;
    // When set, the combine is not launched: *deferred_combine receives it (writing out), for the caller to run or to
    // hand to the next hyper-connection read; the stream has joined the shared expert's branch either way.
    MoeCombine* deferred_combine = nullptr;
    const MoeHostShare* host_share = nullptr;  // needs the *_at tables
};
void moe_layer(Context& ctx, const MoeLayerArgs& args);

// ---- MoE for prompt windows (more than kMaxMatvecTokens tokens; issue 26) -----------------------------------------
//
// The same layer for a whole window at once: the router and the routing of every token, the (token, slot) pairs
// grouped by expert on the device (a counting sort), one grouped tensor-core GEMM launch for the gate and up rows of
// every expert's pairs, SwiGLU into the down products' activations, one grouped launch for the down rows, the shared
// expert as GEMMs, and moe_combine. An expert's quantized blocks are read once per tile of its pairs in the window
// instead of once per pair, and its products run on tensor cores (fp16 operands, as the dense prompt GEMM). The
// ids stay on the device. All on the context's stream: nothing here is captured in a graph.
struct MoePromptArgs;

class MoePromptWorkspace {
public:
    // For windows of up to max_tokens tokens of layers of this shape: one workspace serves every MoE layer of a
    // model (the layers run one after another on one stream).
    MoePromptWorkspace(Context& ctx, const MoeLayerShape& shape, int64_t max_tokens);
    // The same in device memory the caller owns (bytes(shape, max_tokens) of it, 256-byte aligned, valid as long as
    // this lives): a model's window buffers lend it the room their block stages use while the MoE runs.
    MoePromptWorkspace(const MoeLayerShape& shape, int64_t max_tokens, void* memory);
    MoePromptWorkspace(const MoePromptWorkspace&) = delete;
    MoePromptWorkspace& operator=(const MoePromptWorkspace&) = delete;
    // The last call's routing, [n_tokens x K] each.
    const int32_t* expert_ids() const { return ids_; }
    const float* expert_weights() const { return weights_; }
    int64_t max_tokens() const { return max_tokens_; }
    const MoeLayerShape& shape() const { return shape_; }
    // The VRAM one takes (the memory plan counts it).
    static size_t bytes(const MoeLayerShape& shape, int64_t max_tokens);

private:
    friend void moe_layer_prompt(Context& ctx, const MoePromptArgs& args);
    void carve(uint8_t* base);
    DeviceBuffer buffer_;  // empty when the memory is the caller's
    MoeLayerShape shape_;
    int64_t max_tokens_ = 0, max_tiles_ = 0;
    float* logits_ = nullptr;
    int32_t* ids_ = nullptr;
    float* weights_ = nullptr;
    int32_t* sorted_pairs_ = nullptr;
    int32_t* expert_tiles_ = nullptr;  // [E + 1]; then tile_expert_, tile_begin_, tile_count_: max_tiles_ each
    int32_t* tile_expert_ = nullptr, *tile_begin_ = nullptr, *tile_count_ = nullptr;
    void* x_act_ = nullptr;          // x quantized for gate and up
    void* x_half_ = nullptr;         // fp16 [T][H]
    float* x_scale_ = nullptr;       // [T]
    float* gate_out_ = nullptr;      // [pairs][2F] (fused) or gate [pairs][F] then up [pairs][F]
    void* hidden_act_ = nullptr;     // silu(gate) * up quantized for down
    void* hidden_half_ = nullptr;    // fp16 [pairs][F]
    float* hidden_scale_ = nullptr;  // [pairs]
    float* expert_out_ = nullptr;    // [pairs][H], in gate_out_'s bytes (never live at once)
    float* shared_g_ = nullptr, *shared_u_ = nullptr, *shared_h_ = nullptr, *shared_out_ = nullptr;  // [T][Fs], [T][H]
};

// Whether moe_layer_prompt takes these weights: quant experts of a type the tensor-core GEMM decodes, whose rows
// hold whole blocks, at most 4,096 experts. Else the window goes through moe_layer in slices.
bool moe_prompt_supported(const MoeLayerShape& shape, const MoeLayerWeights& weights);

// Experts streamed into VRAM while a prompt window computes (experts in host RAM, issue 25): a layer's experts in
// ranges() equal ranges, and for each pass (0: gate and up, 1: down) a range's bytes in a buffer a copy stream fills
// (the address tables already point there). moe_layer_prompt runs a range's grouped products between ready(pass,
// range), which queues on the context's stream the wait for its bytes, and done(pass, range), which releases them.
class MoeExpertStream {
  public:
    virtual int ranges() const = 0;
    virtual void ready(int pass, int range) = 0;
    virtual void done(int pass, int range) = 0;

  protected:
    ~MoeExpertStream() = default;
};

struct MoePromptArgs {
    const MoeLayerShape& shape;
    const MoeLayerWeights& weights;
    const float* x;  // [n_tokens x H], device
    float* out;      // [n_tokens x H]
    int64_t n_tokens = 0;
    MoePromptWorkspace& workspace;
    MoeExpertStream* stream = nullptr;  // null: every expert is where its weights or tables say
};
void moe_layer_prompt(Context& ctx, const MoePromptArgs& args);

// ---- hyper-connections (model/hyper_connection.cpp) ----------------------------------------------------------------
//
// read: xn = rms_norm_grouped(residual) (hc groups of H, gamma `norm`); low = silu((down . xn) / hc); g = up . low;
// mixed[j] = (sum_s sigmoid(g[s H + j]) * xn[s H + j]) / hc (streams in order); with inject: inject = 2 *
// sigmoid((inject_w . xn) / hc). The sigmoid, the stream mix and the inject transform are one kernel; the silu one.
// write: residual[t][s] += inject[t][s] * block_out[t], every stream, one kernel.
struct HyperConnectionDeviceWeights {
    const float* norm = nullptr;     // {HC} f32 (gamma already 1 + w), device
    const Tensor* down = nullptr;    // {HC, r}
    const Tensor* up = nullptr;      // {r, HC}
    const Tensor* inject = nullptr;  // {HC, hc}; null for the final mixer
};
struct HyperConnectionDims {
    int64_t n_streams = 0;
    int64_t n_embd = 0;
    int64_t low_rank = 0;
    float eps = 1e-6f;
};
struct HyperConnectionReadArgs {
    const HyperConnectionDims& shape;
    const HyperConnectionDeviceWeights& weights;
    float* residual;  // [n_tokens x HC]
    float* mixed;     // [n_tokens x H]
    float* inject;    // [n_tokens x hc]; null for the final mixer
    int64_t n_tokens = 1;
    float* workspace;  // hyper_connection_workspace_floats floats
    // The previous block's write, not yet applied: residual += inject * pending_block_out (hyper_connection_write with
    // the inject buffer as it holds now) comes first, fused into the read's first kernel where it can be.
    const float* pending_block_out = nullptr;
    // Or the previous block's write as an MoE combine not yet run (moe_layer's deferred_combine; at most one of the
    // two): its values are formed in the read's first kernel, with moe_combine's bits, where the read is fused.
    const MoeCombine* pending_combine = nullptr;
    // A buffer of q8_0_activation_bytes(H) bytes, or null: where a one-token read may also write mixed as the Q8_0
    // activations the next product's matvec reads (matmul_shared_input's x_q8_0), so that product needs no quantizer
    // launch. The read returns whether it did (the fused read's up product, on sm_90+).
    void* mixed_q8_0 = nullptr;
};
int64_t hyper_connection_workspace_floats(const HyperConnectionDims& shape, int64_t n_tokens);
bool hyper_connection_read(Context& ctx, const HyperConnectionReadArgs& args);
void hyper_connection_write(Context& ctx, const HyperConnectionDims& shape, float* residual, const float* block_out,
                            const float* inject, int64_t n_tokens);

// ---- PLE rows from mapped host memory (model/ple.cpp: ple_rows_into, then cpu::get_row per head) -------------------

// Page-locked host memory mapped into the device's address space (cudaHostAlloc with cudaHostAllocMapped): the PLE
// table (hundreds of GB at full size) stays on the host and kernels read its rows over the bus.
class MappedHostBuffer {
public:
    // write_combined: cudaHostAllocWriteCombined as well (fast host writes and device reads, slow host reads).
    explicit MappedHostBuffer(size_t bytes, bool write_combined = false);
    ~MappedHostBuffer();
    MappedHostBuffer(const MappedHostBuffer&) = delete;
    MappedHostBuffer& operator=(const MappedHostBuffer&) = delete;
    void* host() const { return host_; }
    const void* device() const { return device_; }
    size_t size() const { return bytes_; }

private:
    void* host_ = nullptr;
    void* device_ = nullptr;
    size_t bytes_ = 0;
};

// For each of n_tokens tokens (tokens[t] on the device) and each head h: the hashed row of ple_rows_into, from the
// token and its predecessors (the device history of ngram - 1 tokens, oldest first, then the earlier tokens of this
// call), then that table row converted to f32 at out[(t * n_heads + h) * row_width ..]. The history is advanced past
// the call's tokens. Hash constants are device arrays of uint64 (multipliers[ngram], offsets and sizes[n_heads]).
struct PleGatherArgs {
    int64_t ngram = 0;
    int64_t heads_per_ngram = 0;
    int32_t eos = 0;
    const uint64_t* multipliers = nullptr;
    const uint64_t* offsets = nullptr;
    const uint64_t* sizes = nullptr;
    const void* table = nullptr;  // MappedHostBuffer::device() (or device memory), table_rows rows of row_width values
    DType table_type = DType::F16;
    int64_t row_width = 0;
    int64_t table_rows = 0;
    const int32_t* tokens = nullptr;
    int32_t* history = nullptr;
    int64_t n_tokens = 0;
    int64_t* rows = nullptr;  // [n_tokens x n_heads] out: the row ids (device)
    void* staging = nullptr;  // n_tokens * n_heads * row_bytes(table_type, row_width) device bytes
    float* out = nullptr;
};
void ple_gather(Context& ctx, const PleGatherArgs& args);

// The same rows when the host has read them already (a table that stays in its file: runtime/ple_row_reader.h):
// n_rows rows of row_bytes(table_type, row_width) in pinned host memory, copied into the device staging on the
// context's stream (a captured graph copies from the same address on every replay: the host fills it before), then
// converted to f32 at out[i * row_width ..] as ple_gather converts them.
struct PleHostRowsArgs {
    const void* host_rows = nullptr;  // pinned (cudaHostAlloc) host memory
    DType table_type = DType::F16;
    int64_t row_width = 0;
    int64_t n_rows = 0;
    void* staging = nullptr;  // n_rows * row_bytes device bytes
    float* out = nullptr;
};
void ple_rows_from_host(Context& ctx, const PleHostRowsArgs& args);

// ---- sampling (runtime/sampler.cpp) ---------------------------------------------------------------------------------

// Device buffers for sampling rows of up to n_vocab logits.
class SamplingWorkspace {
public:
    SamplingWorkspace(Context& ctx, int64_t n_vocab);
    int64_t n_vocab() const { return n_vocab_; }
    void* data() const { return buffer_.data(); }

private:
    DeviceBuffer buffer_;
    int64_t n_vocab_ = 0;
};

// Greedy: *out = the index of the largest logit, ties to the lowest index (argmax_lowest); -1 when a logit is NaN or
// none is above -inf. One kernel (the last block to finish reduces the blocks' results).
void sample_greedy(Context& ctx, const float* logits, int64_t n_vocab, int32_t* out, SamplingWorkspace& workspace);

// Sampler::sample_top_k_small for 1 <= top_k <= 1024 (and top_k < n_vocab), with the draw's uniform number given in
// device memory: the top_k largest logits, larger first and ties to the lower id (-0 == +0); p_j = exp(l_j - l_max) in
// double; top-p keeps the shortest prefix whose running sum (in order, double) reaches top_p * sum; min-p drops from
// the end while l_j - l_max < floor_logit (keeping one); then w_j = exp((l_j - l_max) * inv_temperature) in double,
// the first j whose running sum exceeds uniform * sum(w) is the token (the most likely one if rounding runs past the
// end). -1 for NaN, +inf or all -inf logits. The host computes floor_logit = log(min_p) (-inf: off) and
// inv_temperature = 1.0 / temperature as the CPU sampler does, so the only differences from the CPU are the device's
// double exp (within 1 ulp of glibc's) and nothing else: the same token unless the draw lies within ~1e-16 of a
// boundary.
struct TopKSamplingArgs {
    const float* logits = nullptr;
    int64_t n_vocab = 0;
    int32_t top_k = 40;
    float top_p = 1.0f;
    float floor_logit = -__builtin_huge_valf();
    double inv_temperature = 1.0;
    const double* uniform = nullptr;  // device, in [0, 1)
    int32_t* out = nullptr;
};
constexpr int32_t kMaxDeviceTopK = 1024;
void sample_top_k(Context& ctx, const TopKSamplingArgs& args, SamplingWorkspace& workspace);

}  // namespace strata::cuda
