// `strata synth --fast`: quantized tensors filled with random quant blocks instead of quantized random floats.
//
// Every bit pattern of a block's payload is a valid encoding in the types below (grid indices use all their bits:
// IQ2_XS 9 bits into 512 entries, IQ3_XXS 8 into 256, IQ3_S 9 into 512, IQ1_M 11 into 2048; sign fields are 7-bit
// indices or raw bits), so payload and sub-block scale bytes come straight from a counter-based random stream; only
// the f16 super-block scales are written explicitly (never NaN or Inf), and the affine K-quants get their mins tied to
// their scales so values are centred on zero. The super-block scale d of a tensor is its float generator's RMS (a few
// rows sampled) over the RMS the type's blocks have at d = 1 (measured once by dequantizing random blocks).
//
// Float tensors (F32/F16/BF16) and any type without a block filler go through the float generator as in
// add_planned_tensors, rows in parallel: the same bytes as the normal path.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <map>
#include <memory>

#include "convert/synth.h"
#include "core/error.h"
#include "core/quant_blocks.h"
#include "core/thread_pool.h"

namespace strata {

namespace {

constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;
constexpr uint64_t kFastSalt = 0x5EED0FA57B10C5ull;  // keeps the block streams apart from the float streams
constexpr int64_t kChunkBlocks = 8192;               // a multiple of 8: chunks start on 8-byte stream words

uint64_t mix64(uint64_t v) {
    v = (v ^ (v >> 30)) * 0xBF58476D1CE4E5B9ull;
    v = (v ^ (v >> 27)) * 0x94D049BB133111EBull;
    return v ^ (v >> 31);
}


// Bytes [byte0, byte0 + n) of the stream `key`: word w of the stream is mix64(key + w * gamma), so any chunking of
// a tensor gives the same bytes. byte0 must be a multiple of 8.
void random_bytes(uint8_t* dst, uint64_t byte0, size_t n, uint64_t key) {
    uint64_t w = byte0 / 8;
    size_t i = 0;
    for (; i + 8 <= n; i += 8, ++w) {
        const uint64_t v = mix64(key + w * kGamma);
        std::memcpy(dst + i, &v, 8);
    }
    if (i < n) {
        const uint64_t v = mix64(key + w * kGamma);
        std::memcpy(dst + i, &v, n - i);
    }
}

void put16(uint8_t* p, uint16_t v) {
    p[0] = static_cast<uint8_t>(v & 0xFF);
    p[1] = static_cast<uint8_t>(v >> 8);
}

// The f16 scales a tensor's blocks get.
struct Scales {
    uint16_t d = 0;
    uint16_t dmin = 0;  // affine K-quants: d times the mean level, so that min = scale centres the values
};

// Mean level of an affine K-quant (levels 0..2^bits - 1); 0 for the symmetric types.
float mean_level(DType t) {
    switch (t) {
        case DType::Q2_K:
            return 1.5f;
        case DType::Q4_K:
            return 7.5f;
        case DType::Q5_K:
            return 15.5f;
        default:
            return 0.f;
    }
}

bool has_block_filler(DType t) {
    switch (t) {
        case DType::Q8_0:
        case DType::Q4_0:
        case DType::IQ4_NL:
        case DType::Q2_K:
        case DType::Q3_K:
        case DType::Q4_K:
        case DType::Q5_K:
        case DType::Q6_K:
        case DType::IQ4_XS:
        case DType::IQ2_XS:
        case DType::IQ3_XXS:
        case DType::IQ3_S:
        case DType::IQ1_M:
            return true;
        default:
            return false;
    }
}

// Q4_K / Q5_K: 6-bit scales 32..63 taken from the random bytes, each sub-block's min equal to its scale, packed as
// core's unpack_scale_min_k4 reads them.
void centred_k4_scales(uint8_t* scales) {
    uint8_t s[8];
    for (int j = 0; j < 8; ++j) s[j] = static_cast<uint8_t>(32 | (scales[j] & 31));
    for (int j = 0; j < 4; ++j) {
        const auto high = static_cast<uint8_t>((s[j + 4] >> 4) << 6);
        scales[j] = static_cast<uint8_t>(s[j] | high);      // scale j, top bits of scale j + 4
        scales[j + 4] = static_cast<uint8_t>(s[j] | high);  // min j, top bits of min j + 4
        scales[j + 8] = static_cast<uint8_t>((s[j + 4] & 0xF) * 0x11);
    }
}

// Overwrites the scale fields of n random blocks of type t.
void fix_blocks(DType t, uint8_t* p, int64_t n, Scales s) {
    const size_t bb = traits(t).block_bytes;
    for (int64_t i = 0; i < n; ++i, p += bb) {
        switch (t) {
            case DType::Q8_0:
                put16(p + offsetof(BlockQ8_0, d), s.d);
                break;
            case DType::Q4_0:
                put16(p + offsetof(BlockQ4_0, d), s.d);
                break;
            case DType::IQ4_NL:
                put16(p + offsetof(BlockIQ4_NL, d), s.d);
                break;
            case DType::Q2_K: {
                uint8_t* sc = p + offsetof(BlockQ2_K, scales);
                for (int j = 0; j < 16; ++j) {
                    const int v = 8 | (sc[j] & 7);  // scale 8..15, min the same
                    sc[j] = static_cast<uint8_t>(v | (v << 4));
                }
                put16(p + offsetof(BlockQ2_K, d), s.d);
                put16(p + offsetof(BlockQ2_K, dmin), s.dmin);
                break;
            }
            case DType::Q3_K:
                put16(p + offsetof(BlockQ3_K, d), s.d);  // 6-bit scales - 32: random is symmetric
                break;
            case DType::Q4_K:
                centred_k4_scales(p + offsetof(BlockQ4_K, scales));
                put16(p + offsetof(BlockQ4_K, d), s.d);
                put16(p + offsetof(BlockQ4_K, dmin), s.dmin);
                break;
            case DType::Q5_K:
                centred_k4_scales(p + offsetof(BlockQ5_K, scales));
                put16(p + offsetof(BlockQ5_K, d), s.d);
                put16(p + offsetof(BlockQ5_K, dmin), s.dmin);
                break;
            case DType::Q6_K:
                put16(p + offsetof(BlockQ6_K, d), s.d);  // int8 scales: random is symmetric
                break;
            case DType::IQ4_XS:
                put16(p + offsetof(BlockIQ4_XS, d), s.d);
                break;
            case DType::IQ2_XS:
                put16(p + offsetof(BlockIQ2_XS, d), s.d);
                break;
            case DType::IQ3_XXS:
                put16(p + offsetof(BlockIQ3_XXS, d), s.d);
                break;
            case DType::IQ3_S:
                put16(p + offsetof(BlockIQ3_S, d), s.d);
                break;
            case DType::IQ1_M: {
                // The f16 d lives in the top nibbles of the four uint16 of scales (low nibble first).
                uint8_t* sc = p + offsetof(BlockIQ1_M, scales);
                for (int k = 0; k < 4; ++k)
                    sc[2 * k + 1] = static_cast<uint8_t>((sc[2 * k + 1] & 0x0F) | (((s.d >> (4 * k)) & 0xF) << 4));
                break;
            }
            default:
                STRATA_ASSERT(false);
        }
    }
}

Scales scales_for(DType t, float d) {
    // Never NaN, Inf or zero: clamp to the f16 range (the smallest subnormal and the largest finite value).
    const float clamped = std::isfinite(d) ? std::clamp(d, 6.0e-8f, 65504.f) : 1.f;
    Scales s;
    s.d = f32_to_f16(clamped);
    s.dmin = f32_to_f16(std::min(f16_to_f32(s.d) * mean_level(t), 65504.f));
    return s;
}

// RMS of t's random blocks at d = 1.
double unit_rms(DType t) {
    constexpr int64_t kBlocks = 256;
    const size_t bb = traits(t).block_bytes;
    const int64_t bs = traits(t).block_size;
    std::vector<uint8_t> blocks(bb * kBlocks);
    random_bytes(blocks.data(), 0, blocks.size(), mix64(kFastSalt + static_cast<uint64_t>(t)));
    fix_blocks(t, blocks.data(), kBlocks, scales_for(t, 1.f));
    std::vector<float> values(static_cast<size_t>(bs * kBlocks));
    dequantize_row(t, blocks.data(), values.data(), bs * kBlocks);
    double sum2 = 0;
    for (float v : values) sum2 += static_cast<double>(v) * v;
    return std::sqrt(sum2 / static_cast<double>(values.size()));
}

// RMS of the float generator's values for t: up to 8 rows spread over the tensor.
double sampled_rms(const PlannedTensor& t) {
    const int64_t width = t.ne[0], n_rows = t.n_rows();
    if (n_rows <= 0 || width <= 0) return 1.0;  // no data to fill
    std::vector<float> row(static_cast<size_t>(width));
    double sum2 = 0;
    int64_t count = 0, last = -1;
    for (int64_t k = 0; k < 8; ++k) {
        const int64_t r = n_rows > 1 ? k * (n_rows - 1) / 7 : 0;
        if (r == last) continue;
        last = r;
        t.rows(r, 1, row.data());
        for (float v : row) sum2 += static_cast<double>(v) * v;
        count += width;
    }
    const double rms = count > 0 ? std::sqrt(sum2 / static_cast<double>(count)) : 0.0;
    return std::isfinite(rms) && rms > 0 ? rms : 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(width, 1)));
}

// The float generator's rows, converted as add_planned_tensors does, rows spread over the pool.
gguf::Writer::Fill float_fill(std::shared_ptr<ThreadPool> pool, RowFn rows, DType type, int64_t width, int64_t n_rows) {
    return [pool, rows, type, width, n_rows](uint8_t* dst, size_t n_bytes) {
        const size_t rb = row_bytes(type, width);
        STRATA_ASSERT(n_bytes == rb * static_cast<size_t>(n_rows));
        const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(width, 1));
        pool->parallel_for(
            n_rows,
            [&](int64_t begin, int64_t end) {
                std::vector<float> buf(static_cast<size_t>((end - begin) * width));
                rows(begin, end - begin, buf.data());
                uint8_t* out = dst + static_cast<size_t>(begin) * rb;
                if (type == DType::F32) {
                    std::memcpy(out, buf.data(), buf.size() * sizeof(float));
                    return;
                }
                for (int64_t i = 0; i < end - begin; ++i)
                    quantize_row(type, buf.data() + i * width, out + static_cast<size_t>(i) * rb, width);
            },
            grain);
    };
}

gguf::Writer::Fill block_fill(std::shared_ptr<ThreadPool> pool, DType type, uint64_t key, Scales scales) {
    return [pool, type, key, scales](uint8_t* dst, size_t n_bytes) {
        const size_t bb = traits(type).block_bytes;
        STRATA_ASSERT(n_bytes % bb == 0);
        const auto n_blocks = static_cast<int64_t>(n_bytes / bb);
        const int64_t n_chunks = (n_blocks + kChunkBlocks - 1) / kChunkBlocks;
        pool->parallel_for(
            n_chunks,
            [&](int64_t begin, int64_t end) {
                for (int64_t c = begin; c < end; ++c) {
                    const int64_t b0 = c * kChunkBlocks, n = std::min(kChunkBlocks, n_blocks - b0);
                    uint8_t* p = dst + static_cast<size_t>(b0) * bb;
                    random_bytes(p, static_cast<uint64_t>(b0) * bb, static_cast<size_t>(n) * bb, key);
                    fix_blocks(type, p, n, scales);
                }
            },
            1);
    };
}

}  // namespace

bool synth_fast_fills(DType t) {
    return has_block_filler(t);
}

void add_fast_tensors(gguf::Writer& writer, const SynthModel& m, uint64_t seed, int n_threads) {
    auto pool = std::make_shared<ThreadPool>(n_threads > 0 ? n_threads : default_thread_count());
    std::map<DType, double> unit;  // per type, measured once
    for (const PlannedTensor& t : m.plan.tensors) {
        const DType type = planned_type(t, m.types);
        const int64_t width = t.ne[0], n_rows = t.n_rows();
        // The skew lives in the embedding's planted direction (synth.cpp's SynthSource): keep its real values.
        const bool carries_skew = m.router_skew > 0.0 && t.name == "token_embd.weight";
        if (!has_block_filler(type) || carries_skew) {
            writer.add_tensor(t.name, type, t.ne, float_fill(pool, t.rows, type, width, n_rows));
            continue;
        }
        if (!unit.count(type)) unit[type] = unit_rms(type);
        const double d = sampled_rms(t) / unit[type];
        const uint64_t key = mix64(seed ^ mix64(hash_name(t.name) ^ kFastSalt));
        writer.add_tensor(t.name, type, t.ne, block_fill(pool, type, key, scales_for(type, static_cast<float>(d))));
    }
}

uint64_t synth_planned_bytes(const SynthModel& m) {
    uint64_t total = 0;
    for (const PlannedTensor& t : m.plan.tensors)
        total += row_bytes(planned_type(t, m.types), t.ne[0]) * static_cast<uint64_t>(t.n_rows());
    return total;
}

}  // namespace strata
