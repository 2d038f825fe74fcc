// Scalar reference dot products of the basic weight types: llama.cpp's generic algorithms.
// F32 / F16 / BF16 weights against F32 activations: cpu::dot (eight interleaved partial sums, fixed order).
// Q8_0 / Q4_0 / IQ4_NL against Q8_0 activations: an exact integer sum per block of 32, multiplied once by the product
// of the two f16 block scales and added to a float sum.
// IQ4_XS against Q8_K: per super-block, the exact integer sums of the 8 sub-blocks weighted by their integer scales
// (ls - 32), then one multiply by the f16 weight scale and the activation's float scale.
#include <cstdint>
#include <vector>

#include "backend/cpu/dot_kernels.h"
#include "backend/cpu/ops.h"
#include "core/dtype.h"
#include "core/quant_blocks.h"
#include "core/quant_tables.h"

namespace strata::cpu {

namespace {

// Float weights: the row converted to f32 once per call (through dequantize_row's table), then cpu::dot's eight
// interleaved partial sums for each column: a fixed order, the same whatever n_cols is, and without the serial
// dependency of a single running sum.
void dot_float_columns(DType type, int64_t n, const void* w, const void* a, size_t a_stride, float* out, int n_cols) {
    const float* row = static_cast<const float*>(w);
    thread_local std::vector<float> converted;  // grows once
    if (type != DType::F32) {
        converted.resize(static_cast<size_t>(n));
        dequantize_row(type, w, converted.data(), n);
        row = converted.data();
    }
    for (int c = 0; c < n_cols; ++c)
        out[c] = dot(row, reinterpret_cast<const float*>(static_cast<const uint8_t*>(a) + c * a_stride), n);
}

template <DType T>
void float_columns(int64_t n, const void* w, const void* a, size_t a_stride, float* out, int n_cols) {
    dot_float_columns(T, n, w, a, a_stride, out, n_cols);
}

float dot_q8_0_one(int64_t n, const BlockQ8_0* x, const BlockQ8_0* y) {
    float sum = 0;
    for (int64_t i = 0; i < n / kQ8_0Block; ++i) {
        int32_t s = 0;
        for (int j = 0; j < 32; ++j) s += x[i].qs[j] * y[i].qs[j];
        sum += static_cast<float>(s) * (f16_to_f32(x[i].d) * f16_to_f32(y[i].d));
    }
    return sum;
}

float dot_q4_0_one(int64_t n, const BlockQ4_0* x, const BlockQ8_0* y) {
    float sum = 0;
    for (int64_t i = 0; i < n / kQ4_0Block; ++i) {
        int32_t s = 0;
        for (int j = 0; j < 16; ++j) {
            s += ((x[i].qs[j] & 0xF) - 8) * y[i].qs[j];
            s += ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + 16];
        }
        sum += static_cast<float>(s) * (f16_to_f32(x[i].d) * f16_to_f32(y[i].d));
    }
    return sum;
}

float dot_iq4_nl_one(int64_t n, const BlockIQ4_NL* x, const BlockQ8_0* y) {
    float sum = 0;
    for (int64_t i = 0; i < n / kIQ4NLBlock; ++i) {
        int32_t s = 0;
        for (int j = 0; j < 16; ++j) {
            s += quant::kIQ4NLValues[x[i].qs[j] & 0xF] * y[i].qs[j];
            s += quant::kIQ4NLValues[x[i].qs[j] >> 4] * y[i].qs[j + 16];
        }
        sum += static_cast<float>(s) * (f16_to_f32(x[i].d) * f16_to_f32(y[i].d));
    }
    return sum;
}

float dot_iq4_xs_one(int64_t n, const BlockIQ4_XS* x, const BlockQ8_K* y) {
    float sum = 0;
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        int32_t isum = 0;
        for (int j = 0; j < 8; ++j) {
            const int ls = ((x[i].scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | (((x[i].scales_h >> (2 * j)) & 3) << 4);
            const uint8_t* q = x[i].qs + 16 * j;
            const int8_t* a = y[i].qs + 32 * j;
            int32_t s = 0;
            for (int l = 0; l < 16; ++l)
                s += quant::kIQ4NLValues[q[l] & 0xF] * a[l] + quant::kIQ4NLValues[q[l] >> 4] * a[l + 16];
            isum += (ls - 32) * s;
        }
        sum += f16_to_f32(x[i].d) * y[i].d * static_cast<float>(isum);
    }
    return sum;
}

// Each column on its own: the scalar path is trivially independent of n_cols.
template <typename W, typename A, float (*One)(int64_t, const W*, const A*)>
void each_column(int64_t n, const void* w, const void* a, size_t a_stride, float* out, int n_cols) {
    for (int c = 0; c < n_cols; ++c)
        out[c] = One(n, static_cast<const W*>(w),
                     reinterpret_cast<const A*>(static_cast<const uint8_t*>(a) + c * a_stride));
}

}  // namespace

void register_dots_basic_scalar(DotTable& t) {
    t.set(DType::F32, float_columns<DType::F32>);
    t.set(DType::F16, float_columns<DType::F16>);
    t.set(DType::BF16, float_columns<DType::BF16>);
    t.set(DType::Q8_0, each_column<BlockQ8_0, BlockQ8_0, dot_q8_0_one>);
    t.set(DType::Q4_0, each_column<BlockQ4_0, BlockQ8_0, dot_q4_0_one>);
    t.set(DType::IQ4_NL, each_column<BlockIQ4_NL, BlockQ8_0, dot_iq4_nl_one>);
    t.set(DType::IQ4_XS, each_column<BlockIQ4_XS, BlockQ8_K, dot_iq4_xs_one>);
}

}  // namespace strata::cpu
