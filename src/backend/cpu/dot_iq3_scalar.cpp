// Scalar reference dot products of IQ3_XXS / IQ3_S weights with Q8_K activations: llama.cpp's generic integer
// algorithm. Each group of 32 weights is an exact integer sum of grid magnitude x signed activation, multiplied by
// the group's odd integer scale 2 * ls + 1; the super-block's float scales (weight d times activation d) multiply the
// integer total once. IQ3_XXS's dequantized value is d * (2 * ls + 1) / 4 * grid, hence the final factor 1/4.
#include <cstring>

#include "backend/cpu/dot_kernels.h"
#include "backend/cpu/dot_scalar.h"
#include "core/dtype.h"
#include "core/quant_blocks.h"
#include "core/quant_tables.h"

namespace strata::cpu {

namespace {

float dot_iq3_xxs_one(int64_t n, const BlockIQ3_XXS* x, const BlockQ8_K* y) {
    float sum = 0;
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        const uint8_t* qs = x[i].qs;
        const uint8_t* scales_and_signs = x[i].qs + kQK_K / 4;
        const int8_t* a = y[i].qs;
        int32_t isum = 0;
        for (int ib32 = 0; ib32 < 8; ++ib32) {
            uint32_t aux;
            std::memcpy(&aux, scales_and_signs + 4 * ib32, 4);
            int32_t s = 0;
            for (int l = 0; l < 4; ++l, qs += 2, a += 8) {
                const uint32_t signs = quant::even_signs(aux >> (7 * l));
                s += signed_grid_dot(quant::kIQ3XXSGrid[qs[0]], 4, signs, a);
                s += signed_grid_dot(quant::kIQ3XXSGrid[qs[1]], 4, signs >> 4, a + 4);
            }
            isum += static_cast<int32_t>(2 * (aux >> 28) + 1) * s;
        }
        sum += f16_to_f32(x[i].d) * y[i].d * static_cast<float>(isum);
    }
    return 0.25f * sum;
}

float dot_iq3_s_one(int64_t n, const BlockIQ3_S* x, const BlockQ8_K* y) {
    float sum = 0;
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        const int8_t* a = y[i].qs;
        int32_t isum = 0;
        for (int ib32 = 0; ib32 < 8; ++ib32) {
            const uint8_t* qs = x[i].qs + 8 * ib32;
            const uint32_t qh = x[i].qh[ib32];
            const uint8_t* signs = x[i].signs + 4 * ib32;
            int32_t s = 0;
            for (int k = 0; k < 8; ++k, a += 4) {
                // Grid entry k of this group: low 8 index bits in qs[k], the ninth is bit k of qh.
                const uint32_t entry = quant::kIQ3SGrid[qs[k] | (((qh >> k) & 1) << 8)];
                s += signed_grid_dot(entry, 4, static_cast<uint32_t>(signs[k / 2] >> (4 * (k % 2))), a);
            }
            const int32_t ls = (x[i].scales[ib32 / 2] >> (4 * (ib32 % 2))) & 0xF;
            isum += (2 * ls + 1) * s;
        }
        sum += f16_to_f32(x[i].d) * y[i].d * static_cast<float>(isum);
    }
    return sum;
}

}  // namespace

void register_dots_iq3_scalar(DotTable& t) {
    t.set(DType::IQ3_XXS, scalar_q8k_columns<BlockIQ3_XXS, dot_iq3_xxs_one>);
    t.set(DType::IQ3_S, scalar_q8k_columns<BlockIQ3_S, dot_iq3_s_one>);
}

}  // namespace strata::cpu
