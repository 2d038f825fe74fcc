// Private to the CUDA backend: what the host code (context.cpp, matmul.cu) calls in the kernel files.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace strata::cuda {

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
};
bool launch_dequantize_float(const DequantizeLaunch& l);
bool launch_dequantize_basic(const DequantizeLaunch& l);
bool launch_dequantize_kquant(const DequantizeLaunch& l);
bool launch_dequantize_iq(const DequantizeLaunch& l);

}  // namespace strata::cuda
