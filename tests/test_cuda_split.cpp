// A model split over several GPUs (issue 29; model/cuda/split_cuda.cpp) must give the logits of one card bit for bit:
// each stage runs its blocks with the same kernels on the same values, and the residual streams (with the write a
// block leaves pending for the next read) are copied from stage to stage unchanged. Without two GPUs the same code
// path runs with two stages on GPU 0 (two contexts, two streams, the hand-off as a device-to-device copy ordered by
// events): every architecture's test model, cut at several blocks, against the unsplit model: prompts fed at once and
// in calls that cut it into prompt and decode windows (a window boundary inside the prompt), greedy decoding of 10
// tokens (tokens and every step's logits), a checkpoint restored, and experts in host RAM on the split.
// Without the CUDA backend compiled in or without a GPU, every test skips with a message saying so.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "convert/convert.h"
#include "core/dtype.h"
#include "format/gguf.h"
#include "model/model.h"
#include "model_test_util.h"
#include "test_util.h"

#include "cuda_skip.h"  // and backend/cuda/cuda_backend.h with the CUDA backend

using namespace strata;
namespace fs = std::filesystem;

namespace {

using strata::testing::bit_mismatches;
using strata::testing::converted_golden;
using strata::testing::random_tokens;

constexpr const char* kSkippedTests = "CUDA split tests";  // cuda_skip.h

int64_t n_layer_of(const std::string& path) {
    int64_t n = 0;
    const auto file = gguf::File::open(path);
    const std::string arch = file->get_str("general.architecture");
    n = file->get_u32(arch + ".block_count");
    if (const auto mtp = file->get_u32_opt(arch + ".nextn_predict_layers")) n -= *mtp;
    return n;
}

// Two stages on GPU 0: blocks [0, cut) and [cut, n_layer).
LoadOptions split_at(LoadOptions options, int64_t cut, int64_t n_layer) {
    options.split = {{.device = 0, .vram_budget = 0, .first_block = 0, .end_block = cut, .experts = {}},
                     {.device = 0, .vram_budget = 0, .first_block = cut, .end_block = n_layer, .experts = {}}};
    return options;
}

// Greedy decoding of n tokens after the prompt (in one call): the tokens, and the logits of the prompt's last token
// and of every step, one after another.
struct Greedy {
    std::vector<int32_t> tokens;
    std::vector<float> logits;
};
Greedy greedy(const Model& m, const std::vector<int32_t>& prompt, int n) {
    const size_t V = static_cast<size_t>(m.info().n_vocab);
    auto seq = m.new_sequence(static_cast<int64_t>(prompt.size()) + n + 8);
    std::vector<float> step(V);
    Greedy g;
    m.forward(*seq, prompt, step, true);
    for (int i = 0; i < n; ++i) {
        g.logits.insert(g.logits.end(), step.begin(), step.end());
        const auto t = static_cast<int32_t>(std::max_element(step.begin(), step.end()) - step.begin());
        g.tokens.push_back(t);
        m.forward(*seq, std::vector<int32_t>{t}, step, true);
    }
    g.logits.insert(g.logits.end(), step.begin(), step.end());
    return g;
}

// The logits of feeding `tokens` per_call at a time, then of 3 more after a checkpoint taken there, restored, and the
// same 3 fed again (they must be the first 3's).
struct Fed {
    std::vector<float> logits, again;
};
Fed fed(const Model& m, const std::vector<int32_t>& tokens, size_t per_call, const std::vector<int32_t>& more) {
    Fed f{.logits = strata::testing::logits_fed(m, tokens, per_call), .again = {}};
    const size_t V = static_cast<size_t>(m.info().n_vocab);
    auto seq = m.new_sequence(static_cast<int64_t>(tokens.size() + more.size()) + 8);
    m.forward(*seq, tokens, {}, false);
    const auto cp = m.checkpoint(*seq);
    std::vector<float> first(more.size() * V), second(more.size() * V);
    m.forward(*seq, more, first, false);
    m.restore(*seq, *cp);
    m.forward(*seq, more, second, false);
    f.again = first;
    f.again.insert(f.again.end(), second.begin(), second.end());
    return f;
}

// Every comparison of one model file, unsplit against a split at each cut, with prompt windows of `chunk` tokens
// (0: the default window).
void expect_split_exact(const std::string& path, const char* what, int64_t chunk) {
    const int64_t L = n_layer_of(path);
    LoadOptions base{.backend = Backend::Cuda};
    base.prompt_chunk = chunk;
    auto one = load_model(path, base);
    const int64_t V = one->info().n_vocab;
    const std::vector<int32_t> tokens = random_tokens(V, 40, 11), more = random_tokens(V, 3, 12);
    // 40 at once: prompt windows (40 = 16 + 16 + a decode window of 8 with chunk 16); 1 and 3 a call: decode windows
    // (graphs); 13 a call: a prompt window, then decode windows, cut where the windows of other calls are not.
    const size_t per_calls[] = {40, 1, 3, 13};
    std::vector<Fed> want;
    for (const size_t per_call : per_calls) want.push_back(fed(*one, tokens, per_call, more));
    const Greedy want_greedy = greedy(*one, tokens, 10);
    one.reset();

    // The cuts: after the first block (qwen4exp's second block has the PLE layer, which applies the handed-in write
    // before its first read), in the middle, before the last.
    std::vector<int64_t> cuts = {1, L / 2, L - 1};
    cuts.erase(std::remove_if(cuts.begin(), cuts.end(), [&](int64_t c) { return c < 1 || c >= L; }), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    ASSERT_FALSE(cuts.empty()) << what << ": a split needs two blocks or more";
    for (const int64_t cut : cuts) {
        auto split = load_model(path, split_at(base, cut, L));
        ASSERT_EQ(split->info().n_vocab, V);
        for (size_t i = 0; i < std::size(per_calls); ++i) {
            const Fed got = fed(*split, tokens, per_calls[i], more);
            EXPECT_EQ(bit_mismatches(got.logits, want[i].logits), 0u)
                << what << ", cut at " << cut << ", chunk " << chunk << ", " << per_calls[i] << " a call";
            EXPECT_EQ(bit_mismatches(got.again, want[i].again), 0u)
                << what << ", cut at " << cut << ", chunk " << chunk << ", " << per_calls[i]
                << " a call: checkpoint and restore";
        }
        const Greedy got = greedy(*split, tokens, 10);
        EXPECT_EQ(got.tokens, want_greedy.tokens) << what << ", cut at " << cut << ", chunk " << chunk;
        EXPECT_EQ(bit_mismatches(got.logits, want_greedy.logits), 0u)
            << what << ", cut at " << cut << ", chunk " << chunk << ": greedy steps' logits";
        std::printf("[ split %s ] cut at %lld of %lld blocks, prompt chunk %lld: logits and greedy tokens equal to "
                    "one context\n",
                    what, static_cast<long long>(cut), static_cast<long long>(L), static_cast<long long>(chunk));
    }
}

TEST(CudaSplit, Qwen4ExpTwoStagesOnOneDeviceAreBitExact) {
    SKIP_WITHOUT_CUDA_DEVICE();
    for (const int64_t chunk : {int64_t{0}, int64_t{16}})
        expect_split_exact(converted_golden("qwen4exp"), "qwen4exp", chunk);
}

TEST(CudaSplit, Qwen35MoeTwoStagesOnOneDeviceAreBitExact) {
    SKIP_WITHOUT_CUDA_DEVICE();
    for (const int64_t chunk : {int64_t{0}, int64_t{16}})
        expect_split_exact(converted_golden("qwen35moe"), "qwen35moe", chunk);
}

TEST(CudaSplit, Qwen3NextTwoStagesOnOneDeviceAreBitExact) {
    SKIP_WITHOUT_CUDA_DEVICE();
    for (const int64_t chunk : {int64_t{0}, int64_t{16}})
        expect_split_exact(converted_golden("qwen3next"), "qwen3next", chunk);
}

// Experts in host RAM on both stages (each stage registers and caches its own blocks' experts; cache slots are by
// trunk block): the logits of the all-in-VRAM unsplit model, bit for bit (the offload promises that on one card).
TEST(CudaSplit, ExpertsInHostRamOnTheStagesAreBitExact) {
    SKIP_WITHOUT_CUDA_DEVICE();
    for (const char* name : {"qwen4exp", "qwen35moe"}) {
        const std::string path = converted_golden(name);
        const int64_t L = n_layer_of(path);
        const auto file = gguf::File::open(path);
        const int64_t n_expert = file->get_u32(file->get_str("general.architecture") + ".expert_count");
        LoadOptions base{.backend = Backend::Cuda};
        base.prompt_chunk = 16;
        auto one = load_model(path, base);
        const std::vector<int32_t> tokens = random_tokens(one->info().n_vocab, 40, 13);
        std::vector<std::vector<float>> want;
        for (const size_t per_call : {size_t{40}, size_t{1}, size_t{3}})
            want.push_back(strata::testing::logits_fed(*one, tokens, per_call));
        one.reset();
        LoadOptions options = split_at(base, L / 2, L);
        for (CudaStage& stage : options.split) {
            stage.experts.in_host = true;
            stage.experts.cache_slots.assign(static_cast<size_t>(L), 0);  // the stage reads its own blocks'
            for (int64_t b = stage.first_block; b < stage.end_block; ++b)
                stage.experts.cache_slots[static_cast<size_t>(b)] = n_expert / 2;
        }
        auto split = load_model(path, options);
        size_t i = 0;
        for (const size_t per_call : {size_t{40}, size_t{1}, size_t{3}}) {
            EXPECT_EQ(bit_mismatches(strata::testing::logits_fed(*split, tokens, per_call), want[i++]), 0u)
                << name << ", experts in host RAM on a split, " << per_call << " a call";
        }
        const std::optional<ExpertOffloadStats> stats = split->expert_offload_stats();
        ASSERT_TRUE(stats.has_value()) << name;
        EXPECT_GT(stats->lookups, 0) << name;
        std::printf("[ split %s ] experts in host RAM, half the slots on each stage: logits equal to all in VRAM "
                    "(%lld lookups, %lld hits)\n",
                    name, static_cast<long long>(stats->lookups), static_cast<long long>(stats->hits));
    }
}

TEST(CudaSplit, ClearErrors) {
    SKIP_WITHOUT_CUDA_DEVICE();
    const std::string path = converted_golden("qwen35moe");
    const int64_t L = n_layer_of(path);
    LoadOptions bad{.backend = Backend::Cuda};
    bad.split = {{.device = 0, .vram_budget = 0, .first_block = 0, .end_block = L + 1, .experts = {}},
                 {.device = 0, .vram_budget = 0, .first_block = L + 1, .end_block = L + 2, .experts = {}}};
    strata::testing::expect_error([&] { (void)load_model(path, bad); }, "split stage 0");
    bad.split = {{.device = 0, .vram_budget = 0, .first_block = 0, .end_block = 1, .experts = {}},
                 {.device = 99, .vram_budget = 0, .first_block = 1, .end_block = L, .experts = {}}};
    strata::testing::expect_error([&] { (void)load_model(path, bad); }, "device 99");
}

}  // namespace
