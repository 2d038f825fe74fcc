// Scalar reference dot products of Q4_K / Q5_K / Q6_K weights with Q8_K activations: llama.cpp's generic integer
// algorithm. Per super-block, exact integer sums per sub-block are multiplied by the sub-block's integer scale and
// added up; the float scales (weight d and dmin, activation d) multiply once per super-block. Mins (Q4_K, Q5_K) and
// Q6_K's -32 offset go through the activation's bsums, the sums of each 16 activation values.
#include <cstring>

#include "backend/cpu/dot_kernels.h"
#include "backend/cpu/dot_scalar.h"
#include "core/dtype.h"
#include "core/quant_blocks.h"

namespace strata::cpu {

namespace {

// The 8 6-bit scales and mins of a Q4_K / Q5_K super-block.
void scales_and_mins(const uint8_t* packed, uint8_t* scales, uint8_t* mins) {
    for (int j = 0; j < 8; ++j) quant::unpack_scale_min_k4(packed, j, &scales[j], &mins[j]);
}

// sum over sub-blocks j of mins[j] * (sum of the 32 activations of sub-block j), from the bsums of 16.
int32_t mins_term(const uint8_t* mins, const int16_t* bsums) {
    int32_t s = 0;
    for (int j = 0; j < 8; ++j) s += mins[j] * (bsums[2 * j] + bsums[2 * j + 1]);
    return s;
}

float dot_q4_k_one(int64_t n, const BlockQ4_K* x, const BlockQ8_K* y) {
    float sum = 0;
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        uint8_t scales[8], mins[8];
        scales_and_mins(x[i].scales, scales, mins);
        int32_t isum = 0;
        for (int j = 0; j < 8; ++j) {
            const uint8_t* q = x[i].qs + 32 * (j / 2);
            const int8_t* a = y[i].qs + 32 * j;
            const int shift = 4 * (j % 2);
            int32_t s = 0;
            for (int l = 0; l < 32; ++l) s += ((q[l] >> shift) & 0xF) * a[l];
            isum += scales[j] * s;
        }
        const float dy = y[i].d;
        sum += f16_to_f32(x[i].d) * dy * static_cast<float>(isum) -
               f16_to_f32(x[i].dmin) * dy * static_cast<float>(mins_term(mins, y[i].bsums));
    }
    return sum;
}

float dot_q5_k_one(int64_t n, const BlockQ5_K* x, const BlockQ8_K* y) {
    float sum = 0;
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        uint8_t scales[8], mins[8];
        scales_and_mins(x[i].scales, scales, mins);
        int32_t isum = 0;
        for (int j = 0; j < 8; ++j) {
            const uint8_t* q = x[i].qs + 32 * (j / 2);
            const int8_t* a = y[i].qs + 32 * j;
            const int shift = 4 * (j % 2);
            int32_t s = 0;
            for (int l = 0; l < 32; ++l) {
                const int high = (x[i].qh[l] >> j) & 1;  // bit j of qh[l]: the fifth bit of sub-block j
                s += (((q[l] >> shift) & 0xF) | (high << 4)) * a[l];
            }
            isum += scales[j] * s;
        }
        const float dy = y[i].d;
        sum += f16_to_f32(x[i].d) * dy * static_cast<float>(isum) -
               f16_to_f32(x[i].dmin) * dy * static_cast<float>(mins_term(mins, y[i].bsums));
    }
    return sum;
}

float dot_q6_k_one(int64_t n, const BlockQ6_K* x, const BlockQ8_K* y) {
    float sum = 0;
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        int32_t isum = 0, offset = 0;
        for (int sb = 0; sb < 16; ++sb) {
            // Sub-block sb: 128-element half sb / 8, quarter (sb % 8) / 2 of it.
            const int half = sb / 8, k = (sb % 8) / 2, l0 = 16 * (sb % 2);
            const uint8_t* ql = x[i].ql + 64 * half + 32 * (k % 2);
            const uint8_t* qh = x[i].qh + 32 * half;
            const int8_t* a = y[i].qs + 16 * sb;
            int32_t s = 0;
            for (int l = 0; l < 16; ++l) {
                const int low = (ql[l0 + l] >> (4 * (k / 2))) & 0xF;
                const int high = (qh[l0 + l] >> (2 * k)) & 3;
                s += (low | (high << 4)) * a[l];
            }
            isum += x[i].scales[sb] * s;
            offset += x[i].scales[sb] * y[i].bsums[sb];
        }
        sum += f16_to_f32(x[i].d) * y[i].d * static_cast<float>(isum - 32 * offset);
    }
    return sum;
}

}  // namespace

void register_dots_kquant_scalar(DotTable& t) {
    t.set(DType::Q4_K, scalar_q8k_columns<BlockQ4_K, dot_q4_k_one>);
    t.set(DType::Q5_K, scalar_q8k_columns<BlockQ5_K, dot_q5_k_one>);
    t.set(DType::Q6_K, scalar_q8k_columns<BlockQ6_K, dot_q6_k_one>);
}

}  // namespace strata::cpu
