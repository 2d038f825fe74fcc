// Matrix products over quantized dot-product kernels: activations quantized once per call, output rows split into
// units that the pool's threads claim, and within a unit up to dot_columns() tokens per kernel call so that the
// weight unpacking is shared by several tokens of a prompt. Packed weights (packed.h) go to the GEMMs instead.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/cpu/gemm_packed.h"
#include "backend/cpu/matmul_rows.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/packed.h"
#include "backend/cpu/quant_dot.h"
#include "core/error.h"
#include "core/quant_blocks.h"

namespace strata::cpu {

namespace {

// Tokens whose quantized activations are walked per pass over a unit's rows: they stay in L2 while the unit's rows
// (in L1) are reused against them.
constexpr int64_t kTokenBlock = 64;

// How a job's activations are laid out: the dot kernels' activation type, or one of the packed GEMMs' layouts.
enum class ActLayout { Kernel, BiasedQ8_0, SignedQ8_0, I16Q8_0, Q8_KSums, Q8_KGroups, BiasedQ8_K };

// A job of matmul_many: its plan (matmul_rows.h) and where its activations and outputs go.
struct PreparedJob {
    MatmulRowsPlan plan;
    float* y = nullptr;
    size_t act_offset = 0;  // into the activation buffer
    int64_t rows_per_unit = 0;
    int64_t first_unit = 0;
};

struct QuantizeTask {
    DType act;
    ActLayout layout;
    const float* x;
    int64_t in;
    int64_t n_tokens;
    size_t offset;
    size_t stride;
};

// Quantized rows of a source copied out to a job's contiguous columns.
struct GatherTask {
    size_t src_offset;
    int64_t src_rows;
    size_t stride;
    const int64_t* rows;
    int64_t n;
    size_t dst_offset;
};

// Per calling thread, reused from call to call.
struct MatmulBuffers {
    std::vector<PreparedJob> jobs;
    std::vector<QuantizeTask> quantize;
    std::vector<GatherTask> gather;
    std::vector<uint8_t> activations;
};
thread_local MatmulBuffers t_buffers;

// Per worker thread: a unit's decoded IQ2_XS rows (prompts only; grows to the largest unit once).
thread_local std::vector<uint8_t> t_decoded;

// Rows per claimed unit: enough work to amortise the claim, small enough that the rows stay in L1 and that a decode
// step spreads evenly over the threads.
int64_t rows_per_unit(const Tensor& w, int64_t n_tokens, int n_threads, bool packed) {
    const int64_t out = w.ne[1];
    if (packed) {
        // Whole groups; one group per unit for prompts (its rows stay in L1 across the token blocks).
        const int64_t groups = (out + kPackRows - 1) / kPackRows;
        const int64_t per_unit = n_tokens >= 4 ? 1 : std::clamp<int64_t>(groups / (8 * n_threads), 1, 4);
        return per_unit * kPackRows;
    }
    const int64_t by_cache = std::max<int64_t>(1, static_cast<int64_t>(16384 / std::max<size_t>(1, w.nb[1])));
    const int64_t by_balance = std::max<int64_t>(1, out / (8 * n_threads));
    const int64_t rows = n_tokens >= kDotCols ? std::min<int64_t>(16, by_cache) : std::min<int64_t>(64, by_balance);
    return std::clamp<int64_t>(rows, 1, out);
}

void run_packed_unit(const MatmulRowsPlan& j, const uint8_t* act, float* y, int64_t row_begin, int64_t row_end) {
    const Tensor& w = *j.w;
    const int64_t out = w.ne[1];
    const size_t group_bytes = packed_group_bytes(w);
    const int64_t cols = j.cols;
    for (int64_t t0 = 0; t0 < j.n_tokens; t0 += kTokenBlock) {
        const int64_t t_end = std::min(j.n_tokens, t0 + kTokenBlock);
        for (int64_t r = row_begin; r < row_end; r += kPackRows) {
            const uint8_t* group =
                static_cast<const uint8_t*>(w.packed) + group_bytes * static_cast<size_t>(r / kPackRows);
            for (int64_t t = t0; t < t_end; t += cols) {
                const PackedGemm g{.group = group,
                                   .n_blocks = w.ne[0] / traits(w.type).block_size,
                                   .act = act + static_cast<size_t>(t) * j.act_stride,
                                   .act_stride = j.act_stride,
                                   .n_cols = static_cast<int>(std::min<int64_t>(cols, t_end - t)),
                                   .y = y + t * out + r,
                                   .y_stride = static_cast<size_t>(out),
                                   .n_rows = static_cast<int>(std::min<int64_t>(kPackRows, row_end - r))};
                j.gemm(g);
            }
        }
    }
}

void run_unit(const MatmulRowsPlan& j, const uint8_t* act, float* y, int64_t row_begin, int64_t row_end) {
    const Tensor& w = *j.w;
    const int64_t in = w.ne[0], out = w.ne[1];
    float tile[kMaxDotCols];
    for (int64_t t0 = 0; t0 < j.n_tokens; t0 += kTokenBlock) {
        const int64_t t_end = std::min(j.n_tokens, t0 + kTokenBlock);
        for (int64_t t = t0; t < t_end; t += j.cols) {
            const int cols = static_cast<int>(std::min<int64_t>(j.cols, t_end - t));
            const uint8_t* a = act + static_cast<size_t>(t) * j.act_stride;
            for (int64_t r = row_begin; r < row_end; ++r) {
                j.kernel(in, w.row(r), a, j.act_stride, tile, cols);
                for (int c = 0; c < cols; ++c) y[(t + c) * out + r] = tile[c];
            }
        }
    }
}

// A unit's rows decoded once, then every token chunk against them: the decode (gathers, sign masks, the transpose by
// group) costs about as much as 8 tokens' arithmetic, so a 64-token expert saves three quarters of it.
void run_decoded_unit(const MatmulRowsPlan& j, const uint8_t* act, float* y, int64_t row_begin, int64_t row_end,
                      uint8_t* decoded) {
    const Tensor& w = *j.w;
    const int64_t in = w.ne[0], out = w.ne[1];
    const size_t row_bytes = static_cast<size_t>(in / kQK_K) * kIq2XsDecodedBlockBytes;
    for (int64_t r = row_begin; r < row_end; ++r)
        decode_iq2_xs_groups(in, w.row(r), decoded + row_bytes * static_cast<size_t>(r - row_begin));
    float tile[kIq2XsPairCols];
    for (int64_t t = 0; t < j.n_tokens; t += kIq2XsPairCols) {
        const int cols = static_cast<int>(std::min<int64_t>(kIq2XsPairCols, j.n_tokens - t));
        const uint8_t* a = act + static_cast<size_t>(t) * j.act_stride;
        int64_t r = row_begin;
        for (; r + 1 < row_end; r += 2) {
            const uint8_t* row0 = decoded + row_bytes * static_cast<size_t>(r - row_begin);
            dot_iq2_xs_decoded_pair({.n = in,
                                     .row0 = row0,
                                     .row1 = row0 + row_bytes,
                                     .act = a,
                                     .act_stride = j.act_stride,
                                     .y = y + t * out + r,
                                     .y_stride = static_cast<size_t>(out),
                                     .n_cols = cols});
        }
        if (r < row_end) {  // an odd last row: the kernel that decodes as it goes (the same bits)
            dot_iq2_xs_groups(in, w.row(r), a, j.act_stride, tile, cols);
            for (int c = 0; c < cols; ++c) y[(t + c) * out + r] = tile[c];
        }
    }
}

// IQ2_XS with AVX2: the unit's rows decoded once, 8 to a block of the 8-row layout, then each block of rows against
// up to kTokenBlock tokens in one kernel call (gemm_iq2_xs_rows8_kernels.inc; the row kernel's bits).
void run_rows8_unit(const MatmulRowsPlan& j, const uint8_t* act, float* y, int64_t row_begin, int64_t row_end,
                    uint8_t* decoded) {
    const Tensor& w = *j.w;
    const int64_t in = w.ne[0], out = w.ne[1];
    const int64_t n_groups = (row_end - row_begin + 7) / 8;
    const size_t group_bytes = static_cast<size_t>(in / kQK_K) * kIq2XsRows8BlockBytes;
    for (int64_t g = 0; g < n_groups; ++g) {
        const int64_t first = row_begin + 8 * g;
        decode_iq2_xs_rows8(in, w.row(first), w.nb[1], static_cast<int>(std::min<int64_t>(8, row_end - first)),
                            decoded + group_bytes * static_cast<size_t>(g));
    }
    const auto rows8_gemm = j.isa == Isa::Avx2Vnni ? gemm_iq2_xs_rows8_avxvnni : gemm_iq2_xs_rows8_avx2;
    for (int64_t t0 = 0; t0 < j.n_tokens; t0 += kTokenBlock) {
        for (int64_t g = 0; g < n_groups; ++g) {
            const int64_t first = row_begin + 8 * g;
            rows8_gemm({.n = in,
                        .decoded = decoded + group_bytes * static_cast<size_t>(g),
                        .act = act + static_cast<size_t>(t0) * j.act_stride,
                        .act_stride = j.act_stride,
                        .n_cols = static_cast<int>(std::min(kTokenBlock, j.n_tokens - t0)),
                        .y = y + t0 * out + first,
                        .y_stride = static_cast<size_t>(out),
                        .n_rows = static_cast<int>(std::min<int64_t>(8, row_end - first))});
        }
    }
}

// Q8_0 with AVX2 alone: each group of the unit widened to int16 once, then all the tokens against it.
void run_i16_unit(const MatmulRowsPlan& j, const uint8_t* act, float* y, int64_t row_begin, int64_t row_end,
                  uint8_t* wide) {
    const Tensor& w = *j.w;
    const int64_t out = w.ne[1], n_blocks = w.ne[0] / 32;
    const size_t group_bytes = packed_group_bytes(w);
    for (int64_t r = row_begin; r < row_end; r += kPackRows) {
        widen_q8_0_group_avx2(static_cast<const uint8_t*>(w.packed) + group_bytes * static_cast<size_t>(r / kPackRows),
                              n_blocks, wide);
        gemm_q8_0_i16_avx2({.group = wide,
                            .n_blocks = n_blocks,
                            .act = act,
                            .act_stride = j.act_stride,
                            .n_cols = static_cast<int>(j.n_tokens),
                            .y = y + r,
                            .y_stride = static_cast<size_t>(out),
                            .n_rows = static_cast<int>(std::min<int64_t>(kPackRows, row_end - r))});
    }
}

// Tokens from which a Q8_0 product with AVX2 alone widens its weights: the widening costs about what one token's
// int8 products do, and each token then saves ~10% of its products.
constexpr int64_t kI16MinTokens = 8;

// How w's activations are laid out for n_tokens tokens and which kernel reads them.
MatmulRowsPlan plan_for(const Tensor& w, int64_t n_tokens, Isa isa) {
    STRATA_ASSERT(w.ne[2] == 1 && w.ne[3] == 1);
    const int64_t in = w.ne[0];
    const bool packed = w.packed != nullptr && has_packed_gemm(w.type, isa);
    ActLayout layout = ActLayout::Kernel;
    MatmulRowsPlan p{.w = &w,
                     .n_tokens = n_tokens,
                     .isa = isa,
                     .act = activation_type(w.type),
                     .row_align = packed ? kPackRows : 1,
                     .kernel = packed ? nullptr : dot_kernel(w.type, isa)};
    if (!packed && w.type == DType::IQ2_XS && isa == Isa::Avx512) {
        layout = ActLayout::Q8_KGroups;
        p.kernel = dot_iq2_xs_groups;
        p.cols = kMaxDotCols;
        p.act_stride = q8_k_groups_row_bytes(in);
        p.decode_once = n_tokens > kMaxDotCols;
        p.by_group = true;
    } else if (!packed) {
        p.act_stride = row_bytes(p.act, in);
        p.cols = dot_columns(w.type, isa);
        if (w.type == DType::IQ2_XS && (isa == Isa::Avx2 || isa == Isa::Avx2Vnni) && n_tokens > p.cols) {
            p.rows8 = true;
            layout = ActLayout::BiasedQ8_K;
            p.act_stride = static_cast<size_t>(in / kQK_K) * kBiasedQ8KBlockBytes;
        }
    } else if (w.type == DType::Q8_0 && isa == Isa::Avx2 && n_tokens >= kI16MinTokens) {
        layout = ActLayout::I16Q8_0;
        p.act_stride = static_cast<size_t>(in / 32) * kI16BlockBytes;
        p.i16 = true;
    } else if (w.type == DType::Q8_0) {
        layout = isa == Isa::Avx2 ? ActLayout::SignedQ8_0 : ActLayout::BiasedQ8_0;
        p.act_stride = static_cast<size_t>(in / 32) * kBiasedBlockBytes;
        p.cols = kPackedCols;
        p.gemm = isa == Isa::Avx512     ? gemm_q8_0_packed
                 : isa == Isa::Avx2Vnni ? gemm_q8_0_packed_avxvnni
                                        : gemm_q8_0_packed_avx2;
    } else if (w.type == DType::Q6_K) {
        layout = ActLayout::BiasedQ8_K;
        p.act_stride = static_cast<size_t>(in / kQK_K) * kBiasedQ8KBlockBytes;
        p.cols = kPackedColsQ6_K;
        p.gemm = isa == Isa::Avx2Vnni ? gemm_q6_k_packed_avxvnni : gemm_q6_k_packed_avx2;
    } else if (w.type == DType::IQ3_XXS || w.type == DType::IQ3_S) {
        layout = ActLayout::BiasedQ8_K;
        p.act_stride = static_cast<size_t>(in / kQK_K) * kBiasedQ8KBlockBytes;
        p.cols = kPackedColsIQ3_XXS;
        const bool vnni = isa == Isa::Avx2Vnni;
        p.gemm = w.type == DType::IQ3_S ? (vnni ? gemm_iq3_s_packed_avxvnni : gemm_iq3_s_packed_avx2)
                                        : (vnni ? gemm_iq3_xxs_packed_avxvnni : gemm_iq3_xxs_packed_avx2);
    } else if (w.type == DType::IQ4_XS) {
        const bool biased = isa == Isa::Avx2Vnni;
        layout = biased ? ActLayout::BiasedQ8_K : ActLayout::Q8_KSums;
        p.act_stride = static_cast<size_t>(in / kQK_K) * (biased ? kBiasedQ8KBlockBytes : kQ8KSumsBlockBytes);
        p.cols = kPackedColsIQ4_XS;
        p.gemm = biased ? gemm_iq4_xs_packed_avxvnni : gemm_iq4_xs_packed_avx2;
    } else if (w.type == DType::Q5_K) {
        layout = ActLayout::Q8_KSums;
        p.cols = kPackedColsQ4_K;
        p.act_stride = static_cast<size_t>(in / kQK_K) * kQ8KSumsBlockBytes;
        p.gemm = isa == Isa::Avx2Vnni ? gemm_q5_k_packed_avxvnni : gemm_q5_k_packed_avx2;
    } else {
        layout = ActLayout::Q8_KSums;
        p.cols = kPackedColsQ4_K;
        p.act_stride = static_cast<size_t>(in / kQK_K) * kQ8KSumsBlockBytes;
        p.gemm = isa == Isa::Avx512     ? gemm_q4_k_packed
                 : isa == Isa::Avx2Vnni ? gemm_q4_k_packed_avxvnni
                                        : gemm_q4_k_packed_avx2;
    }
    p.layout = static_cast<uint8_t>(layout);
    return p;
}

void quantize_into(ActLayout layout, DType act, Isa isa, const float* x, uint8_t* dst, int64_t in) {
    const bool avx512 = isa == Isa::Avx512, avx2 = isa == Isa::Avx2 || isa == Isa::Avx2Vnni;
    switch (layout) {
        case ActLayout::BiasedQ8_0:
            (avx512 ? quantize_q8_0_biased
             : avx2 ? quantize_q8_0_biased_avx2
                    : quantize_q8_0_biased_portable)(x, dst, in);
            break;
        case ActLayout::SignedQ8_0:
            quantize_q8_0_signed_avx2(x, dst, in);
            break;
        case ActLayout::I16Q8_0:
            quantize_q8_0_i16_avx2(x, dst, in);
            break;
        case ActLayout::Q8_KSums:
            (avx512 ? quantize_q8_k_sums : avx2 ? quantize_q8_k_sums_avx2 : quantize_q8_k_sums_portable)(x, dst, in);
            break;
        case ActLayout::Q8_KGroups:
            quantize_q8_k_groups(x, dst, in);
            break;
        case ActLayout::BiasedQ8_K:
            quantize_q8_k_biased_avx2(x, dst, in);
            break;
        case ActLayout::Kernel:
            quantize_activations(act, x, dst, in);
            break;
    }
}

void run_rows(const MatmulRowsPlan& p, const uint8_t* act, float* y, int64_t row_begin, int64_t row_end,
              uint8_t* decoded) {
    if (p.rows8) {
        run_rows8_unit(p, act, y, row_begin, row_end, decoded);
    } else if (p.i16) {
        run_i16_unit(p, act, y, row_begin, row_end, decoded);
    } else if (p.decode_once) {
        run_decoded_unit(p, act, y, row_begin, row_end, decoded);
    } else if (p.kernel) {
        run_unit(p, act, y, row_begin, row_end);
    } else {
        run_packed_unit(p, act, y, row_begin, row_end);
    }
}

}  // namespace

MatmulRowsPlan plan_matmul_rows(const Tensor& w, int64_t n_tokens) {
    return plan_for(w, n_tokens, active_isa());
}

void quantize_matmul_row(const MatmulRowsPlan& plan, const float* x, uint8_t* dst) {
    quantize_into(static_cast<ActLayout>(plan.layout), plan.act, plan.isa, x, dst, plan.w->ne[0]);
}

size_t matmul_rows_scratch_bytes(const MatmulRowsPlan& p, int64_t n_rows) {
    const auto blocks = static_cast<size_t>(p.w->ne[0] / kQK_K), rows = static_cast<size_t>(n_rows);
    if (p.rows8) return blocks * kIq2XsRows8BlockBytes * ((rows + 7) / 8);
    if (p.i16) return static_cast<size_t>(p.w->ne[0] / 32) * 2 * kI16HalfBlockBytes;  // one group, reused
    if (p.decode_once) return blocks * kIq2XsDecodedBlockBytes * rows;
    return 0;
}

size_t matmul_rows_act_bytes_bound(int64_t in) {
    // F32 activations (float weights) are the largest: 4 bytes a value; the quantized layouts take under 2.2.
    return static_cast<size_t>(in) * sizeof(float) + 64;
}

size_t matmul_rows_scratch_bound(int64_t in, int64_t n_rows) {
    const auto blocks = static_cast<size_t>(in / kQK_K), rows = static_cast<size_t>(n_rows);
    const size_t i16 = static_cast<size_t>(in / 32) * 2 * kI16HalfBlockBytes;
    return std::max(i16, blocks * std::max(kIq2XsRows8BlockBytes * ((rows + 7) / 8), kIq2XsDecodedBlockBytes * rows));
}

void matmul_rows(const MatmulRowsPlan& plan, const uint8_t* act, float* y, int64_t row_begin, int64_t row_end,
                 uint8_t* scratch) {
    STRATA_ASSERT(row_begin >= 0 && row_begin <= row_end && row_end <= plan.w->ne[1]);
    STRATA_ASSERT(row_begin % plan.row_align == 0);
    if (row_begin == row_end || plan.n_tokens <= 0) return;
    run_rows(plan, act, y, row_begin, row_end, scratch);
}

void matmul_many(std::span<const MatmulJob> jobs, ThreadPool* pool) {
    MatmulBuffers& b = t_buffers;
    b.jobs.clear();
    b.quantize.clear();
    b.gather.clear();
    const Isa isa = active_isa();
    const int n_threads = pool ? pool->size() : 1;
    size_t act_bytes = 0;
    int64_t units = 0;
    double work = 0;
    for (const MatmulJob& job : jobs) {
        const Tensor& w = *job.w;
        STRATA_ASSERT(w.ne[2] == 1 && w.ne[3] == 1);
        if (job.n_tokens <= 0 || w.ne[1] == 0) continue;
        const int64_t in = w.ne[0];
        PreparedJob p{.plan = plan_for(w, job.n_tokens, isa), .y = job.y};
        const DType act = p.plan.act;
        const auto layout = static_cast<ActLayout>(p.plan.layout);
        const size_t act_stride = p.plan.act_stride;
        // Products that read the same activations (gate and up, q/k/v) share one quantized copy.
        const int64_t source_rows = job.x_rows ? job.x_count : job.n_tokens;
        STRATA_ASSERT(!job.x_rows || job.x_count > 0);
        const QuantizeTask* source = nullptr;
        for (const QuantizeTask& q : b.quantize) {
            if (q.x == job.x && q.act == act && q.layout == layout && q.in == in && q.n_tokens >= source_rows) {
                source = &q;
                break;
            }
        }
        if (!source) {
            act_bytes = (act_bytes + 63) / 64 * 64;
            b.quantize.push_back({act, layout, job.x, in, source_rows, act_bytes, act_stride});
            act_bytes += act_stride * static_cast<size_t>(source_rows);
            source = &b.quantize.back();
        }
        if (!job.x_rows) {
            p.act_offset = source->offset;
        } else {
            // Jobs gathering the same rows of the same source (an expert's gate and up) share one copy.
            const GatherTask* copy = nullptr;
            for (const GatherTask& g : b.gather) {
                if (g.src_offset == source->offset && g.rows == job.x_rows && g.n >= job.n_tokens) {
                    copy = &g;
                    break;
                }
            }
            if (!copy) {
                act_bytes = (act_bytes + 63) / 64 * 64;
                b.gather.push_back({source->offset, source_rows, act_stride, job.x_rows, job.n_tokens, act_bytes});
                act_bytes += act_stride * static_cast<size_t>(job.n_tokens);
                copy = &b.gather.back();
            }
            p.act_offset = copy->dst_offset;
        }
        p.rows_per_unit = rows_per_unit(w, job.n_tokens, n_threads, p.plan.kernel == nullptr);
        p.first_unit = units;
        units += (w.ne[1] + p.rows_per_unit - 1) / p.rows_per_unit;
        work += static_cast<double>(w.ne[0]) * static_cast<double>(w.ne[1]) * static_cast<double>(job.n_tokens);
        b.jobs.push_back(p);
    }
    if (b.jobs.empty()) return;
    // 64-byte aligned: the by-group layout's blocks start cache lines.
    if (b.activations.size() < act_bytes + 64) b.activations.resize(act_bytes + 64);
    uint8_t* activations = b.activations.data() + (64 - reinterpret_cast<uintptr_t>(b.activations.data()) % 64) % 64;
    const bool parallel = pool && pool->size() > 1 && work >= 65536.0;

    // Quantize the activations: one item per (task, token).
    int64_t quantize_items = 0;
    for (const QuantizeTask& q : b.quantize) quantize_items += q.n_tokens;
    auto quantize_range = [&](int64_t begin, int64_t end) {
        int64_t base = 0;
        for (const QuantizeTask& q : b.quantize) {
            for (int64_t t = std::max(begin - base, int64_t{0}); t < std::min(end - base, q.n_tokens); ++t) {
                uint8_t* dst = activations + q.offset + static_cast<size_t>(t) * q.stride;
                const float* x = q.x + t * q.in;
                quantize_into(q.layout, q.act, isa, x, dst, q.in);
            }
            base += q.n_tokens;
        }
    };
    if (parallel && quantize_items >= 8) {
        pool->parallel_for(quantize_items, quantize_range);
    } else {
        quantize_range(0, quantize_items);
    }

    // Copy out the gathered rows: one item per (task, row).
    int64_t gather_items = 0;
    for (const GatherTask& g : b.gather) gather_items += g.n;
    auto gather_range = [&](int64_t begin, int64_t end) {
        int64_t base = 0;
        for (const GatherTask& g : b.gather) {
            for (int64_t i = std::max(begin - base, int64_t{0}); i < std::min(end - base, g.n); ++i) {
                STRATA_ASSERT(g.rows[i] >= 0 && g.rows[i] < g.src_rows);
                std::memcpy(activations + g.dst_offset + static_cast<size_t>(i) * g.stride,
                            activations + g.src_offset + static_cast<size_t>(g.rows[i]) * g.stride, g.stride);
            }
            base += g.n;
        }
    };
    if (parallel && gather_items >= 64) {
        pool->parallel_for(gather_items, gather_range);
    } else if (gather_items > 0) {
        gather_range(0, gather_items);
    }

    auto unit_range = [&](int64_t begin, int64_t end) {
        size_t j = 0;
        for (int64_t u = begin; u < end; ++u) {
            while (j + 1 < b.jobs.size() && b.jobs[j + 1].first_unit <= u) ++j;
            const PreparedJob& p = b.jobs[j];
            const int64_t row_begin = (u - p.first_unit) * p.rows_per_unit;
            const int64_t row_end = std::min(p.plan.w->ne[1], row_begin + p.rows_per_unit);
            const size_t need = matmul_rows_scratch_bytes(p.plan, row_end - row_begin) + 64;
            if (need > 64 && t_decoded.size() < need) t_decoded.resize(need);
            uint8_t* decoded = t_decoded.data() + (64 - reinterpret_cast<uintptr_t>(t_decoded.data()) % 64) % 64;
            run_rows(p.plan, activations + p.act_offset, p.y, row_begin, row_end, decoded);
        }
    };
    if (parallel) {
        pool->parallel_for(units, unit_range, 1);
    } else {
        unit_range(0, units);
    }
}

void matmul(const MatmulArgs& a) {
    const MatmulJob job{.w = &a.w, .x = a.x, .y = a.y, .n_tokens = a.n_tokens};
    matmul_many({&job, 1}, a.pool);
}

}  // namespace strata::cpu
