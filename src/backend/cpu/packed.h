// Weights repacked for the CPU's GEMMs (AVX-512, and AVX2 reading each 64-byte unit as two 8-row halves) (llama.cpp's
// "repack" buffers and ik_llama.cpp's run-time repacking do the same). Rows are interleaved in groups of 16, so one
// 64-byte load holds 4 consecutive quants of all 16 rows and one vpdpbusd against 4 broadcast activation bytes advances
// 16 dot products; a unit of weights is then reused by several tokens from registers instead of once per token. Per
// block of each type, for the 16 rows:
//   Q8_0 (32 values, 576 bytes): f16 scales d, int16 quant sums, then quants 4 at a time (64 bytes per 4 values).
//   Q4_K (256 values, 2,496 bytes): f16 d, f16 dmin, the 8 sub-block scales as bytes (16 per sub-block), the mins
//     as int16 pairs (sub-blocks 2p, 2p+1; 64 bytes per pair), then per pair p the nibble bytes 4 at a time: low
//     nibbles are sub-block 2p, high nibbles 2p+1, as in the format.
//   Q5_K (256 values, 3,008 bytes; AVX2 only): the Q4_K layout of its scales, mins and low nibbles, then the fifth
//     bits: qh bytes 4k .. 4k+3 of lane l at 2496 + 64k + 4l (bit j of qh[e] is value e of sub-block j, as in the
//     format).
//   Q6_K (256 values, 3,424 bytes; AVX2 only): f16 d, the 16 sub-block scales as int8 (16 per sub-block), the int32
//     -128 x sum over sub-blocks of scale x the sum of (q - 32) (what biased activations add, taken back out), then per
//     sub-block j three 64-byte units of its 16 6-bit values q, 4 per row: of values 4k+i (k < 4), unit 0 byte i is
//     q_0 | (q_2 >> 4) << 6, unit 1 q_1 | (q_3 >> 4) << 6, unit 2 (q_2 & 15) | (q_3 & 15) << 4.
//   IQ4_XS (256 values, 2,272 bytes; AVX2 only): f16 d, the 8 sub-block scales ls - 32 as int8 (16 per sub-block),
//     the int32 -128 x sum over sub-blocks of scale x the sum of its table values, then per sub-block j the 16 nibble
//     bytes of each row 4 at a time: bytes 16j + 4k .. +3 of lane l at 224 + 256j + 64k + 4l (low nibbles are values
//     4k.., high nibbles 16 + 4k.., as in the format).
//   IQ3_XXS (256 values, 1,760 bytes; AVX2 only): f16 d, the 8 odd scales 2 ls + 1 as int8 (16 per sub-block), the
//     int32 -128 x sum over sub-blocks of scale x the sum of its signed grid values, then per sub-block j the grid
//     index bytes (index k covers values 4k..4k+3; lane l's at 224 + 128j + 16k + l), then per sub-block j each
//     row's 32 sign bits (bit e is value e's, the format's 7 stored bits and even parity per 8 values) at
//     1248 + 64j + 4l.
//   IQ3_S (256 values, 1,888 bytes; AVX2 only): the IQ3_XXS layout with the low 8 bits of its 9-bit indices, the
//     odd scales 2 ls + 1 and the format's own sign bits, then each row's qh byte of sub-block j (bit k: index k's
//     ninth bit) at 1760 + 16j + l.
//
// Every output keeps the numerics of one fixed order over the blocks (gemm_packed.h), so a token's result is the same
// whichever other tokens share the call (the matmul contract).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cpu/quant_dot.h"
#include "core/tensor.h"

namespace strata::cpu {

constexpr int64_t kPackRows = 16;
constexpr size_t kPackedQ8_0BlockBytes = 32 + 32 + 16 * 32;
constexpr size_t kPackedQ4_KBlockBytes = 32 + 32 + 128 + 256 + 16 * 128;
constexpr size_t kPackedQ5_KBlockBytes = kPackedQ4_KBlockBytes + 16 * 32;
constexpr size_t kPackedQ6_KBlockBytes = 32 + 256 + 64 + 16 * 192;
constexpr size_t kPackedIQ4_XSBlockBytes = 32 + 128 + 64 + 16 * 128;
constexpr size_t kPackedIQ3_XXSBlockBytes = 32 + 128 + 64 + 16 * 64 + 16 * 32;
constexpr size_t kPackedIQ3_SBlockBytes = kPackedIQ3_XXSBlockBytes + 16 * 8;

// Whether w (2-D, or 3-D with one matrix per ne[2] slice) gets a packed form: Q8_0 or Q4_K with the matmuls on AVX2
// or more (active_isa(); with scalar code the copy would never be read), Q5_K, Q6_K, IQ4_XS and IQ3_XXS on the AVX2
// class only (AVX-512 has no GEMM for them and keeps its row kernels).
bool packable(const Tensor& w);
// Whether instruction set isa has a GEMM over packed weights of type t (otherwise a packed copy is ignored).
bool has_packed_gemm(DType t, Isa isa);
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
