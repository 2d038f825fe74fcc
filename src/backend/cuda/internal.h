// Private to the CUDA backend: what the host code (context.cpp, matmul.cu) calls in the kernel files.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace strata {
struct Tensor;
}

namespace strata::cuda {

class Context;

// Copy the quant codebooks into the current device's memory (each kernel file owns the tables it reads). Every Context
// calls them on its device; a second call on the same device writes the same bytes again.
void upload_basic_tables();  // IQ4_NL levels (matvec_basic.cu)
void upload_iq_tables();  // IQ2_XS, IQ3_XXS, IQ3_S, IQ1_M grids (matvec_iq.cu)

// The activations of a quantized matrix product as the kernels read them, for n_tokens rows of `in` values:
// q[t * in + i] the 8-bit values, d[t * in / 32 + i / 32] the scale of each 32 (a Q8_K scale repeated over its 256),
// s16[t * in / 16 + i / 16] = scale * (sum of the 16 values) for the types whose weights carry a minimum.
struct QuantizedActivations {
    const int8_t* q;
    const float* d;
    const float* s16;
};

// Expert gather (MoE): one launch runs n_pairs single-token products, pair p with the weights of expert ids[p]
// (w + ids[p] * expert_bytes), the activation row p / pairs_per_act_row, writing y + p * rows. The ids are read on the
// device, so the launch can sit in a captured graph after the kernel that chose them.
struct ExpertGather {
    const int32_t* ids = nullptr;  // device, n_pairs entries (null: no gather)
    size_t expert_bytes = 0;
    int64_t n_pairs = 0;
    int64_t pairs_per_act_row = 1;
    // Two stacked tensors in one launch (separate gate and up): pairs from second_from on are pair - second_from of
    // the second tensor, which starts second_offset bytes after w (0: one tensor).
    int64_t second_from = 0;
    int64_t second_offset = 0;
    // Experts in host RAM (issue 25): when set, expert e's slice starts at at[e] (second_at[e] for the second tensor),
    // a VRAM cache slot or a mapped host address read over PCIe; w, expert_bytes and second_offset are not used. A null
    // entry: the pair is computed on the host, its thread blocks return at once.
    const uint8_t* const* at = nullptr;
    const uint8_t* const* second_at = nullptr;
};

// More matrices of the same type and row length in the same launch, against the same activations: products that
// share an input (q/k/v, the GDN projections, gate/up) then cost one launch and one tail instead of several.
struct MatvecSegment {
    const uint8_t* w = nullptr;
    size_t row_bytes = 0;
    int64_t rows = 0;
    float* y = nullptr;  // y[t * rows + r]
};
constexpr int kMaxMatvecSegments = 4;

// Activations that a matvec launch of one token forms and quantizes itself, for weights that read Q8_0 activations
// and rows of at most kMaxOwnActivations values: every block computes silu(x / divisor) (the hyper-connection read's
// low-rank step) into its shared memory before its products, so no quantizer launch goes first. The values and bits
// are quantize_silu_scaled's (the same per-value code).
struct OwnActivations {
    const float* silu_of = nullptr;  // the f32 row x (null: the launch reads act as usual)
    float divisor = 1.0f;
};
constexpr int64_t kMaxOwnActivations = 1024;

// The hyper-connection read's mix in the epilogue of its up product (one token, kHcMixStreams streams, own silu
// activations): block b's warp s takes the 8 rows s * H + 8 b .. 8 b + 7 (the same columns j of every stream), and
// the block then writes mixed[j] = hyper-connection mix of its 8 columns instead of the gate rows; block 0 also turns
// the inject product's per-stream shares into the transformed inject. The mix kernel's values and bits.
struct HcMix {
    const float* xn = nullptr;  // [hc x H] the normalized streams (null: no mix; y is written as usual)
    float* mixed = nullptr;     // [H]
    float* inject = nullptr;    // [hc], or null: no inject
    const float* inject_partials = nullptr;  // [hc (stream) x hc (inject row)]
    int64_t H = 0;
    // Also mixed as Q8_0 activations (q null: not asked; H a multiple of 32, clusters_supported): the launch then
    // runs in clusters of kHcMixClusterBlocks, whose blocks hand their columns to rank 0, which quantizes the 32 as
    // quantize_activations would. The product that reads mixed next then skips its quantizer launch.
    QuantizedActivations q8_0 = {};
};
constexpr int kHcMixStreams = 4;
constexpr int kHcMixColumns = 8;  // columns j per block (H must be a multiple)
constexpr int kHcMixClusterBlocks = 32 / kHcMixColumns;  // blocks that hold one Q8_0 block of mixed
// Whether a launch of w_type weights with rows of `in` values and n_tokens tokens can take OwnActivations.
bool can_form_own_activations(DType w_type, int64_t in, int64_t n_tokens);

// One matrix-vector launch: rows [0, rows) of W (row_bytes apart) against n_tokens (1..8) activation rows.
struct MatvecLaunch {
    DType type;
    const uint8_t* w;
    size_t row_bytes;
    int64_t rows;
    int64_t in;
    int n_tokens;
    QuantizedActivations act;  // quant types
    const float* x;            // float types: the f32 activations
    float* y;                  // y[t * rows + r]
    cudaStream_t stream;
    ExpertGather gather = {};  // with gather.ids set, n_tokens must be 1
    // Segments after the first (w, row_bytes, rows, y above); none with a gather.
    MatvecSegment more[kMaxMatvecSegments - 1] = {};
    int n_more = 0;
    // Activations formed in the kernel instead of act (which is then unused); with a gather, row p / pairs_per_act_row.
    OwnActivations own = {};
    HcMix mix = {};  // with own activations only
};
// Each family's launcher returns false for a type it does not own.
bool launch_matvec_float(const MatvecLaunch& l);  // F32, F16, BF16
bool launch_matvec_basic(const MatvecLaunch& l);  // Q8_0, Q4_0, IQ4_NL, IQ4_XS
bool launch_matvec_kquant(const MatvecLaunch& l);  // Q2_K .. Q6_K
bool launch_matvec_iq(const MatvecLaunch& l);  // IQ2_XS, IQ3_XXS, IQ3_S, IQ1_M

// Rows [0, rows) of W dequantized to f32 rows of `in` values (out[r * in + i]), for the GEMM path.
struct DequantizeLaunch {
    DType type;
    const uint8_t* w;
    size_t row_bytes;
    int64_t rows;
    int64_t in;
    float* out;
    cudaStream_t stream;
    __half* out_half = nullptr;  // quant types: fp16 rows here instead of out (float types take out only)
};
bool launch_dequantize_float(const DequantizeLaunch& l);
bool launch_dequantize_basic(const DequantizeLaunch& l);
bool launch_dequantize_kquant(const DequantizeLaunch& l);
bool launch_dequantize_iq(const DequantizeLaunch& l);

// One tensor-core GEMM (gemm_tensor_core.cuh; quant types, more than kMaxMatvecTokens tokens): y[t * ldy + r] for
// rows [0, rows) of W against n_tokens rows of fp16 activations, tile_tokens (64 or 128) tokens a block. With splits
// > 1 each of the splits ranges of k_tiles_per_split tiles of 64 writes partials[s * rows * n_tokens + t * rows + r]
// instead, for the caller to add in order.
struct GemmLaunch {
    DType type;
    const uint8_t* w;
    size_t row_bytes;
    int64_t rows;
    int64_t in;
    int64_t n_tokens;
    const __half* x;           // x[t * in + k]
    const float* token_scale;  // token t's sums are multiplied by token_scale[t]
    float* y;
    int64_t ldy;
    int tile_tokens;
    int splits;
    int64_t k_tiles_per_split;
    float* partials;  // splits * rows * n_tokens floats when splits > 1
    cudaStream_t stream;
};
bool launch_gemm_basic(const GemmLaunch& l);
bool launch_gemm_kquant(const GemmLaunch& l);
bool launch_gemm_iq(const GemmLaunch& l);

// Pairs a block of the grouped expert GEMM takes (an expert with more has several tiles): 64, or 128 where experts
// average 64 pairs or more (each expert's weights are then decoded half as often). The workspace is cut for 64.
constexpr int kGroupedGemmTokens = 64;
constexpr int kGroupedGemmWideTokens = 128;
// The grouped expert GEMM of a prompt window's MoE (gemm_tensor_core.cuh's GroupedGemmParams says what each field
// is): one launch multiplies every expert's pairs by that expert's one or two matrices.
struct GroupedGemmLaunch {
    DType type;
    int n_mats;  // 1 or 2 (gate and up)
    const uint8_t* w[2];
    const uint8_t* const* at[2];
    size_t expert_bytes;
    size_t row_bytes;
    int64_t rows;
    int64_t in;
    const __half* x;
    const float* x_scale;
    int x_div;
    const int32_t* tile_first;  // device ints: the tiles [*tile_first, *tile_end) run
    const int32_t* tile_end;
    const int32_t* tile_expert;
    const int32_t* tile_begin;
    const int32_t* tile_count;
    const int32_t* sorted_pairs;
    int64_t max_tiles;
    float* out[2];
    int64_t ld_out;
    cudaStream_t stream;
    int tile_tokens = kGroupedGemmTokens;  // the pairs a tile holds (the grouping's); kGroupedGemmWideTokens or 64
};
bool launch_grouped_gemm_basic(const GroupedGemmLaunch& l);
bool launch_grouped_gemm_kquant(const GroupedGemmLaunch& l);
bool launch_grouped_gemm_iq(const GroupedGemmLaunch& l);
bool launch_grouped_gemm(const GroupedGemmLaunch& l);
// The shared memory a tensor-core GEMM block of tile_tokens tokens takes (a device with less runs 64-token tiles).
size_t gemm_tile_shared_bytes(int tile_tokens);
// moe.cu's routing of T tokens (softmax, top n_used, the weights): ids and weights [T x n_used].
void route_tokens(const float* logits, int64_t T, int n_expert, int n_used, bool normalize, int32_t* ids,
                  float* weights, cudaStream_t stream);
// Whether weights of this type run in the tensor-core GEMMs (the quant types; float weights do not).
bool supports_gemm_tensor_core(DType type);
// x[t * in + k] = the quantized activations (q, d per 32 values) as fp16 times a power of two per row, and
// row_scale[t] the power of two that undoes it (matmul.cu's prompt path: what the CPU multiplies, in fp16's range).
void activations_to_half(const QuantizedActivations& act, int64_t in, int64_t n_rows, __half* x, float* row_scale,
                         cudaStream_t stream);

// __CUDA_ARCH__ of the kernels loaded for the current device (kernel_arch.cu): 900 for an sm_90 build on an H200, 750
// for a 75-virtual build on the same H200 (its PTX JIT-compiled: the sm_75 code runs); 0 when the build has no code
// the device runs.
int loaded_kernel_arch();
// Whether the current device takes programmatic dependent launches and the loaded kernels were compiled to use them
// (9.0+ both; context.cpp): the launches of launch.cuh then ask for them.
bool programmatic_launch_supported();
// Whether the current device launches thread-block clusters and the loaded kernels have their cluster code (sm_90+
// both; the hyper-connection read's first kernel, the up product's Q8_0 epilogue).
bool clusters_supported();
// Asks, once per kernel and device, for the largest shared-memory carveout of the SM's L1/shared split. Kernels whose
// shared memory differs (a matvec's staged chunks, the elementwise kernels' none) then never make an SM change its
// split between them: Flash-Next decode on the H200, +1.3% (bench/NOTES.md, session 13).
void prefer_shared_memory_carveout(const void* kernel);

// causal_conv's checks of a window (gdn.cu): throws Error on a bad one; false when there is nothing to do.
struct ConvWindowArgs;
bool check_conv_window(const ConvWindowArgs& a);

// Any family (false: a type no family owns).
bool launch_matvec_any(const MatvecLaunch& l);
bool launch_dequantize_any(const DequantizeLaunch& l);

// The activations of a product with weights of type w_type, quantized on the device as matmul does (the CPU's rules);
// n_rows rows of `in` floats. Device bytes of each array for that many values (0 for float weights, which read f32):
struct QuantizedActivationBytes {
    size_t q = 0, d = 0, s16 = 0;
    size_t total() const { return q + d + s16; }
};
QuantizedActivationBytes quantized_activation_bytes(DType w_type, int64_t n_values);
// Whether products with weights of types a and b read the same activations (both f32, Q8_0 or Q8_K).
bool same_activation_format(DType a, DType b);
// Whether w_type's products read quantized activations (false: f32 x).
bool reads_quantized_activations(DType w_type);
// Whether w_type's products read Q8_K activations (256-value blocks; else Q8_0 or f32).
bool reads_q8_k_activations(DType w_type);
// Carves the three arrays out of `base` (quantized_activation_bytes apart).
QuantizedActivations quantized_activations_at(void* base, DType w_type, int64_t n_values);
void quantize_activations(DType w_type, const float* x, int64_t in, int64_t n_rows, const QuantizedActivations& out,
                          cudaStream_t stream);
// The decode-window product y = w . x in two steps, for a caller that quantizes x itself: where matmul would quantize
// x for w (its context scratch), then the product of those activations (n_tokens <= kMaxMatvecTokens).
QuantizedActivations matvec_activations(Context& ctx, const Tensor& w, int64_t n_tokens);
// Whether a window of n_tokens against w runs as that product on Q8_0 activations (blocks of 32), which a kernel
// before it can then write itself, block by block (gated_norm_matmul, decode_attention_matmul).
bool matvec_reads_q8_0(const Tensor& w, int64_t n_tokens);
void matvec_quantized(Context& ctx, const Tensor& w, const QuantizedActivations& act, const float* x, float* y,
                      int64_t n_tokens);
// The same for the rows hidden[t] = silu(gate[t]) * up[t] (cpu::silu_mul), computed on the way: one launch instead of
// two. hidden (may be null for quant types) also gets the f32 values.
struct SwiGluQuantize {
    DType w_type;
    const float* gate;
    const float* up;
    int64_t stride;  // floats between rows of gate (and of up)
    int64_t in;
    int64_t n_rows;
    float* hidden;
    QuantizedActivations out;
    cudaStream_t stream;
};
void quantize_swiglu(const SwiGluQuantize& args);
// The rows silu(x[t] / divisor) quantized for w_type (a quantized type), as the hyper-connection read's low-rank
// step: one launch instead of the silu and the quantizer.
void quantize_silu_scaled(DType w_type, const float* x, float divisor, int64_t in, int64_t n_rows,
                          const QuantizedActivations& out, cudaStream_t stream);

}  // namespace strata::cuda
