// Private to the CPU backend: the AVX-512 kernels over packed Q8_0 weights (packed.h) and the activation layout they
// read. Defined in gemm_q8_0_avx512.cpp; called only when active_isa() is AVX-512.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::cpu {

// Per 32 activations: the 32 Q8_0 quants plus 128 (as unsigned bytes, what vpdpbusd multiplies) and the block scale
// as f32. The bias is taken back out with the weights' quant sums.
constexpr size_t kBiasedBlockBytes = 36;
// llama.cpp's reference Q8_0 quantization (byte for byte the same quants and f16 scale) in that layout.
void quantize_q8_0_biased(const float* x, uint8_t* dst, int64_t n);

// y[c * y_stride + r] = row r of one packed group times activation column c, for r < n_rows (<= 16) and
// c < n_cols (<= 8); activation column c starts at act + c * act_stride.
struct PackedGemm {
    const uint8_t* group;
    int64_t n_blocks;
    const uint8_t* act;
    size_t act_stride;
    int n_cols;
    float* y;
    size_t y_stride;
    int n_rows;
};
constexpr int kPackedCols = 8;
void gemm_q8_0_packed(const PackedGemm& g);

}  // namespace strata::cpu
