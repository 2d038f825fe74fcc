// The CPU expert workers (src/runtime/cpu_expert_pool.h). Oracles: the CPU backend's public matmul (cpu::matmul over
// each expert's 2-D views, on the rows of the tokens that chose it, then cpu::silu_mul and the down matmul: what
// moe_forward computes per expert), and moe_forward itself for the combined layer output (its routing captured through
// a RoutingSink, the combine redone here in its order). Every comparison is of bits. Also: a worker that never answers
// (the wait gives up within its bound, done() never runs, no row that is not the pool's changes) and no allocation per
// job (a counting global operator new).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/packed.h"
#include "backend/cpu/quant_dot.h"
#include "core/dtype.h"
#include "model/moe.h"
#include "model/scratch.h"
#include "runtime/cpu_expert_pool.h"
#include "count_allocations.h"
#include "test_util.h"

namespace strata {
namespace {

namespace cpu = strata::cpu;

std::vector<float> gaussian(size_t n, std::mt19937& rng, float sigma) {
    std::normal_distribution<float> d(0.0f, sigma);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
}

// A weight of `type` with ne = {in, rows, slices}, each row quantized from its own gaussian floats.
struct Weight {
    std::vector<uint8_t> bytes;
    Tensor t;
    Weight(DType type, int64_t in, int64_t rows, int64_t slices, std::mt19937& rng, float sigma = 0.05f) {
        const size_t rb = row_bytes(type, in);
        bytes.resize(rb * static_cast<size_t>(rows * slices));
        for (int64_t r = 0; r < rows * slices; ++r) {
            const std::vector<float> src = gaussian(static_cast<size_t>(in), rng, sigma);
            quantize_row(type, src.data(), bytes.data() + rb * static_cast<size_t>(r), in);
        }
        const int64_t ne[3] = {in, rows, slices};
        t = make_tensor("w", type, slices > 1 ? 3 : 2, ne, bytes.data());
    }
};

struct LayerCase {
    std::string name;
    DType gate_type, up_type, down_type;
    bool fused = false;  // one gate_up tensor (then up_type is gate_type)
};

// A small MoE layer as bind_moe makes it: packed where the CPU packs (Q8_0, Q4_K), expert views, a shared expert.
struct Layer {
    MoeShape shape;
    MoeWeights w;
    std::vector<std::unique_ptr<Weight>> owned;
    cpu::PackedWeights packer;

    Layer(const LayerCase& c, int64_t H, int64_t E, int64_t K, int64_t F, std::mt19937& rng) {
        shape = {
            .n_embd = H, .n_expert = E, .n_expert_used = K, .n_ff = F, .n_ff_shared = F, .normalize_weights = true};
        auto make = [&](DType type, int64_t in, int64_t rows, int64_t slices, float sigma = 0.05f) {
            owned.push_back(std::make_unique<Weight>(type, in, rows, slices, rng, sigma));
            Tensor t = owned.back()->t;
            packer.pack(t);  // when packable on this CPU
            return t;
        };
        w.router = make(DType::F32, H, E, 1, 0.5f);
        if (c.fused) {
            w.gate_up = make(c.gate_type, H, 2 * F, E);
        } else {
            w.gate = make(c.gate_type, H, F, E);
            w.up = make(c.up_type, H, F, E);
        }
        w.down = make(c.down_type, F, H, E);
        w.shared_gate = gaussian(static_cast<size_t>(H), rng, 0.1f);
        w.shared_gate_proj = make(DType::Q8_0, H, F, 1);
        w.shared_up = make(DType::Q8_0, H, F, 1);
        w.shared_down = make(DType::Q8_0, F, H, 1);
        auto view = [](const Tensor& t, int64_t e, int64_t row, int64_t n) {
            Tensor v = cpu::matrix_view(t, e, row, n);
            v.name.clear();
            return v;
        };
        for (int64_t e = 0; e < E; ++e) {
            w.expert_gate.push_back(c.fused ? view(*w.gate_up, e, 0, F) : view(*w.gate, e, 0, F));
            w.expert_up.push_back(c.fused ? view(*w.gate_up, e, F, F) : view(*w.up, e, 0, F));
            w.expert_down.push_back(view(w.down, e, 0, H));
        }
    }
};

// The oracle for one expert: cpu::matmul of its views over the rows of x listed in `tokens` (as moe_forward gathers
// them), SwiGLU, the down matmul. Returns [tokens x H].
std::vector<float> expert_reference(const Layer& l, int32_t e, const std::vector<int64_t>& tokens, const float* x) {
    const int64_t H = l.shape.n_embd, F = l.shape.n_ff, n = static_cast<int64_t>(tokens.size());
    std::vector<float> xs(static_cast<size_t>(n * H)), g(static_cast<size_t>(n * F)), u(g.size()),
        y(static_cast<size_t>(n * H));
    for (int64_t i = 0; i < n; ++i) std::memcpy(&xs[static_cast<size_t>(i * H)], x + tokens[i] * H, H * sizeof(float));
    const auto ei = static_cast<size_t>(e);
    cpu::matmul({.w = l.w.expert_gate[ei], .x = xs.data(), .y = g.data(), .n_tokens = n});
    cpu::matmul({.w = l.w.expert_up[ei], .x = xs.data(), .y = u.data(), .n_tokens = n});
    for (int64_t i = 0; i < n; ++i) cpu::silu_mul(&g[static_cast<size_t>(i * F)], &u[static_cast<size_t>(i * F)], F);
    cpu::matmul({.w = l.w.expert_down[ei], .x = g.data(), .y = y.data(), .n_tokens = n});
    return y;
}

// Distinct expert ids per token: a random draw, or (every_token_expert >= 0) that expert in every token's list.
std::vector<int32_t> random_ids(int64_t T, int64_t E, int64_t K, std::mt19937& rng, int32_t every_token_expert) {
    std::vector<int32_t> ids;
    for (int64_t t = 0; t < T; ++t) {
        std::vector<int32_t> all(static_cast<size_t>(E));
        for (int32_t e = 0; e < E; ++e) all[static_cast<size_t>(e)] = e;
        std::shuffle(all.begin(), all.end(), rng);
        if (every_token_expert >= 0) {
            auto it = std::find(all.begin(), all.end(), every_token_expert);
            std::iter_swap(all.begin() + static_cast<int64_t>(rng() % K), it);
        }
        ids.insert(ids.end(), all.begin(), all.begin() + K);
    }
    return ids;
}

// Bytes of a float that no kernel writes: rows the pool must leave alone keep it.
constexpr uint32_t kUntouched = 0x7fc0beefu;

bool is_untouched(const float* row, int64_t n) {
    for (int64_t j = 0; j < n; ++j) {
        uint32_t bits;
        std::memcpy(&bits, row + j, 4);
        if (bits != kUntouched) return false;
    }
    return true;
}

std::vector<float> untouched_rows(int64_t n) {
    std::vector<float> y(static_cast<size_t>(n));
    for (float& v : y) std::memcpy(&v, &kUntouched, 4);
    return y;
}

std::vector<cpu::Isa> isas_here() {
    std::vector<cpu::Isa> out;
    for (const cpu::Isa isa : {cpu::Isa::Scalar, cpu::Isa::Avx2, cpu::Isa::Avx2Vnni, cpu::Isa::Avx512})
        if (cpu::supports_isa(isa)) out.push_back(isa);
    return out;
}

struct IsaOverride {
    explicit IsaOverride(cpu::Isa isa) { cpu::override_active_isa(isa); }
    ~IsaOverride() { cpu::override_active_isa(std::nullopt); }
};

CpuExpertPoolOptions options_for(const Layer& l, int workers) {
    return {
        .n_workers = workers,
        .pin = false,  // a test shares the machine: several pools' workers on one core would spin against each other
        .max_n_embd = l.shape.n_embd,
        .max_n_ff = l.shape.n_ff,
        .max_expert_used = l.shape.n_expert_used,
        .max_tokens = 8,
        .spin_us = 50};
}

constexpr int64_t kBoundUs = 20'000'000;  // a finished job never needs this; a hung one fails the test instead

const LayerCase kCases[] = {
    {"f32", DType::F32, DType::F32, DType::F32},
    {"q8_0", DType::Q8_0, DType::Q8_0, DType::Q8_0},
    {"q4_k_fused", DType::Q4_K, DType::Q4_K, DType::Q4_K, true},
    {"iq2_xs", DType::IQ2_XS, DType::IQ2_XS, DType::IQ2_XS},
    // gate and up in different activation layouts (IQ2_XS and packed Q4_K), down in Q8_0
    {"mixed", DType::IQ2_XS, DType::Q4_K, DType::Q8_0},
};

class CpuExpertPoolRows : public ::testing::TestWithParam<LayerCase> {};

// y rows of mine pairs equal the per-expert oracle bit for bit, for 1..8 tokens, several subsets of the pairs, 1..4
// workers and every instruction set this CPU has; rows not mine keep their bytes.
TEST_P(CpuExpertPoolRows, BitIdenticalToTheCpuBackendsExpertProducts) {
    const LayerCase c = GetParam();
    std::mt19937 rng(2501 + static_cast<unsigned>(c.gate_type));
    const int64_t H = 512, E = 12, K = 4, F = 256;
    const Layer layer(c, H, E, K, F, rng);
    std::vector<std::unique_ptr<CpuExpertPool>> pools;
    for (int workers = 1; workers <= 4; ++workers)
        pools.push_back(std::make_unique<CpuExpertPool>(options_for(layer, workers)));
    int64_t compared = 0;
    for (const cpu::Isa isa : isas_here()) {
        const IsaOverride held(isa);
        for (int64_t T = 1; T <= 8; ++T) {
            const std::vector<float> x = gaussian(static_cast<size_t>(T * H), rng, 1.0f);
            for (const std::string pattern : {"all", "none", "half", "one expert"}) {
                SCOPED_TRACE(std::string(cpu::isa_name(isa)) + " T " + std::to_string(T) + " " + pattern);
                const std::vector<int32_t> ids = random_ids(T, E, K, rng, pattern == "one expert" ? 5 : -1);
                std::vector<uint8_t> mine(static_cast<size_t>(T * K));
                for (size_t p = 0; p < mine.size(); ++p) {
                    mine[p] = pattern == "all"    ? 1
                              : pattern == "none" ? 0
                              : pattern == "half" ? static_cast<uint8_t>(rng() % 2)
                                                  : static_cast<uint8_t>(ids[p] == 5);
                }
                // The oracle per expert, over every token that routed to it (mine or not: batching must not matter).
                std::vector<float> want(static_cast<size_t>(T * K * H));
                for (int32_t e = 0; e < E; ++e) {
                    std::vector<int64_t> tokens, pairs;
                    for (int64_t p = 0; p < T * K; ++p)
                        if (ids[static_cast<size_t>(p)] == e) tokens.push_back(p / K), pairs.push_back(p);
                    if (tokens.empty()) continue;
                    const std::vector<float> y = expert_reference(layer, e, tokens, x.data());
                    for (size_t i = 0; i < pairs.size(); ++i)
                        std::memcpy(&want[static_cast<size_t>(pairs[i] * H)], &y[i * static_cast<size_t>(H)],
                                    H * sizeof(float));
                }
                for (auto& pool : pools) {
                    std::vector<float> y = untouched_rows(T * K * H);
                    int done_calls = 0;
                    pool->start({.layer = 0,
                                 .shape = &layer.shape,
                                 .weights = &layer.w,
                                 .n_tokens = T,
                                 .x = x.data(),
                                 .ids = ids.data(),
                                 .mine = mine.data(),
                                 .y = y.data()},
                                [&] { ++done_calls; });
                    ASSERT_TRUE(pool->wait(kBoundUs));
                    EXPECT_EQ(done_calls, 1);
                    EXPECT_GT(pool->last_job_ns(), 0);
                    EXPECT_FALSE(pool->busy());
                    for (int64_t p = 0; p < T * K; ++p) {
                        const float* got = &y[static_cast<size_t>(p * H)];
                        if (!mine[static_cast<size_t>(p)]) {
                            EXPECT_TRUE(is_untouched(got, H)) << "pair " << p << " is not mine but changed";
                            continue;
                        }
                        ASSERT_EQ(std::memcmp(got, &want[static_cast<size_t>(p * H)], H * sizeof(float)), 0)
                            << "pair " << p << " (expert " << ids[static_cast<size_t>(p)] << ") with "
                            << pool->n_workers() << " workers";
                        ++compared;
                    }
                }
            }
        }
    }
    EXPECT_GT(compared, 0);
}

INSTANTIATE_TEST_SUITE_P(Types, CpuExpertPoolRows, ::testing::ValuesIn(kCases),
                         [](const auto& param_info) { return param_info.param.name; });

// Captures moe_forward's routing.
struct CapturedRouting : RoutingSink {
    std::vector<int32_t> ids;
    std::vector<float> weights;
    void record(int64_t, int64_t, int64_t k, int64_t n_rows, const int32_t* i, const float* w) override {
        ids.assign(i, i + n_rows * k);
        weights.assign(w, w + n_rows * k);
    }
};

// sum_k w[t,k] * y[t,k] + the shared expert, in moe_forward's order, equals moe_forward's output bit for bit.
TEST(CpuExpertPool, CombinedRowsEqualMoeForward) {
    for (const LayerCase& c : kCases) {
        SCOPED_TRACE(c.name);
        std::mt19937 rng(77 + static_cast<unsigned>(c.down_type));
        const int64_t H = 256, E = 16, K = 4, F = 256;
        const Layer layer(c, H, E, K, F, rng);
        CpuExpertPool pool(options_for(layer, 2));
        for (int64_t T = 1; T <= 8; ++T) {
            SCOPED_TRACE("T " + std::to_string(T));
            const std::vector<float> x = gaussian(static_cast<size_t>(T * H), rng, 1.0f);
            std::vector<float> want(static_cast<size_t>(T * H));
            Scratch scratch;
            CapturedRouting routing;
            moe_forward({.shape = layer.shape,
                         .weights = layer.w,
                         .x = x.data(),
                         .out = want.data(),
                         .n_tokens = T,
                         .scratch = scratch,
                         .routing = &routing});
            ASSERT_EQ(routing.ids.size(), static_cast<size_t>(T * K));

            std::vector<float> y(static_cast<size_t>(T * K * H));
            const std::vector<uint8_t> mine(static_cast<size_t>(T * K), 1);
            pool.start({.shape = &layer.shape,
                        .weights = &layer.w,
                        .n_tokens = T,
                        .x = x.data(),
                        .ids = routing.ids.data(),
                        .mine = mine.data(),
                        .y = y.data()},
                       nullptr);
            ASSERT_TRUE(pool.wait(kBoundUs));

            // The shared expert as moe_forward computes it (the GPU's part in the offload).
            std::vector<float> sg(static_cast<size_t>(T * F)), su(sg.size()), shared(static_cast<size_t>(T * H));
            cpu::matmul({.w = *layer.w.shared_gate_proj, .x = x.data(), .y = sg.data(), .n_tokens = T});
            cpu::matmul({.w = *layer.w.shared_up, .x = x.data(), .y = su.data(), .n_tokens = T});
            for (int64_t t = 0; t < T; ++t)
                cpu::silu_mul(&sg[static_cast<size_t>(t * F)], &su[static_cast<size_t>(t * F)], F);
            cpu::matmul({.w = *layer.w.shared_down, .x = sg.data(), .y = shared.data(), .n_tokens = T});
            std::vector<float> got(static_cast<size_t>(T * H), 0.0f);
            for (int64_t t = 0; t < T; ++t) {
                float* o = &got[static_cast<size_t>(t * H)];
                for (int64_t k = 0; k < K; ++k) {
                    const float wk = routing.weights[static_cast<size_t>(t * K + k)];
                    const float* yk = &y[static_cast<size_t>((t * K + k) * H)];
                    for (int64_t j = 0; j < H; ++j) o[j] += wk * yk[j];
                }
                const float gate = cpu::sigmoid(cpu::dot(layer.w.shared_gate.data(), x.data() + t * H, H));
                for (int64_t j = 0; j < H; ++j) o[j] += gate * shared[static_cast<size_t>(t * H + j)];
            }
            EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
        }
    }
}

// Jobs back to back, as a decode step's layers come: a worker still leaving one job when the next starts must not
// take a unit of the next one and lose it (every job completes, each done() runs once). More workers than cores, so
// that workers are preempted between their claims, where that window opens.
TEST(CpuExpertPool, BackToBackJobsAllComplete) {
    std::mt19937 rng(4);
    const int64_t H = 512, E = 16, K = 4, F = 256, T = 8;
    const Layer layer({"q8_0", DType::Q8_0, DType::Q8_0, DType::Q8_0}, H, E, K, F, rng);
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const std::vector<float> x = gaussian(static_cast<size_t>(T * H), rng, 1.0f);
    const std::vector<int32_t> ids = random_ids(T, E, K, rng, -1);
    const std::vector<uint8_t> mine(static_cast<size_t>(T * K), 1);
    std::vector<float> y(static_cast<size_t>(T * K * H));
    for (int workers : {2, 2 * cores + 1}) {
        SCOPED_TRACE(std::to_string(workers) + " workers");
        CpuExpertPoolOptions o = options_for(layer, workers);
        o.pin = true;  // several workers a core
        o.spin_us = 2000;
        CpuExpertPool pool(o);
        std::atomic<int> done_calls{0};
        int completed = 0;
        for (int job = 0; job < 600; ++job) {
            pool.start({.shape = &layer.shape,
                        .weights = &layer.w,
                        .n_tokens = job % T + 1,
                        .x = x.data(),
                        .ids = ids.data(),
                        .mine = mine.data(),
                        .y = y.data()},
                       [&] { done_calls.fetch_add(1); });
            if (!pool.wait(5'000'000)) break;
            ++completed;
        }
        EXPECT_EQ(completed, 600);
        EXPECT_EQ(done_calls.load(), completed);
    }
}

// A worker that never answers: wait() gives up within its bound, done() never runs, and the rows that are not the
// pool's keep their bytes.
TEST(CpuExpertPool, StalledWorkerMakesTheWaitGiveUpWithinItsBound) {
    std::mt19937 rng(9);
    const Layer layer({"q8_0", DType::Q8_0, DType::Q8_0, DType::Q8_0}, 256, 8, 2, 256, rng);
    for (int workers : {1, 2}) {
        SCOPED_TRACE(std::to_string(workers) + " workers");
        CpuExpertPoolOptions o = options_for(layer, workers);
        o.stall_for_test = true;
        std::atomic<int> done_calls{0};
        {
            CpuExpertPool pool(o);
            const int64_t T = 4, K = 2, H = 256;
            const std::vector<float> x = gaussian(static_cast<size_t>(T * H), rng, 1.0f);
            const std::vector<int32_t> ids = random_ids(T, 8, K, rng, -1);
            const std::vector<uint8_t> mine = {1, 0, 1, 1, 0, 1, 0, 1};
            std::vector<float> y = untouched_rows(T * K * H);
            pool.start({.shape = &layer.shape,
                        .weights = &layer.w,
                        .n_tokens = T,
                        .x = x.data(),
                        .ids = ids.data(),
                        .mine = mine.data(),
                        .y = y.data()},
                       [&] { done_calls.fetch_add(1); });
            const auto t0 = std::chrono::steady_clock::now();
            EXPECT_FALSE(pool.wait(20'000));
            const double waited_ms =
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            EXPECT_GE(waited_ms, 20.0);
            EXPECT_LT(waited_ms, 20.0 + 500.0);  // bounded (slack for a loaded machine)
            EXPECT_TRUE(pool.busy());
            EXPECT_FALSE(pool.wait(0));
            for (int64_t p = 0; p < T * K; ++p) {
                if (!mine[static_cast<size_t>(p)]) {
                    EXPECT_TRUE(is_untouched(&y[static_cast<size_t>(p * H)], H)) << "pair " << p;
                }
            }
        }  // the destructor stops the stalled worker and joins every thread
        EXPECT_EQ(done_calls.load(), 0);
    }
}

// start() and the workers allocate nothing: the process's allocation count over many jobs does not move.
TEST(CpuExpertPool, NoAllocationPerJob) {
    std::mt19937 rng(31);
    for (const LayerCase& c : {kCases[3], kCases[2], kCases[4]}) {
        SCOPED_TRACE(c.name);
        const Layer layer(c, 512, 16, 4, 256, rng);
        CpuExpertPool pool(options_for(layer, 2));
        std::vector<std::vector<float>> xs;
        std::vector<std::vector<int32_t>> ids;
        std::vector<std::vector<uint8_t>> mines;
        for (int64_t T = 1; T <= 8; ++T) {
            xs.push_back(gaussian(static_cast<size_t>(T * 512), rng, 1.0f));
            ids.push_back(random_ids(T, 16, 4, rng, T % 2 ? 3 : -1));
            mines.emplace_back(static_cast<size_t>(T * 4), uint8_t{1});
            for (size_t p = 0; p < mines.back().size(); p += 3) mines.back()[p] = 0;
        }
        std::vector<float> y(static_cast<size_t>(8 * 4 * 512));
        std::atomic<int> done_calls{0};
        const std::function<void()> done = [&done_calls] { done_calls.fetch_add(1); };
        const int64_t before = g_allocations.load();
        for (int round = 0; round < 3; ++round)
            for (int64_t T = 1; T <= 8; ++T) {
                const auto i = static_cast<size_t>(T - 1);
                pool.start({.shape = &layer.shape,
                            .weights = &layer.w,
                            .n_tokens = T,
                            .x = xs[i].data(),
                            .ids = ids[i].data(),
                            .mine = mines[i].data(),
                            .y = y.data()},
                           done);
                if (!pool.wait(kBoundUs)) break;
            }
        const int64_t after = g_allocations.load();
        EXPECT_EQ(after - before, 0);
        EXPECT_EQ(done_calls.load(), 24);
    }
}

TEST(CpuExpertPool, DefaultsToOneWorkerPerPhysicalCoreLessOne) {
    const std::vector<int> cores = physical_core_cpus();
    ASSERT_FALSE(cores.empty());
    CpuExpertPool pool({.max_n_embd = 256, .max_n_ff = 256, .max_expert_used = 2});
    EXPECT_EQ(pool.n_workers(), std::max<int>(1, static_cast<int>(cores.size()) - 1));
    // Pinning may be refused (containers); it never fails the pool. The first allowed core is left to the caller.
    EXPECT_LE(pool.n_pinned(), pool.n_workers());
    EXPECT_EQ(pool.caller_cpu(), cores.size() > 1 ? cores[0] : -1);
}

// `strata bench cpu-experts` on a synthesized model: one row per job size, and one-line errors for bad input.
TEST(CpuExpertPoolCli, BenchCpuExpertsPrintsARowPerJobSize) {
    const testing::TempDir dir;
    const std::string model = dir / "m.gguf";
    ASSERT_EQ(testing::run_strata("synth --preset small-k --type q4_k --out " + model).status, 0);
    const auto r = testing::run_strata("bench cpu-experts --model " + model + " -r 5 --threads 1");
    ASSERT_EQ(r.status, 0) << r.err;
    // workers, pinned (1 where the OS allows it, else 0), tokens
    const char* rows[][2] = {{"| 1 | 1 | 1 | ", "| 1 | 0 | 1 | "},
                             {"| 1 | 1 | 2 | ", "| 1 | 0 | 2 | "},
                             {"| 1 | 1 | 4 | ", "| 1 | 0 | 4 | "},
                             {"| 1 | 1 | 8 | ", "| 1 | 0 | 8 | "}};
    for (const auto& row : rows)
        EXPECT_TRUE(r.out.find(row[0]) != std::string::npos || r.out.find(row[1]) != std::string::npos) << r.out;
    EXPECT_NE(r.out.find("experts q4_k/q4_k/q4_k"), std::string::npos) << r.out;
    testing::expect_user_error(testing::run_strata("bench cpu-experts --model " + model + " --threads 0"), "--threads");
    testing::expect_user_error(testing::run_strata("bench cpu-experts --model " + dir / "missing.gguf"));
}

}  // namespace
}  // namespace strata
