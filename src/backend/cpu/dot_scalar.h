// Private to the scalar kernel files (compiled without -m flags; never include it from an _avx2 / _avx512 file): the
// multi-column DotFn built from a one-column reference dot product (trivially bit-identical per column), and the
// signed grid-entry dot product of the IQ2/IQ3 reference kernels.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/quant_blocks.h"
#include "core/quant_tables.h"

namespace strata::cpu {

// sum_j grid_byte(entry, j) * (+-a[j]) over the `count` elements of one grid entry (8 for IQ2_XS, 4 for IQ3); bit j
// of signs negates element j.
inline int32_t signed_grid_dot(uint64_t entry, int count, uint32_t signs, const int8_t* a) {
    int32_t s = 0;
    for (int j = 0; j < count; ++j) {
        const int32_t v = quant::grid_byte(entry, j) * a[j];
        s += (signs >> j) & 1 ? -v : v;
    }
    return s;
}

template <typename Block, float (*One)(int64_t n, const Block* w, const BlockQ8_K* a)>
void scalar_q8k_columns(int64_t n, const void* w, const void* a, size_t a_stride, float* out, int n_cols) {
    const auto* x = static_cast<const Block*>(w);
    for (int c = 0; c < n_cols; ++c)
        out[c] = One(n, x, reinterpret_cast<const BlockQ8_K*>(static_cast<const uint8_t*>(a) + c * a_stride));
}

}  // namespace strata::cpu
