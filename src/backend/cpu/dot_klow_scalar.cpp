// Scalar reference dot products of Q2_K / Q3_K weights with Q8_K activations: llama.cpp's generic integer algorithm.
// Per super-block, exact integer sums per 16-value sub-block are multiplied by the sub-block's integer scale and
// added up; the float scales multiply once per super-block. Q2_K's mins go through the activation's bsums (the sums
// of each 16 activation values); Q3_K's "minus 4 where the high bit is clear" is applied to each value.
#include "backend/cpu/dot_kernels.h"
#include "backend/cpu/dot_scalar.h"
#include "core/dtype.h"
#include "core/quant_blocks.h"

namespace strata::cpu {

namespace {

// The 2-bit field of element l (0..31) of 32-element group g (0..7) in Q2_K / Q3_K qs: group g lives in the 32
// bytes of half g / 4, at bit offset 2 * (g % 4).
inline int two_bits(const uint8_t* qs, int g, int l) { return (qs[32 * (g / 4) + l] >> (2 * (g % 4))) & 3; }

float dot_q2_k_one(int64_t n, const BlockQ2_K* x, const BlockQ8_K* y) {
    float sum = 0;
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        int32_t isum = 0, mins = 0;
        for (int sb = 0; sb < 16; ++sb) {
            const int g = sb / 2, l0 = 16 * (sb % 2);
            const int8_t* a = y[i].qs + 16 * sb;
            int32_t s = 0;
            for (int l = 0; l < 16; ++l) s += two_bits(x[i].qs, g, l0 + l) * a[l];
            isum += (x[i].scales[sb] & 0xF) * s;
            mins += (x[i].scales[sb] >> 4) * y[i].bsums[sb];
        }
        const float dy = y[i].d;
        sum += dy * f16_to_f32(x[i].d) * static_cast<float>(isum) -
               dy * f16_to_f32(x[i].dmin) * static_cast<float>(mins);
    }
    return sum;
}

float dot_q3_k_one(int64_t n, const BlockQ3_K* x, const BlockQ8_K* y) {
    float sum = 0;
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        int32_t isum = 0;
        for (int sb = 0; sb < 16; ++sb) {
            const int g = sb / 2, l0 = 16 * (sb % 2);
            const int8_t* a = y[i].qs + 16 * sb;
            int32_t s = 0;
            for (int l = 0; l < 16; ++l) {
                // The high bit of element 32g + l is bit g of hmask[l]; clear means the value is 4 lower.
                const int high = (x[i].hmask[l0 + l] >> g) & 1;
                s += (two_bits(x[i].qs, g, l0 + l) - (high ? 0 : 4)) * a[l];
            }
            isum += (quant::unpack_scale_q3_k(x[i].scales, sb) - 32) * s;
        }
        sum += y[i].d * f16_to_f32(x[i].d) * static_cast<float>(isum);
    }
    return sum;
}

}  // namespace

void register_dots_klow_scalar(DotTable& t) {
    t.set(DType::Q2_K, scalar_q8k_columns<BlockQ2_K, dot_q2_k_one>);
    t.set(DType::Q3_K, scalar_q8k_columns<BlockQ3_K, dot_q3_k_one>);
}

}  // namespace strata::cpu
