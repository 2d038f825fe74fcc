// The sampler against its definitions (runtime/sampler.h): chi-square goodness of fit over 10^5 draws for
// temperature, top-k, top-p, min-p and their chain, with the expected distribution computed here from the definition
// by a full sort; penalties and logit bias against numbers worked out by hand; determinism per seed; greedy ties; and
// the stop-string matcher. Seeds are fixed, so every run draws the same tokens and the verdicts never flicker.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/sampler.h"
#include "runtime/sampler_kernels.h"
#include "runtime/stop_strings.h"
#include "test_util.h"

namespace strata {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The chain's distribution from the definitions, in double precision, by a full sort (no bias, no penalties).
std::vector<double> expected_distribution(const std::vector<float>& logits, const SamplingParams& p) {
    const size_t n = logits.size();
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return logits[a] > logits[b]; });
    const double top = logits[order[0]];
    size_t kept = n;
    if (p.top_k > 0 && static_cast<size_t>(p.top_k) < n) kept = static_cast<size_t>(p.top_k);
    if (p.top_p < 1.0f) {  // smallest prefix whose probability (softmax over what top-k kept) reaches top_p
        double z = 0.0;
        for (size_t j = 0; j < kept; ++j) z += std::exp(logits[order[j]] - top);
        double cumulative = 0.0;
        for (size_t j = 0; j < kept; ++j) {
            cumulative += std::exp(logits[order[j]] - top) / z;
            if (cumulative >= p.top_p) {
                kept = j + 1;
                break;
            }
        }
    }
    if (p.min_p > 0.0f)  // p >= min_p * p_max, and p / p_max = exp(l - l_max)
        while (kept > 1 && std::exp(logits[order[kept - 1]] - top) < p.min_p) --kept;
    std::vector<double> probs(n, 0.0);
    double z = 0.0;
    for (size_t j = 0; j < kept; ++j) z += probs[order[j]] = std::exp((logits[order[j]] - top) / p.temperature);
    for (double& q : probs) q /= z;
    return probs;
}

// P(chi-square with df degrees of freedom > x), Wilson-Hilferty: the cube root of chi2/df is close to normal.
double chi_square_tail(double x, double df) {
    const double s = 2.0 / (9.0 * df);
    const double z = (std::cbrt(x / df) - (1.0 - s)) / std::sqrt(s);
    return 0.5 * std::erfc(z / std::sqrt(2.0));
}

// Draws n tokens and checks them against `expected`: no token outside its support, and a chi-square test (bins with
// an expected count under 5 pooled) that passes at significance 0.001.
void expect_fits(Sampler& sampler, const std::vector<float>& logits, const std::vector<double>& expected, int draws) {
    std::vector<int64_t> observed(logits.size(), 0);
    for (int i = 0; i < draws; ++i) {
        const int32_t t = sampler.sample(logits);
        ASSERT_GE(t, 0);
        ASSERT_LT(static_cast<size_t>(t), logits.size());
        ++observed[static_cast<size_t>(t)];
    }
    double chi2 = 0.0, pooled_expected = 0.0;
    int64_t pooled_observed = 0;
    int bins = 0;
    for (size_t t = 0; t < logits.size(); ++t) {
        const double e = expected[t] * draws;
        if (expected[t] == 0.0) {
            EXPECT_EQ(observed[t], 0) << "token " << t << " is outside the kept set but was drawn";
            continue;
        }
        if (e < 5.0) {
            pooled_expected += e;
            pooled_observed += observed[t];
            continue;
        }
        chi2 += (observed[t] - e) * (observed[t] - e) / e;
        ++bins;
    }
    if (pooled_expected > 0.0) {
        chi2 += (pooled_observed - pooled_expected) * (pooled_observed - pooled_expected) / pooled_expected;
        ++bins;
    }
    if (bins < 2) return;  // a single outcome: the support check above is the whole test
    const double p_value = chi_square_tail(chi2, bins - 1);
    EXPECT_GT(p_value, 0.001) << "chi2 " << chi2 << " over " << bins << " bins";
}

// Twelve logits with distinct values, not in sorted order, so the sort inside the sampler matters.
const std::vector<float> kSmallLogits = {1.0f, 3.2f, -0.5f, 2.5f, 0.3f, 2.9f, -2.0f, 1.7f, 0.9f, 2.2f, -1.1f, 0.0f};

SamplingParams plain(float temperature) {
    return {.temperature = temperature, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 1234};
}

TEST(SamplerFit, Temperature) {
    for (float t : {1.0f, 0.7f, 1.8f}) {
        SCOPED_TRACE("temperature " + std::to_string(t));
        SamplingParams p = plain(t);
        Sampler s(p, static_cast<int64_t>(kSmallLogits.size()));
        expect_fits(s, kSmallLogits, expected_distribution(kSmallLogits, p), 100000);
    }
}

TEST(SamplerFit, TopK) {
    for (int k : {1, 3, 5}) {
        SCOPED_TRACE("top-k " + std::to_string(k));
        SamplingParams p = plain(0.9f);
        p.top_k = k;
        Sampler s(p, static_cast<int64_t>(kSmallLogits.size()));
        expect_fits(s, kSmallLogits, expected_distribution(kSmallLogits, p), 100000);
    }
}

TEST(SamplerFit, TopP) {
    for (float top_p : {0.3f, 0.75f, 0.95f}) {
        SCOPED_TRACE("top-p " + std::to_string(top_p));
        SamplingParams p = plain(1.0f);
        p.top_p = top_p;
        Sampler s(p, static_cast<int64_t>(kSmallLogits.size()));
        expect_fits(s, kSmallLogits, expected_distribution(kSmallLogits, p), 100000);
    }
}

TEST(SamplerFit, MinP) {
    for (float min_p : {0.05f, 0.3f, 0.8f}) {
        SCOPED_TRACE("min-p " + std::to_string(min_p));
        SamplingParams p = plain(1.3f);
        p.min_p = min_p;
        Sampler s(p, static_cast<int64_t>(kSmallLogits.size()));
        expect_fits(s, kSmallLogits, expected_distribution(kSmallLogits, p), 100000);
    }
}

TEST(SamplerFit, WholeChainSmallTopK) {
    SamplingParams p = {.temperature = 0.7f, .top_k = 8, .top_p = 0.9f, .min_p = 0.05f, .seed = 99};
    Sampler s(p, static_cast<int64_t>(kSmallLogits.size()));
    expect_fits(s, kSmallLogits, expected_distribution(kSmallLogits, p), 100000);
}

// A vocabulary large enough for the histogram path (no top-k, or top-k above the heap's limit) with many tokens at
// the top-p boundary.
std::vector<float> gaussian_logits(size_t n, float stddev, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> normal(0.0, stddev);
    std::vector<float> logits(n);
    for (float& l : logits) l = static_cast<float>(normal(rng));
    return logits;
}

TEST(SamplerFit, LargeVocabularyHistogramPath) {
    const std::vector<float> logits = gaussian_logits(3000, 2.0f, 5);
    const std::vector<SamplingParams> settings = {
        {.temperature = 1.0f, .top_k = 0, .top_p = 0.6f, .min_p = 0.0f, .seed = 7},
        {.temperature = 0.7f, .top_k = 0, .top_p = 0.9f, .min_p = 0.0f, .seed = 8},
        {.temperature = 1.2f, .top_k = 0, .top_p = 1.0f, .min_p = 0.02f, .seed = 9},
        {.temperature = 0.8f, .top_k = 1500, .top_p = 0.95f, .min_p = 0.0f, .seed = 10},
        {.temperature = 1.0f, .top_k = 1100, .top_p = 1.0f, .min_p = 0.0f, .seed = 11},
        {.temperature = 0.9f, .top_k = 200, .top_p = 0.8f, .min_p = 0.01f, .seed = 12},  // heap path, same vocab
    };
    for (const SamplingParams& p : settings) {
        SCOPED_TRACE("T " + std::to_string(p.temperature) + " k " + std::to_string(p.top_k) + " p " +
                     std::to_string(p.top_p) + " min-p " + std::to_string(p.min_p));
        Sampler s(p, static_cast<int64_t>(logits.size()));
        expect_fits(s, logits, expected_distribution(logits, p), 100000);
    }
}

TEST(SamplerFit, FullVocabularyKeepsExactlyTheNucleus) {
    // Flash-Next's vocabulary size; the nucleus boundary falls among thousands of near-equal tokens.
    const std::vector<float> logits = gaussian_logits(248320, 1.0f, 21);
    SamplingParams p = {.temperature = 0.7f, .top_k = 0, .top_p = 0.5f, .min_p = 0.0f, .seed = 3};
    const std::vector<double> expected = expected_distribution(logits, p);
    Sampler s(p, static_cast<int64_t>(logits.size()));
    float lowest_kept = kInf;
    for (size_t t = 0; t < logits.size(); ++t)
        if (expected[t] > 0.0) lowest_kept = std::min(lowest_kept, logits[t]);
    for (int i = 0; i < 3000; ++i) {
        const int32_t t = s.sample(logits);
        ASSERT_GT(expected[static_cast<size_t>(t)], 0.0)
            << "token " << t << " (logit " << logits[t] << ") is outside the nucleus (lowest kept " << lowest_kept
            << ")";
    }
}

TEST(Sampler, SameSeedSameTokensOtherSeedOtherTokens) {
    const std::vector<float> logits = gaussian_logits(5000, 1.5f, 1);
    auto run = [&](uint64_t seed, int32_t top_k) {
        Sampler s({.temperature = 0.8f, .top_k = top_k, .top_p = 0.95f, .min_p = 0.0f, .seed = seed}, 5000);
        std::vector<int32_t> out;
        for (int i = 0; i < 200; ++i) out.push_back(s.sample(logits));
        return out;
    };
    for (int32_t k : {0, 40}) {
        EXPECT_EQ(run(42, k), run(42, k));
        EXPECT_NE(run(42, k), run(43, k));
    }
}

TEST(Sampler, VectorWidthsGiveTheSameTokens) {
    // The AVX2 kernels and the baseline 4-wide ones do the same float operations per token, so the same seed gives
    // the same tokens on every x86-64 machine (and on ARM, which runs the 4-wide code).
    const std::vector<float> logits = gaussian_logits(248320, 1.0f, 77);
    const std::vector<SamplingParams> settings = {
        {.temperature = 0.7f, .top_k = 0, .top_p = 0.95f, .min_p = 0.0f, .repetition_penalty = 1.1f, .seed = 4},
        {.temperature = 0.7f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .seed = 5},
        {.temperature = 1.3f, .top_k = 5000, .top_p = 1.0f, .min_p = 0.001f, .seed = 6},
        {.temperature = 1.0f, .top_k = 0, .top_p = 0.9f, .min_p = 0.0f, .seed = 7},
    };
    auto run = [&](const SamplingParams& p, bool baseline) {
        sampler_kernels::use_baseline_for_testing(baseline);
        Sampler s(p, static_cast<int64_t>(logits.size()));
        std::vector<int32_t> out;
        for (int i = 0; i < 40; ++i) {
            out.push_back(s.sample(logits));
            s.accept(out.back());
        }
        sampler_kernels::use_baseline_for_testing(false);
        return out;
    };
    for (const SamplingParams& p : settings) EXPECT_EQ(run(p, false), run(p, true)) << "seed " << p.seed;
    std::printf("kernels in use here: %s\n", sampler_kernels::kernel_width_name());
}

TEST(Sampler, PenaltiesMatchAHandComputation) {
    // logits: t0 2.0, t1 -1.0, t2 0.5, t3 3.0, t4 0.0, t5 -0.25
    // accepted: 4 5 0 0 1 3 with a window of the last 4 -> counts t0 2, t1 1, t3 1 (t4 and t5 have left the window)
    // repetition 1.5, presence 0.2, frequency 0.1:
    //   t0: 2.0 / 1.5 - (0.2 + 2 * 0.1) =  1.333333 - 0.4 =  0.933333
    //   t1: -1.0 * 1.5 - (0.2 + 0.1)   = -1.5 - 0.3      = -1.8
    //   t3: 3.0 / 1.5 - (0.2 + 0.1)     =  2.0 - 0.3      =  1.7
    //   t2, t4, t5 unchanged: 0.5, 0.0, -0.25
    std::vector<float> row = {2.0f, -1.0f, 0.5f, 3.0f, 0.0f, -0.25f};
    Sampler s({.repetition_penalty = 1.5f,
               .presence_penalty = 0.2f,
               .frequency_penalty = 0.1f,
               .penalty_last_n = 4,
               .greedy = true},
              6);
    s.accept(std::vector<int32_t>{4, 5, 0, 0, 1, 3});
    EXPECT_EQ(s.sample_in_place(row), 3);  // 1.7 is still the largest
    const std::vector<float> want = {0.933333f, -1.8f, 0.5f, 1.7f, 0.0f, -0.25f};
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(row[i], want[i], 1e-5) << "token " << i;

    // A stronger presence penalty (1.5, no frequency) moves the choice: t3 = 3.0 / 1.5 - 1.5 = 0.5 (exact in float),
    // t0 = 1.333 - 1.5 < 0, so t2 (0.5, unpenalized) and t3 tie and greedy takes the lower id, t2.
    std::vector<float> row2 = {2.0f, -1.0f, 0.5f, 3.0f, 0.0f, -0.25f};
    Sampler s2({.repetition_penalty = 1.5f, .presence_penalty = 1.5f, .penalty_last_n = 4, .greedy = true}, 6);
    s2.accept(std::vector<int32_t>{4, 5, 0, 0, 1, 3});
    EXPECT_EQ(s2.sample_in_place(row2), 2);
    EXPECT_FLOAT_EQ(row2[3], 0.5f);

    // -1 looks back over everything; 0 turns the penalties off.
    std::vector<float> row3 = {2.0f, -1.0f, 0.5f, 3.0f, 0.0f, -0.25f};
    Sampler all({.frequency_penalty = 1.0f, .penalty_last_n = -1, .greedy = true}, 6);
    all.accept(std::vector<int32_t>{3, 3, 3, 4});  // t3: 3 - 3 = 0; t4: 0 - 1 = -1
    EXPECT_EQ(all.sample_in_place(row3), 0);
    EXPECT_FLOAT_EQ(row3[3], 0.0f);
    EXPECT_FLOAT_EQ(row3[4], -1.0f);
    std::vector<float> row4 = {2.0f, -1.0f, 0.5f, 3.0f, 0.0f, -0.25f};
    Sampler off({.frequency_penalty = 1.0f, .penalty_last_n = 0, .greedy = true}, 6);
    off.accept(std::vector<int32_t>{3, 3, 3, 4});
    EXPECT_EQ(off.sample_in_place(row4), 3);
    EXPECT_FLOAT_EQ(row4[3], 3.0f);
}

TEST(Sampler, LogitBiasComesFirstAndMinusInfinityBans) {
    // Bias +2.5 on t2: 0.5 + 2.5 = 3.0 ties t3's 3.0 -> lowest id, t2.
    std::vector<float> row = {2.0f, -1.0f, 0.5f, 3.0f};
    Sampler biased({.logit_bias = {{2, 2.5f}}, .greedy = true}, 4);
    EXPECT_EQ(biased.sample_in_place(row), 2);
    EXPECT_FLOAT_EQ(row[2], 3.0f);
    // Bias before the repetition penalty: t0 (2.0 - 3.0 = -1.0) is then multiplied: -1.0 * 2 = -2.0.
    std::vector<float> row2 = {2.0f, -1.0f, 0.5f, 3.0f};
    Sampler order({.repetition_penalty = 2.0f, .logit_bias = {{0, -3.0f}}, .greedy = true}, 4);
    order.accept(0);
    order.sample_in_place(row2);
    EXPECT_FLOAT_EQ(row2[0], -2.0f);

    // A banned token is never drawn, on either path.
    const std::vector<float> logits = {5.0f, 4.9f, 1.0f, 0.0f};
    for (int32_t top_k : {0, 2}) {
        Sampler banned(
            {.temperature = 1.0f, .top_k = top_k, .top_p = 1.0f, .min_p = 0.0f, .logit_bias = {{0, -kInf}}, .seed = 5},
            4);
        for (int i = 0; i < 2000; ++i) ASSERT_NE(banned.sample(logits), 0);
    }
}

TEST(Sampler, GreedyTakesTheLowestIdOfATie) {
    const std::vector<float> logits = {1.0f, 3.0f, -kInf, 3.0f, 2.0f};
    Sampler greedy({.greedy = true}, 5);
    EXPECT_EQ(greedy.sample(logits), 1);
    Sampler zero_temperature({.temperature = 0.0f}, 5);
    EXPECT_EQ(zero_temperature.sample(logits), 1);
    EXPECT_EQ(argmax_lowest(logits), 1);
    // top-k 1 is greedy too, through the sort.
    Sampler top1({.temperature = 1.0f, .top_k = 1, .seed = 8}, 5);
    for (int i = 0; i < 50; ++i) EXPECT_EQ(top1.sample(logits), 1);
}

TEST(Sampler, BadParametersAndLogitsAreErrors) {
    using strata::testing::expect_error;
    expect_error([] { Sampler({.temperature = -1.0f}, 10); }, "temperature");
    expect_error([] { Sampler({.top_p = 0.0f}, 10); }, "top-p");
    expect_error([] { Sampler({.top_p = 1.5f}, 10); }, "top-p");
    expect_error([] { Sampler({.min_p = -0.1f}, 10); }, "min-p");
    expect_error([] { Sampler({.repetition_penalty = 0.0f}, 10); }, "repetition penalty");
    expect_error([] { Sampler({.penalty_last_n = -2}, 10); }, "penalty window");
    expect_error([] { Sampler({.logit_bias = {{10, 1.0f}}}, 10); }, "outside the vocabulary");
    expect_error([] { Sampler({.logit_bias = {{1, kInf}}}, 10); }, "logit bias");
    Sampler s({}, 3);
    expect_error([&] { s.sample(std::vector<float>{1.0f, 2.0f}); }, "vocabulary of 3");
    expect_error([&] { s.sample(std::vector<float>{1.0f, std::nanf(""), 2.0f}); }, "non-finite");
    expect_error([&] { s.sample(std::vector<float>{-kInf, -kInf, -kInf}); }, "non-finite");
}

// Feeds pieces one by one; returns everything shown.
std::string stream(StopMatcher& m, const std::vector<std::string>& pieces) {
    std::string shown;
    for (const std::string& p : pieces) shown += m.push(p);
    return shown + m.flush();
}

TEST(StopStrings, CutsAtAMatchSplitAcrossPieces) {
    StopMatcher m({"<|im_end|>"});
    EXPECT_EQ(stream(m, {"Hello", " world<|im", "_e", "nd|>and more", " text"}), "Hello world");
    EXPECT_TRUE(m.stopped());
    EXPECT_EQ(m.matched(), "<|im_end|>");
}

TEST(StopStrings, HoldsBackOnlyWhatCouldStartAStopString) {
    StopMatcher m({"STOP"});
    EXPECT_EQ(m.push("abcS"), "abc");  // "S" might begin STOP
    EXPECT_EQ(m.push("T"), "");        // "ST" still might
    EXPECT_EQ(m.push("x"), "STx");     // it did not
    EXPECT_FALSE(m.stopped());
    EXPECT_EQ(m.push("ST"), "");
    EXPECT_EQ(m.flush(), "ST");  // the end of generation releases what was held
}

TEST(StopStrings, OverlappingPrefixesAndSeveralStops) {
    // "aab": after "aa" the held part must restart at the second 'a'.
    StopMatcher m({"aab"});
    EXPECT_EQ(stream(m, {"xa", "a", "a", "b", "tail"}), "xa");
    StopMatcher several({"END", "\n\n", "ENDING"});
    EXPECT_EQ(stream(several, {"one\n", "two EN", "DING"}), "one\ntwo ");
    EXPECT_EQ(several.matched(), "ENDING");  // same start: the longer one
    StopMatcher earliest({"world", "lo w"});
    EXPECT_EQ(stream(earliest, {"hello world"}), "hel");
    StopMatcher none({});
    EXPECT_EQ(stream(none, {"a", "b"}), "ab");
    StopMatcher empty_string({""});
    EXPECT_EQ(stream(empty_string, {"a", "b"}), "ab");
}

TEST(StopStrings, NeverEmitsAStopStringWhateverTheSplit) {
    // Every way of cutting the text into two or three pieces.
    const std::string text = "the answer is 42</s> and then more</s>";
    for (size_t a = 0; a <= text.size(); ++a)
        for (size_t b = a; b <= text.size(); b += 3) {
            StopMatcher m({"</s>", "42<"});
            const std::string shown = stream(m, {text.substr(0, a), text.substr(a, b - a), text.substr(b)});
            ASSERT_EQ(shown, "the answer is ") << a << " " << b;
        }
}

}  // namespace
}  // namespace strata
