// Batched forward and sequence checkpoints (issue 6, DESIGN.md "Batched = single").
//  - forward_batch: sequences of different lengths, prompt chunks mixed with single-token decode steps and last_only
//    rows, in several orders: each entry's logits are bit-identical (memcmp) to forward() on that sequence alone with
//    the same pieces. The oracle is the single-sequence path, whose own correctness test_model_parity checks against
//    transformers.
//  - checkpoint/restore: back to a point (the start, inside a QSA block, on a block boundary, the end), then a new
//    continuation gives bit-identical logits to a fresh sequence fed the whole prefix at once.
//  - errors: bad entries, stale or foreign checkpoints; a failed call changes nothing.
// Models: the transformers fixtures in tests/data (qwen4exp, qwen35moe, qwen3next) and the synth "tiny" preset.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "convert/convert.h"
#include "core/dtype.h"
#include "core/error.h"
#include "model/model.h"
#include "test_util.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

// The model file of a test parameter, made once per process; "" when its fixture is absent.
std::string model_path(const std::string& name) {
    static std::map<std::string, std::string> cache;
    if (auto it = cache.find(name); it != cache.end()) return it->second;
    const fs::path dir = strata::testing::process_temp_dir().path();
    std::string out;
    if (name.rfind("synth-", 0) == 0) {
        out = (dir / (name + ".gguf")).string();
        synth_model({.preset = name.substr(6), .out_path = out, .seed = 7});
    } else if (const fs::path hf = fs::path(STRATA_TEST_DATA) / name / "hf"; fs::exists(hf / "config.json")) {
        out = (dir / (name + ".gguf")).string();
        convert_hf_to_gguf({.hf_dir = hf.string(),
                            .out_path = out,
                            .out_type = DType::F32,
                            .vocab_placeholder = !fs::exists(hf / "tokenizer.json")});
    }
    cache[name] = out;
    return out;
}

std::vector<int32_t> base_prompt(const std::string& name, int64_t n_vocab) {
    std::vector<int32_t> ids;
    std::ifstream f(fs::path(STRATA_TEST_DATA) / name / "prompt.txt");
    int64_t v;
    while (f >> v) ids.push_back(static_cast<int32_t>(v));
    if (ids.empty())  // synth: any ids in range
        for (int32_t i = 0; i < 40; ++i) ids.push_back(static_cast<int32_t>((i * 37 + 11) % n_vocab));
    return ids;
}

// A different prompt of length n made from the base one (rotated, shifted ids).
std::vector<int32_t> variant(const std::vector<int32_t>& base, size_t n, int shift, int64_t n_vocab) {
    std::vector<int32_t> out;
    for (size_t i = 0; i < n; ++i)
        out.push_back(static_cast<int32_t>((base[(i + static_cast<size_t>(shift)) % base.size()] + shift) % n_vocab));
    return out;
}

int32_t argmax(const float* x, int64_t n) {
    return static_cast<int32_t>(std::max_element(x, x + n) - x);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// One call's worth of one sequence: its tokens, whether only the last row's logits are wanted, what came back.
struct Step {
    std::vector<int32_t> tokens;
    bool last_only = false;
    std::vector<float> logits;
};

// Feeds `steps` to a fresh sequence one forward() at a time and returns each step's logits.
std::vector<std::vector<float>> run_alone(const Model& m, const std::vector<Step>& steps, int64_t capacity) {
    auto seq = m.new_sequence(capacity);
    const size_t V = static_cast<size_t>(m.info().n_vocab);
    std::vector<std::vector<float>> out;
    for (const Step& s : steps) {
        std::vector<float> logits(s.last_only ? V : s.tokens.size() * V);
        m.forward(*seq, s.tokens, logits, s.last_only);
        out.push_back(std::move(logits));
    }
    return out;
}

class BatchCheckpoint : public ::testing::TestWithParam<std::string> {
  protected:
    void SetUp() override {
        path_ = model_path(GetParam());
        if (path_.empty()) GTEST_SKIP() << "fixture tests/data/" << GetParam() << " is missing";
        model_ = load_model(path_, {.n_threads = 3});
        V_ = model_->info().n_vocab;
        base_ = base_prompt(GetParam(), V_);
    }

    // Sequences with prompts of different lengths go through rounds of batched calls: each round a sequence still
    // in its prompt feeds the next piece (sizes cycle through `pieces`), then it decodes one greedy token per round.
    // Some rounds leave a sequence out; `order` permutes the entries each round. Returns every sequence's steps.
    std::vector<std::vector<Step>> run_batched(const std::vector<std::vector<int32_t>>& prompts, int n_rounds,
                                               const std::vector<size_t>& pieces, int order_seed) {
        const size_t n = prompts.size();
        std::vector<std::unique_ptr<SequenceState>> seqs;
        for (size_t i = 0; i < n; ++i) seqs.push_back(model_->new_sequence(kCapacity));
        std::vector<std::vector<Step>> steps(n);
        std::vector<size_t> fed(n, 0);
        std::vector<int32_t> next(n, -1);
        for (int round = 0; round < n_rounds; ++round) {
            std::vector<size_t> members;
            for (size_t i = 0; i < n; ++i)
                if ((round + static_cast<int>(i)) % 5 != 4) members.push_back(i);  // now and then one sits out
            // A permutation that changes from round to round.
            std::rotate(members.begin(), members.begin() + (round * order_seed) % std::max<size_t>(members.size(), 1),
                        members.end());
            if ((round + order_seed) % 2) std::reverse(members.begin(), members.end());

            std::vector<Step*> current;
            for (size_t i : members) {
                Step s;
                if (fed[i] < prompts[i].size()) {
                    const size_t piece = pieces[(static_cast<size_t>(round) + i) % pieces.size()];
                    const size_t take = std::min(piece, prompts[i].size() - fed[i]);
                    s.tokens.assign(prompts[i].begin() + static_cast<std::ptrdiff_t>(fed[i]),
                                    prompts[i].begin() + static_cast<std::ptrdiff_t>(fed[i] + take));
                    fed[i] += take;
                    s.last_only = (round + static_cast<int>(i)) % 3 == 0;
                } else {
                    s.tokens = {next[i]};
                    s.last_only = (round % 2) == 0;
                }
                s.logits.resize(static_cast<size_t>(s.last_only ? V_ : static_cast<int64_t>(s.tokens.size()) * V_));
                steps[i].push_back(std::move(s));
                current.push_back(&steps[i].back());
            }
            std::vector<BatchEntry> batch;
            for (size_t k = 0; k < members.size(); ++k)
                batch.push_back({.seq = seqs[members[k]].get(),
                                 .tokens = current[k]->tokens,
                                 .logits = current[k]->logits,
                                 .last_only = current[k]->last_only});
            model_->forward_batch(batch);
            for (size_t k = 0; k < members.size(); ++k) {
                const Step& s = *current[k];
                next[members[k]] = argmax(s.logits.data() + s.logits.size() - static_cast<size_t>(V_), V_);
            }
        }
        return steps;
    }

    static constexpr int64_t kCapacity = 128;
    std::string path_;
    std::unique_ptr<Model> model_;
    int64_t V_ = 0;
    std::vector<int32_t> base_;
};

TEST_P(BatchCheckpoint, BatchedLogitsAreBitIdenticalToSingle) {
    const std::vector<std::vector<int32_t>> prompts = {variant(base_, 37, 0, V_), variant(base_, 9, 3, V_),
                                                       variant(base_, 22, 11, V_), variant(base_, 1, 5, V_)};
    const std::vector<std::vector<size_t>> piece_sets = {{5, 1, 7, 3}, {16, 2}, {1}};
    for (int order = 1; order <= 3; ++order) {
        const auto steps = run_batched(prompts, 14, piece_sets[static_cast<size_t>(order - 1)], order);
        for (size_t i = 0; i < prompts.size(); ++i) {
            ASSERT_FALSE(steps[i].empty());
            const auto alone = run_alone(*model_, steps[i], kCapacity);
            for (size_t r = 0; r < steps[i].size(); ++r)
                ASSERT_TRUE(same_bits(steps[i][r].logits, alone[r]))
                    << "order " << order << ", sequence " << i << ", its step " << r << " ("
                    << steps[i][r].tokens.size() << " tokens)";
        }
    }
}

TEST_P(BatchCheckpoint, EntriesWithoutTokensOrLogitsAreFine) {
    auto a = model_->new_sequence(16), b = model_->new_sequence(16);
    const std::vector<int32_t> t = variant(base_, 4, 1, V_);
    std::vector<float> la(static_cast<size_t>(V_));
    const BatchEntry batch[] = {{.seq = a.get(), .tokens = t, .logits = la, .last_only = true},
                                {.seq = b.get(), .tokens = {}, .logits = {}, .last_only = false}};
    model_->forward_batch(batch);
    EXPECT_EQ(a->n_past(), 4);
    EXPECT_EQ(b->n_past(), 0);
    const BatchEntry no_logits[] = {{.seq = b.get(), .tokens = t, .logits = {}, .last_only = false}};
    model_->forward_batch(no_logits);
    EXPECT_EQ(b->n_past(), 4);
    std::vector<float> lb(static_cast<size_t>(V_));
    auto c = model_->new_sequence(16);
    model_->forward(*c, t, lb, true);
    EXPECT_TRUE(same_bits(la, lb));
    model_->forward_batch({});
}

TEST_P(BatchCheckpoint, RestoreThenContinueEqualsFreshSequence) {
    const std::vector<int32_t> prefix = variant(base_, 30, 2, V_);
    auto seq = model_->new_sequence(kCapacity);
    // Checkpoints at 0, inside a QSA block (ratio 4: 5, 13), on a block boundary (16) and at the end (30).
    const std::vector<int64_t> points = {0, 5, 13, 16, 30};
    std::vector<std::unique_ptr<SequenceCheckpoint>> cps;
    int64_t pos = 0;
    for (int64_t p : points) {
        if (p > pos) {
            model_->forward(*seq, std::span<const int32_t>(prefix.data() + pos, static_cast<size_t>(p - pos)), {});
            pos = p;
        }
        cps.push_back(model_->checkpoint(*seq));
        EXPECT_EQ(cps.back()->n_past(), p);
        EXPECT_GT(cps.back()->memory_bytes(), 0u);
        EXPECT_LT(cps.back()->memory_bytes(), seq->memory_bytes()) << "a checkpoint holds no KV cells";
    }
    // Go on past the last checkpoint with something else, then come back to each point, newest first (restoring an
    // earlier point keeps the older checkpoints valid).
    const std::vector<int32_t> detour = variant(base_, 11, 7, V_);
    model_->forward(*seq, detour, {});
    for (size_t k = points.size(); k-- > 0;) {
        const int64_t p = points[k];
        model_->restore(*seq, *cps[k]);
        ASSERT_EQ(seq->n_past(), p);
        const std::vector<int32_t> cont = variant(base_, 9, static_cast<int>(k) + 13, V_);
        std::vector<float> got(cont.size() * static_cast<size_t>(V_));
        // The continuation in two pieces, one a single token.
        const size_t split = 1 + k % 3;
        model_->forward(*seq, std::span<const int32_t>(cont.data(), split), std::span<float>(got.data(), split * V_));
        model_->forward(*seq, std::span<const int32_t>(cont.data() + split, cont.size() - split),
                        std::span<float>(got.data() + split * V_, (cont.size() - split) * V_));

        auto fresh = model_->new_sequence(kCapacity);
        std::vector<int32_t> all(prefix.begin(), prefix.begin() + p);
        all.insert(all.end(), cont.begin(), cont.end());
        std::vector<float> full(all.size() * static_cast<size_t>(V_));
        model_->forward(*fresh, all, full);
        const std::vector<float> want(full.begin() + p * V_, full.end());
        ASSERT_TRUE(same_bits(got, want)) << "restored to " << p;
    }

    // The sequence is now back at 0 plus a continuation: the checkpoints above 0 are stale (test below). A new
    // checkpoint after a restore, then restored and continued inside a batch with another sequence.
    seq->reset();
    model_->forward(*seq, std::span<const int32_t>(prefix.data(), 13), {});
    auto at13 = model_->checkpoint(*seq);
    model_->forward(*seq, detour, {});
    model_->restore(*seq, *at13);
    const std::vector<int32_t> y = variant(base_, 6, 21, V_), z = variant(base_, 5, 22, V_);
    model_->forward(*seq, y, {});
    auto mid = model_->checkpoint(*seq);
    model_->forward(*seq, z, {});
    model_->restore(*seq, *mid);
    auto other = model_->new_sequence(kCapacity);
    const std::vector<int32_t> other_tokens = variant(base_, 12, 4, V_);
    std::vector<float> got(z.size() * static_cast<size_t>(V_)), other_logits(static_cast<size_t>(V_));
    const std::vector<int32_t> z2 = variant(base_, 5, 23, V_);
    const BatchEntry batch[] = {{.seq = other.get(), .tokens = other_tokens, .logits = other_logits, .last_only = true},
                                {.seq = seq.get(), .tokens = z2, .logits = got, .last_only = false}};
    model_->forward_batch(batch);
    std::vector<int32_t> all(prefix.begin(), prefix.begin() + 13);
    all.insert(all.end(), y.begin(), y.end());
    all.insert(all.end(), z2.begin(), z2.end());
    auto fresh = model_->new_sequence(kCapacity);
    std::vector<float> full(all.size() * static_cast<size_t>(V_));
    model_->forward(*fresh, all, full);
    EXPECT_TRUE(same_bits(got, std::vector<float>(full.end() - static_cast<std::ptrdiff_t>(z2.size() * V_), full.end())));
}

TEST_P(BatchCheckpoint, BadBatchesThrowAndChangeNothing) {
    using strata::testing::expect_error;
    auto a = model_->new_sequence(20), b = model_->new_sequence(20);
    const std::vector<int32_t> t = variant(base_, 6, 1, V_), u = variant(base_, 6, 9, V_);
    std::vector<float> la(static_cast<size_t>(V_)), lb(static_cast<size_t>(V_));
    const std::vector<int32_t> bad = {0, static_cast<int32_t>(V_)}, negative = {-1};
    const std::vector<int32_t> long_tokens(21, 1);
    std::vector<float> small(static_cast<size_t>(V_) - 1);
    auto foreign_model = load_model(path_, {.n_threads = 1});
    auto foreign = foreign_model->new_sequence(20);

    auto attempt = [&](const BatchEntry& second, const std::string& what) {
        const BatchEntry batch[] = {{.seq = a.get(), .tokens = t, .logits = la, .last_only = true}, second};
        expect_error([&] { model_->forward_batch(batch); }, what);
    };
    attempt({.seq = nullptr, .tokens = u, .logits = lb, .last_only = true}, "no sequence");
    attempt({.seq = a.get(), .tokens = u, .logits = lb, .last_only = true}, "appear once");
    attempt({.seq = b.get(), .tokens = bad, .logits = {}, .last_only = false}, "out of range");
    attempt({.seq = b.get(), .tokens = negative, .logits = {}, .last_only = false}, "out of range");
    attempt({.seq = b.get(), .tokens = long_tokens, .logits = {}, .last_only = false}, "do not fit");
    attempt({.seq = b.get(), .tokens = u, .logits = small, .last_only = true}, "logits buffer");
    attempt({.seq = foreign.get(), .tokens = u, .logits = lb, .last_only = true}, "not created by this model");
    EXPECT_EQ(a->n_past(), 0);
    EXPECT_EQ(b->n_past(), 0);

    // Nothing moved: the same batch now succeeds and matches two fresh single runs.
    const BatchEntry ok[] = {{.seq = a.get(), .tokens = t, .logits = la, .last_only = true},
                             {.seq = b.get(), .tokens = u, .logits = lb, .last_only = true}};
    model_->forward_batch(ok);
    std::vector<float> ra(static_cast<size_t>(V_)), rb(static_cast<size_t>(V_));
    auto fa = model_->new_sequence(20), fb = model_->new_sequence(20);
    model_->forward(*fa, t, ra, true);
    model_->forward(*fb, u, rb, true);
    EXPECT_TRUE(same_bits(la, ra));
    EXPECT_TRUE(same_bits(lb, rb));
}

TEST_P(BatchCheckpoint, StaleOrForeignCheckpointsAreRefused) {
    using strata::testing::expect_error;
    const std::vector<int32_t> p = variant(base_, 20, 3, V_);
    auto seq = model_->new_sequence(64), other = model_->new_sequence(64);
    model_->forward(*seq, std::span<const int32_t>(p.data(), 8), {});
    auto at8 = model_->checkpoint(*seq);
    model_->forward(*seq, std::span<const int32_t>(p.data() + 8, 8), {});
    auto at16 = model_->checkpoint(*seq);

    expect_error([&] { model_->restore(*other, *at8); }, "another sequence");
    auto foreign_model = load_model(path_, {.n_threads = 1});
    auto foreign = foreign_model->new_sequence(64);
    expect_error([&] { foreign_model->restore(*foreign, *at8); }, "another model");
    expect_error([&] { foreign_model->restore(*seq, *at8); }, "not created by this model");
    expect_error([&] { (void)foreign_model->checkpoint(*seq); }, "not created by this model");

    // Back to 8 and on with other tokens: the checkpoint at 16 is ahead, and after going past 16 again, stale.
    model_->restore(*seq, *at8);
    expect_error([&] { model_->restore(*seq, *at16); }, "ahead");
    const std::vector<int32_t> q = variant(base_, 10, 5, V_);
    model_->forward(*seq, q, {});
    expect_error([&] { model_->restore(*seq, *at16); }, "rolled back");
    // The checkpoint at 8 is still good: restoring it again gives what a fresh sequence gives.
    model_->restore(*seq, *at8);
    std::vector<float> got(static_cast<size_t>(V_)), want(static_cast<size_t>(V_));
    model_->forward(*seq, q, got, true);
    auto fresh = model_->new_sequence(64);
    std::vector<int32_t> all(p.begin(), p.begin() + 8);
    all.insert(all.end(), q.begin(), q.end());
    model_->forward(*fresh, all, want, true);
    EXPECT_TRUE(same_bits(got, want));

    // A reset makes every earlier checkpoint stale, even one at 0.
    auto at0 = model_->checkpoint(*other);
    other->reset();
    expect_error([&] { model_->restore(*other, *at0); }, "reset");
    seq->reset();
    model_->forward(*seq, std::span<const int32_t>(p.data(), 10), {});
    expect_error([&] { model_->restore(*seq, *at8); }, "reset");
    EXPECT_EQ(seq->n_past(), 10);
}

std::vector<std::string> models() {
    return {"qwen4exp", "qwen35moe", "qwen3next", "synth-tiny"};
}

INSTANTIATE_TEST_SUITE_P(Models, BatchCheckpoint, ::testing::ValuesIn(models()), [](const auto& p) {
    std::string n = p.param;
    std::replace(n.begin(), n.end(), '-', '_');
    return n;
});

}  // namespace
