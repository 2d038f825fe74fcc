// Speculative decoding, CPU side (issue 28): the prompt-lookup drafter and the policy as plain data (oracles: drafts
// and choices worked out by hand), and greedy speculative decoding against plain greedy decoding on the bundled model
// (the oracle: the same model decoding one token a call), which must give the same tokens whatever the window.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/model.h"
#include "runtime/prompt_lookup.h"
#include "runtime/sampler.h"
#include "runtime/speculation.h"
#include "runtime/speculative_decode.h"
#include "model_test_util.h"
#include "test_util.h"

namespace strata {
using strata::testing::plain_greedy;

namespace {

using V = std::vector<int32_t>;

TEST(PromptLookup, TheLatestLongestMatchProposesWhatFollowedIt) {
    // "... 1 2 3 9 ... 1 2 3 7 8 ... 1 2 3": the 3-gram 1 2 3 last occurred before 7 8.
    const V h = {5, 1, 2, 3, 9, 4, 1, 2, 3, 7, 8, 6, 1, 2, 3};
    EXPECT_EQ(prompt_lookup_draft(h, {.max_draft = 2}), (V{7, 8}));
    EXPECT_EQ(prompt_lookup_draft(h, {.max_draft = 5}), (V{7, 8, 6, 1, 2}));
    // A longer suffix wins over a later shorter one: "4 1 2 3" occurred once, before 7.
    const V g = {4, 1, 2, 3, 7, 0, 2, 3, 5, 4, 1, 2, 3};
    EXPECT_EQ(prompt_lookup_draft(g, {.max_draft = 1}), (V{7}));
    EXPECT_EQ(prompt_lookup_draft(g, {.max_draft = 1, .max_ngram = 2}), (V{5}));  // "2 3" last before 5
    // Nothing recurs, or the shortest allowed suffix is longer than any match: no draft.
    EXPECT_TRUE(prompt_lookup_draft(V{1, 2, 3, 4}, {}).empty());
    EXPECT_TRUE(prompt_lookup_draft(V{1, 2, 9, 1, 2}, {.min_ngram = 3}).empty());
    EXPECT_EQ(prompt_lookup_draft(V{1, 2, 9, 1, 2}, {.min_ngram = 2}), (V{9, 1, 2}));
    // The draft stops at the end of the history; an empty or one-token history proposes nothing.
    EXPECT_EQ(prompt_lookup_draft(V{7, 7}, {}), (V{7}));
    EXPECT_TRUE(prompt_lookup_draft(V{}, {}).empty());
    EXPECT_TRUE(prompt_lookup_draft(V{3}, {}).empty());
}

TEST(SpeculationPolicy, DraftsOnlyWhenTheMeasurementsSayItPays) {
    // A window of w tokens costs as much as w single tokens (compute-bound): even drafts that are always accepted only
    // tie with plain decoding (5 tokens for the price of 5), and a tie is not worth the risk.
    SpeculationPolicy p(4);
    for (int w = 1; w <= 5; ++w) p.record_cost(w, 0.010 * w);
    for (int i = 0; i < 200; ++i) p.record_round(4, 4);
    EXPECT_EQ(p.choose(), 0);
    // Memory-bound (a window of 5 costs 1.2 single tokens) and drafts always accepted: the longest draft.
    SpeculationPolicy r(4);
    r.record_cost(1, 0.010);
    for (int w = 2; w <= 5; ++w) r.record_cost(w, 0.010 + 0.0005 * w);
    for (int i = 0; i < 200; ++i) r.record_round(4, 4);
    EXPECT_EQ(r.choose(), 4);
    EXPECT_NEAR(r.acceptance(3), 1.0, 1e-6);
    // The same costs, first drafts always rejected from now on: plain decoding.
    for (int i = 0; i < 200; ++i) r.record_round(4, 0);
    EXPECT_EQ(r.choose(), 0);
    EXPECT_NEAR(r.acceptance(0), 0.0, 1e-6);
    EXPECT_NEAR(r.acceptance(1), 1.0, 1e-6) << "a position after a rejection is not judged";
    // Half the rounds accept everything, half nothing (a_1 = 0.5, a_i = 1 after it): E(k) = 1 + 0.5 k; with
    // cost(k + 1) = 0.01 + 0.0005 (k + 1), E / cost grows with k: the longest draft.
    SpeculationPolicy h(4);
    h.record_cost(1, 0.010);
    for (int w = 2; w <= 5; ++w) h.record_cost(w, 0.010 + 0.0005 * w);
    for (int i = 0; i < 400; ++i) h.record_round(4, i % 2 ? 4 : 0);
    EXPECT_EQ(h.choose(), 4);
    EXPECT_NEAR(h.acceptance(0), 0.5, 0.1);
}

// A stalled window (another process on a shared core) must not stop drafting: measured slower than its tokens one at a
// time, it is left out of the cost line, where as its only point off one token it would set the slope.
TEST(SpeculationPolicy, AStalledFirstWindowDoesNotPriceWindowsOut) {
    SpeculationPolicy p(4);
    for (int i = 0; i < 26; ++i) p.record_cost(1, 0.001);
    for (int i = 0; i < 50; ++i) p.record_round(4, 4);
    p.record_cost(3, 0.0059);  // 5.9x a token for 3 tokens: a stall
    EXPECT_EQ(p.choose(), 4);
    EXPECT_LT(p.cost(5), 0.002);
    // A window that costs as much as its tokens one by one is measured: then windows do not pay.
    for (int i = 0; i < 40; ++i) p.record_cost(3, 0.0030);
    EXPECT_EQ(p.choose(), 0);
}

TEST(SpeculationPolicy, PicksTheDrafterThatPaysAndNeitherWhenNoneDoes) {
    // Memory-bound windows (5 tokens cost 1.2 single tokens) and a cheap MTP pass (a tenth of a token): MTP drafts at
    // 0.8 acceptance beat plain decoding; prompt lookup, always accepted here, beats MTP where it has a match.
    SpeculationPolicy p(4, /*has_mtp=*/true);
    p.record_cost(1, 0.010);
    for (int w = 2; w <= 5; ++w) p.record_cost(w, 0.010 + 0.0005 * w);
    p.record_draft_cost(1, 0.001);
    for (int i = 0; i < 300; ++i) p.record_round(Drafter::Mtp, 1, i % 5 != 0 ? 1 : 0);
    for (int i = 0; i < 300; ++i) p.record_round(Drafter::PromptLookup, 4, 4);
    EXPECT_EQ(p.plan(0).drafter, Drafter::Mtp);
    EXPECT_GE(p.plan(0).k, 1);
    EXPECT_EQ(p.plan(4).drafter, Drafter::PromptLookup);
    EXPECT_EQ(p.plan(4).k, 4);
    EXPECT_EQ(p.plan(2).k, 2) << "prompt lookup drafts no more than it proposes";
    // The bundled model on this CPU: each window token costs about half a token more, an MTP pass a third of a
    // token, MTP accepted at 0.65: no MTP round pays, and without a lookup match the plan is plain decoding (bar the
    // exploring draft every kExplore-th call).
    SpeculationPolicy c(4, true);
    for (int w = 1; w <= 5; ++w) c.record_cost(w, 0.0008 + 0.0005 * (w - 1));
    c.record_draft_cost(1, 0.00027);
    for (int i = 0; i < 300; ++i) c.record_round(Drafter::Mtp, 2, i % 20 < 13 ? (i % 2 ? 2 : 1) : 0);
    int drafted = 0;
    for (int i = 0; i < 2 * SpeculationPolicy::kExplore; ++i) drafted += c.plan(0).k > 0;
    EXPECT_EQ(drafted, 2);
    EXPECT_NEAR(c.rate(Drafter::Mtp, 0) * 0.0008, 1.0, 1e-9);
    EXPECT_LT(c.rate(Drafter::Mtp, 1), c.rate(Drafter::Mtp, 0));
}

TEST(WindowProjection, SpeedupFromWindowCostsAtAPerDraftAcceptance) {
    // Worked by hand: each extra window token costs a tenth of a token, drafts accepted at 0.9 each. A window of 4
    // (3 drafts) gives 1 + 0.9 + 0.81 + 0.729 = 3.439 tokens for 1.3 tokens' cost: 2.645x. Re-feeding after a
    // rejection (1 - 0.729 of the rounds) a window of round(3.439) = 3 tokens costs 0.271 x 1.2 more: 2.116x.
    const std::vector<double> costs = {1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7};
    const std::vector<WindowProjection> p = project_windows(costs, 0.9);
    ASSERT_EQ(p.size(), 8u);
    EXPECT_EQ(p[0].window, 1);
    EXPECT_DOUBLE_EQ(p[0].speedup, 1.0);
    EXPECT_DOUBLE_EQ(p[0].speedup_refeed, 1.0);
    EXPECT_EQ(p[3].window, 4);
    EXPECT_NEAR(p[3].cost_ratio, 1.3, 1e-12);
    EXPECT_NEAR(p[3].tokens, 3.439, 1e-12);
    EXPECT_NEAR(p[3].speedup, 3.439 / 1.3, 1e-12);
    EXPECT_NEAR(p[3].speedup_refeed, 3.439 / (1.3 + 0.271 * 1.2), 1e-12);
    // E(k) / (1 + 0.1 k) grows up to the longest window here: 8 tokens, (1 - 0.9^8) / 0.1 / 1.7 = 3.33x.
    EXPECT_EQ(best_window(p).window, 8);
    EXPECT_NEAR(best_window(p).speedup, (1 - std::pow(0.9, 8)) / 0.1 / 1.7, 1e-12);
    // Compute-bound windows (w tokens cost w): nothing beats plain decoding, so the best window is one token.
    const std::vector<WindowProjection> bound = project_windows(std::vector<double>{1, 2, 3, 4}, 0.9);
    ASSERT_EQ(bound.size(), 4u);
    for (const WindowProjection& w : bound) EXPECT_LE(w.speedup, 1.0 + 1e-12);
    EXPECT_EQ(best_window(bound).window, 1);
    EXPECT_EQ(best_window(bound, /*refeed=*/true).window, 1);
    // Every draft accepted and windows free: w tokens a round, no re-feed.
    const std::vector<WindowProjection> all_free = project_windows(std::vector<double>{2, 2, 2}, 1.0);
    EXPECT_DOUBLE_EQ(all_free[2].speedup, 3.0);
    EXPECT_DOUBLE_EQ(all_free[2].speedup_refeed, 3.0);
    // Nothing measured: nothing projected; more sizes than a round drafts: only kMaxDraft + 1 of them.
    EXPECT_TRUE(project_windows({}, 0.9).empty());
    EXPECT_EQ(project_windows(std::vector<double>(12, 1.0), 0.5).size(), size_t(SpeculationPolicy::kMaxDraft + 1));
}

TEST(WindowProjection, ExpectedTokensChainThePerPositionAcceptance) {
    const std::vector<double> a = {0.5, 0.8, 0.25};
    double all = 0;
    EXPECT_DOUBLE_EQ(expected_round_tokens(a, 0, &all), 1.0);
    EXPECT_DOUBLE_EQ(all, 1.0);
    EXPECT_DOUBLE_EQ(expected_round_tokens(a, 3, &all), 1 + 0.5 + 0.4 + 0.1);
    EXPECT_DOUBLE_EQ(all, 0.1);
    EXPECT_DOUBLE_EQ(expected_round_tokens(a, 7), 2.0) << "positions past the list add nothing";
    EXPECT_EQ(refeed_window(0.2), 1);
    EXPECT_EQ(refeed_window(3.439), 3);
    EXPECT_EQ(refeed_window(100), SpeculationPolicy::kMaxDraft + 1);
}

std::string bundled() {
    return std::string(STRATA_SOURCE_DIR) + "/assets/strata-code-19m.gguf";
}

TEST(SpeculativeDecode, GreedyTokensEqualPlainGreedyDecoding) {
    auto m = load_model(bundled(), {.n_threads = 2});
    const int64_t vocab = m->info().n_vocab;
    std::mt19937 rng(3);
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(vocab - 1));
    // A repetitive prompt (drafts accepted and rejected) and a random one (few drafts).
    V repetitive;
    for (int r = 0; r < 6; ++r) repetitive.insert(repetitive.end(), {40, 41, 42, 43, 44, 45});
    V random;
    for (int i = 0; i < 24; ++i) random.push_back(pick(rng));
    for (const V& prompt : {repetitive, random}) {
        const V want = plain_greedy(*m, prompt, 80);
        for (const int k : {1, 3, 7}) {
            auto seq = m->new_sequence(static_cast<int64_t>(prompt.size()) + 80 + 8);
            std::vector<float> logits(static_cast<size_t>(vocab));
            m->forward(*seq, prompt, logits, true);
            V got;
            const SpeculativeStats st =
                greedy_speculative_decode(*m, *seq, logits, prompt, 80, {.max_draft = k, .lookup = {.min_ngram = 1}},
                                          [&](int32_t t) {
                    got.push_back(t);
                    return true;
                });
            EXPECT_EQ(got, want) << "spec " << k;
            // The sequence holds the prompt and the emitted tokens, the last one too when it was an accepted draft.
            EXPECT_GE(seq->n_past(), static_cast<int64_t>(prompt.size() + want.size()) - 1) << "spec " << k;
            EXPECT_LE(seq->n_past(), static_cast<int64_t>(prompt.size() + want.size())) << "spec " << k;
            std::printf("[ spec %d ] %lld forward passes for 80 tokens, %lld of %lld drafts accepted\n", k,
                        static_cast<long long>(st.rounds), static_cast<long long>(st.accepted),
                        static_cast<long long>(st.drafted));
        }
    }
}

// A model that cannot take checkpoints (CUDA: no device memory for the copy): speculation stops drafting and the
// tokens are still plain greedy decoding's.
TEST(SpeculativeDecode, WithoutCheckpointsItDecodesPlainly) {
    struct NoCheckpoints final : Model {
        explicit NoCheckpoints(const Model& m) : inner(m) {}
        const ModelInfo& info() const override { return inner.info(); }
        std::unique_ptr<SequenceState> new_sequence(int64_t n) const override { return inner.new_sequence(n); }
        void forward(SequenceState& seq, std::span<const int32_t> tokens, std::span<float> logits,
                     bool last_only) const override {
            inner.forward(seq, tokens, logits, last_only);
        }
        const Model& inner;  // checkpoint() is Model's: it throws Error
    };
    auto m = load_model(bundled(), {.n_threads = 2});
    const NoCheckpoints plain(*m);
    V prompt;
    for (int r = 0; r < 6; ++r) prompt.insert(prompt.end(), {40, 41, 42, 43, 44, 45});
    auto seq = plain.new_sequence(static_cast<int64_t>(prompt.size()) + 40 + 8);
    std::vector<float> logits(static_cast<size_t>(m->info().n_vocab));
    plain.forward(*seq, prompt, logits, true);
    V got;
    const SpeculativeStats st = greedy_speculative_decode(plain, *seq, logits, prompt, 40,
                                                          {.max_draft = 4, .lookup = {.min_ngram = 1}, .adaptive = false},
                                                          [&](int32_t t) {
                                                              got.push_back(t);
                                                              return true;
                                                          });
    EXPECT_EQ(got, plain_greedy(*m, prompt, 40));
    EXPECT_TRUE(st.no_checkpoint);
    EXPECT_EQ(st.drafted, 0);
}

// Keyed draws (Sampler::sample_at): the token depends on (seed, position, logits) alone, and over positions the draws
// follow softmax(logits): a chi-square test against the softmax computed here, on 8 tokens and 40,000 positions.
TEST(KeyedSampling, DrawsDependOnThePositionAloneAndFollowTheSoftmax) {
    const std::vector<float> logits = {1.0f, 0.5f, 0.0f, -0.5f, 2.0f, -1.0f, 0.25f, 1.5f};
    Sampler a({.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 42}, 8);
    Sampler b({.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 42}, 8);
    for (int i = 0; i < 37; ++i) (void)b.sample(logits);  // b's stream has moved on; keyed draws must not care
    for (uint64_t pos : {0ull, 1ull, 17ull, 123456789ull})
        EXPECT_EQ(a.sample_at(logits, pos), b.sample_at(logits, pos));
    std::vector<double> p(8);
    double z = 0;
    for (size_t i = 0; i < 8; ++i) z += p[i] = std::exp(static_cast<double>(logits[i]));
    constexpr int kDraws = 40000;
    std::vector<int> count(8, 0);
    for (int pos = 0; pos < kDraws; ++pos)
        ++count[static_cast<size_t>(a.sample_at(logits, static_cast<uint64_t>(pos)))];
    double chi2 = 0;
    for (size_t i = 0; i < 8; ++i) {
        const double expected = kDraws * p[i] / z;
        chi2 += (count[i] - expected) * (count[i] - expected) / expected;
    }
    // 7 degrees of freedom: P(chi2 > 24.3) = 0.001.
    EXPECT_LT(chi2, 24.3);
}

// Sampled decoding with speculation gives the tokens sampled decoding without it gives, for the same seed.
TEST(SpeculativeDecode, SampledTokensEqualSamplingWithoutSpeculation) {
    auto m = load_model(bundled(), {.n_threads = 2});
    const int64_t vocab = m->info().n_vocab;
    V prompt;
    for (int r = 0; r < 6; ++r) prompt.insert(prompt.end(), {40, 41, 42, 43, 44, 45});
    for (const uint64_t seed : {1ull, 2ull}) {
        Sampler sampler({.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = seed}, vocab);
        // Without speculation: one token a call, each drawn at its position.
        V want;
        {
            auto seq = m->new_sequence(static_cast<int64_t>(prompt.size()) + 64);
            std::vector<float> logits(static_cast<size_t>(vocab));
            m->forward(*seq, prompt, logits, true);
            for (int i = 0; i < 48; ++i) {
                const int32_t t = sampler.sample_at(logits, prompt.size() + static_cast<uint64_t>(i));
                want.push_back(t);
                m->forward(*seq, V{t}, logits, true);
            }
        }
        for (const int k : {1, 4}) {
            auto seq = m->new_sequence(static_cast<int64_t>(prompt.size()) + 64);
            std::vector<float> logits(static_cast<size_t>(vocab));
            m->forward(*seq, prompt, logits, true);
            V got;
            const SpeculativeStats st = speculative_decode(
                *m, *seq, logits, prompt, 48, {.max_draft = k, .lookup = {.min_ngram = 1}},
                [&](std::span<const float> row, int64_t pos) {
                    return sampler.sample_at(row, static_cast<uint64_t>(pos));
                },
                [&](int32_t t) {
                    got.push_back(t);
                    return true;
                });
            EXPECT_EQ(got, want) << "seed " << seed << ", spec " << k;
            std::printf("[ sampled spec %d ] seed %llu: %lld passes for 48 tokens, %lld of %lld drafts accepted\n", k,
                        static_cast<unsigned long long>(seed), static_cast<long long>(st.rounds),
                        static_cast<long long>(st.accepted), static_cast<long long>(st.drafted));
        }
    }
}

// After a rejected draft the sequence is as if the drafts were never fed: its next logits equal those of a sequence
// that saw only the accepted tokens (bit for bit: the CPU backend does not depend on batching).
TEST(SpeculativeDecode, RejectedDraftsLeaveNoTrace) {
    auto m = load_model(bundled(), {.n_threads = 2});
    const int64_t vocab = m->info().n_vocab;
    // Random ids: the drafts that prompt lookup finds are often wrong (seed 3: 2 of 7 rejected at --spec 3). No
    // policy (it decides from timings, which a busy machine moves): every match is drafted.
    std::mt19937 rng(3);
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(vocab - 1));
    V prompt;
    for (int i = 0; i < 24; ++i) prompt.push_back(pick(rng));
    const int64_t n = 80;
    auto seq = m->new_sequence(static_cast<int64_t>(prompt.size()) + n + 8);
    std::vector<float> logits(static_cast<size_t>(vocab));
    m->forward(*seq, prompt, logits, true);
    V got;
    const SpeculativeStats st =
        greedy_speculative_decode(*m, *seq, logits, prompt, n, {.max_draft = 3, .lookup = {.min_ngram = 1}, .adaptive = false},
                                  [&](int32_t t) {
            got.push_back(t);
            return true;
        });
    ASSERT_GT(st.refeeds + st.commits, 0)
        << "the prompt should make some draft fail (pick another prompt if the model changed)";
    EXPECT_EQ(st.refeeds, 0) << "the CPU keeps the accepted prefix by a commit, without a second pass";
    // The speculative sequence goes on with the emitted tokens it has not been fed, then one more token; a fresh one
    // is fed the prompt, every emitted token and that token: the logits after it must be the same.
    V all = prompt;
    all.insert(all.end(), got.begin(), got.end());
    const int64_t fed = seq->n_past();
    ASSERT_LE(fed, std::ssize(all));
    V rest(all.begin() + fed, all.end());
    rest.push_back(7);
    all.push_back(7);
    std::vector<float> a(static_cast<size_t>(vocab)), b(static_cast<size_t>(vocab));
    m->forward(*seq, rest, a, true);
    auto fresh = m->new_sequence(static_cast<int64_t>(all.size()) + 1);
    m->forward(*fresh, all, b, true);
    EXPECT_EQ(a, b);
}

// A commit keeps a prefix of a verification window bit for bit: the sequence then gives the logits of one that was
// fed only that prefix, for every prefix length, alone and for two windows of one batch, with the window crossing QSA blocks of 4 cells past the indexer's
// top-k of 64 cells (so pooled keys decide the selection) and the PLE n-gram history. The window must be the last pass after the checkpoint given.
TEST(Commit, KeepsAPrefixOfAWindowBitForBit) {
    auto m = load_model(bundled(), {.n_threads = 2});
    const int64_t vocab = m->info().n_vocab;
    std::mt19937 rng(5);
    std::uniform_int_distribution<int32_t> pick(1, static_cast<int32_t>(vocab - 1));
    V prompt, window, tail;
    for (int i = 0; i < 98; ++i) prompt.push_back(pick(rng));
    for (int i = 0; i < 6; ++i) window.push_back(pick(rng));
    for (int i = 0; i < 3; ++i) tail.push_back(pick(rng));
    for (int64_t keep = 0; keep <= std::ssize(window); ++keep) {
        auto seq = m->new_sequence(128);
        std::vector<float> rows(window.size() * static_cast<size_t>(vocab)), a(static_cast<size_t>(vocab)),
            b(static_cast<size_t>(vocab));
        m->forward(*seq, prompt, {}, true);
        const auto before = m->checkpoint(*seq);
        const BatchEntry entry{.seq = seq.get(), .tokens = window, .logits = rows, .window = true};
        m->forward_batch({&entry, 1});
        ASSERT_TRUE(m->commit(*seq, *before, keep));
        EXPECT_EQ(seq->n_past(), std::ssize(prompt) + keep);
        EXPECT_THROW(m->commit(*seq, *before, 0), Error) << "the window is spent";
        m->forward(*seq, tail, a, true);
        V all = prompt;
        all.insert(all.end(), window.begin(), window.begin() + keep);
        all.insert(all.end(), tail.begin(), tail.end());
        auto fresh = m->new_sequence(128);
        m->forward(*fresh, all, b, true);
        EXPECT_EQ(a, b) << "keep " << keep;
        // The window's logits of the kept rows are those of the kept tokens fed alone.
        if (keep > 0) {
            auto again = m->new_sequence(128);
            std::vector<float> c(static_cast<size_t>(vocab));
            V upto = prompt;
            upto.insert(upto.end(), window.begin(), window.begin() + keep);
            m->forward(*again, upto, c, true);
            EXPECT_TRUE(std::equal(c.begin(), c.end(), rows.begin() + (keep - 1) * vocab)) << "keep " << keep;
        }
    }
    // Two windows in one batch (the server's slots), each keeping its own prefix: the same as each fed alone.
    {
        auto s1 = m->new_sequence(128), s2 = m->new_sequence(128);
        const V p2(prompt.begin() + 10, prompt.end());
        m->forward(*s1, prompt, {}, true);
        m->forward(*s2, p2, {}, true);
        const auto c1 = m->checkpoint(*s1), c2 = m->checkpoint(*s2);
        const V w2(window.rbegin(), window.rend());
        const BatchEntry both[] = {{.seq = s1.get(), .tokens = window, .window = true},
                                   {.seq = s2.get(), .tokens = w2, .window = true}};
        m->forward_batch(both);
        ASSERT_TRUE(m->commit(*s1, *c1, 2));
        ASSERT_TRUE(m->commit(*s2, *c2, 5));
        std::vector<float> a1(static_cast<size_t>(vocab)), a2(a1.size()), b1(a1.size()), b2(a1.size());
        const BatchEntry next[] = {{.seq = s1.get(), .tokens = tail, .logits = a1, .last_only = true},
                                   {.seq = s2.get(), .tokens = tail, .logits = a2, .last_only = true}};
        m->forward_batch(next);
        V all1 = prompt, all2 = p2;
        all1.insert(all1.end(), window.begin(), window.begin() + 2);
        all2.insert(all2.end(), w2.begin(), w2.begin() + 5);
        all1.insert(all1.end(), tail.begin(), tail.end());
        all2.insert(all2.end(), tail.begin(), tail.end());
        auto f1 = m->new_sequence(128), f2 = m->new_sequence(128);
        m->forward(*f1, all1, b1, true);
        m->forward(*f2, all2, b2, true);
        EXPECT_EQ(a1, b1);
        EXPECT_EQ(a2, b2);
    }
    // Misuse: a pass that was no window, and a prefix longer than the window.
    auto seq = m->new_sequence(128);
    m->forward(*seq, prompt, {}, true);
    const auto before = m->checkpoint(*seq);
    m->forward(*seq, window, {}, true);
    EXPECT_THROW(m->commit(*seq, *before, 1), Error);
    m->restore(*seq, *before);
    const BatchEntry entry{.seq = seq.get(), .tokens = window, .window = true};
    m->forward_batch({&entry, 1});
    EXPECT_THROW(m->commit(*seq, *before, std::ssize(window) + 1), Error);
    EXPECT_EQ(seq->n_past(), std::ssize(prompt) + std::ssize(window)) << "a refused commit changes nothing";
}

}  // namespace
}  // namespace strata
