// Dot products of quantized weight rows with quantized activation rows: the kernels behind every CPU matmul.
// Each weight type has llama.cpp's activation type (Q8_K for k- and i-quants, Q8_0 for Q8_0 / Q4_0 / IQ4_NL, F32 for
// float weights), so results agree with llama.cpp's. Kernels exist per instruction set (scalar, AVX2, AVX-512 with
// VNNI); the best one this CPU supports is picked at run time by CPUID.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "core/dtype.h"

namespace strata::cpu {

// Avx2Vnni is AVX2 plus AVX-VNNI (VEX vpdpbusd: Alder Lake and later, Zen 5): it has no dot kernels of its own (its
// slot falls back to AVX2's) but its own packed GEMMs.
enum class Isa : int { Scalar = 0, Avx2 = 1, Avx2Vnni = 2, Avx512 = 3 };
constexpr int kIsaCount = 4;
const char* isa_name(Isa isa);

// The best instruction set this CPU and OS support (AVX2 needs AVX2, FMA, F16C and BMI2; Avx2Vnni adds AVX-VNNI;
// AVX-512 adds F, BW, DQ, VL and VNNI to AVX2).
Isa detected_isa();
// The set the matmuls use: detected_isa(), lowered by STRATA_ISA in the environment: scalar, avx2-novnni (plain AVX2),
// avx2 (the AVX2 class: AVX-VNNI where the CPU has it), avx512.
Isa active_isa();
// Tests: make active_isa() return `isa` (capped at detected_isa()) until called with nullopt, so one process can run
// the matmuls on every instruction set.
// (An instruction set this CPU lacks gives the best one it has below it.)
void override_active_isa(std::optional<Isa> isa);
// Whether this CPU runs instruction set `isa` (for Avx2Vnni: AVX2 and AVX-VNNI, whatever else it has).
bool supports_isa(Isa isa);

// llama.cpp's vec_dot_type of a weight type.
DType activation_type(DType weight);
// Quantizes n floats (a multiple of the activation type's block) into activation type `act` (F32: a copy). The
// numerics are llama.cpp's reference quantizers, byte for byte.
void quantize_activations(DType act, const float* x, void* dst, int64_t n);

// out[c] = dot(weight row w, activation row c) for c < n_cols, where activation row c starts at
// a + c * a_stride bytes; n elements, a multiple of the weight's block. n_cols is 1..dot_columns(type, isa): every
// kernel takes kDotCols, kernels whose weight decoding costs more than a column's arithmetic take up to kMaxDotCols.
// Contract: out[c] is bit-identical to what a call with n_cols = 1 on that column alone returns, so results never
// depend on how tokens are grouped.
constexpr int kDotCols = 4;
constexpr int kMaxDotCols = 16;
using DotFn = void (*)(int64_t n, const void* w, const void* a, size_t a_stride, float* out, int n_cols);

// The kernel for weight type w on instruction set isa: the best registered one at or below isa (every computable
// type has a scalar kernel); throws Error for a type without any.
DotFn dot_kernel(DType w, Isa isa);
// The most columns that kernel takes per call.
int dot_columns(DType w, Isa isa);
// Whether a kernel written for exactly this (type, isa) pair is registered (tests report the others as skipped).
bool has_native_dot(DType w, Isa isa);

}  // namespace strata::cpu
