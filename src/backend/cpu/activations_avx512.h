// Private to the CPU backend: AVX-512 versions of the array activations in ops.h (activations_avx512.cpp), of attend
// (attend_avx512.cpp) and of gated_delta_step (delta_step_avx512.cpp), called only when active_isa() is AVX-512; and
// their AVX2 forms for the AVX2 instruction sets.
#pragma once

#include <cstdint>

#include "backend/cpu/ops.h"

namespace strata::cpu {

void sigmoid_avx512(float* x, int64_t n);
void silu_avx512(float* x, int64_t n);
void silu_mul_avx512(float* g, const float* u, int64_t n);
// The same with AVX2 (activations_avx2.cpp), for the AVX2 instruction sets.
void sigmoid_avx2(float* x, int64_t n);
void silu_avx2(float* x, int64_t n);
void silu_mul_avx2(float* g, const float* u, int64_t n);
// false (nothing done) for a head size it has no register form for: 64, 128 and 256 have one.
bool attend_avx512(const AttendArgs& args);
// false (nothing done) unless the value head is 64 or 128 wide.
bool gated_delta_step_avx512(const DeltaStepArgs& args);
// The same with AVX2 (attend_avx2.cpp, delta_step_avx2.cpp): false unless head_dim is a multiple of 64 / the value
// head a multiple of 32.
bool attend_avx2(const AttendArgs& args);
bool gated_delta_step_avx2(const DeltaStepArgs& args);

}  // namespace strata::cpu
