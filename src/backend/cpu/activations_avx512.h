// Private to the CPU backend: AVX-512 versions of the array activations in ops.h (activations_avx512.cpp), called
// only when active_isa() is AVX-512.
#pragma once

#include <cstdint>

namespace strata::cpu {

void sigmoid_avx512(float* x, int64_t n);
void silu_mul_avx512(float* g, const float* u, int64_t n);

}  // namespace strata::cpu
