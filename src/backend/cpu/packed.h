// Weights repacked for the CPU's AVX-512 GEMM (llama.cpp's "repack" buffers and ik_llama.cpp's run-time repacking
// do the same). Q8_0 rows are interleaved in groups of 16: for each 32-element block, the 16 rows' scales, the 16
// rows' sums of quants, then their quants 4 bytes at a time, so one 64-byte load holds 4 consecutive quants of all
// 16 rows and one vpdpbusd against 4 broadcast activation bytes advances 16 dot products. A unit of weights is then
// reused by up to 8 tokens from registers instead of once per token.
//
// Every output keeps the numerics of one fixed order: acc = fma(float(exact block sum), dw * da, acc) over the blocks
// in order, so a token's result is the same whichever other tokens share the call (the matmul contract).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace strata::cpu {

constexpr int64_t kPackRows = 16;
// One block of a group: 16 f16 scales, 16 int16 quant sums, 16 x 32 quants.
constexpr size_t kPackedBlockBytes = 32 + 32 + 16 * 32;

// Whether w (2-D, or 3-D with one matrix per ne[2] slice) gets a packed form: Q8_0, and the matmuls run AVX-512 VNNI
// (active_isa(); with a lower one the copy would never be read).
bool packable(const Tensor& w);
// Bytes of one group of 16 rows (ne[0] / 32 blocks), of one slice, and of the whole packed tensor.
size_t packed_group_bytes(const Tensor& w);
size_t packed_slice_bytes(const Tensor& w);
size_t packed_bytes(const Tensor& w);
// Writes w's packed form to dst (packed_bytes(w), 64-byte aligned). Rows past the last are zero (scale 0).
void pack_rows(const Tensor& w, uint8_t* dst);
// Where rows [row_begin, ...) of slice `slice` start in w's packed form, or null when w has none or row_begin does not
// start a group (the view then uses the row kernels).
const void* packed_rows(const Tensor& w, int64_t slice, int64_t row_begin);

// Owns packed copies of a model's weights.
class PackedWeights {
  public:
    // When w is packable: packs it, points w.packed at the copy and returns true.
    bool pack(Tensor& w);
    size_t bytes() const { return bytes_; }
    size_t count() const { return buffers_.size(); }

  private:
    struct Free {
        void operator()(uint8_t* p) const;
    };
    std::vector<std::unique_ptr<uint8_t, Free>> buffers_;
    size_t bytes_ = 0;
};

}  // namespace strata::cpu
