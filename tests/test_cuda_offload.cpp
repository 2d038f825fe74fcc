// Experts in host RAM on CUDA (issue 25): the placement of the routed experts must not change an answer. The gathered
// expert products read each expert's bytes through an address table (a VRAM cache slot or the expert's pinned host
// pages, read over PCIe), with the same kernels in the same order, so every run below must give the logits of the
// all-in-VRAM run bit for bit (the bound is 1e-3 of the largest logit; this design owes exact equality):
// no slots (every expert read over PCIe), half the experts warm, every expert warm, and a policy that swaps on every
// window (copies landing while windows run, slots re-chosen while their copy is in flight).
// Without the CUDA backend compiled in or without a GPU, every test skips with a message saying so.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "convert/convert.h"
#include "core/dtype.h"
#include "format/gguf.h"
#include "model/model.h"
#include "model/moe.h"
#include "model_test_util.h"
#include "runtime/cpu_expert_pool.h"
#include "test_util.h"

#include "cuda_skip.h"  // and backend/cuda/cuda_backend.h with the CUDA backend

using namespace strata;
namespace fs = std::filesystem;

namespace {

using strata::testing::bit_mismatches;
using strata::testing::converted_golden;
using strata::testing::random_tokens;

constexpr const char* kSkippedTests = "CUDA offload tests";  // cuda_skip.h

// Swaps as much as a policy can: every routed expert that is not intended for a slot is admitted into the next slot
// in turn, every window. A slot is often re-chosen while its last copy is still in flight.
class ChurnAdvisor final : public ExpertCacheAdvisor {
  public:
    void observe(int64_t layer, int64_t, int64_t, std::span<const int32_t> ids, std::span<const int32_t> residents,
                 std::vector<ExpertSwap>& swaps) override {
        if (residents.empty()) return;
        int64_t& cursor = cursor_[layer];
        std::vector<int32_t> now(residents.begin(), residents.end());
        for (int32_t e : ids) {
            if (std::find(now.begin(), now.end(), e) != now.end()) continue;
            const int64_t slot = cursor++ % static_cast<int64_t>(now.size());
            now[static_cast<size_t>(slot)] = e;
            swaps.push_back({.slot = slot, .admit = e});
        }
        ++observed;
    }
    int64_t observed = 0;

  private:
    std::map<int64_t, int64_t> cursor_;
};

std::string synthesized(const std::string& preset, DType expert_type) {
    static std::map<std::string, std::string> cache;
    const std::string key = preset + "-" + dtype_name(expert_type);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
    const std::string out = (fs::path(strata::testing::process_temp_dir().path()) / (key + ".gguf")).string();
    synth_model({.preset = preset, .expert_type = expert_type, .out_path = out, .seed = 7});
    return cache[key] = out;
}

std::string bundled_model() {
    return (fs::path(STRATA_SOURCE_DIR) / "assets" / "strata-code-19m.gguf").string();
}

int64_t n_expert_of(const std::string& path) {
    const auto file = gguf::File::open(path);
    return file->get_u32(file->get_str("general.architecture") + ".expert_count");
}

// The all-in-VRAM run of a file: 40 random tokens (from `seed`) fed per_calls[i] at a time, with the default prompt
// window (fed[0]) and with 16-token windows (fed[1], the streamed cases'): the window sizes decide which kernels a
// token goes through.
struct Reference {
    int64_t V = 0, L = 0;
    std::vector<int32_t> tokens;
    std::vector<std::vector<float>> fed[2];
};

Reference all_in_vram(const std::string& path, unsigned seed, std::span<const size_t> per_calls) {
    Reference r;
    for (int chunked = 0; chunked < 2; ++chunked) {
        LoadOptions options{.backend = Backend::Cuda};
        if (chunked) options.prompt_chunk = 16;
        auto reference = load_model(path, options);
        r.V = reference->info().n_vocab;
        r.L = reference->info().n_layer;
        r.tokens = random_tokens(r.V, 40, seed);
        for (size_t per_call : per_calls)
            r.fed[chunked].push_back(strata::testing::logits_fed(*reference, r.tokens, per_call));
    }
    return r;
}

// Every placement against the all-in-VRAM run of the same file: a prompt in one call (prompt windows), then the same
// tokens fed 1 and 3 a call (decode windows, graphs), 40 tokens each. The streamed cases cut the prompt into
// 16-token windows (the grouped path's least at these shapes) whose misses go through the ring; `grouped`: the
// experts' type takes the grouped path, so those windows must have streamed.
void expect_placement_free(const std::string& path, const char* what, bool grouped = false) {
    const int64_t n_expert = n_expert_of(path);
    const size_t per_calls[] = {40, 1, 3};
    const Reference want = all_in_vram(path, 5, per_calls);
    const int64_t L = want.L;

    std::vector<int32_t> half, all;
    for (int32_t e = 0; e < n_expert; ++e) (e < n_expert / 2 ? half : all).push_back(e);
    all.insert(all.begin(), half.begin(), half.end());
    struct Case {
        const char* name;
        int64_t slots;
        const std::vector<int32_t>* warm;
        bool churn;
        int stream_ranges = 0, stream_buffers = 0;
    };
    const int quarter = n_expert % 4 == 0 ? 4 : 1;
    const Case cases[] = {
        {"no slots", 0, nullptr, false},
        {"half warm", n_expert / 2, &half, false},
        {"all warm", n_expert, &all, false},
        {"churn over a quarter", std::max<int64_t>(n_expert / 4, 1), nullptr, true},
        {"streamed, no slots, 2 ranges in 4 buffers", 0, nullptr, false, 2, 4},
        {"streamed, half warm, ranges of a quarter in 2 buffers", n_expert / 2, &half, false, quarter, 2},
        {"streamed, churn over a quarter, 1 range in 1 buffer", std::max<int64_t>(n_expert / 4, 1), nullptr, true, 1,
         1}};
    for (const Case& c : cases) {
        LoadOptions options{.backend = Backend::Cuda};
        options.experts.in_host = true;
        options.experts.cache_slots.assign(static_cast<size_t>(L), c.slots);
        options.experts.stream_ranges = c.stream_ranges;
        options.experts.stream_buffers = c.stream_buffers;
        if (c.stream_ranges) options.prompt_chunk = 16;
        if (c.warm) options.experts.warm.assign(static_cast<size_t>(L), *c.warm);
        auto churn = std::make_shared<ChurnAdvisor>();
        if (c.churn) options.experts.advisor = churn;
        auto m = load_model(path, options);
        for (size_t i = 0; i < std::size(per_calls); ++i) {
            const std::vector<float> got = strata::testing::logits_fed(*m, want.tokens, per_calls[i]);
            EXPECT_EQ(bit_mismatches(got, want.fed[c.stream_ranges ? 1 : 0][i]), 0u)
                << what << ", " << c.name << ", " << per_calls[i] << " a call";
        }
        if (c.churn) {
            EXPECT_GT(churn->observed, 0) << what << ": the policy was never asked";
        }
        const int64_t streamed = m->expert_offload_stats() ? m->expert_offload_stats()->streamed_windows : 0;
        if (c.stream_ranges && grouped) {
            EXPECT_GT(streamed, 0) << what << ", " << c.name << ": nothing streamed";
        }
        std::printf("[ offload %s ] %s: logits equal to all-in-VRAM (%lld streamed windows)\n", what, c.name,
                    static_cast<long long>(streamed));
    }
}

TEST(CudaOffload, PlacementDoesNotChangeTheBundledModel) {
    SKIP_WITHOUT_CUDA_DEVICE();
    expect_placement_free(bundled_model(), "bundled model");
}

TEST(CudaOffload, PlacementDoesNotChangeQuantizedExperts) {
    SKIP_WITHOUT_CUDA_DEVICE();
    for (DType t : {DType::IQ2_XS, DType::Q4_K, DType::F32})
        expect_placement_free(synthesized("small-k", t), dtype_name(t), t != DType::F32);
}

TEST(CudaOffload, PlacementDoesNotChangeTheSingleStreamArchitectures) {
    SKIP_WITHOUT_CUDA_DEVICE();
    for (const char* name : {"qwen35moe", "qwen3next"}) expect_placement_free(converted_golden(name), name);
}

// How far an offload run's logits are from the reference's: the largest difference against the largest logit, and the
// tokens whose argmax departs (near_ties: where the reference's top two are within 1e-4, counted apart).
struct Closeness {
    double max_diff = 0, max_ref = 0;
    int disagree = 0, near_ties = 0;
};

Closeness closeness(const std::vector<float>& got, const std::vector<float>& want, int64_t V) {
    Closeness c;
    for (size_t t = 0; t < want.size() / static_cast<size_t>(V); ++t) {
        const float* a = got.data() + t * static_cast<size_t>(V);
        const float* b = want.data() + t * static_cast<size_t>(V);
        for (int64_t j = 0; j < V; ++j) {
            c.max_diff = std::max(c.max_diff, static_cast<double>(std::abs(a[j] - b[j])));
            c.max_ref = std::max(c.max_ref, static_cast<double>(std::abs(b[j])));
        }
        std::vector<float> sorted(b, b + V);
        std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
        const bool tie = sorted[0] - sorted[1] < 1e-4f;
        if (std::max_element(a, a + V) - a != std::max_element(b, b + V) - b) (tie ? c.near_ties : c.disagree)++;
    }
    return c;
}

// The bound, 1e-3 of the largest logit, and every argmax equal except near-ties (printed).
void expect_close(const std::vector<float>& got, const std::vector<float>& want, int64_t V, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    const Closeness c = closeness(got, want, V);
    std::printf(
        "[ offload ] %s: max |diff| %.3g of max |logit| %.3g (relative %.3g), argmax departures %d (+%d "
        "near-ties)\n",
        what.c_str(), c.max_diff, c.max_ref, c.max_diff / c.max_ref, c.disagree, c.near_ties);
    EXPECT_LE(c.max_diff, 1e-3 * c.max_ref) << what;
    EXPECT_EQ(c.disagree, 0) << what;
}

std::shared_ptr<CpuExpertPool> cpu_workers_for(const std::string& path, int n_workers) {
    const auto file = gguf::File::open(path);
    const std::string arch = file->get_str("general.architecture");
    return std::make_shared<CpuExpertPool>(
        CpuExpertPoolOptions{.n_workers = n_workers,
                             .max_n_embd = file->get_u32(arch + ".embedding_length"),
                             .max_n_ff = file->get_u32(arch + ".expert_feed_forward_length"),
                             .max_expert_used = file->get_u32(arch + ".expert_used_count")});
}

// The CPU expert workers' share: their rows come from the CPU backend's kernels (the same quantized activations,
// another summation order), so the logits move by rounding only.
void expect_cpu_share_close(const std::string& path, const char* what) {
    auto reference = load_model(path, {.backend = Backend::Cuda});
    const int64_t V = reference->info().n_vocab, L = reference->info().n_layer;
    const int64_t n_expert = n_expert_of(path);
    const std::vector<int32_t> tokens = random_tokens(V, 40, 9);
    // The reference is fed as the offload run is: a prompt window takes the GEMM path (fp16 operands), which moves
    // the logits by more than the CPU workers' rounding does.
    const size_t per_calls[] = {1, 3, tokens.size()};  // the last: prompt windows
    std::vector<std::vector<float>> wants;
    for (const size_t per_call : per_calls) wants.push_back(strata::testing::logits_fed(*reference, tokens, per_call));
    reference.reset();
    for (const double share : {0.5, 1.0}) {
        LoadOptions options{.backend = Backend::Cuda};
        options.experts.in_host = true;
        options.experts.cache_slots.assign(static_cast<size_t>(L), std::max<int64_t>(n_expert / 4, 1));
        options.experts.advisor = std::make_shared<ChurnAdvisor>();
        options.experts.cpu_workers = cpu_workers_for(path, 2);
        options.experts.cpu_share = share;
        auto m = load_model(path, options);
        for (size_t call = 0; call < std::size(per_calls); ++call)
            expect_close(strata::testing::logits_fed(*m, tokens, per_calls[call]), wants[call], V,
                         std::string("cpu share ") + what + ", share " + std::to_string(share) + ", " +
                             std::to_string(per_calls[call]) + " a call");
    }
}

// Experts read from the mapped file (the RAM budget cannot pin them): nothing pinned, the CPU workers compute every
// miss, a prompt window streams its misses from the file's pages through the ring, and one that cannot stream runs
// as decode windows of 8 tokens. Against the all-in-VRAM run fed the same way (a prompt cut into 8-token windows
// goes through the decode kernels, so its reference is fed 8 a call), within the CPU workers' rounding.
void expect_file_experts_close(const std::string& path, const char* what, bool grouped) {
    const int64_t n_expert = n_expert_of(path);
    const size_t per_calls[] = {1, 3, 8, 40};
    const Reference ref = all_in_vram(path, 11, per_calls);
    const int64_t V = ref.V, L = ref.L;
    const std::vector<int32_t>& tokens = ref.tokens;
    const std::vector<float>&fed_1 = ref.fed[0][0], &fed_3 = ref.fed[0][1], &fed_8 = ref.fed[0][2];
    const std::vector<float>& streamed_prompt = ref.fed[1][3];
    for (const bool ring : {false, true}) {
        LoadOptions options{.backend = Backend::Cuda};
        options.experts.in_host = true;
        options.experts.from_file = true;
        options.experts.cache_slots.assign(static_cast<size_t>(L), std::max<int64_t>(n_expert / 4, 1));
        options.experts.advisor = std::make_shared<ChurnAdvisor>();
        options.experts.cpu_workers = cpu_workers_for(path, 2);
        if (ring) {
            options.experts.stream_ranges = n_expert % 4 == 0 ? 4 : 1;
            options.experts.stream_buffers = 2;
            options.prompt_chunk = 16;
        }
        auto m = load_model(path, options);
        const std::string name = std::string("from the file, ") + what + (ring ? ", ring" : ", no ring");
        expect_close(strata::testing::logits_fed(*m, tokens, 1), fed_1, V, name + ", 1 a call");
        expect_close(strata::testing::logits_fed(*m, tokens, 3), fed_3, V, name + ", 3 a call");
        const std::vector<float> prompt = strata::testing::logits_fed(*m, tokens, tokens.size());
        const ExpertOffloadStats stats = *m->expert_offload_stats();
        const bool streamed = stats.streamed_windows > 0;
        if (ring && grouped) {
            EXPECT_TRUE(streamed) << name << ": nothing streamed";
        }
        if (!ring) {
            EXPECT_FALSE(streamed) << name << ": streamed without a ring";
        }
        expect_close(prompt, streamed ? streamed_prompt : fed_8, V,
                     name + ", the prompt in one call" + (streamed ? " (streamed)" : " (as decode windows)"));
        // Only the ring's copies cross the bus: no miss is read in place.
        if (!streamed) {
            EXPECT_EQ(stats.pcie_bytes, 0) << name << ": a miss read over PCIe";
        }
        EXPECT_GT(stats.cpu_pairs, 0) << name << ": the CPU workers computed nothing";
    }
}

TEST(CudaOffload, CpuWorkersShareStaysWithinRounding) {
    SKIP_WITHOUT_CUDA_DEVICE();
    expect_cpu_share_close(bundled_model(), "bundled model");
    for (DType t : {DType::IQ2_XS, DType::Q4_K}) expect_cpu_share_close(synthesized("small-k", t), dtype_name(t));
    expect_cpu_share_close(converted_golden("qwen35moe"), "qwen35moe");
}

TEST(CudaOffload, ExpertsReadFromTheFileStayWithinRounding) {
    SKIP_WITHOUT_CUDA_DEVICE();
    expect_file_experts_close(bundled_model(), "bundled model", false);
    for (DType t : {DType::IQ2_XS, DType::Q4_K, DType::F32})
        expect_file_experts_close(synthesized("small-k", t), dtype_name(t), t != DType::F32);
}

TEST(CudaOffload, ExpertsReadFromTheFileNeedCpuWorkers) {
    SKIP_WITHOUT_CUDA_DEVICE();
    LoadOptions options{.backend = Backend::Cuda};
    options.experts.in_host = true;
    options.experts.from_file = true;
    options.experts.cache_slots.assign(64, 2);
    try {
        (void)load_model(synthesized("small-k", DType::Q4_K), options);
        ADD_FAILURE() << "experts read from the file loaded without CPU workers";
    } catch (const Error& e) {
        std::printf("[ offload from file ] %s\n", e.what());
        EXPECT_NE(std::string(e.what()).find("--cpu-experts"), std::string::npos) << e.what();
    }
}

// A CPU worker that never answers: the layer's wait on the GPU gives up at its bound, and the forward call fails with
// the stall report; the logits it was given are never written (no row that did not arrive is combined into them).
TEST(CudaOffload, AWorkerThatNeverAnswersFailsTheRequest) {
    SKIP_WITHOUT_CUDA_DEVICE();
    const std::string path = synthesized("small-k", DType::Q4_K);
    const auto file = gguf::File::open(path);
    LoadOptions options{.backend = Backend::Cuda};
    options.experts.in_host = true;
    options.experts.cache_slots.assign(64, 0);
    options.experts.cpu_workers = std::make_shared<CpuExpertPool>(
        CpuExpertPoolOptions{.n_workers = 1,
                             .max_n_embd = file->get_u32("qwen4exp.embedding_length"),
                             .max_n_ff = file->get_u32("qwen4exp.expert_feed_forward_length"),
                             .max_expert_used = file->get_u32("qwen4exp.expert_used_count"),
                             .stall_for_test = true});
    options.experts.cpu_share = 1.0;
    auto m = load_model(path, options);
    auto seq = m->new_sequence(8);
    std::vector<float> logits(static_cast<size_t>(m->info().n_vocab), -12345.0f);
    const auto start = std::chrono::steady_clock::now();
    try {
        m->forward(*seq, std::vector<int32_t>{1}, logits);
        ADD_FAILURE() << "a window whose CPU rows never came returned";
    } catch (const Error& e) {
        const std::string what = e.what();
        std::printf("[ offload stall ] %s\n", what.c_str());
        EXPECT_NE(what.find("gave up"), std::string::npos) << what;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(s, 10.0) << "the wait is bounded (1 s a wait)";
    for (float v : logits) ASSERT_EQ(v, -12345.0f) << "logits were written from a window that gave up";
}

TEST(CudaOffload, ClearErrors) {
    SKIP_WITHOUT_CUDA_DEVICE();
    // The policy asks for a slot that does not exist: a clear error, not a write past the slots.
    class BadAdvisor final : public ExpertCacheAdvisor {
        void observe(int64_t, int64_t, int64_t, std::span<const int32_t>, std::span<const int32_t>,
                     std::vector<ExpertSwap>& swaps) override {
            swaps.push_back({.slot = 1000, .admit = 0});
        }
    };
    LoadOptions options{.backend = Backend::Cuda};
    options.experts.in_host = true;
    options.experts.cache_slots.assign(64, 2);
    options.experts.advisor = std::make_shared<BadAdvisor>();
    auto m = load_model(synthesized("small-k", DType::Q4_K), options);
    auto seq = m->new_sequence(8);
    std::vector<float> logits(static_cast<size_t>(m->info().n_vocab));
    EXPECT_THROW(m->forward(*seq, std::vector<int32_t>{1}, logits), Error);
}

}  // namespace

// Decode speed with experts in host RAM, on a file given by STRATA_OFFLOAD_MODEL (a perf run on the GPU machine; it
// skips without one): warm caches of STRATA_OFFLOAD_SLOTS slots a layer (comma-separated list; default 0,64,256)
// holding experts 0..S-1 and no adaptation, so the hit rate of random-router synth files is S / n_expert. Prints
// tokens/s of 64 decode tokens after a 16-token prompt, and the all-in-VRAM figure when the file fits.
TEST(CudaOffloadPerf, DecodeWithWarmSlots) {
    SKIP_WITHOUT_CUDA_DEVICE();
    const char* path = std::getenv("STRATA_OFFLOAD_MODEL");
    if (!path) GTEST_SKIP() << "STRATA_OFFLOAD_MODEL not set: offload decode timing skipped";
    std::vector<int64_t> slot_counts;
    std::string list = std::getenv("STRATA_OFFLOAD_SLOTS") ? std::getenv("STRATA_OFFLOAD_SLOTS") : "0,64,256";
    for (size_t start = 0; start <= list.size();) {
        const size_t comma = list.find(',', start);
        slot_counts.push_back(std::stoll(list.substr(start, comma - start)));
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    const int64_t n_expert = n_expert_of(path);
    auto time_decode = [&](const LoadOptions& options, const std::string& what) {
        auto m = load_model(path, options);
        const int64_t V = m->info().n_vocab;
        auto seq = m->new_sequence(128);
        HostFloats logits = m->host_floats(static_cast<size_t>(V));
        m->forward(*seq, random_tokens(V, 16, 3), logits, true);
        std::vector<int32_t> next = random_tokens(V, 72, 4);
        for (int i = 0; i < 8; ++i)
            m->forward(*seq, std::span<const int32_t>(&next[static_cast<size_t>(i)], 1), logits);
        const auto start = std::chrono::steady_clock::now();
        for (int i = 8; i < 72; ++i)
            m->forward(*seq, std::span<const int32_t>(&next[static_cast<size_t>(i)], 1), logits);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::printf("[ offload perf ] %s: %.1f tokens/s decode (64 tokens)\n", what.c_str(), 64 / s);
        std::fflush(stdout);
    };
    try {
        time_decode({.backend = Backend::Cuda}, "all in VRAM");
    } catch (const Error& e) {
        std::printf("[ offload perf ] all in VRAM: does not load (%s)\n", e.what());
    }
    for (int64_t slots : slot_counts) {
        LoadOptions options{.backend = Backend::Cuda};
        options.experts.in_host = true;
        std::vector<int32_t> warm;
        for (int32_t e = 0; e < std::min<int64_t>(slots, n_expert); ++e) warm.push_back(e);
        options.experts.cache_slots.assign(256, slots);
        options.experts.warm.assign(256, warm);
        time_decode(options, "experts in host RAM, " + std::to_string(slots) + " warm slots a layer");
    }
}
