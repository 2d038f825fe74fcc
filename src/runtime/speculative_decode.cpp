#include "runtime/speculative_decode.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "core/error.h"

namespace strata {

namespace {

int32_t argmax(const float* row, int64_t n) {
    return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

SpeculativeStats& SpeculativeStats::operator+=(const SpeculativeStats& o) {
    rounds += o.rounds;
    drafted += o.drafted;
    accepted += o.accepted;
    refeeds += o.refeeds;
    commits += o.commits;
    emitted += o.emitted;
    mtp_passes += o.mtp_passes;
    mtp_retired = mtp_retired || o.mtp_retired;
    no_checkpoint = no_checkpoint || o.no_checkpoint;
    for (size_t d = 0; d < drafted_by.size(); ++d) {
        drafted_by[d] += o.drafted_by[d];
        accepted_by[d] += o.accepted_by[d];
        rounds_by[d] += o.rounds_by[d];
    }
    return *this;
}

void speculative_prefill(const Model& model, SequenceState& seq, MtpDrafter* mtp, std::span<const int32_t> prompt,
                         std::span<float> logits, int64_t chunk) {
    if (prompt.empty()) return;
    if (chunk <= 0) throw Error("speculative_prefill: the chunk size must be positive");
    if (mtp && mtp->retired()) mtp = nullptr;
    if (mtp && mtp->observed() != seq.n_past())
        throw Error("speculative_prefill: the MTP drafter has seen " + std::to_string(mtp->observed()) +
                    " tokens, the sequence holds " + std::to_string(seq.n_past()));
    std::vector<float> residual;
    for (size_t start = 0; start < prompt.size(); start += static_cast<size_t>(chunk)) {
        const std::span<const int32_t> part = prompt.subspan(start, std::min(prompt.size() - start, size_t(chunk)));
        const bool last = start + part.size() == prompt.size();
        const std::span<float> out = last ? logits : std::span<float>();
        if (mtp) {
            residual.resize(part.size() * static_cast<size_t>(mtp->width()));
            model.forward_with_residual(seq, part, out, residual, /*last_only=*/true);
            mtp->observe(part, residual, /*build_now=*/true);
        } else {
            model.forward(seq, part, out, /*last_only=*/true);
        }
    }
}

RoundDrafts draft_round(SpeculationPolicy& policy, MtpDrafter* mtp, std::span<const int32_t> history, int room,
                        const SpeculativeOptions& o) {
    RoundDrafts r;
    if (mtp && mtp->retired()) mtp = nullptr;
    if (room <= 0 || history.empty()) return r;
    PromptLookupOptions lookup = o.lookup;
    lookup.max_draft = room;
    if (o.prompt_lookup) r.lookup = prompt_lookup_draft(history, lookup);
    if (o.adaptive)
        r.plan = policy.plan(static_cast<int>(r.lookup.size()));
    else
        r.plan = {r.lookup.empty() && mtp ? Drafter::Mtp : Drafter::PromptLookup, room};
    if (r.plan.k > 0 && r.plan.drafter == Drafter::PromptLookup) {
        r.tokens.assign(r.lookup.begin(), r.lookup.begin() + std::min<size_t>(r.lookup.size(), size_t(r.plan.k)));
    } else if (r.plan.k > 0 && r.plan.drafter == Drafter::Mtp && mtp) {
        // A long backlog of cells (rounds that drafted by lookup) is built first, untimed: the policy prices a
        // draft pass, and the backlog is work owed whether or not this round drafts.
        if (const int64_t backlog = mtp->queued(); backlog > 8) {
            const auto build_start = std::chrono::steady_clock::now();
            mtp->build();
            policy.record_cell_cost(backlog, seconds_since(build_start));
        }
        const int64_t passes = mtp->passes();
        const auto start = std::chrono::steady_clock::now();
        r.tokens = mtp->draft(history.back(), std::min(r.plan.k, room), o.mtp_min_p).tokens;
        r.mtp_passes = mtp->passes() - passes;
        policy.record_draft_cost(static_cast<int>(r.mtp_passes), seconds_since(start));
    }
    r.plan.k = static_cast<int>(r.tokens.size());
    return r;
}

void judge_round(SpeculationPolicy& policy, const RoundDrafts& r, int accepted, std::optional<int32_t> following) {
    const int k = static_cast<int>(r.tokens.size());
    accepted = std::clamp(accepted, 0, k);
    // Without the target's next token only the accepted positions are known.
    if (k > 0 && r.plan.drafter == Drafter::Mtp) policy.record_round(Drafter::Mtp, following ? k : accepted, accepted);
    // Prompt lookup's whole proposal is judged against what the round found out, whichever drafter ran: the
    // accepted drafts and the target's next token. Free measurements of positions not drafted (also on plain
    // rounds), so its acceptance at longer windows is known before the policy tries them.
    if (r.lookup.empty()) return;
    const int judged = std::min<int>(static_cast<int>(r.lookup.size()), accepted + (following ? 1 : 0));
    int agree = 0;
    while (agree < judged &&
           r.lookup[static_cast<size_t>(agree)] == (agree < accepted ? r.tokens[static_cast<size_t>(agree)] : *following))
        ++agree;
    if (judged > 0) policy.record_round(Drafter::PromptLookup, judged, agree);
}

bool retire_mtp_if_unpaid(SpeculationPolicy& policy, MtpDrafter& mtp) {
    if (mtp.retired() || policy.mtp_may_pay()) return false;
    // Even drafts always accepted would not pay for the MTP passes and cells here: stop keeping it.
    mtp.retire();
    policy.retire_mtp();
    return true;
}

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
    MtpDrafter* mtp = o.mtp && !o.mtp->retired() ? o.mtp : nullptr;
    if (mtp && mtp->observed() != seq.n_past())
        throw Error("speculative decoding: the MTP drafter has seen " + std::to_string(mtp->observed()) +
                    " tokens, the sequence holds " + std::to_string(seq.n_past()) +
                    " (feed the prompt with "
                    "speculative_prefill)");
    const int max_draft = std::clamp(o.max_draft, 0, SpeculationPolicy::kMaxDraft);
    std::optional<SpeculationPolicy> own;
    SpeculationPolicy& policy = o.policy ? *o.policy : own.emplace(max_draft, mtp != nullptr);
    if (!mtp) policy.retire_mtp();
    SpeculativeStats stats;
    std::vector<float> rows(static_cast<size_t>((max_draft + 1) * V));
    const size_t W = mtp ? static_cast<size_t>(mtp->width()) : 0;
    std::vector<float> residual((static_cast<size_t>(max_draft) + 1) * W);
    int64_t produced = 0;
    int32_t next = pick(row(logits.data()), static_cast<int64_t>(history.size()));  // the pick after the fed tokens
    while (produced < n) {
        // `next` is the target's own token: always emitted.
        ++produced;
        ++stats.emitted;
        if (!emit(next) || produced == n) break;
        history.push_back(next);
        const int room = static_cast<int>(std::min<int64_t>(max_draft, n - produced));
        RoundDrafts round = draft_round(policy, stats.no_checkpoint ? nullptr : mtp, history,
                                        stats.no_checkpoint ? 0 : room, o);
        const DraftPlan plan = round.plan;
        std::vector<int32_t>& draft = round.tokens;
        stats.mtp_passes += round.mtp_passes;
        std::unique_ptr<SequenceCheckpoint> before;
        if (!draft.empty()) {
            try {
                before = model.checkpoint(seq);
            } catch (const Error&) {
                // No way back from a rejected draft (the state's copy did not fit): plain decoding from here.
                stats.no_checkpoint = true;
                draft.clear();
            }
        }
        std::vector<int32_t> window{next};
        window.insert(window.end(), draft.begin(), draft.end());
        const int k = static_cast<int>(draft.size());
        const auto start = std::chrono::steady_clock::now();
        const BatchEntry entry{.seq = &seq,
                               .tokens = window,
                               .logits = std::span<float>(rows.data(), static_cast<size_t>((k + 1) * V)),
                               .residual = mtp ? std::span<float>(residual) : std::span<float>(),
                               .window = k > 0};
        model.forward_batch({&entry, 1});
        policy.record_cost(k + 1, seconds_since(start));
        ++stats.rounds;
        // Accept drafts while each equals the target's pick after the tokens before it.
        int accepted = 0;
        // Row i holds the logits before the token at position base + i (base: where `next` sits).
        const int64_t base = static_cast<int64_t>(history.size()) - 1;
        while (accepted < k &&
               pick(row(rows.data() + accepted * V), base + 1 + accepted) == draft[static_cast<size_t>(accepted)])
            ++accepted;
        const float* after = rows.data() + accepted * V;  // the logits after the accepted prefix
        const int32_t following = pick(row(after), base + 1 + accepted);
        if (k > 0) {
            const auto d = static_cast<size_t>(plan.drafter);
            ++stats.rounds_by[d];
            stats.drafted_by[d] += k;
            stats.accepted_by[d] += accepted;
        }
        // Clipped to what ran: a checkpoint that failed leaves an empty draft.
        round.plan.k = k;
        judge_round(policy, round, accepted, following);
        stats.drafted += k;
        stats.accepted += accepted;
        if (accepted < k) {
            // The sequence holds rejected drafts: keep the accepted prefix's state from the window's recorded inputs
            // (a commit), or go back to before the round and feed the prefix again (the same logits: batching does not
            // change them).
            if (model.commit(seq, *before, accepted + 1)) {
                ++stats.commits;
                policy.record_commit();
            } else {
                model.restore(seq, *before);
                const std::span<const int32_t> keep(window.data(), static_cast<size_t>(accepted + 1));
                model.forward(seq, keep, std::span<float>(rows.data(), static_cast<size_t>((accepted + 1) * V)));
                ++stats.rounds;
                ++stats.refeeds;
            }
        }
        // The trunk keeps `next` and the accepted drafts: the MTP layer's cells follow (their residual rows are the
        // window pass's, which the rejected rows after them did not touch).
        if (mtp) mtp->observe(std::span<const int32_t>(window.data(), static_cast<size_t>(accepted + 1)), residual);
        if (mtp && o.adaptive && retire_mtp_if_unpaid(policy, *mtp)) {
            mtp = nullptr;
            stats.mtp_retired = true;
        }
        bool stop = false;
        for (int i = 0; i < accepted && !stop; ++i) {
            ++produced;
            ++stats.emitted;
            history.push_back(draft[static_cast<size_t>(i)]);
            stop = !emit(draft[static_cast<size_t>(i)]) || produced == n;
        }
        if (stop) break;
        next = following;
    }
    for (int w = 1; w <= max_draft + 1; ++w) stats.window_cost[static_cast<size_t>(w)] = policy.cost(w);
    stats.draft_pass_cost = policy.draft_pass_cost();
    return stats;
}

}  // namespace strata
