// The small per-token ops the model's blocks need between the big ones (issue 7, model wiring): embedding rows, NEOX
// rope at device positions, the GDN block's activations and gates, the gated output norm, row stores at positions,
// the QSA indexer's pooled keys, the PLE gate and residual update, and residual adds. Each computes what the CPU code
// of the model layer computes (named at each op), the oracle of tests/test_cuda_block_ops.cpp. Like cuda_backend.h
// this header needs no CUDA headers.
//
// Positions are int32 device arrays (one per token of the window), so a captured graph replays the same launches for
// every window; the host writes the positions before each replay. Pointers are device pointers; work is queued on
// the context's stream. Bad shapes throw Error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "backend/cuda/cuda_backend.h"

namespace strata::cuda {

// Embedding rows (HybridModel::embed: cpu::get_row of token_embd): out[(t * copies + c) * width + i] = row
// tokens[t] of the table converted to f32, for every copy c < copies (qwen4exp starts its hc residual streams as
// copies of the embedding). table: {width, rows} of any type matmul supports, in device memory. A token outside
// [0, rows) gives a row of zeros. staging: embed_staging_bytes(table, n_tokens) device bytes (the raw rows, then their
// f32 conversion when copies > 1).
struct EmbedArgs {
    const Tensor* table = nullptr;
    const int32_t* tokens = nullptr;
    int64_t n_tokens = 0;
    int64_t copies = 1;
    float* out = nullptr;
    void* staging = nullptr;
};
size_t embed_staging_bytes(const Tensor& table, int64_t n_tokens);
void embed_rows(Context& ctx, const EmbedArgs& args);

// cpu::rope_neox on the first n_rot values of every head: head h of token t at x + t * token_stride + h * head_stride,
// at position positions[t] (angles in double, as the CPU: pos * freq_base^(-2i / n_rot), cos and sin rounded to float).
struct RopeArgs {
    float* x = nullptr;
    int64_t n_tokens = 0;
    int64_t n_heads = 0;
    int64_t token_stride = 0;
    int64_t head_stride = 0;
    int64_t n_rot = 0;
    const int32_t* positions = nullptr;
    float freq_base = 10000.0f;
};
void rope_neox(Context& ctx, const RopeArgs& args);
// rms_norm_grouped over each head of args.rope (head_dim values, gamma shared by the heads, in place), then rope_neox
// of the heads: one launch instead of two, the same bits for heads under 1,024 values (longer groups take the grouped
// norm's block kernel, which adds in another order).
struct NormRopeArgs {
    RopeArgs rope;
    int64_t head_dim = 0;
    const float* gamma = nullptr;  // {head_dim}, or null
    float eps = 0.0f;
};
void rms_norm_rope(Context& ctx, const NormRopeArgs& args);
// Several independent sets (the attention block's q, k and indexer q heads) in one launch: each set's bits as its own
// rms_norm_rope call. At most kMaxNormRopeSets sets.
constexpr int kMaxNormRopeSets = 4;
void rms_norm_rope(Context& ctx, std::span<const NormRopeArgs> sets);

// The GDN block after its conv (model/gdn.cpp, conv_rows): every value of the [n_tokens x conv_dim] rows goes through
// silu; then the first key_dim values (q) and the next key_dim (k) are l2-normalised per head of head_dim values
// (cpu::l2_norm, eps 1e-6), and q multiplied by q_scale. In place.
struct GdnActivateArgs {
    float* conv = nullptr;
    int64_t n_tokens = 0;
    int64_t conv_dim = 0;
    int64_t key_dim = 0;
    int64_t head_dim = 0;
    float q_scale = 1.0f;
};
void gdn_activate(Context& ctx, const GdnActivateArgs& args);

// The GDN gates (model/gdn.cpp, heads): for t < n_tokens, h < n_heads, in place:
// beta[t * n_heads + h] = sigmoid(beta), alpha[t * n_heads + h] = a[h] * softplus(alpha + dt_bias[h]) (the log decay g).
struct GdnGatesArgs {
    float* beta = nullptr;
    float* alpha = nullptr;
    const float* a = nullptr;        // {n_heads}: -exp(A_log)
    const float* dt_bias = nullptr;  // {n_heads}
    int64_t n_tokens = 0;
    int64_t n_heads = 0;
};
void gdn_gates(Context& ctx, const GdnGatesArgs& args);

// A decode window's (at most kMaxMatvecTokens tokens) causal_conv, gdn_activate and gdn_gates in one launch, with the
// same bits: the conv must write the activations' rows (conv.out == act.conv, rows of act.conv_dim).
void gdn_conv_activate(Context& ctx, const ConvWindowArgs& conv, const GdnActivateArgs& act,
                       const GdnGatesArgs& gates);

// qwen3next's fused beta/alpha projection (model/gdn.cpp, project): ba rows of 2 * key_heads * per_group values, per
// key group g its per_group beta logits then its per_group alpha logits; value head g * per_group + j gets
// beta[t * n + g * per_group + j] and alpha[...] (n = key_heads * per_group). Copies, nothing computed.
struct SplitBetaAlphaArgs {
    const float* ba = nullptr;
    float* beta = nullptr;
    float* alpha = nullptr;
    int64_t n_tokens = 0;
    int64_t key_heads = 0;
    int64_t per_group = 0;
};
void split_beta_alpha(Context& ctx, const SplitBetaAlphaArgs& args);

// The GDN output norm (model/gdn.cpp): each head row o = x + (t * n_heads + h) * head_dim becomes
// rms_norm(o, gamma, eps) * act(z) with z at the same offset of `z`, act sigmoid or silu. In place.
struct GatedNormArgs {
    float* x = nullptr;
    const float* z = nullptr;
    const float* gamma = nullptr;  // {head_dim}
    int64_t n_tokens = 0;
    int64_t n_heads = 0;
    int64_t head_dim = 0;
    bool sigmoid_gate = true;  // false: silu
    float eps = 1e-6f;
};
void gated_norm(Context& ctx, const GatedNormArgs& args);
// gated_norm, then y = w . x of its rows (x = args.x after the norm, as matmul computes it). When w's products read
// Q8_0 activations, the window is a decode window and each head holds whole blocks of 32, the norm's warps quantize
// their values for the product on the way: one launch fewer, the same bits.
void gated_norm_matmul(Context& ctx, const GatedNormArgs& args, const Tensor& w, float* y);

// dst + positions[t] * width <- src + t * src_stride (width floats), for t < n_tokens; positions outside
// [0, dst_rows) are skipped. (The QSA indexer's raw keys into the per-sequence key array.)
struct StoreRowsArgs {
    float* dst = nullptr;
    int64_t dst_rows = 0;
    const float* src = nullptr;
    int64_t src_stride = 0;  // 0: width
    int64_t width = 0;
    const int32_t* positions = nullptr;
    int64_t n_tokens = 0;
};
void store_rows(Context& ctx, const StoreRowsArgs& args);

// The QSA indexer's pooled keys (model/attention.cpp, index_append): for each token t whose position p completes a
// block ((p + 1) % ratio == 0, block b = (p + 1) / ratio - 1 < max_blocks): pooled[b] = mean of raw rows
// [b * ratio, b * ratio + ratio) (summed in order in float, then divided by ratio), then cpu::rms_norm with k_norm,
// then cpu::rope_neox over n_rot at position b * ratio. raw: the stored raw keys (store_rows before this), at least
// max_blocks * ratio rows of head_dim; n_rot even and at most head_dim.
struct IndexerPoolArgs {
    const float* raw = nullptr;
    float* pooled = nullptr;
    int64_t max_blocks = 0;
    int64_t head_dim = 0;
    int64_t ratio = 0;
    const float* k_norm = nullptr;  // {head_dim}
    float eps = 1e-6f;
    int64_t n_rot = 0;
    float freq_base = 10000.0f;
    const int32_t* positions = nullptr;
    int64_t n_tokens = 0;
};
void indexer_pool(Context& ctx, const IndexerPoolArgs& args);
// store_rows then indexer_pool in one launch (the same bits): store.dst is pool.raw, the same tokens and positions.
void indexer_store_pool(Context& ctx, const StoreRowsArgs& store, const IndexerPoolArgs& pool);

// The PLE gate (model/ple.cpp, gate_and_conv): per token t and stream s, with k and q rows of n_streams * n_embd
// (already normalised): g = dot(k_s, q_s) * (1 / sqrt(n_embd)) (the inverse rounded to float, as the CPU);
// g = sqrt(max(|g|, 1e-6)) * sign(g) (sign 0 at 0);
// gated[t][s][j] = sigmoid(g) * value[t][j].
struct PleGateArgs {
    const float* key = nullptr;    // [n_tokens x HC]
    const float* query = nullptr;  // [n_tokens x HC]
    const float* value = nullptr;  // [n_tokens x H]
    float* gated = nullptr;        // [n_tokens x HC]
    int64_t n_tokens = 0;
    int64_t n_streams = 0;
    int64_t n_embd = 0;
};
void ple_gate(Context& ctx, const PleGateArgs& args);

// residual[i] += gated[i] + silu(conv[i]) for i < n (the PLE output), in that order of additions.
void ple_residual_add(Context& ctx, float* residual, const float* gated, const float* conv, int64_t n);

// x[i] += y[i] for i < n (the residual adds of qwen35moe / qwen3next blocks).
void add_inplace(Context& ctx, float* x, const float* y, int64_t n);

}  // namespace strata::cuda
