#include "backend/cpu/packed.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>

#include "backend/cpu/gemm_packed.h"
#include "backend/cpu/quant_dot.h"
#include "core/error.h"
#include "core/quant_blocks.h"
#include "core/quant_tables.h"

namespace strata::cpu {

namespace {

size_t packed_block_bytes(DType t) {
    switch (t) {
        case DType::Q8_0:
            return kPackedQ8_0BlockBytes;
        case DType::Q4_K:
            return kPackedQ4_KBlockBytes;
        case DType::Q5_K:
            return kPackedQ5_KBlockBytes;
        case DType::IQ4_XS:
            return kPackedIQ4_XSBlockBytes;
        case DType::IQ3_XXS:
            return kPackedIQ3_XXSBlockBytes;
        case DType::IQ3_S:
            return kPackedIQ3_SBlockBytes;
        default:
            STRATA_ASSERT(t == DType::Q6_K);
            return kPackedQ6_KBlockBytes;
    }
}

void pack_q8_0_row(const BlockQ8_0* row, int64_t nb, int lane, uint8_t* group) {
    for (int64_t b = 0; b < nb; ++b) {
        uint8_t* block = group + static_cast<size_t>(b) * kPackedQ8_0BlockBytes;
        std::memcpy(block + 2 * lane, &row[b].d, 2);
        int16_t sum = 0;
        for (int j = 0; j < 32; ++j) sum = static_cast<int16_t>(sum + row[b].qs[j]);
        std::memcpy(block + 32 + 2 * lane, &sum, 2);
        // Quants 4k..4k+3 of lane l at 64 + 64k + 4l.
        for (int k = 0; k < 8; ++k) std::memcpy(block + 64 + 64 * k + 4 * lane, row[b].qs + 4 * k, 4);
    }
}

// Q4_K, or Q5_K (BlockQ5_K: the same fields plus qh) with its fifth bits after the Q4_K part.
template <typename Block>
void pack_q4_k_row(const Block* row, int64_t nb, int lane, uint8_t* group) {
    constexpr bool kFiveBits = std::is_same_v<Block, BlockQ5_K>;
    for (int64_t b = 0; b < nb; ++b) {
        uint8_t* block = group + static_cast<size_t>(b) * (kFiveBits ? kPackedQ5_KBlockBytes : kPackedQ4_KBlockBytes);
        std::memcpy(block + 2 * lane, &row[b].d, 2);
        std::memcpy(block + 32 + 2 * lane, &row[b].dmin, 2);
        for (int j = 0; j < 8; ++j) {
            uint8_t scale = 0, min = 0;
            quant::unpack_scale_min_k4(row[b].scales, j, &scale, &min);
            block[64 + 16 * j + lane] = scale;
            const int16_t m = min;
            std::memcpy(block + 192 + 64 * (j / 2) + 4 * lane + 2 * (j % 2), &m, 2);
        }
        // Nibble bytes 32p + 4k .. +3 of lane l at 448 + 512p + 64k + 4l.
        for (int p = 0; p < 4; ++p)
            for (int k = 0; k < 8; ++k)
                std::memcpy(block + 448 + 512 * p + 64 * k + 4 * lane, row[b].qs + 32 * p + 4 * k, 4);
        if constexpr (kFiveBits) {
            for (int k = 0; k < 8; ++k) std::memcpy(block + 2496 + 64 * k + 4 * lane, row[b].qh + 4 * k, 4);
        }
    }
}

// Value v (< 256) of a Q6_K super-block, 0..63: in half v / 128, quarter q = (v % 128) / 32 and position l = v % 32,
// the low nibble of ql[64 half + 32 (q % 2) + l] (the high one for q >= 2) and bits 2q, 2q+1 of qh[32 half + l].
int q6_k_value(const BlockQ6_K& b, int v) {
    const int half = v / 128, quarter = (v % 128) / 32, l = v % 32;
    const int low = (b.ql[64 * half + 32 * (quarter % 2) + l] >> (4 * (quarter / 2))) & 0xF;
    const int high = (b.qh[32 * half + l] >> (2 * quarter)) & 3;
    return low | (high << 4);
}

void pack_q6_k_row(const BlockQ6_K* row, int64_t nb, int lane, uint8_t* group) {
    for (int64_t b = 0; b < nb; ++b) {
        uint8_t* block = group + static_cast<size_t>(b) * kPackedQ6_KBlockBytes;
        std::memcpy(block + 2 * lane, &row[b].d, 2);
        int values[kQK_K];
        for (int v = 0; v < kQK_K; ++v) values[v] = q6_k_value(row[b], v);
        int32_t weight_sums = 0;
        for (int j = 0; j < 16; ++j) {
            block[32 + 16 * j + lane] = static_cast<uint8_t>(row[b].scales[j]);
            int32_t sum = 0;
            uint8_t* units = block + 352 + 192 * j + 4 * lane;
            for (int i = 0; i < 4; ++i) {
                int q[4];
                for (int k = 0; k < 4; ++k) {
                    q[k] = values[16 * j + 4 * k + i];
                    sum += q[k] - 32;
                }
                units[i] = static_cast<uint8_t>(q[0] | (q[2] >> 4) << 6);
                units[64 + i] = static_cast<uint8_t>(q[1] | (q[3] >> 4) << 6);
                units[128 + i] = static_cast<uint8_t>((q[2] & 15) | (q[3] & 15) << 4);
            }
            weight_sums += row[b].scales[j] * sum;
        }
        const int32_t start = -128 * weight_sums;
        std::memcpy(block + 288 + 4 * lane, &start, 4);
    }
}

void pack_iq4_xs_row(const BlockIQ4_XS* row, int64_t nb, int lane, uint8_t* group) {
    for (int64_t b = 0; b < nb; ++b) {
        uint8_t* block = group + static_cast<size_t>(b) * kPackedIQ4_XSBlockBytes;
        std::memcpy(block + 2 * lane, &row[b].d, 2);
        int32_t value_sums = 0;
        for (int j = 0; j < 8; ++j) {
            const int ls =
                ((row[b].scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | (((row[b].scales_h >> (2 * j)) & 3) << 4);
            block[32 + 16 * j + lane] = static_cast<uint8_t>(static_cast<int8_t>(ls - 32));
            int32_t sum = 0;
            for (int l = 0; l < 16; ++l)
                sum +=
                    quant::kIQ4NLValues[row[b].qs[16 * j + l] & 0xF] + quant::kIQ4NLValues[row[b].qs[16 * j + l] >> 4];
            value_sums += (ls - 32) * sum;
            for (int k = 0; k < 4; ++k)
                std::memcpy(block + 224 + 256 * j + 64 * k + 4 * lane, row[b].qs + 16 * j + 4 * k, 4);
        }
        const int32_t start = -128 * value_sums;
        std::memcpy(block + 160 + 4 * lane, &start, 4);
    }
}

void pack_iq3_xxs_row(const BlockIQ3_XXS* row, int64_t nb, int lane, uint8_t* group) {
    for (int64_t b = 0; b < nb; ++b) {
        uint8_t* block = group + static_cast<size_t>(b) * kPackedIQ3_XXSBlockBytes;
        std::memcpy(block + 2 * lane, &row[b].d, 2);
        int32_t value_sums = 0;
        for (int j = 0; j < 8; ++j) {
            uint32_t aux;
            std::memcpy(&aux, row[b].qs + kQK_K / 4 + 4 * j, 4);
            const int odd_scale = 2 * static_cast<int>(aux >> 28) + 1;
            block[32 + 16 * j + lane] = static_cast<uint8_t>(odd_scale);
            uint32_t signs = 0;
            for (int l = 0; l < 4; ++l) signs |= static_cast<uint32_t>(quant::even_signs(aux >> (7 * l))) << (8 * l);
            std::memcpy(block + 1248 + 64 * j + 4 * lane, &signs, 4);
            int32_t sum = 0;
            for (int k = 0; k < 8; ++k) {
                const uint8_t index = row[b].qs[8 * j + k];
                block[224 + 128 * j + 16 * k + lane] = index;
                for (int i = 0; i < 4; ++i) {
                    const int magnitude = static_cast<int>((quant::kIQ3XXSGrid[index] >> (8 * i)) & 0xFF);
                    sum += (signs >> (4 * k + i)) & 1 ? -magnitude : magnitude;
                }
            }
            value_sums += odd_scale * sum;
        }
        const int32_t start = -128 * value_sums;
        std::memcpy(block + 160 + 4 * lane, &start, 4);
    }
}

void pack_iq3_s_row(const BlockIQ3_S* row, int64_t nb, int lane, uint8_t* group) {
    for (int64_t b = 0; b < nb; ++b) {
        uint8_t* block = group + static_cast<size_t>(b) * kPackedIQ3_SBlockBytes;
        std::memcpy(block + 2 * lane, &row[b].d, 2);
        int32_t value_sums = 0;
        for (int j = 0; j < 8; ++j) {
            const int odd_scale = 2 * ((row[b].scales[j / 2] >> (4 * (j % 2))) & 0xF) + 1;
            block[32 + 16 * j + lane] = static_cast<uint8_t>(odd_scale);
            uint32_t signs;
            std::memcpy(&signs, row[b].signs + 4 * j, 4);
            std::memcpy(block + 1248 + 64 * j + 4 * lane, &signs, 4);
            block[1760 + 16 * j + lane] = row[b].qh[j];
            int32_t sum = 0;
            for (int k = 0; k < 8; ++k) {
                block[224 + 128 * j + 16 * k + lane] = row[b].qs[8 * j + k];
                const uint32_t entry = quant::kIQ3SGrid[row[b].qs[8 * j + k] | (((row[b].qh[j] >> k) & 1) << 8)];
                for (int i = 0; i < 4; ++i) {
                    const int magnitude = static_cast<int>((entry >> (8 * i)) & 0xFF);
                    sum += (signs >> (4 * k + i)) & 1 ? -magnitude : magnitude;
                }
            }
            value_sums += odd_scale * sum;
        }
        const int32_t start = -128 * value_sums;
        std::memcpy(block + 160 + 4 * lane, &start, 4);
    }
}

}  // namespace

bool has_packed_gemm(DType t, Isa isa) {
    const bool avx2_class = isa == Isa::Avx2 || isa == Isa::Avx2Vnni;
    switch (t) {
        case DType::Q8_0:
        case DType::Q4_K:
            return avx2_class || isa == Isa::Avx512;
        case DType::Q5_K:
        case DType::Q6_K:
        case DType::IQ4_XS:
        case DType::IQ3_XXS:
        case DType::IQ3_S:
            return avx2_class;
        default:
            return false;
    }
}

bool packable(const Tensor& w) {
    const int64_t block = w.type == DType::Q8_0 ? 32 : kQK_K;
    return has_packed_gemm(w.type, active_isa()) && w.ne[3] == 1 && w.ne[0] % block == 0 && w.ne[1] >= 1 &&
           w.data != nullptr;
}

size_t packed_group_bytes(const Tensor& w) {
    return static_cast<size_t>(w.ne[0] / traits(w.type).block_size) * packed_block_bytes(w.type);
}

size_t packed_slice_bytes(const Tensor& w) {
    return static_cast<size_t>((w.ne[1] + kPackRows - 1) / kPackRows) * packed_group_bytes(w);
}

size_t packed_bytes(const Tensor& w) {
    return packed_slice_bytes(w) * static_cast<size_t>(w.ne[2]);
}

void pack_rows(const Tensor& w, uint8_t* dst) {
    STRATA_ASSERT(has_packed_gemm(w.type, Isa::Avx2) && w.ne[0] % traits(w.type).block_size == 0);
    const int64_t nb = w.ne[0] / traits(w.type).block_size, rows = w.ne[1];
    std::memset(dst, 0, packed_bytes(w));
    for (int64_t slice = 0; slice < w.ne[2]; ++slice) {
        const uint8_t* base = static_cast<const uint8_t*>(w.data) + w.nb[2] * static_cast<size_t>(slice);
        uint8_t* out_slice = dst + packed_slice_bytes(w) * static_cast<size_t>(slice);
        for (int64_t r = 0; r < rows; ++r) {
            const uint8_t* row = base + w.nb[1] * static_cast<size_t>(r);
            uint8_t* group = out_slice + packed_group_bytes(w) * static_cast<size_t>(r / kPackRows);
            const int lane = static_cast<int>(r % kPackRows);
            switch (w.type) {
                case DType::Q8_0:
                    pack_q8_0_row(reinterpret_cast<const BlockQ8_0*>(row), nb, lane, group);
                    break;
                case DType::Q4_K:
                    pack_q4_k_row(reinterpret_cast<const BlockQ4_K*>(row), nb, lane, group);
                    break;
                case DType::Q5_K:
                    pack_q4_k_row(reinterpret_cast<const BlockQ5_K*>(row), nb, lane, group);
                    break;
                case DType::IQ4_XS:
                    pack_iq4_xs_row(reinterpret_cast<const BlockIQ4_XS*>(row), nb, lane, group);
                    break;
                case DType::IQ3_XXS:
                    pack_iq3_xxs_row(reinterpret_cast<const BlockIQ3_XXS*>(row), nb, lane, group);
                    break;
                case DType::IQ3_S:
                    pack_iq3_s_row(reinterpret_cast<const BlockIQ3_S*>(row), nb, lane, group);
                    break;
                default:
                    pack_q6_k_row(reinterpret_cast<const BlockQ6_K*>(row), nb, lane, group);
                    break;
            }
        }
    }
}

const void* packed_rows(const Tensor& w, int64_t slice, int64_t row_begin) {
    if (w.packed == nullptr || row_begin % kPackRows != 0) return nullptr;
    return static_cast<const uint8_t*>(w.packed) + packed_slice_bytes(w) * static_cast<size_t>(slice) +
           packed_group_bytes(w) * static_cast<size_t>(row_begin / kPackRows);
}

void quantize_q8_0_biased_portable(const float* x, uint8_t* dst, int64_t n) {
    BlockQ8_0 block;
    for (int64_t i = 0; i < n / 32; ++i, dst += kBiasedBlockBytes) {
        quantize_row(DType::Q8_0, x + 32 * i, &block, 32);
        for (int j = 0; j < 32; ++j) dst[j] = static_cast<uint8_t>(block.qs[j] + 128);
        const float d = f16_to_f32(block.d);
        std::memcpy(dst + 32, &d, 4);
    }
}

void quantize_q8_k_sums_portable(const float* x, uint8_t* dst, int64_t n) {
    BlockQ8_K block;
    for (int64_t i = 0; i < n / kQK_K; ++i, dst += kQ8KSumsBlockBytes) {
        quantize_row(DType::Q8_K, x + kQK_K * i, &block, kQK_K);
        std::memcpy(dst, block.qs, kQK_K);
        std::memcpy(dst + kQK_K, &block.d, 4);
        for (int j = 0; j < 8; ++j) {
            const auto sum = static_cast<int16_t>(block.bsums[2 * j] + block.bsums[2 * j + 1]);
            std::memcpy(dst + kQK_K + 4 + 2 * j, &sum, 2);
        }
    }
}

void PackedWeights::Free::operator()(uint8_t* p) const {
    std::free(p);
}

bool PackedWeights::pack(Tensor& w) {
    if (!packable(w)) return false;
    const size_t n = (packed_bytes(w) + 63) / 64 * 64;
    auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, n));
    if (p == nullptr) throw std::bad_alloc();
    buffers_.emplace_back(p);
    pack_rows(w, p);
    w.packed = p;
    bytes_ += n;
    return true;
}

}  // namespace strata::cpu
