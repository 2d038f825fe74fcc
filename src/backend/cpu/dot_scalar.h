// Private to the scalar kernel files (compiled without -m flags; never include it from an _avx2 / _avx512 file): the
// multi-column DotFn built from a one-column reference dot product, which is trivially bit-identical per column.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/quant_blocks.h"

namespace strata::cpu {

template <typename Block, float (*One)(int64_t n, const Block* w, const BlockQ8_K* a)>
void scalar_q8k_columns(int64_t n, const void* w, const void* a, size_t a_stride, float* out, int n_cols) {
    const auto* x = static_cast<const Block*>(w);
    for (int c = 0; c < n_cols; ++c)
        out[c] = One(n, x, reinterpret_cast<const BlockQ8_K*>(static_cast<const uint8_t*>(a) + c * a_stride));
}

}  // namespace strata::cpu
