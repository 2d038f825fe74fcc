// Sampling cost per token over Flash-Next's 248,320-entry vocabulary: the full chain (bias, penalties over 64 tokens,
// top-k, top-p, min-p, temperature) on one row of logits, as `strata run` calls it once per generated token.
//
// Logits: Gaussian, standard deviation 1 ("flat": top-p 0.95 keeps most of the vocabulary, the worst case for the
// nucleus) and 4 (a peaked row more like a trained model's). Run: build-x/bench/bench_sampler
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "runtime/sampler.h"

namespace {

constexpr int64_t kVocab = 248320;

std::vector<float> gaussian_logits(float stddev, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, stddev);
    std::vector<float> logits(kVocab);
    for (float& l : logits) l = normal(rng);
    return logits;
}

enum Setting { kTypical, kTopPOnly, kGreedy, kTemperatureOnly };

strata::SamplingParams params_for(Setting s) {
    switch (s) {
        case kTypical:  // llama.cpp-like defaults with a repetition penalty
            return {.temperature = 0.7f,
                    .top_k = 40,
                    .top_p = 0.95f,
                    .min_p = 0.05f,
                    .repetition_penalty = 1.1f,
                    .penalty_last_n = 64,
                    .seed = 1};
        case kTopPOnly:  // no top-k: the nucleus has to be found over the whole vocabulary
            return {.temperature = 0.7f,
                    .top_k = 0,
                    .top_p = 0.95f,
                    .min_p = 0.0f,
                    .repetition_penalty = 1.1f,
                    .penalty_last_n = 64,
                    .seed = 1};
        case kGreedy:
            return {.top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 1, .greedy = true};
        case kTemperatureOnly:
            return {.temperature = 0.7f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 1};
    }
    return {};
}

void BM_Sample(benchmark::State& state) {
    const auto setting = static_cast<Setting>(state.range(0));
    const float stddev = static_cast<float>(state.range(1));
    const std::vector<float> logits = gaussian_logits(stddev, 7);
    strata::Sampler sampler(params_for(setting), kVocab);
    std::mt19937_64 history_rng(3);
    for (int i = 0; i < 64; ++i) sampler.accept(static_cast<int32_t>(history_rng() % kVocab));
    for (auto _ : state) {
        int32_t token = sampler.sample(logits);
        benchmark::DoNotOptimize(token);
    }
    state.SetLabel(std::string(setting == kTypical    ? "typical: T0.7 k40 p0.95 minp0.05 rep1.1/64"
                               : setting == kTopPOnly ? "top-p 0.95 only (T0.7, rep1.1/64)"
                               : setting == kGreedy   ? "greedy"
                                                      : "temperature 0.7 only") +
                   ", logits N(0," + std::to_string(state.range(1)) + ")");
}

BENCHMARK(BM_Sample)
    ->ArgsProduct({{kTypical, kTopPOnly, kGreedy, kTemperatureOnly}, {1, 4}})
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
