// CUDA parity of the paged KV cache and QSA decode attention (issue 7, slice 3) against the CPU reference:
// - the append writes every value where the page table says, by the storage rule of attention.h (fp16 bits and the
//   int8 values and scales compared exactly with the rule computed on the host);
// - decode attention (full and over a QSA cell list) against cpu::attend over the same stored values (the fp16-rounded
//   or dequantized int8 keys and values in f32), for odd head counts, GQA ratios 1, 4, 8 and 12, cache lengths that are
//   no multiple of 4 or of the split size, shuffled (non-identity) page tables, with the qwen4exp output gate;
// - the same results whatever the split count;
// - the QSA selection identical to model/attention.h's qsa_select (cells, count and scores bit for bit), ties included;
// - a captured CUDA graph replayed token after token (positions and lengths in device memory) against the CPU.
// STRATA_CUDA_PERF=1 adds the Flash-Next timing (24 query heads, 2 kv heads of 256, indexer 4 x 128, budget 2048,
// ratio 4; 12 attention layers; 32K and 128K cells) next to the device copy bandwidth measured in the same run.
//
// Without the CUDA backend compiled in (-DSTRATA_CUDA=ON) or without a GPU, every test skips with a message saying so.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/dtype.h"
#include "core/error.h"
#include "model/attention.h"

#if STRATA_HAS_CUDA
#include <cuda_runtime.h>

#include <memory>

#include "backend/cuda/attention.h"
#include "backend/cuda/cuda_backend.h"
#include "cuda_test_util.h"
#endif

namespace {

#if !STRATA_HAS_CUDA

TEST(CudaAttention, SkippedWithoutTheBackend) {
    GTEST_SKIP() << "CUDA backend not compiled in (configure with -DSTRATA_CUDA=ON): CUDA attention tests skipped";
}

#else

namespace cuda = strata::cuda;
namespace cpu = strata::cpu;
using namespace strata::cuda_test;
constexpr const char* kDeviceTests = "CUDA attention tests";
using cuda::KvStorage;

// ---- the storage rule of attention.h, on the host ------------------------------------------------------------------

struct Int8Group {
    int8_t q[64];
    uint16_t scale;
};

Int8Group quantize_group(const float* x) {
    Int8Group g{};
    float amax = 0.0f;
    for (int i = 0; i < 64; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int i = 0; i < 64; ++i) g.q[i] = static_cast<int8_t>(std::clamp(std::round(x[i] * id), -127.0f, 127.0f));
    g.scale = strata::f32_to_f16(d);
    return g;
}

// A cache on the device with a shuffled page table (more physical pages than logical ones, so some are never used),
// and its host mirror: the values as the cache stores them, in f32, by logical cell (the CPU oracle's input).
struct TestCache {
    int64_t nkv, hd, width, capacity, logical, physical;
    KvStorage storage;
    std::vector<int32_t> pages;
    std::unique_ptr<cuda::KvCache> cache;
    cuda::DeviceBuffer table_dev, n_cells_dev;
    std::vector<float> k_ref, v_ref;
    int32_t n_cells = 0;

    TestCache(int64_t n_head_kv, int64_t head_dim, KvStorage kind, int64_t cap, std::mt19937& rng)
        : nkv(n_head_kv), hd(head_dim), width(n_head_kv * head_dim), capacity(cap), storage(kind) {
        logical = (cap + 3) / 4;
        physical = logical + 5;
        std::vector<int32_t> perm(static_cast<size_t>(physical));
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        pages.assign(perm.begin(), perm.begin() + logical);
        cache = std::make_unique<cuda::KvCache>(context(), cuda::KvCacheShape{.n_head_kv = nkv, .head_dim = hd,
                                                                              .n_pages = physical, .storage = kind});
        table_dev = upload(pages);
        n_cells_dev = upload(std::vector<int32_t>{0});
        k_ref.assign(static_cast<size_t>(logical * 4 * width), 0.0f);
        v_ref = k_ref;
    }
    cuda::PageTable table() const { return {.pages = table_dev.as<int32_t>(), .n_logical_pages = logical}; }
    const int32_t* n_cells_ptr() const { return n_cells_dev.as<int32_t>(); }

    void mirror(const float* x, float* dst) const {
        if (storage == KvStorage::F16) {
            for (int64_t i = 0; i < width; ++i) dst[i] = strata::f16_to_f32(strata::f32_to_f16(x[i]));
            return;
        }
        for (int64_t g = 0; g < width / 64; ++g) {
            const Int8Group q = quantize_group(x + g * 64);
            for (int i = 0; i < 64; ++i) dst[g * 64 + i] = strata::f16_to_f32(q.scale) * static_cast<float>(q.q[i]);
        }
    }

    // Rows of T tokens (width floats each) written at the given positions.
    void append(const std::vector<float>& k, const std::vector<float>& v, const std::vector<int32_t>& positions) {
        const cuda::DeviceBuffer kd = upload(k), vd = upload(v), pd = upload(positions);
        cuda::kv_append(context(), {.cache = cache->view(), .table = table(), .k = kd.as<float>(),
                                    .v = vd.as<float>(), .positions = pd.as<int32_t>(),
                                    .n_cells = n_cells_dev.as<int32_t>(),
                                    .n_tokens = static_cast<int64_t>(positions.size())});
        context().synchronize();
        for (size_t t = 0; t < positions.size(); ++t) {
            const int32_t pos = positions[t];
            if (pos < 0 || pos >= logical * 4) continue;
            mirror(k.data() + t * width, k_ref.data() + pos * width);
            mirror(v.data() + t * width, v_ref.data() + pos * width);
            n_cells = std::max(n_cells, pos + 1);
        }
    }

    // Cells [n_cells, n) in chunks of varying size; keys and values gaussian.
    void fill_to(int32_t n, std::mt19937& rng) {
        static const int kChunks[] = {1, 7, 3, 64, 5, 256, 2, 1000};
        int c = 0;
        while (n_cells < n) {
            const int32_t t = std::min<int32_t>(kChunks[c++ % 8], n - n_cells);
            std::vector<int32_t> pos(static_cast<size_t>(t));
            std::iota(pos.begin(), pos.end(), n_cells);
            append(gaussian(static_cast<size_t>(t * width), rng), gaussian(static_cast<size_t>(t * width), rng), pos);
        }
    }
};

// ---- attention on both sides ----------------------------------------------------------------------------------------

// Queries laid out as the model's projection: per head [q | gate] (2 hd floats), q RMS-sized (sigma 1) so scores
// scale * q.k are O(1) and the softmax is neither flat nor one-hot.
struct Queries {
    int64_t nh, hd;
    std::vector<float> qg;
    Queries(int64_t n_head, int64_t head_dim, std::mt19937& rng)
        : nh(n_head), hd(head_dim), qg(gaussian(static_cast<size_t>(n_head * 2 * head_dim), rng, 1.5f)) {}
};

std::vector<float> cpu_attention(const TestCache& c, const Queries& q, std::span<const int32_t> cells) {
    std::vector<float> out(static_cast<size_t>(q.nh * q.hd));
    const float scale = 1.0f / std::sqrt(static_cast<float>(q.hd));
    for (int64_t h = 0; h < q.nh; ++h) {
        const int64_t kvh = h / (q.nh / c.nkv);
        float* o = out.data() + h * q.hd;
        cpu::attend({.q = q.qg.data() + h * 2 * q.hd, .keys = c.k_ref.data() + kvh * q.hd,
                     .values = c.v_ref.data() + kvh * q.hd, .row_stride = c.width, .head_dim = q.hd, .cells = cells,
                     .scale = scale, .out = o});
        const float* gate = q.qg.data() + h * 2 * q.hd + q.hd;
        for (int64_t d = 0; d < q.hd; ++d) o[d] *= cpu::sigmoid(gate[d]);
    }
    return out;
}

struct DeviceSelection {
    const int32_t* cells = nullptr;
    const int32_t* n_selected = nullptr;
    int64_t max_cells = 0;
};

std::vector<float> gpu_attention(const TestCache& c, const Queries& q, int64_t splits, DeviceSelection sel = {}) {
    cuda::Context& ctx = context();
    const cuda::DeviceBuffer qd = upload(q.qg);
    const size_t ws = cuda::decode_attention_workspace_bytes(q.nh, q.hd, splits);
    const cuda::DeviceBuffer work = ctx.allocate(ws, "test");
    std::vector<float> poisoned(static_cast<size_t>(q.nh * q.hd), std::nanf(""));
    const cuda::DeviceBuffer out = upload(poisoned);
    cuda::decode_attention(ctx, {.cache = c.cache->view(), .table = c.table(), .n_cells = c.n_cells_ptr(),
                                 .cells = sel.cells, .n_selected = sel.n_selected, .max_cells = sel.max_cells,
                                 .q = qd.as<float>(), .n_head = q.nh, .q_head_stride = 2 * q.hd,
                                 .gate = qd.as<float>() + q.hd, .gate_head_stride = 2 * q.hd,
                                 .scale = 1.0f / std::sqrt(static_cast<float>(q.hd)), .out = out.as<float>(),
                                 .n_splits = splits, .workspace = work.data(), .workspace_bytes = ws});
    return download<float>(out.data(), static_cast<size_t>(q.nh * q.hd));
}

// The GPU in f32 with another summation order and its own expf against the CPU in f32: each output is a convex
// combination of values, so its error is a few ulp of the largest |v| times the growth of a sum over n cells
// (~sqrt(n) eps typical); 1e-9 NMSE is ~3e-5 relative RMS, a few hundred times the worst case seen in development and
// far below what one wrong cell, head or scale would give (>1e-3).
constexpr double kAttentionNmse = 1e-9;
// The split count only regroups the same f32 sums and rescalings: 1e-11 NMSE (~3e-6 relative RMS).
constexpr double kSplitNmse = 1e-11;

// ---- the cache ------------------------------------------------------------------------------------------------------

TEST(CudaKvCache, AppendFollowsThePageTableAndTheRule) {
    SKIP_WITHOUT_DEVICE();
    std::mt19937 rng(11);
    struct Case {
        int64_t nkv, hd;
        KvStorage storage;
    };
    for (const Case cs : {Case{3, 128, KvStorage::F16}, Case{1, 32, KvStorage::F16}, Case{3, 128, KvStorage::Int8},
                          Case{2, 64, KvStorage::Int8}, Case{5, 256, KvStorage::Int8}}) {
        SCOPED_TRACE("nkv " + std::to_string(cs.nkv) + " hd " + std::to_string(cs.hd) +
                     (cs.storage == KvStorage::F16 ? " f16" : " int8"));
        TestCache c(cs.nkv, cs.hd, cs.storage, 37, rng);
        c.fill_to(19, rng);
        // Out of order, a gap, one outside the table (skipped), an exact zero row (scale 0) and a large one.
        std::vector<float> k = gaussian(static_cast<size_t>(4 * c.width), rng, 3.0f), v = k;
        std::fill(k.begin() + c.width, k.begin() + 2 * c.width, 0.0f);
        for (int64_t i = 0; i < c.width; ++i) v[3 * c.width + i] *= 1000.0f;
        c.append(k, v, {30, 20, 1000, 25});
        const std::vector<int32_t> n_cells = download<int32_t>(c.n_cells_ptr(), 1);
        EXPECT_EQ(n_cells[0], 31);
        EXPECT_EQ(c.n_cells, 31);
        const cuda::KvCacheView& view = c.cache->view();
        const size_t value_bytes = cuda::KvCache::value_bytes_per_page(view.shape) * static_cast<size_t>(c.physical);
        const size_t scale_bytes = cuda::KvCache::scale_bytes_per_page(view.shape) * static_cast<size_t>(c.physical);
        for (int which = 0; which < 2; ++which) {
            const std::vector<uint8_t> raw = download<uint8_t>(which ? view.v : view.k, value_bytes);
            const std::vector<uint16_t> scales =
                scale_bytes ? download<uint16_t>(which ? view.v_scales : view.k_scales, scale_bytes / 2)
                            : std::vector<uint16_t>();
            const std::vector<float>& ref = which ? c.v_ref : c.k_ref;
            int64_t bad = 0;
            for (int32_t pos : std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 10, 17, 18, 20, 25, 30}) {
                const int64_t page = c.pages[static_cast<size_t>(pos / 4)];
                for (int64_t h = 0; h < c.nkv; ++h) {
                    const int64_t row = (page * c.nkv + h) * 4 + pos % 4;
                    const float* want = ref.data() + pos * c.width + h * c.hd;
                    for (int64_t d = 0; d < c.hd; ++d) {
                        float got;
                        if (cs.storage == KvStorage::F16) {
                            uint16_t bits;
                            std::memcpy(&bits, raw.data() + (row * c.hd + d) * 2, 2);
                            got = strata::f16_to_f32(bits);
                        } else {
                            const auto q = static_cast<int8_t>(raw[static_cast<size_t>(row * c.hd + d)]);
                            got = strata::f16_to_f32(scales[static_cast<size_t>(row * (c.hd / 64) + d / 64)]) * q;
                        }
                        bad += std::memcmp(&got, &want[d], 4) != 0;
                    }
                }
            }
            EXPECT_EQ(bad, 0) << (which ? "V" : "K") << ": values that differ from the storage rule";
        }
    }
}

TEST(CudaKvCache, RejectsBadShapes) {
    SKIP_WITHOUT_DEVICE();
    cuda::Context& ctx = context();
    expect_error([&] { (void)cuda::KvCache(ctx, {.n_head_kv = 2, .head_dim = 96, .n_pages = 4}); }, "head_dim 96");
    expect_error(
        [&] { (void)cuda::KvCache(ctx, {.n_head_kv = 2, .head_dim = 32, .n_pages = 4, .storage = KvStorage::Int8}); },
        "head_dim 32");
    expect_error([&] { (void)cuda::KvCache(ctx, {.n_head_kv = 0, .head_dim = 64, .n_pages = 4}); }, "n_head_kv");
}

// ---- full attention -------------------------------------------------------------------------------------------------

struct AttentionCase {
    int64_t nh, nkv, hd;
    KvStorage storage;
    int32_t n_cells;
};

std::string describe(const AttentionCase& c) {
    return std::to_string(c.nh) + " heads / " + std::to_string(c.nkv) + " kv, hd " + std::to_string(c.hd) + ", " +
           (c.storage == KvStorage::F16 ? "f16" : "int8") + ", " + std::to_string(c.n_cells) + " cells";
}

TEST(CudaAttention, FullMatchesCpuAndSplitCountDoesNotMatter) {
    SKIP_WITHOUT_DEVICE();
    std::mt19937 rng(21);
    const AttentionCase cases[] = {
        {5, 5, 64, KvStorage::F16, 1},      {5, 5, 64, KvStorage::F16, 333},   {12, 3, 128, KvStorage::F16, 1001},
        {8, 1, 256, KvStorage::F16, 4099},  {6, 6, 32, KvStorage::F16, 45},    {16, 2, 256, KvStorage::F16, 777},
        {24, 3, 64, KvStorage::Int8, 517},  {4, 1, 128, KvStorage::Int8, 2050}, {3, 3, 256, KvStorage::Int8, 90},
        {24, 2, 256, KvStorage::Int8, 3001}, {24, 2, 256, KvStorage::F16, 2},   {7, 7, 128, KvStorage::Int8, 6}};
    double worst = 0, worst_split = 0;
    for (const AttentionCase& ac : cases) {
        SCOPED_TRACE(describe(ac));
        TestCache c(ac.nkv, ac.hd, ac.storage, ac.n_cells + 3, rng);
        c.fill_to(ac.n_cells, rng);
        const Queries q(ac.nh, ac.hd, rng);
        std::vector<int32_t> all(static_cast<size_t>(ac.n_cells));
        std::iota(all.begin(), all.end(), 0);
        const std::vector<float> ref = cpu_attention(c, q, all);
        const int64_t auto_splits = cuda::decode_attention_splits(context(), ac.nkv, ac.n_cells);
        const std::vector<float> one = gpu_attention(c, q, 1);
        const double e = nmse(one, ref);
        EXPECT_LT(e, kAttentionNmse) << "1 split";
        worst = std::max(worst, e);
        for (const int64_t splits : {int64_t{3}, int64_t{7}, int64_t{64}, auto_splits}) {
            const std::vector<float> got = gpu_attention(c, q, splits);
            const double es = nmse(got, one);
            EXPECT_LT(nmse(got, ref), kAttentionNmse) << splits << " splits";
            EXPECT_LT(es, kSplitNmse) << splits << " splits against 1";
            worst_split = std::max(worst_split, es);
        }
    }
    std::printf("[ info     ] full attention: worst NMSE against the CPU %.3g, between split counts %.3g\n", worst,
                worst_split);
}

// decode_attention_matmul against decode_attention per token then matmul: the same heads and the same product, bit
// for bit. Q8_0 and IQ4_NL weights take the fused form (the merge kernels quantize the heads); Q4_K (Q8_K
// activations) and a window of more than 8 tokens take the separate ops.
TEST(CudaAttention, AttentionMatmulGivesTheSeparateOpsBits) {
    SKIP_WITHOUT_DEVICE();
    cuda::Context& ctx = context();
    std::mt19937 rng(52);
    struct Case {
        AttentionCase attention;
        strata::DType type;
        int64_t tokens, rows;
    };
    const Case cases[] = {{{24, 2, 256, KvStorage::F16, 300}, strata::DType::Q8_0, 1, 96},
                          {{24, 2, 256, KvStorage::F16, 300}, strata::DType::Q8_0, 3, 96},
                          {{8, 1, 128, KvStorage::Int8, 50}, strata::DType::IQ4_NL, 2, 64},
                          {{4, 2, 64, KvStorage::F16, 20}, strata::DType::Q4_K, 1, 32},
                          {{4, 2, 64, KvStorage::F16, 20}, strata::DType::Q8_0, 9, 32}};
    for (const Case& k : cases) {
        const AttentionCase& ac = k.attention;
        const std::string what =
            describe(ac) + ", " + strata::dtype_name(k.type) + ", " + std::to_string(k.tokens) + " tokens";
        SCOPED_TRACE(what);
        TestCache c(ac.nkv, ac.hd, ac.storage, ac.n_cells + 3, rng);
        c.fill_to(ac.n_cells, rng);
        const int64_t width = ac.nh * ac.hd, splits = 5;
        const cuda::DeviceBuffer qd = upload(gaussian(static_cast<size_t>(k.tokens * 2 * width), rng, 1.5f));
        const std::vector<uint8_t> bytes = random_weights(k.type, k.rows, width, rng);
        const cuda::DeviceBuffer dw = ctx.upload(bytes.data(), bytes.size(), "test");
        const strata::Tensor w = matrix(k.type, width, k.rows, dw.data(), strata::Device::Cuda);
        const size_t ws = cuda::decode_attention_workspace_bytes(ac.nh, ac.hd, splits);
        const cuda::DeviceBuffer work = ctx.allocate(ws, "test");
        std::vector<float> heads[2], product[2];
        for (int fused = 0; fused < 2; ++fused) {
            const cuda::DeviceBuffer out = ctx.allocate(static_cast<size_t>(k.tokens * width) * 4, "test"),
                                     y = ctx.allocate(static_cast<size_t>(k.tokens * k.rows) * 4, "test");
            std::vector<cuda::DecodeAttentionArgs> per_token;
            for (int64_t t = 0; t < k.tokens; ++t) {
                const float* qg = qd.as<float>() + t * 2 * width;
                per_token.push_back({.cache = c.cache->view(),
                                     .table = c.table(),
                                     .n_cells = c.n_cells_ptr(),
                                     .q = qg,
                                     .n_head = ac.nh,
                                     .q_head_stride = 2 * ac.hd,
                                     .gate = qg + ac.hd,
                                     .gate_head_stride = 2 * ac.hd,
                                     .scale = 1.0f / std::sqrt(static_cast<float>(ac.hd)),
                                     .out = out.as<float>() + t * width,
                                     .n_splits = splits,
                                     .workspace = work.data(),
                                     .workspace_bytes = ws});
            }
            if (fused) {
                cuda::decode_attention_matmul(ctx, per_token, w, y.as<float>());
            } else {
                for (const cuda::DecodeAttentionArgs& a : per_token) cuda::decode_attention(ctx, a);
                cuda::matmul(ctx, {.w = w, .x = out.as<float>(), .y = y.as<float>(), .n_tokens = k.tokens});
            }
            heads[fused] = download<float>(out.data(), static_cast<size_t>(k.tokens * width));
            product[fused] = download<float>(y.data(), static_cast<size_t>(k.tokens * k.rows));
        }
        EXPECT_EQ(std::memcmp(heads[0].data(), heads[1].data(), heads[0].size() * 4), 0) << what << ": heads differ";
        EXPECT_EQ(std::memcmp(product[0].data(), product[1].data(), product[0].size() * 4), 0)
            << what << ": products differ";
    }
}

// ---- QSA ------------------------------------------------------------------------------------------------------------

// Pooled keys with ties on purpose: every 5th row copies an earlier one (equal scores), every 3rd is zero (score 0:
// with relu, ties at 0 decide the last places whenever fewer than k blocks score above 0).
std::vector<float> pooled_keys(int64_t n_blocks, int64_t di, std::mt19937& rng) {
    std::vector<float> p = gaussian(static_cast<size_t>(n_blocks * di), rng);
    std::uniform_int_distribution<int64_t> pick(0, std::max<int64_t>(0, n_blocks - 1));
    for (int64_t b = 0; b < n_blocks; ++b) {
        float* row = p.data() + b * di;
        if (b % 3 == 1) std::fill(row, row + di, 0.0f);
        if (b % 5 == 4) {
            const int64_t src = pick(rng) % b;
            std::copy_n(p.data() + src * di, di, row);
        }
    }
    return p;
}

struct QsaDevice {
    strata::IndexerShape shape;
    int64_t max_blocks;
    cuda::DeviceBuffer q, pooled, scores, keys, cells, n_selected;
    QsaDevice(const strata::IndexerShape& s, int64_t max_blk, const std::vector<float>& qv,
              const std::vector<float>& pooled_rows)
        : shape(s), max_blocks(max_blk) {
        q = upload(qv);
        pooled = upload(pooled_rows);
        scores = context().allocate(static_cast<size_t>(max_blocks) * 4, "test");
        keys = context().allocate(static_cast<size_t>(max_blocks) * 8, "test");
        cells = context().allocate(static_cast<size_t>(strata::qsa_max_cells(s)) * 4, "test");
        n_selected = context().allocate(4, "test");
    }
    cuda::QsaSelectArgs args(const int32_t* n_cells) const {
        return {.n_head = shape.n_head, .head_dim = shape.head_dim, .budget = shape.budget, .ratio = shape.ratio,
                .q = q.as<float>(), .pooled = pooled.as<float>(), .max_blocks = max_blocks, .n_cells = n_cells,
                .scores = scores.as<float>(), .keys = keys.as<uint32_t>(), .cells = cells.as<int32_t>(),
                .n_selected = n_selected.as<int32_t>()};
    }
    DeviceSelection selection() const {
        return {.cells = cells.as<int32_t>(), .n_selected = n_selected.as<int32_t>(),
                .max_cells = strata::qsa_max_cells(shape)};
    }
};

TEST(CudaQsa, SelectionIsExactlyTheCpus) {
    SKIP_WITHOUT_DEVICE();
    std::mt19937 rng(31);
    struct Case {
        strata::IndexerShape shape;
        std::vector<int32_t> n_cells;
    };
    const Case cases[] = {
        {{.n_head = 4, .head_dim = 128, .budget = 2048, .ratio = 4}, {1, 3, 4, 2051, 2052, 2053, 2056, 8197, 40001}},
        {{.n_head = 2, .head_dim = 32, .budget = 16, .ratio = 4}, {1, 5, 16, 17, 19, 20, 21, 63, 97, 1000}},
        {{.n_head = 3, .head_dim = 60, .budget = 30, .ratio = 5}, {4, 30, 34, 35, 36, 301, 5003}},
        {{.n_head = 1, .head_dim = 16, .budget = 3, .ratio = 4}, {3, 4, 9, 77}},  // budget < ratio: only the tail
        {{.n_head = 4, .head_dim = 64, .budget = 256, .ratio = 4}, {140001}},     // keys beyond shared memory
    };
    int64_t compared = 0;
    for (const Case& cs : cases) {
        const strata::IndexerShape& s = cs.shape;
        const int64_t max_cells_in_cache = *std::max_element(cs.n_cells.begin(), cs.n_cells.end());
        const int64_t max_blocks = std::max<int64_t>(1, max_cells_in_cache / s.ratio);
        const std::vector<float> pooled = pooled_keys(max_blocks, s.head_dim, rng);
        for (const int32_t n : cs.n_cells) {
            SCOPED_TRACE("indexer " + std::to_string(s.n_head) + " x " + std::to_string(s.head_dim) + ", budget " +
                         std::to_string(s.budget) + ", ratio " + std::to_string(s.ratio) + ", " + std::to_string(n) +
                         " cells");
            // Queries normalised as the model's (RMS 1 per head).
            std::vector<float> q = gaussian(static_cast<size_t>(s.n_head * s.head_dim), rng);
            const std::vector<int32_t> want = strata::qsa_select(s, q.data(), pooled.data(), n - 1);
            std::vector<float> want_scores(static_cast<size_t>(n / s.ratio + 1));
            std::vector<int32_t> scratch_cells(static_cast<size_t>(strata::qsa_max_cells(s)));
            strata::QsaSelectScratch select_scratch;
            strata::qsa_select_into(s, q.data(), pooled.data(), n - 1, scratch_cells.data(), want_scores.data(),
                                    select_scratch);
            const QsaDevice dev(s, max_blocks, q, pooled);
            const cuda::DeviceBuffer n_dev = upload(std::vector<int32_t>{n});
            cuda::qsa_select(context(), dev.args(n_dev.as<int32_t>()));
            const int32_t got_n = download<int32_t>(dev.n_selected.data(), 1)[0];
            ASSERT_EQ(got_n, static_cast<int32_t>(want.size()));
            const std::vector<int32_t> got = download<int32_t>(dev.cells.data(), want.size());
            EXPECT_EQ(got, want);
            const int64_t n_blocks = n / s.ratio;
            if (std::min(s.budget / s.ratio, n_blocks) < n_blocks) {
                const std::vector<float> got_scores = download<float>(dev.scores.data(), static_cast<size_t>(n_blocks));
                EXPECT_EQ(std::memcmp(got_scores.data(), want_scores.data(), static_cast<size_t>(n_blocks) * 4), 0)
                    << "scores differ from the CPU's bits";
            }
            ++compared;
        }
    }
    std::printf("[ info     ] %lld selections compared cell for cell\n", static_cast<long long>(compared));
}

TEST(CudaQsa, SparseAttentionMatchesCpu) {
    SKIP_WITHOUT_DEVICE();
    std::mt19937 rng(41);
    struct Case {
        AttentionCase a;
        strata::IndexerShape ix;
    };
    const Case cases[] = {
        {{24, 2, 256, KvStorage::F16, 1999}, {.n_head = 4, .head_dim = 128, .budget = 256, .ratio = 4}},
        {{24, 2, 256, KvStorage::Int8, 1999}, {.n_head = 4, .head_dim = 128, .budget = 256, .ratio = 4}},
        {{8, 1, 128, KvStorage::Int8, 703}, {.n_head = 2, .head_dim = 64, .budget = 64, .ratio = 4}},
        {{12, 3, 64, KvStorage::F16, 129}, {.n_head = 3, .head_dim = 32, .budget = 200, .ratio = 4}},  // keeps all
    };
    for (const Case& cs : cases) {
        SCOPED_TRACE(describe(cs.a));
        TestCache c(cs.a.nkv, cs.a.hd, cs.a.storage, cs.a.n_cells + 9, rng);
        c.fill_to(cs.a.n_cells, rng);
        const Queries q(cs.a.nh, cs.a.hd, rng);
        const int64_t max_blocks = c.logical * 4 / cs.ix.ratio;
        const std::vector<float> pooled = pooled_keys(max_blocks, cs.ix.head_dim, rng);
        const std::vector<float> iq = gaussian(static_cast<size_t>(cs.ix.n_head * cs.ix.head_dim), rng);
        const std::vector<int32_t> cells = strata::qsa_select(cs.ix, iq.data(), pooled.data(), cs.a.n_cells - 1);
        const std::vector<float> ref = cpu_attention(c, q, cells);
        const QsaDevice dev(cs.ix, max_blocks, iq, pooled);
        cuda::qsa_select(context(), dev.args(c.n_cells_ptr()));
        const int64_t splits = cuda::decode_attention_splits(context(), cs.a.nkv, strata::qsa_max_cells(cs.ix));
        for (const int64_t s : {int64_t{1}, int64_t{5}, splits}) {
            const std::vector<float> got = gpu_attention(c, q, s, dev.selection());
            EXPECT_LT(nmse(got, ref), kAttentionNmse) << s << " splits";
        }
        // Against attention over all cells: QSA must have left some out (except the case that keeps all).
        std::vector<int32_t> all(static_cast<size_t>(cs.a.n_cells));
        std::iota(all.begin(), all.end(), 0);
        if (static_cast<int64_t>(cells.size()) < cs.a.n_cells) {
            EXPECT_GT(nmse(cpu_attention(c, q, all), ref), 1e-6);
        }
    }
}

// A prompt window's queries at consecutive positions (model/cuda/hybrid_cuda.cpp attention_window): the batched
// selection (in groups of various sizes, each query with its own workspace) gives every query the cells, count and
// bits it gets alone, and the batched attention (one launch for all queries, one split) the bits of each query's own
// one-split decode_attention; the positions cross the QSA budget inside the window and the tail block takes every
// offset.
TEST(CudaQsa, BatchedWindowGivesEachQuerysOwnBits) {
    SKIP_WITHOUT_DEVICE();
    cuda::Context& ctx = context();
    std::mt19937 rng(43);
    struct Case {
        AttentionCase a;  // n_cells: the cache length after the window
        strata::IndexerShape ix;
        int64_t window;
        bool sparse;
    };
    const Case cases[] = {
        {{24, 2, 256, KvStorage::F16, 300}, {.n_head = 4, .head_dim = 128, .budget = 64, .ratio = 4}, 77, true},
        {{8, 1, 128, KvStorage::Int8, 40}, {.n_head = 2, .head_dim = 64, .budget = 16, .ratio = 4}, 40, true},
        {{12, 3, 64, KvStorage::F16, 60}, {.n_head = 3, .head_dim = 32, .budget = 30, .ratio = 5}, 45, true},
        {{8, 2, 64, KvStorage::F16, 70}, {}, 33, false},  // full attention: every query over its own prefix
    };
    for (const Case& cs : cases) {
        SCOPED_TRACE(describe(cs.a) + (cs.sparse ? ", QSA" : ", full") + ", window " + std::to_string(cs.window));
        const int64_t T = cs.window, nh = cs.a.nh, hd = cs.a.hd, width = nh * hd;
        TestCache c(cs.a.nkv, hd, cs.a.storage, cs.a.n_cells + 9, rng);
        c.fill_to(cs.a.n_cells, rng);
        std::vector<int32_t> lengths(static_cast<size_t>(T));
        for (int64_t t = 0; t < T; ++t) lengths[static_cast<size_t>(t)] = static_cast<int32_t>(cs.a.n_cells - T + 1 + t);
        const cuda::DeviceBuffer lengths_dev = upload(lengths);
        const cuda::DeviceBuffer qd = upload(gaussian(static_cast<size_t>(T * 2 * width), rng, 1.5f));
        const strata::IndexerShape& ix = cs.ix;
        const int64_t max_cells = cs.sparse ? strata::qsa_max_cells(ix) : 0;
        const int64_t max_blocks = cs.sparse ? c.logical * 4 / ix.ratio : 1;
        cuda::DeviceBuffer pooled, iq, cells[2], n_selected[2], scores, keys;
        if (cs.sparse) {
            pooled = upload(pooled_keys(max_blocks, ix.head_dim, rng));
            iq = upload(gaussian(static_cast<size_t>(T * ix.n_head * ix.head_dim), rng));
            scores = ctx.allocate(static_cast<size_t>(T * max_blocks) * 4, "test");
            keys = ctx.allocate(static_cast<size_t>(T * max_blocks) * 8, "test");
            for (int k = 0; k < 2; ++k) {
                cells[k] = upload(std::vector<int32_t>(static_cast<size_t>(T * max_cells), -7));
                n_selected[k] = upload(std::vector<int32_t>(static_cast<size_t>(T), -7));
            }
            auto select = [&](int k, int64_t t, int64_t n) {
                cuda::qsa_select(ctx, {.n_head = ix.n_head, .head_dim = ix.head_dim, .budget = ix.budget,
                                       .ratio = ix.ratio, .q = iq.as<float>() + t * ix.n_head * ix.head_dim,
                                       .pooled = pooled.as<float>(), .max_blocks = max_blocks,
                                       .n_cells = lengths_dev.as<int32_t>() + t, .scores = scores.as<float>(),
                                       .keys = keys.as<uint32_t>(), .cells = cells[k].as<int32_t>() + t * max_cells,
                                       .n_selected = n_selected[k].as<int32_t>() + t, .n_queries = n,
                                       .q_stride = ix.n_head * ix.head_dim, .cells_stride = max_cells});
            };
            for (int64_t t = 0; t < T; ++t) select(0, t, 1);
            const std::vector<int32_t> want_n = download<int32_t>(n_selected[0].data(), static_cast<size_t>(T));
            const std::vector<int32_t> want = download<int32_t>(cells[0].data(), static_cast<size_t>(T * max_cells));
            bool dropped = false;
            for (int64_t t = 0; t < T; ++t) dropped |= want_n[static_cast<size_t>(t)] < lengths[static_cast<size_t>(t)];
            EXPECT_TRUE(dropped) << "the window never crosses the budget";
            for (const int64_t group : {T, int64_t{5}, int64_t{1}}) {
                for (int64_t t = 0; t < T; t += group) select(1, t, std::min(group, T - t));
                EXPECT_EQ(download<int32_t>(n_selected[1].data(), static_cast<size_t>(T)), want_n) << group;
                const std::vector<int32_t> got = download<int32_t>(cells[1].data(), static_cast<size_t>(T * max_cells));
                for (int64_t t = 0; t < T; ++t) {
                    const auto at = static_cast<size_t>(t * max_cells), n = static_cast<size_t>(want_n[size_t(t)]);
                    EXPECT_TRUE(std::equal(got.begin() + long(at), got.begin() + long(at + n), want.begin() + long(at)))
                        << "query " << t << ", groups of " << group;
                }
            }
        }
        const size_t ws = cuda::decode_attention_workspace_bytes(nh, hd, 1);
        const cuda::DeviceBuffer work = ctx.allocate(ws, "test");
        const cuda::DeviceBuffer alone = ctx.allocate(static_cast<size_t>(T * width) * 4, "test");
        const cuda::DeviceBuffer batched = upload(std::vector<float>(static_cast<size_t>(T * width), std::nanf("")));
        const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
        for (int64_t t = 0; t < T; ++t) {
            const float* qg = qd.as<float>() + t * 2 * width;
            cuda::decode_attention(ctx, {.cache = c.cache->view(), .table = c.table(),
                                         .n_cells = lengths_dev.as<int32_t>() + t,
                                         .cells = cs.sparse ? cells[0].as<int32_t>() + t * max_cells : nullptr,
                                         .n_selected = cs.sparse ? n_selected[0].as<int32_t>() + t : nullptr,
                                         .max_cells = max_cells, .q = qg, .n_head = nh, .q_head_stride = 2 * hd,
                                         .gate = qg + hd, .gate_head_stride = 2 * hd, .scale = scale,
                                         .out = alone.as<float>() + t * width, .n_splits = 1,
                                         .workspace = work.data(), .workspace_bytes = ws});
        }
        cuda::decode_attention(ctx, {.cache = c.cache->view(), .table = c.table(), .n_cells = lengths_dev.as<int32_t>(),
                                     .cells = cs.sparse ? cells[0].as<int32_t>() : nullptr,
                                     .n_selected = cs.sparse ? n_selected[0].as<int32_t>() : nullptr,
                                     .max_cells = max_cells, .q = qd.as<float>(), .n_head = nh,
                                     .q_head_stride = 2 * hd, .gate = qd.as<float>() + hd, .gate_head_stride = 2 * hd,
                                     .scale = scale, .out = batched.as<float>(), .n_splits = 1, .n_queries = T,
                                     .q_token_stride = 2 * width, .gate_token_stride = 2 * width,
                                     .out_token_stride = width, .cells_stride = cs.sparse ? max_cells : 0});
        const std::vector<float> want = download<float>(alone.data(), static_cast<size_t>(T * width));
        const std::vector<float> got = download<float>(batched.data(), static_cast<size_t>(T * width));
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << "batched attention differs";
        // And the last query against the CPU (the per-query path's oracle), so a shared fault cannot hide.
        if (!cs.sparse) {
            Queries last(nh, hd, rng);
            last.qg = download<float>(qd.as<float>() + (T - 1) * 2 * width, static_cast<size_t>(2 * width));
            std::vector<int32_t> all(static_cast<size_t>(lengths.back()));
            std::iota(all.begin(), all.end(), 0);
            const std::vector<float> ref = cpu_attention(c, last, all);
            EXPECT_LT(nmse(std::vector<float>(got.end() - width, got.end()), ref), kAttentionNmse);
        }
    }
}

// Append one token, select, attend, all captured once as a graph and replayed for consecutive tokens: only the device
// buffers change between replays (the position, written by a copy queued before each launch).
TEST(CudaAttention, GraphReplayMatchesCpu) {
    SKIP_WITHOUT_DEVICE();
    cuda::Context& ctx = context();
    cudaStream_t stream = ctx.stream().handle();
    std::mt19937 rng(51);
    const strata::IndexerShape ix{.n_head = 2, .head_dim = 64, .budget = 32, .ratio = 4};
    const AttentionCase ac{16, 2, 128, KvStorage::Int8, 97};
    TestCache c(ac.nkv, ac.hd, ac.storage, 160, rng);
    c.fill_to(ac.n_cells, rng);
    const int64_t max_blocks = c.logical;
    const std::vector<float> pooled = pooled_keys(max_blocks, ix.head_dim, rng);
    const std::vector<float> iq = gaussian(static_cast<size_t>(ix.n_head * ix.head_dim), rng);
    const QsaDevice dev(ix, max_blocks, iq, pooled);
    const Queries q(ac.nh, ac.hd, rng);
    const cuda::DeviceBuffer qd = upload(q.qg);
    const int64_t splits = 6;
    const size_t ws = cuda::decode_attention_workspace_bytes(ac.nh, ac.hd, splits);
    const cuda::DeviceBuffer work = ctx.allocate(ws, "test"), out = ctx.allocate(q.qg.size() / 2 * 4, "test");
    const cuda::DeviceBuffer kd = ctx.allocate(static_cast<size_t>(c.width) * 4, "test");
    const cuda::DeviceBuffer vd = ctx.allocate(static_cast<size_t>(c.width) * 4, "test");
    const cuda::DeviceBuffer pos_dev = ctx.allocate(4, "test");
    auto step = [&] {
        cuda::kv_append(ctx, {.cache = c.cache->view(), .table = c.table(), .k = kd.as<float>(), .v = vd.as<float>(),
                              .positions = pos_dev.as<int32_t>(), .n_cells = c.n_cells_dev.as<int32_t>(),
                              .n_tokens = 1});
        cuda::qsa_select(ctx, dev.args(c.n_cells_ptr()));
        cuda::decode_attention(ctx, {.cache = c.cache->view(), .table = c.table(), .n_cells = c.n_cells_ptr(),
                                     .cells = dev.cells.as<int32_t>(), .n_selected = dev.n_selected.as<int32_t>(),
                                     .max_cells = strata::qsa_max_cells(ix), .q = qd.as<float>(), .n_head = ac.nh,
                                     .q_head_stride = 2 * ac.hd, .gate = qd.as<float>() + ac.hd,
                                     .gate_head_stride = 2 * ac.hd,
                                     .scale = 1.0f / std::sqrt(static_cast<float>(ac.hd)),
                                     .out = out.as<float>(), .n_splits = splits, .workspace = work.data(),
                                     .workspace_bytes = ws});
    };
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    step();
    CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int token = 0; token < 9; ++token) {
        const int32_t pos = c.n_cells;
        const std::vector<float> k = gaussian(static_cast<size_t>(c.width), rng, 2.0f);
        const std::vector<float> v = gaussian(static_cast<size_t>(c.width), rng);
        CHECK_CUDA(cudaMemcpyAsync(kd.data(), k.data(), k.size() * 4, cudaMemcpyHostToDevice, stream));
        CHECK_CUDA(cudaMemcpyAsync(vd.data(), v.data(), v.size() * 4, cudaMemcpyHostToDevice, stream));
        CHECK_CUDA(cudaMemcpyAsync(pos_dev.data(), &pos, 4, cudaMemcpyHostToDevice, stream));
        CHECK_CUDA(cudaGraphLaunch(exec, stream));
        CHECK_CUDA(cudaStreamSynchronize(stream));
        // The host mirror takes the same token.
        c.mirror(k.data(), c.k_ref.data() + pos * c.width);
        c.mirror(v.data(), c.v_ref.data() + pos * c.width);
        c.n_cells = pos + 1;
        const std::vector<int32_t> cells = strata::qsa_select(ix, iq.data(), pooled.data(), pos);
        const std::vector<float> ref = cpu_attention(c, q, cells);
        const std::vector<float> got = download<float>(out.data(), ref.size());
        EXPECT_LT(nmse(got, ref), kAttentionNmse) << "token at " << pos;
        EXPECT_EQ(download<int32_t>(c.n_cells_ptr(), 1)[0], pos + 1);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
}

TEST(CudaAttention, RejectsBadArguments) {
    SKIP_WITHOUT_DEVICE();
    cuda::Context& ctx = context();
    std::mt19937 rng(61);
    TestCache c(2, 128, KvStorage::F16, 16, rng);
    const cuda::DeviceBuffer b = ctx.allocate(1 << 20, "test");
    const cuda::DecodeAttentionArgs good{.cache = c.cache->view(), .table = c.table(), .n_cells = c.n_cells_ptr(),
                                         .q = b.as<float>(), .n_head = 8, .out = b.as<float>(), .n_splits = 2,
                                         .workspace = b.data(), .workspace_bytes = 1 << 20};
    cuda::DecodeAttentionArgs a = good;
    a.n_head = 7;
    expect_error([&] { cuda::decode_attention(ctx, a); }, "no multiple");
    a = good;
    a.n_head = 2 * 64;  // 64 query heads per kv head at hd 128: over the 32 the kernel holds
    expect_error([&] { cuda::decode_attention(ctx, a); }, "query heads per kv head");
    a = good;
    a.workspace_bytes = 16;
    expect_error([&] { cuda::decode_attention(ctx, a); }, "workspace");
    a = good;
    a.n_splits = 0;
    expect_error([&] { cuda::decode_attention(ctx, a); }, "n_splits");
    a = good;
    const int32_t* cells = b.as<int32_t>();
    a.cells = cells;
    expect_error([&] { cuda::decode_attention(ctx, a); }, "n_selected");
}

// ---- timing ---------------------------------------------------------------------------------------------------------

// The Flash-Next attention layers at decode: 12 layers (48 blocks, one in 4 attention) in one graph, each layer with
// its own cache, pooled keys and page table (shuffled), so nothing a replay reads was left in L2 by the layer before.
TEST(CudaPerf, FlashNextDecodeAttention) {
    if (!std::getenv("STRATA_CUDA_PERF")) GTEST_SKIP() << "set STRATA_CUDA_PERF=1 for the CUDA timing run";
    SKIP_WITHOUT_DEVICE();
    cuda::Context& ctx = context();
    const double copy_gbs = copy_bandwidth_gbs(ctx);
    constexpr int64_t kLayers = 12, kHeads = 24, kKvHeads = 2, kDim = 256;
    const strata::IndexerShape ix{.n_head = 4, .head_dim = 128, .budget = 2048, .ratio = 4};
    std::printf("[ perf     ] %s, %d SMs, L2 %.0f MB; device copy (read + write) %.0f GB/s\n", ctx.info().name.c_str(),
                ctx.info().multiprocessors, ctx.info().l2_bytes / 1e6, copy_gbs);
    std::printf("[ perf     ] Flash-Next attention at decode: %lld q heads, %lld kv heads of %lld, indexer %lld x "
                "%lld, budget %lld, ratio %lld; per layer = one 12-layer graph replay / 12 (median of 21)\n",
                static_cast<long long>(kHeads), static_cast<long long>(kKvHeads), static_cast<long long>(kDim),
                static_cast<long long>(ix.n_head), static_cast<long long>(ix.head_dim),
                static_cast<long long>(ix.budget), static_cast<long long>(ix.ratio));
    std::printf("[ perf     ] %-28s %8s %7s %10s %10s %8s %7s\n", "what", "cells", "splits", "us/layer", "MB/layer",
                "GB/s", "%copy");
    std::mt19937 rng(71);
    const std::vector<float> chunk_k = gaussian(size_t{4096} * kKvHeads * kDim, rng);
    const std::vector<float> chunk_v = gaussian(size_t{4096} * kKvHeads * kDim, rng);
    const cuda::DeviceBuffer ck = upload(chunk_k), cv = upload(chunk_v);
    const Queries q(kHeads, kDim, rng);
    const cuda::DeviceBuffer qd = upload(q.qg);
    const std::vector<float> iq = gaussian(static_cast<size_t>(ix.n_head * ix.head_dim), rng);
    const cuda::DeviceBuffer out = ctx.allocate(static_cast<size_t>(kHeads * kDim) * 4, "perf");
    for (const int32_t n_cells : {32768, 131072}) {
        const int64_t n_blocks = n_cells / ix.ratio;
        const std::vector<float> pooled = gaussian(static_cast<size_t>(n_blocks * ix.head_dim), rng);
        for (const KvStorage storage : {KvStorage::F16, KvStorage::Int8}) {
            const char* kind = storage == KvStorage::F16 ? "f16" : "int8";
            struct Layer {
                std::unique_ptr<cuda::KvCache> cache;
                cuda::DeviceBuffer table, n_cells, positions;
                std::unique_ptr<QsaDevice> qsa;
            };
            std::vector<Layer> layers(kLayers);
            const int64_t pages = n_cells / 4;
            for (Layer& l : layers) {
                l.cache = std::make_unique<cuda::KvCache>(
                    ctx, cuda::KvCacheShape{.n_head_kv = kKvHeads, .head_dim = kDim, .n_pages = pages,
                                            .storage = storage});
                std::vector<int32_t> perm(static_cast<size_t>(pages));
                std::iota(perm.begin(), perm.end(), 0);
                std::shuffle(perm.begin(), perm.end(), rng);
                l.table = upload(perm);
                l.n_cells = upload(std::vector<int32_t>{0});
                std::vector<int32_t> pos(static_cast<size_t>(n_cells));
                std::iota(pos.begin(), pos.end(), 0);
                l.positions = upload(pos);
                for (int64_t t0 = 0; t0 < n_cells; t0 += 4096)
                    cuda::kv_append(ctx, {.cache = l.cache->view(), .table = {l.table.as<int32_t>(), pages},
                                          .k = ck.as<float>(), .v = cv.as<float>(),
                                          .positions = l.positions.as<int32_t>() + t0,
                                          .n_cells = l.n_cells.as<int32_t>(), .n_tokens = 4096});
                l.qsa = std::make_unique<QsaDevice>(ix, n_blocks, iq, pooled);
            }
            ctx.synchronize();
            const int64_t qsa_cells = strata::qsa_max_cells(ix);
            const int64_t qsa_splits = cuda::decode_attention_splits(ctx, kKvHeads, qsa_cells);
            const int64_t full_splits = cuda::decode_attention_splits(ctx, kKvHeads, n_cells);
            const size_t ws =
                cuda::decode_attention_workspace_bytes(kHeads, kDim, 2 * std::max(qsa_splits, full_splits));
            const cuda::DeviceBuffer work = ctx.allocate(ws, "perf");
            auto attend = [&](const Layer& l, bool sparse, int64_t splits) {
                cuda::decode_attention(
                    ctx, {.cache = l.cache->view(), .table = {l.table.as<int32_t>(), pages},
                          .n_cells = l.n_cells.as<int32_t>(),
                          .cells = sparse ? l.qsa->cells.as<int32_t>() : nullptr,
                          .n_selected = sparse ? l.qsa->n_selected.as<int32_t>() : nullptr,
                          .max_cells = sparse ? qsa_cells : 0, .q = qd.as<float>(), .n_head = kHeads,
                          .q_head_stride = 2 * kDim, .gate = qd.as<float>() + kDim, .gate_head_stride = 2 * kDim,
                          .scale = 1.0f / 16.0f, .out = out.as<float>(), .n_splits = splits,
                          .workspace = work.data(), .workspace_bytes = ws});
            };
            const double select_us = graph_median_us(ctx, [&] {
                for (const Layer& l : layers) cuda::qsa_select(ctx, l.qsa->args(l.n_cells.as<int32_t>()));
            }) / kLayers;
            const double sparse_us = graph_median_us(ctx, [&] {
                for (const Layer& l : layers) attend(l, true, qsa_splits);
            }) / kLayers;
            const double qsa_us = graph_median_us(ctx, [&] {
                for (const Layer& l : layers) {
                    cuda::qsa_select(ctx, l.qsa->args(l.n_cells.as<int32_t>()));
                    attend(l, true, qsa_splits);
                }
            }) / kLayers;
            const double full_us = graph_median_us(ctx, [&] {
                for (const Layer& l : layers) attend(l, false, full_splits);
            }) / kLayers;
            // Variants of the split count, for the notes: half the splits for the sparse cells, twice for all cells.
            const int64_t sparse_half = std::max<int64_t>(1, qsa_splits / 2), full_double = 2 * full_splits;
            const double sparse_half_us = graph_median_us(ctx, [&] {
                for (const Layer& l : layers) attend(l, true, sparse_half);
            }) / kLayers;
            const double full_double_us = graph_median_us(ctx, [&] {
                for (const Layer& l : layers) attend(l, false, full_double);
            }) / kLayers;
            // Bytes each part must move: K and V of the cells read (values and int8 scales), the pooled keys read, the
            // block keys written and read back, the cell list written and read back.
            const double per_cell = 2.0 * static_cast<double>(cuda::KvCache::value_bytes_per_page(
                                                                  layers[0].cache->shape()) +
                                                              cuda::KvCache::scale_bytes_per_page(
                                                                  layers[0].cache->shape())) /
                                    4.0;
            const int32_t n_sel = download<int32_t>(layers[0].qsa->n_selected.data(), 1)[0];
            const double select_bytes = static_cast<double>(n_blocks) * (ix.head_dim * 4 + 8 + 4) + n_sel * 4.0;
            const double sparse_bytes = n_sel * (per_cell + 4.0);
            const double full_bytes = n_cells * per_cell;
            auto line = [&](const std::string& what, int64_t cells, int64_t splits, double us, double bytes) {
                const double gbs = bytes / (us * 1e-6) / 1e9;
                std::printf("[ perf     ] %-28s %8lld %7lld %10.2f %10.2f %8.0f %6.1f%%\n", what.c_str(),
                            static_cast<long long>(cells), static_cast<long long>(splits), us, bytes / 1e6, gbs,
                            100.0 * gbs / copy_gbs);
            };
            const std::string ctx_name = std::to_string(n_cells / 1024) + "K " + kind;
            line(ctx_name + " indexer+top-k", n_cells, 0, select_us, select_bytes);
            line(ctx_name + " sparse attention", n_sel, qsa_splits, sparse_us, sparse_bytes);
            line(ctx_name + " QSA decode (both)", n_cells, qsa_splits, qsa_us, select_bytes + sparse_bytes);
            line(ctx_name + " full attention", n_cells, full_splits, full_us, full_bytes);
            line(ctx_name + " sparse, half splits", n_sel, sparse_half, sparse_half_us, sparse_bytes);
            line(ctx_name + " full, double splits", n_cells, full_double, full_double_us, full_bytes);
        }
    }
}

#endif  // STRATA_HAS_CUDA

}  // namespace
