// `strata bench qsa-union` (issue 8, seed 003): one prompt chunk of QSA attention at the Flash-Next shape (24 query
// heads, 2 kv heads of 256, budget 2,048 at ratio 4), timed with the FP32 per-query kernel (decode_attention once per
// position, as the model's per-token path) and with the union kernel (groups of 8 positions), for selections whose
// 8-position unions are about 1.15x, 2.7x and 5.2x one position's cells, and for independent selections.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "app/commands.h"
#include "core/dtype.h"
#include "core/error.h"

#if STRATA_HAS_CUDA
#include "backend/cuda/attention.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/qsa_union.h"
#endif

namespace strata::app {

namespace {

constexpr int64_t kBudget = 2048, kRatio = 4;
constexpr int64_t kGroup = 8;  // positions per union (cuda::kQsaUnionGroup)

}  // namespace

#if STRATA_HAS_CUDA
namespace {

constexpr int64_t kHeads = 24, kKvHeads = 2, kHeadDim = 256;

// Each position keeps the blocks of a shared base set except a `drift` fraction, which it replaces with random blocks
// of its own context (drift 1: independent selections); then its partial tail block, as qsa_select lays them out.
// The 8-position union is then about (1 - drift^8) + 8 drift times one position's blocks.
struct Selections {
    std::vector<int32_t> cells, n_selected, lengths;
    int64_t max_cells = 0;
    double union_ratio = 0;  // mean over the groups of 8: union size / the group's first position's cells
};

Selections make_selections(int64_t n_positions, int64_t first_length, double drift, std::mt19937& rng) {
    const int64_t keep = kBudget / kRatio;
    Selections s;
    s.max_cells = keep * kRatio + kRatio;
    s.cells.assign(static_cast<size_t>(n_positions * s.max_cells), 0);
    s.n_selected.resize(static_cast<size_t>(n_positions));
    s.lengths.resize(static_cast<size_t>(n_positions));
    std::uniform_real_distribution<double> u(0.0, 1.0);
    std::vector<int32_t> base;
    std::vector<char> chosen;
    double ratio_sum = 0;
    int64_t groups = 0;
    std::unordered_set<int32_t> group_union;
    for (int64_t t = 0; t < n_positions; ++t) {
        const int64_t length = first_length + t, n_blocks = length / kRatio;
        std::uniform_int_distribution<int32_t> any(0, static_cast<int32_t>(n_blocks - 1));
        if (t % kGroup == 0) {  // a new base set every group, so groups do not share one
            base.clear();
            chosen.assign(static_cast<size_t>(n_blocks + n_positions), 0);
            while (static_cast<int64_t>(base.size()) < keep) {
                const int32_t b = any(rng);
                if (!chosen[static_cast<size_t>(b)]) chosen[static_cast<size_t>(b)] = 1, base.push_back(b);
            }
            std::fill(chosen.begin(), chosen.end(), 0);
        }
        std::vector<int32_t> blocks;
        for (int32_t b : base)
            if (u(rng) >= drift) blocks.push_back(b), chosen[static_cast<size_t>(b)] = 1;
        while (static_cast<int64_t>(blocks.size()) < keep) {
            const int32_t b = any(rng);
            if (!chosen[static_cast<size_t>(b)]) chosen[static_cast<size_t>(b)] = 1, blocks.push_back(b);
        }
        for (int32_t b : blocks) chosen[static_cast<size_t>(b)] = 0;
        std::sort(blocks.begin(), blocks.end());
        int32_t* row = s.cells.data() + t * s.max_cells;
        int64_t n = 0;
        for (int32_t b : blocks)
            for (int64_t j = 0; j < kRatio; ++j) row[n++] = static_cast<int32_t>(b * kRatio + j);
        for (int64_t c = n_blocks * kRatio; c < length; ++c) row[n++] = static_cast<int32_t>(c);
        s.n_selected[static_cast<size_t>(t)] = static_cast<int32_t>(n);
        s.lengths[static_cast<size_t>(t)] = static_cast<int32_t>(length);
        if (t % kGroup == 0) group_union.clear();
        group_union.insert(row, row + n);
        if (t % kGroup == kGroup - 1) {
            ratio_sum += static_cast<double>(group_union.size()) /
                         s.n_selected[static_cast<size_t>(t - kGroup + 1)];
            ++groups;
        }
    }
    s.union_ratio = groups ? ratio_sum / static_cast<double>(groups) : 1.0;
    return s;
}

// Median wall time of a graph replay in milliseconds (the graph holds the whole chunk's launches).
double median_replay_ms(cuda::Context& ctx, const cuda::Graph& graph, int reps) {
    graph.replay(ctx);  // warm-up
    ctx.synchronize();
    std::vector<double> ms;
    for (int r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        graph.replay(ctx);
        ctx.synchronize();
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

}  // namespace
#endif

int run_qsa_union_bench(const Args& args) {
    const int64_t positions = args.get_int("--positions", 8, 65536).value_or(8192);
    const int64_t first = args.get_int("--context", kBudget + kRatio, 1 << 22).value_or(24576);
    const int reps = static_cast<int>(args.get_int("-r", 1, 1000).value_or(5));
    const bool int8 = args.get_choice("--kv-cache", {"f16", "int8"}).value_or("int8") == "int8";
#if STRATA_HAS_CUDA
    cuda::Context ctx{cuda::ContextOptions{}};
    std::mt19937 rng(0x5eed);
    const int64_t capacity = first + positions;
    const int64_t pages = (capacity + cuda::kKvPageCells - 1) / cuda::kKvPageCells;
    // A random pool behind a shuffled page table: int8 values with fp16 scales, or fp16 values.
    cuda::KvCache cache(ctx, {.n_head_kv = kKvHeads, .head_dim = kHeadDim, .n_pages = pages,
                              .storage = int8 ? cuda::KvStorage::Int8 : cuda::KvStorage::F16});
    {
        const size_t values = cuda::KvCache::value_bytes_per_page(cache.shape()) * static_cast<size_t>(pages);
        std::vector<uint8_t> bytes(values);
        std::uniform_int_distribution<int> byte(0, 255);
        for (uint8_t& b : bytes) b = static_cast<uint8_t>(byte(rng));
        if (!int8)  // fp16: random sign and mantissa, magnitudes in [0.5, 1)
            for (size_t i = 1; i < values; i += 2) bytes[i] = static_cast<uint8_t>((bytes[i] & 0x83) | 0x38);
        ctx.copy_to_device(cache.view().k, bytes.data(), values);
        ctx.copy_to_device(cache.view().v, bytes.data(), values);
        if (int8) {
            const size_t n_scales = cuda::KvCache::scale_bytes_per_page(cache.shape()) / 2 * static_cast<size_t>(pages);
            std::vector<uint16_t> scales(n_scales, f32_to_f16(0.02f));
            ctx.copy_to_device(cache.view().k_scales, scales.data(), n_scales * 2);
            ctx.copy_to_device(cache.view().v_scales, scales.data(), n_scales * 2);
        }
    }
    std::vector<int32_t> table(static_cast<size_t>(pages));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    const cuda::DeviceBuffer table_dev = ctx.upload(table.data(), table.size() * 4, "bench");
    const cuda::PageTable page_table{.pages = table_dev.as<int32_t>(), .n_logical_pages = pages};
    std::vector<float> q(static_cast<size_t>(positions * kHeads * 2 * kHeadDim));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& x : q) x = normal(rng);
    const cuda::DeviceBuffer q_dev = ctx.upload(q.data(), q.size() * 4, "bench");
    const cuda::DeviceBuffer out = ctx.allocate(static_cast<size_t>(positions * kHeads * kHeadDim) * 4, "bench");
    const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));

    std::printf("QSA prompt attention, one chunk of %lld positions at %lld-%lld cells of context on %s: %lld query "
                "heads, %lld kv heads of %lld, %s KV, budget %lld at ratio %lld; median of %d graph replays\n",
                static_cast<long long>(positions), static_cast<long long>(first + 1),
                static_cast<long long>(first + positions), ctx.info().name.c_str(), static_cast<long long>(kHeads),
                static_cast<long long>(kKvHeads), static_cast<long long>(kHeadDim), int8 ? "int8" : "fp16",
                static_cast<long long>(kBudget), static_cast<long long>(kRatio), reps);
    std::printf("| selections | union / one position's cells | per-query FP32 ms | union ms | union us per group | "
                "speed-up |\n");
    std::printf("| --- | ---: | ---: | ---: | ---: | ---: |\n");
    std::fflush(stdout);
    struct Row {
        const char* name;
        double drift;
    };
    for (const Row row : {Row{"shared, drift 0.02", 0.02}, Row{"shared, drift 0.21", 0.21},
                          Row{"shared, drift 0.53", 0.53}, Row{"independent", 1.0}}) {
        const Selections sel = make_selections(positions, first + 1, row.drift, rng);
        const cuda::DeviceBuffer cells = ctx.upload(sel.cells.data(), sel.cells.size() * 4, "bench");
        const cuda::DeviceBuffer n_selected = ctx.upload(sel.n_selected.data(), sel.n_selected.size() * 4, "bench");
        const cuda::DeviceBuffer lengths = ctx.upload(sel.lengths.data(), sel.lengths.size() * 4, "bench");
        // Per query: decode_attention once per position, its split count as the model picks it.
        const int64_t splits = cuda::decode_attention_splits(ctx, kKvHeads, sel.max_cells);
        const size_t ws = cuda::decode_attention_workspace_bytes(kHeads, kHeadDim, splits);
        const cuda::DeviceBuffer work = ctx.allocate(ws, "bench");
        cuda::Graph per_query;
        per_query.capture(ctx, [&] {
            for (int64_t t = 0; t < positions; ++t) {
                const float* qg = q_dev.as<float>() + t * kHeads * 2 * kHeadDim;
                cuda::decode_attention(
                    ctx, {.cache = cache.view(), .table = page_table, .n_cells = lengths.as<int32_t>() + t,
                          .cells = cells.as<int32_t>() + t * sel.max_cells,
                          .n_selected = n_selected.as<int32_t>() + t, .max_cells = sel.max_cells, .q = qg,
                          .n_head = kHeads, .q_head_stride = 2 * kHeadDim, .gate = qg + kHeadDim,
                          .gate_head_stride = 2 * kHeadDim, .scale = scale,
                          .out = out.as<float>() + t * kHeads * kHeadDim, .n_splits = splits,
                          .workspace = work.data(), .workspace_bytes = ws});
            }
        });
        const double per_query_ms = median_replay_ms(ctx, per_query, reps);
        per_query.clear();
        // The union kernel over the whole chunk.
        const int64_t union_splits = cuda::qsa_union_splits(ctx, positions, kKvHeads, sel.max_cells);
        const cuda::DeviceBuffer union_work = ctx.allocate(
            cuda::qsa_union_workspace_bytes(positions, sel.max_cells, kHeads, kHeadDim, union_splits), "bench");
        const cuda::QsaUnionAttentionArgs ua{
            .cache = cache.view(), .table = page_table, .n_tokens = positions, .n_cells = lengths.as<int32_t>(),
            .cells = cells.as<int32_t>(), .n_selected = n_selected.as<int32_t>(), .max_cells = sel.max_cells,
            .q = q_dev.as<float>(), .n_head = kHeads, .q_head_stride = 2 * kHeadDim, .gate = q_dev.as<float>() + kHeadDim,
            .gate_head_stride = 2 * kHeadDim, .scale = scale, .out = out.as<float>(), .n_splits = union_splits,
            .workspace = union_work.data(), .workspace_bytes = union_work.size()};
        cuda::qsa_union_attention(ctx, ua);  // eager once: one-time attributes outside the capture
        ctx.synchronize();
        cuda::Graph by_union;
        by_union.capture(ctx, [&] { cuda::qsa_union_attention(ctx, ua); });
        const double union_ms = median_replay_ms(ctx, by_union, reps);
        by_union.clear();
        const double groups = std::ceil(static_cast<double>(positions) / kGroup);
        std::printf("| %s | %.2fx | %.2f | %.2f | %.1f | %.2fx |\n", row.name, sel.union_ratio, per_query_ms, union_ms,
                    union_ms * 1e3 / groups, per_query_ms / union_ms);
        std::fflush(stdout);
    }
    return 0;
#else
    (void)positions;
    (void)first;
    (void)reps;
    (void)int8;
    throw Error("bench qsa-union needs the CUDA backend (configure with -DSTRATA_CUDA=ON) and an NVIDIA GPU");
#endif
}

}  // namespace strata::app
