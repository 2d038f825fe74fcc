#include "runtime/speculative_decode.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "runtime/speculation.h"

namespace strata {

namespace {

int32_t argmax(const float* row, int64_t n) {
    return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

}  // namespace

SpeculativeStats greedy_speculative_decode(const Model& model, SequenceState& seq, std::span<float> logits,
                                           std::vector<int32_t> history, int64_t n, const SpeculativeOptions& o,
                                           const std::function<bool(int32_t)>& emit) {
    return speculative_decode(
        model, seq, logits, std::move(history), n, o,
        [](std::span<const float> row, int64_t) { return argmax(row.data(), static_cast<int64_t>(row.size())); }, emit);
}

SpeculativeStats speculative_decode(const Model& model, SequenceState& seq, std::span<float> logits,
                                    std::vector<int32_t> history, int64_t n, const SpeculativeOptions& o,
                                    const TokenPicker& pick, const std::function<bool(int32_t)>& emit) {
    const int64_t V = model.info().n_vocab;
    const auto row = [&](const float* r) { return std::span<const float>(r, static_cast<size_t>(V)); };
    if (static_cast<int64_t>(logits.size()) < V) throw Error("speculative decoding: the logits need n_vocab floats");
    const int max_draft = std::clamp(o.max_draft, 0, SpeculationPolicy::kMaxDraft);
    SpeculationPolicy policy(max_draft);
    SpeculativeStats stats;
    std::vector<float> rows(static_cast<size_t>((max_draft + 1) * V));
    int64_t produced = 0;
    int32_t next = pick(row(logits.data()), static_cast<int64_t>(history.size()));  // the pick after the fed tokens
    while (produced < n) {
        // `next` is the target's own token: always emitted.
        ++produced;
        if (!emit(next) || produced == n) break;
        history.push_back(next);
        PromptLookupOptions lookup = o.lookup;
        lookup.max_draft = std::min<int>(policy.choose(), static_cast<int>(n - produced));
        const std::vector<int32_t> draft =
            lookup.max_draft > 0 ? prompt_lookup_draft(history, lookup) : std::vector<int32_t>{};
        std::vector<int32_t> window{next};
        window.insert(window.end(), draft.begin(), draft.end());
        const int k = static_cast<int>(draft.size());
        std::unique_ptr<SequenceCheckpoint> before;
        if (k > 0) before = model.checkpoint(seq);
        const auto start = std::chrono::steady_clock::now();
        model.forward(seq, window, std::span<float>(rows.data(), static_cast<size_t>((k + 1) * V)));
        policy.record_cost(k + 1, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        ++stats.rounds;
        // Accept drafts while each equals the target's pick after the tokens before it.
        int accepted = 0;
        // Row i holds the logits before the token at position base + i (base: where `next` sits).
        const int64_t base = static_cast<int64_t>(history.size()) - 1;
        while (accepted < k &&
               pick(row(rows.data() + accepted * V), base + 1 + accepted) == draft[static_cast<size_t>(accepted)])
            ++accepted;
        if (k > 0) policy.record_round(k, accepted);
        stats.drafted += k;
        stats.accepted += accepted;
        bool stop = false;
        for (int i = 0; i < accepted && !stop; ++i) {
            ++produced;
            history.push_back(draft[static_cast<size_t>(i)]);
            stop = !emit(draft[static_cast<size_t>(i)]) || produced == n;
        }
        if (stop) break;
        const float* after = rows.data() + accepted * V;  // the logits after the accepted prefix
        if (accepted < k) {
            // The sequence holds rejected drafts: back to before the round, then the accepted prefix again (the same
            // logits: batching does not change them).
            model.restore(seq, *before);
            const std::span<const int32_t> keep(window.data(), static_cast<size_t>(accepted + 1));
            model.forward(seq, keep, std::span<float>(rows.data(), static_cast<size_t>((accepted + 1) * V)));
            ++stats.rounds;
            ++stats.refeeds;
        }
        next = pick(row(after), base + 1 + accepted);
    }
    return stats;
}

}  // namespace strata
