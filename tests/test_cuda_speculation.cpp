// Speculative decoding on the CUDA backend (issue 28), on the bundled model:
//  - a CUDA checkpoint restored after a rejected window gives the logits of a sequence that never saw it (oracle:
//    that sequence, fed the same tokens without the window), also when its device slot is reused;
//  - the commit step keeps any prefix of a verification window like a sequence fed only that prefix (same oracle);
//  - the trunk's final residual rows (forward_with_residual) and the MTP layer's draft logits (the layer on the host,
//    the head on the device) against the CPU backend's (oracle: the CPU model, the same file);
//  - lossless: greedy output with speculation equals greedy output without it, token for token, for windows of up to
//    1, 3 and 7 drafts, by prompt lookup and by the MTP layer, with captured graphs, launches one by one, and the
//    routed experts in host RAM (oracle: the same backend decoding one token a call);
//  - the commands: generate and run with and without --spec give the same text, bench --spec reports acceptance;
//  - `strata bench --window-costs --backend cuda`: one JSON line per window size (each size's captured graph).
// Without the CUDA backend compiled in or without a GPU, every test skips with a message saying so.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "model/model.h"
#include "model_test_util.h"
#include "runtime/mtp_drafter.h"
#include "runtime/sampler.h"
#include "runtime/speculative_decode.h"
#include "test_util.h"

#include "cuda_skip.h"  // and backend/cuda/cuda_backend.h with the CUDA backend

using namespace strata;

namespace {

constexpr const char* kSkippedTests = "CUDA speculation tests";  // cuda_skip.h

using V = std::vector<int32_t>;
using strata::testing::plain_greedy;

std::string bundled() {
    return std::string(STRATA_SOURCE_DIR) + "/assets/strata-code-19m.gguf";
}

LoadOptions cuda_options(bool graphs = true) {
    return {.backend = Backend::Cuda, .n_threads = 2, .cuda_graphs = graphs};
}

// The routed experts in pinned host RAM, a quarter of each layer's experts cached in VRAM (the rest read over PCIe or
// computed by the CPU workers): what --vram-budget does to a model whose experts do not fit.
LoadOptions offload_options(const Model& probe) {
    LoadOptions o = cuda_options();
    o.experts.in_host = true;
    o.experts.cache_slots.assign(static_cast<size_t>(probe.info().n_layer), 2);
    return o;
}

// A repetitive prompt (lookup and MTP drafts accepted and rejected) and a pseudo-random one (few drafts).
std::vector<V> prompts(int64_t vocab) {
    V repetitive;
    for (int r = 0; r < 6; ++r) repetitive.insert(repetitive.end(), {40, 41, 42, 43, 44, 45});
    V random;
    uint32_t x = 12345;
    for (int i = 0; i < 24; ++i) {
        x = x * 1664525u + 1013904223u;
        random.push_back(static_cast<int32_t>(x % static_cast<uint32_t>(vocab)));
    }
    return {repetitive, random};
}

double max_abs(const std::vector<float>& v) {
    double m = 0;
    for (float f : v) m = std::max(m, static_cast<double>(std::fabs(f)));
    return m;
}

// Max |a - b| over max |b|.
double relative_diff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    double d = 0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
        d = std::max(d, static_cast<double>(std::fabs(a[i] - b[i])));
    return d / std::max(max_abs(b), 1e-30);
}

constexpr int64_t kTokens = 64;

// Greedy decoding with speculation: the tokens and the counts.
struct SpecRun {
    V tokens;
    SpeculativeStats stats;
};
SpecRun speculate(const Model& m, const V& prompt, int k, bool lookup, bool mtp_drafts) {
    const int64_t vocab = m.info().n_vocab;
    const int64_t capacity = static_cast<int64_t>(prompt.size()) + kTokens + 8;
    auto seq = m.new_sequence(capacity);
    std::optional<MtpDrafter> mtp;
    if (mtp_drafts) mtp.emplace(m, capacity);
    std::vector<float> logits(static_cast<size_t>(vocab));
    speculative_prefill(m, *seq, mtp ? &*mtp : nullptr, prompt, logits);
    SpecRun r;
    // No policy (adaptive off) and no probability floor for MTP drafts: every round drafts k tokens where the drafter
    // has them, so windows of every size up to k + 1 run whatever this device's costs say.
    r.stats = greedy_speculative_decode(m, *seq, logits, prompt, kTokens,
                                        {.max_draft = k,
                                         .lookup = {.min_ngram = 1},
                                         .prompt_lookup = lookup,
                                         .mtp = mtp ? &*mtp : nullptr,
                                         .mtp_min_p = 0.0f,
                                         .adaptive = false},
                                        [&](int32_t t) {
                                            r.tokens.push_back(t);
                                            return true;
                                        });
    return r;
}

TEST(CudaSpeculation, RestoredCheckpointGivesTheLogitsOfASequenceThatNeverSawTheWindow) {
    SKIP_WITHOUT_CUDA_DEVICE();
    for (const bool graphs : {true, false}) {
        auto m = load_model(bundled(), cuda_options(graphs));
        const int64_t vocab = m->info().n_vocab;
        const V prompt = prompts(vocab)[1];
        auto seq = m->new_sequence(256), clean = m->new_sequence(256);
        std::vector<float> logits(static_cast<size_t>(vocab)), want(logits.size());
        std::vector<float> rows(static_cast<size_t>(8 * vocab));
        m->forward(*seq, prompt, logits, true);
        m->forward(*clean, prompt, want, true);
        // Rounds of a rejected window: each restores to before it, then feeds one token, as a rejection's re-feed
        // does; the second round on reuses the first round's device slot.
        for (int round = 0; round < 3; ++round) {
            const int32_t next = static_cast<int32_t>((7 + 31 * round) % vocab);
            {
                const auto before = m->checkpoint(*seq);
                EXPECT_EQ(before->n_past(), seq->n_past());
                const V window = {next, 5, 6, 7, 8, 9, 10, 11};
                m->forward(*seq, std::span<const int32_t>(window).first(static_cast<size_t>(2 + 3 * round)), rows);
                m->restore(*seq, *before);
                EXPECT_EQ(seq->n_past(), before->n_past());
            }
            m->forward(*seq, V{next}, logits, true);
            m->forward(*clean, V{next}, want, true);
            EXPECT_LT(relative_diff(logits, want), 1e-4) << "round " << round << (graphs ? ", graphs" : ", eager");
        }
        // A checkpoint from before a reset, or from another sequence, is refused.
        const auto stale = m->checkpoint(*seq);
        seq->reset();
        EXPECT_THROW(m->restore(*seq, *stale), Error);
        EXPECT_THROW(m->restore(*clean, *stale), Error);
    }
}

// The commit step: after a verification window (BatchEntry::window) of 2..8 tokens, keeping a prefix of it gives the
// logits of a sequence fed only that prefix (oracle: a sequence that never saw the window), for every prefix length,
// with graphs and without, and the routed experts in host RAM; the window's KV cells past the prefix are overwritten.
TEST(CudaSpeculation, CommittedPrefixGivesTheLogitsOfASequenceFedOnlyThePrefix) {
    SKIP_WITHOUT_CUDA_DEVICE();
    auto probe = load_model(bundled(), cuda_options());
    const std::vector<std::pair<const char*, LoadOptions>> variants = {
        {"graphs", cuda_options()}, {"eager", cuda_options(false)}, {"experts in host RAM", offload_options(*probe)}};
    probe.reset();
    for (const auto& [name, options] : variants) {
        auto m = load_model(bundled(), options);
        const int64_t vocab = m->info().n_vocab;
        const V prompt = prompts(vocab)[0];
        auto seq = m->new_sequence(512), clean = m->new_sequence(512);
        std::vector<float> logits(static_cast<size_t>(vocab)), want(logits.size());
        std::vector<float> rows(static_cast<size_t>(8 * vocab));
        m->forward(*seq, prompt, logits, true);
        m->forward(*clean, prompt, want, true);
        int round = 0;
        for (const int64_t T : {2, 5, 8})
            for (int64_t keep = 0; keep <= T; ++keep, ++round) {
                V window;
                for (int64_t t = 0; t < T; ++t)
                    window.push_back(static_cast<int32_t>((11 + 7 * round + 13 * t) % vocab));
                const auto before = m->checkpoint(*seq);
                const BatchEntry entry{.seq = seq.get(),
                                       .tokens = window,
                                       .logits = std::span<float>(rows).first(static_cast<size_t>(T * vocab)),
                                       .window = true};
                m->forward_batch(std::span<const BatchEntry>(&entry, 1));
                ASSERT_TRUE(m->commit(*seq, *before, keep)) << name << ": the CUDA trunk commits";
                EXPECT_EQ(seq->n_past(), before->n_past() + keep);
                if (keep > 0) m->forward(*clean, std::span<const int32_t>(window).first(static_cast<size_t>(keep)), {});
                // The next token: from the committed state, and from the sequence fed only the prefix.
                const int32_t next = static_cast<int32_t>((3 + round) % vocab);
                m->forward(*seq, V{next}, logits, true);
                m->forward(*clean, V{next}, want, true);
                // Experts in host RAM: a miss the CPU workers compute in one pass and the GPU in the other.
                EXPECT_LT(relative_diff(logits, want), options.experts.in_host ? 1e-3 : 1e-4)
                    << name << ", window " << T << ", keep " << keep;
                EXPECT_EQ(argmax_lowest(logits), argmax_lowest(want)) << name << ", window " << T << ", keep " << keep;
            }
        // A commit needs the window right after the checkpoint.
        const auto early = m->checkpoint(*seq);
        m->forward(*seq, V{5}, logits, true);
        const V two = {6, 7};
        const BatchEntry late{.seq = seq.get(), .tokens = two, .logits = rows, .window = true};
        m->forward_batch(std::span<const BatchEntry>(&late, 1));
        EXPECT_THROW(m->commit(*seq, *early, 1), Error) << name;
    }
}

TEST(CudaSpeculation, ResidualRowsAndDraftLogitsMatchTheCpuBackend) {
    SKIP_WITHOUT_CUDA_DEVICE();
    auto gpu = load_model(bundled(), cuda_options());
    auto cpu = load_model(bundled(), {.n_threads = 2});
    ASSERT_GT(cpu->draft_residual_width(), 0) << "the bundled model carries an MTP layer";
    ASSERT_EQ(gpu->draft_residual_width(), cpu->draft_residual_width());
    const int64_t width = cpu->draft_residual_width(), vocab = cpu->info().n_vocab;
    const V prompt = prompts(vocab)[0];
    const int64_t n = std::ssize(prompt);
    // A prompt window and a decode window of 4, so both paths hand their rows over.
    for (const int64_t split : {n, n - 4}) {
        std::vector<float> got(static_cast<size_t>(n * width)), want(got.size());
        for (auto [model, rows] : {std::pair{gpu.get(), &got}, std::pair{cpu.get(), &want}}) {
            auto seq = model->new_sequence(n + 8);
            const std::span<const int32_t> ids(prompt);
            model->forward_with_residual(*seq, ids.first(static_cast<size_t>(split)), {},
                                         std::span<float>(*rows).first(static_cast<size_t>(split * width)));
            if (split < n)
                model->forward_with_residual(*seq, ids.subspan(static_cast<size_t>(split)), {},
                                             std::span<float>(*rows).subspan(static_cast<size_t>(split * width)));
        }
        // Prompt windows run fp16 tensor-core products on the device, so the rows differ by rounding; rows from the
        // wrong buffer, position or stream order would differ by about their own size.
        const double rows_diff = relative_diff(got, want);
        std::printf("[ cuda bundled ] residual rows against the CPU's, split at %lld: relative %.3g\n",
                    static_cast<long long>(split), rows_diff);
        EXPECT_LT(rows_diff, 3e-2) << "split at " << split;
        // The draft layer over every cell from the CPU's rows (the same input on both), its last cell's logits.
        std::vector<float> gpu_logits(static_cast<size_t>(vocab)), cpu_logits(gpu_logits.size());
        std::vector<float> gpu_out(static_cast<size_t>(width)), cpu_out(gpu_out.size());
        const std::span<const int32_t> next(prompt.data() + 1, static_cast<size_t>(n - 1));
        const std::span<const float> rows(want.data(), static_cast<size_t>((n - 1) * width));
        auto gpu_state = gpu->new_draft_state(n), cpu_state = cpu->new_draft_state(n);
        gpu->draft_forward(*gpu_state, 0, rows, next, gpu_logits, gpu_out);
        cpu->draft_forward(*cpu_state, 0, rows, next, cpu_logits, cpu_out);
        // The layer runs on the host in both (the CPU model's may take packed copies of its weights); the head is
        // one decode product on the device against the CPU's.
        EXPECT_LT(relative_diff(gpu_out, cpu_out), 1e-3);
        EXPECT_LT(relative_diff(gpu_logits, cpu_logits), 1e-2);
    }
}

TEST(CudaSpeculation, GreedyTokensEqualPlainGreedyDecoding) {
    SKIP_WITHOUT_CUDA_DEVICE();
    auto probe = load_model(bundled(), cuda_options());
    struct Variant {
        const char* name;
        LoadOptions options;
    };
    const std::vector<Variant> variants = {{"graphs", cuda_options()},
                                           {"eager", cuda_options(/*graphs=*/false)},
                                           {"experts in host RAM", offload_options(*probe)}};
    probe.reset();
    for (const Variant& v : variants) {
        auto m = load_model(bundled(), v.options);
        ASSERT_GT(m->draft_residual_width(), 0) << "the MTP layer runs with the CUDA trunk";
        for (const V& prompt : prompts(m->info().n_vocab)) {
            const V want = plain_greedy(*m, prompt, kTokens);
            for (const int k : {1, 3, 7})
                for (const bool mtp : {false, true}) {
                    const SpecRun r = speculate(*m, prompt, k, /*lookup=*/!mtp, mtp);
                    EXPECT_EQ(r.tokens, want) << v.name << ", spec " << k << (mtp ? ", MTP" : ", lookup");
                    EXPECT_EQ(r.stats.refeeds, 0) << v.name << ": the CUDA trunk commits accepted prefixes";
                    const auto d = static_cast<size_t>(mtp ? Drafter::Mtp : Drafter::PromptLookup);
                    if (mtp) {
                        EXPECT_GT(r.stats.drafted_by[d], 0) << v.name << ", spec " << k;
                    }
                    std::printf("[ %s, spec %d, %s ] %lld passes for %lld tokens, %lld of %lld drafts accepted\n",
                                v.name, k, mtp ? "mtp" : "lookup", static_cast<long long>(r.stats.rounds),
                                static_cast<long long>(kTokens), static_cast<long long>(r.stats.accepted_by[d]),
                                static_cast<long long>(r.stats.drafted_by[d]));
                }
        }
    }
}

// The commands with --backend cuda: generate and run (speculation on by default with the bundled model's MTP layer)
// give the text they give with --no-spec, and bench --spec reports its acceptance.
TEST(CudaSpeculation, CommandsSpeculateWithTheSameText) {
    SKIP_WITHOUT_CUDA_DEVICE();
    using strata::testing::run_strata;
    using strata::testing::shell_quote;
    const std::string model = "--model " + shell_quote(bundled()) + " --backend cuda --threads 2 ";
    const std::string code =
        "def merge(a, b):\n    out = []\n    while a and b:\n        out.append(a.pop(0) if a[0] "
        "< b[0] else b.pop(0))\n    return out + a + b\n\ndef merge(a, b):\n";
    for (const std::string& command : {"generate " + model + "--greedy --ids -n 96 --prompt " + shell_quote(code),
                                       "run " + model + "--raw --greedy -n 64 " + shell_quote(code)}) {
        const strata::testing::ShellRun plain = run_strata(command + " --no-spec");
        const strata::testing::ShellRun spec = run_strata(command);  // default: --spec 4, the policy's drafters
        const strata::testing::ShellRun fixed = run_strata(command + " --spec 3 --spec-fixed --spec-drafter lookup");
        ASSERT_EQ(plain.status, 0) << plain.err;
        ASSERT_EQ(spec.status, 0) << spec.err;
        ASSERT_EQ(fixed.status, 0) << fixed.err;
        EXPECT_FALSE(plain.out.empty());
        EXPECT_EQ(spec.out, plain.out) << command;
        EXPECT_EQ(fixed.out, plain.out) << command;
        EXPECT_NE(spec.err.find("speculation"), std::string::npos) << "the stats line on stderr: " << spec.err;
    }
    const strata::testing::ShellRun bench = run_strata("bench " + model + "-p 16 -n 48 -r 1 --spec 3 --json");
    ASSERT_EQ(bench.status, 0) << bench.err;
    EXPECT_NE(bench.out.find("\"spec_acceptance\""), std::string::npos) << bench.out;
}

TEST(CudaSpeculation, BenchWindowCostsRunsEveryWindowSize) {
    SKIP_WITHOUT_CUDA_DEVICE();
    const strata::testing::ShellRun r =
        strata::testing::run_strata("bench --model " + strata::testing::shell_quote(bundled()) +
                                    " --backend cuda --window-costs -d 64 -r 2 --threads 2 --json");
    ASSERT_EQ(r.status, 0) << r.err;
    std::istringstream in(r.out);
    int lines = 0;
    for (std::string line; std::getline(in, line);) {
        ++lines;
        EXPECT_NE(line.find("\"test\":\"window" + std::to_string(lines) + "@d64\""), std::string::npos) << line;
        EXPECT_NE(line.find("\"backend\":\"cuda\""), std::string::npos) << line;
    }
    EXPECT_EQ(lines, 8) << r.out;
}

}  // namespace
