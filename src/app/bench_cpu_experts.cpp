// `strata bench cpu-experts --model FILE [--threads N[,N...]] [-r JOBS]`: the CPU expert workers
// (runtime/cpu_expert_pool.h) on a model's own routed experts. Jobs of 1, 2, 4 and 8 tokens, every pair the pool's,
// each token routed to K distinct random experts of a random MoE layer (so the expert rows come from RAM, not from a
// cache a repeated expert would warm); per size: microseconds per job and GB/s of expert bytes read (each expert's
// rows once per job, as the pool reads them), in all and per worker: the mean over the jobs, and from the median job
// (robust to a machine that other work shares).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "app/commands.h"
#include "backend/cpu/packed.h"
#include "backend/cpu/quant_dot.h"
#include "core/error.h"
#include "format/gguf.h"
#include "model/binding.h"
#include "model/hybrid.h"
#include "model/moe.h"
#include "runtime/cpu_expert_pool.h"

namespace strata::app {

namespace {

constexpr int64_t kSizes[] = {1, 2, 4, 8};
constexpr uint64_t kSeed = 0x25e5e5ULL;
constexpr int64_t kBoundUs = 10'000'000;

struct BoundLayers {
    std::unique_ptr<gguf::File> file;
    cpu::PackedWeights packer;
    MoeShape shape;
    std::vector<MoeWeights> layers;
    std::string expert_types;
};

// Every MoE block's routed experts, bound and packed as the CPU backend binds them.
void bind_layers(const std::string& path, BoundLayers& b) {
    b.file = gguf::File::open(path);
    int64_t n_block_all = 0;
    const ModelInfo info = read_hybrid_info(*b.file, &n_block_all);
    const HparamReader hp(*b.file, info.arch);
    if (!hp.has("expert_count"))
        throw Error("bench cpu-experts: '" + path + "' has no routed experts (no " + hp.key("expert_count") + ")");
    b.shape = read_moe_shape(hp, info.n_embd, n_block_all);
    const TensorBinder binder(*b.file, &b.packer);
    for (int64_t l = 0; l < info.n_layer; ++l) {
        if (!binder.has(block_tensor(l, "ffn_down_exps.weight"))) continue;
        b.layers.push_back(bind_moe(binder, l, b.shape));
        if (b.expert_types.empty()) {
            const MoeWeights& w = b.layers.back();
            b.expert_types = std::string(dtype_name(w.expert_gate[0].type)) + "/" + dtype_name(w.expert_up[0].type) +
                             "/" + dtype_name(w.expert_down[0].type);
        }
    }
    if (b.layers.empty()) throw Error("bench cpu-experts: '" + path + "' has no blk.N.ffn_down_exps.weight tensors");
}

}  // namespace

int run_cpu_experts_bench(const Args& args) {
    const std::string path = model_path_or_default(args);
    require_file(path, "--model");
    const int64_t jobs = args.get_int("-r", 1, 1'000'000).value_or(200);
    std::vector<int> worker_counts;
    if (auto t = args.get("--threads")) {
        size_t start = 0;
        while (true) {
            const size_t comma = t->find(',', start);
            const auto n = parse_int(t->substr(start, comma == std::string::npos ? std::string::npos : comma - start));
            if (!n || *n < 1 || *n > 1024)
                throw Error("--threads expects worker counts from 1 to 1024 separated by commas, got '" + *t + "'");
            worker_counts.push_back(static_cast<int>(*n));
            if (comma == std::string::npos) break;
            start = comma + 1;
        }
    } else {
        worker_counts = {0};  // the pool's default: a worker per physical core less one
    }

    BoundLayers b;
    bind_layers(path, b);
    const MoeShape& s = b.shape;
    const int64_t H = s.n_embd, E = s.n_expert, K = s.n_expert_used;
    std::printf("%s: %zu MoE layers, %lld experts top-%lld, H %lld, F %lld, experts %s, ISA %s, %zu physical cores\n",
                path.c_str(), b.layers.size(), static_cast<long long>(E), static_cast<long long>(K),
                static_cast<long long>(H), static_cast<long long>(s.n_ff), b.expert_types.c_str(),
                cpu::isa_name(cpu::active_isa()), physical_core_cpus().size());
    std::printf(
        "\n| workers | pinned | tokens | experts/job | MiB/job | us/job | p50 us | GB/s | p50 GB/s | "
        "p50 GB/s per worker |\n");
    std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");

    std::mt19937_64 rng(kSeed);
    std::vector<float> x(static_cast<size_t>(8 * H));
    std::normal_distribution<float> gauss(0.0f, 1.0f);
    for (float& v : x) v = gauss(rng);
    std::vector<float> y(static_cast<size_t>(8 * K * H));
    std::vector<uint8_t> mine(static_cast<size_t>(8 * K), 1);
    std::vector<int32_t> all(static_cast<size_t>(E));
    std::iota(all.begin(), all.end(), 0);

    for (const int workers : worker_counts) {
        CpuExpertPool pool(
            {.n_workers = workers, .max_n_embd = H, .max_n_ff = s.n_ff, .max_expert_used = K, .max_tokens = 8});
        for (const int64_t T : kSizes) {
            // The jobs' routing drawn up front, so the timed loop does only the jobs.
            std::vector<int32_t> ids(static_cast<size_t>(jobs * T * K));
            std::vector<size_t> layer_of(static_cast<size_t>(jobs));
            for (int64_t j = 0; j < jobs; ++j) {
                layer_of[static_cast<size_t>(j)] = static_cast<size_t>(rng() % b.layers.size());
                for (int64_t t = 0; t < T; ++t) {
                    std::shuffle(all.begin(), all.end(), rng);
                    std::copy_n(all.begin(), K, ids.begin() + (j * T + t) * K);
                }
            }
            auto run = [&](int64_t j) {
                pool.start({.layer = static_cast<int64_t>(layer_of[static_cast<size_t>(j)]),
                            .shape = &s,
                            .weights = &b.layers[layer_of[static_cast<size_t>(j)]],
                            .n_tokens = T,
                            .x = x.data(),
                            .ids = ids.data() + j * T * K,
                            .mine = mine.data(),
                            .y = y.data()},
                           nullptr);
                if (!pool.wait(kBoundUs)) throw Error("bench cpu-experts: a job did not finish within 10 s");
                return pool.last_job_bytes();
            };
            for (int64_t j = 0; j < std::min<int64_t>(jobs, 8); ++j) run(j);  // warm-up: wake the workers
            uint64_t bytes = 0;
            std::vector<double> job_us(static_cast<size_t>(jobs));
            const auto t0 = std::chrono::steady_clock::now();
            for (int64_t j = 0; j < jobs; ++j) {
                const auto j0 = std::chrono::steady_clock::now();
                bytes += run(j);
                job_us[static_cast<size_t>(j)] =
                    std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - j0).count();
            }
            const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            std::nth_element(job_us.begin(), job_us.begin() + jobs / 2, job_us.end());
            const double median_us = job_us[static_cast<size_t>(jobs / 2)];
            const double us = seconds * 1e6 / static_cast<double>(jobs);
            const double gbs = static_cast<double>(bytes) / seconds / 1e9;
            // Distinct experts a job reads, on average: what the union of T tokens' choices costs.
            const double mib = static_cast<double>(bytes) / static_cast<double>(jobs) / (1 << 20);
            const uint64_t one_expert = b.layers[0].expert_gate[0].nb[1] * static_cast<size_t>(s.n_ff) * 2 +
                                        b.layers[0].expert_down[0].nb[1] * static_cast<size_t>(H);
            const double median_gbs = mib * (1 << 20) / (median_us * 1e3);
            std::printf("| %d | %d | %lld | %.1f | %.2f | %.1f | %.1f | %.2f | %.2f | %.2f |\n", pool.n_workers(),
                        pool.n_pinned(), static_cast<long long>(T),
                        static_cast<double>(bytes) / static_cast<double>(jobs) / static_cast<double>(one_expert), mib,
                        us, median_us, gbs, median_gbs, median_gbs / pool.n_workers());
            std::fflush(stdout);
        }
    }
    return 0;
}

}  // namespace strata::app
