// forward() and forward_batch() of the hybrid models: one code path. The rows of all entries go through the trunk
// together (batch_rows.h), so every weight is read once per pass; each sequence's conv, recurrence, attention and
// n-gram history run on its own state. Every op computes a row alone in a fixed order, so an entry's logits are
// bit-identical to what it gets alone.
#include <algorithm>
#include <string>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "model/hybrid.h"

namespace strata {

void HybridModel::forward(SequenceState& seq, std::span<const int32_t> tokens, std::span<float> logits,
                          bool last_only) const {
    const BatchEntry entry{.seq = &seq, .tokens = tokens, .logits = logits, .last_only = last_only};
    run({&entry, 1}, /*single=*/true);
}

void HybridModel::forward_batch(std::span<const BatchEntry> batch) const {
    run(batch, /*single=*/false);
}

void HybridModel::forward_with_residual(SequenceState& seq, std::span<const int32_t> tokens, std::span<float> logits,
                                        std::span<float> residual, bool last_only) const {
    const int64_t width = draft_residual_width();
    if (width == 0) throw Error("forward_with_residual: this model has no MTP draft layer");
    if (std::ssize(residual) < std::ssize(tokens) * width)
        throw Error("forward_with_residual: the residual buffer holds " + std::to_string(residual.size()) +
                    " floats, needs " + std::to_string(std::ssize(tokens) * width));
    const BatchEntry entry{.seq = &seq, .tokens = tokens, .logits = logits, .last_only = last_only, .residual = residual};
    run({&entry, 1}, /*single=*/true);
}

std::span<HybridSequence* const> HybridModel::validate(std::span<const BatchEntry> batch, bool single) const {
    const int64_t V = info_.n_vocab;
    HybridSequence** seqs = scratch_.take<HybridSequence*>(static_cast<int64_t>(batch.size()));
    for (size_t i = 0; i < batch.size(); ++i) {
        const BatchEntry& e = batch[i];
        // Messages are built only on failure: no string work on the decode path.
        auto fail = [&](const std::string& what, bool name_forward = true) {
            if (single) throw Error(name_forward ? "forward: " + what : what);
            throw Error("forward_batch: entry " + std::to_string(i) + ": " + what);
        };
        if (e.seq == nullptr) fail("no sequence given");
        auto* seq = dynamic_cast<HybridSequence*>(e.seq);
        if (!seq || seq->owner() != this) fail("the sequence was not created by this model");
        for (size_t j = 0; j < i; ++j)
            if (seqs[j] == seq)
                fail("the same sequence is already entry " + std::to_string(j) + "; a sequence may appear once per batch");
        seqs[i] = seq;
        const int64_t T = static_cast<int64_t>(e.tokens.size());
        for (int32_t id : e.tokens)
            if (id < 0 || id >= V)
                fail("token id " + std::to_string(id) + " is out of range (vocabulary of " + std::to_string(V) + ")",
                     false);
        if (seq->n_past() + T > seq->capacity())
            fail("the sequence holds " + std::to_string(seq->n_past()) + " tokens and can take " +
                     std::to_string(seq->capacity()) + "; " + std::to_string(T) + " more do not fit",
                 false);
        if (!e.logits.empty()) {
            const int64_t need = e.last_only ? V : T * V;
            if (static_cast<int64_t>(e.logits.size()) < need)
                fail("the logits buffer holds " + std::to_string(e.logits.size()) + " floats, needs " +
                     std::to_string(need));
        }
        if (!e.residual.empty()) {
            const int64_t width = draft_residual_width();
            if (width == 0) fail("this model has no MTP draft layer (no trunk residual to hand out)");
            if (std::ssize(e.residual) < T * width)
                fail("the residual buffer holds " + std::to_string(e.residual.size()) + " floats, needs " +
                     std::to_string(T * width));
        }
    }
    return {seqs, batch.size()};
}

void HybridModel::run(std::span<const BatchEntry> batch, bool single) const {
    std::lock_guard lock(mutex_);
    scratch_.reset();
    const std::span<HybridSequence* const> all = validate(batch, single);

    // Entries with tokens, in batch order, and their rows.
    const int64_t n_entries = static_cast<int64_t>(batch.size());
    HybridSequence** seqs = scratch_.take<HybridSequence*>(n_entries);
    SequenceRows* rows = scratch_.take<SequenceRows>(n_entries);
    int64_t n_seq = 0, n_rows = 0;
    for (int64_t i = 0; i < n_entries; ++i) {
        const int64_t T = static_cast<int64_t>(batch[static_cast<size_t>(i)].tokens.size());
        rows[i] = {.begin = n_rows, .count = T, .pos0 = all[static_cast<size_t>(i)]->n_past()};
        if (T == 0) continue;
        seqs[n_seq++] = all[static_cast<size_t>(i)];
        n_rows += T;
    }
    if (n_rows == 0) return;
    // A window's sequence records its inputs (the trunk's blocks that can fill their window logs); any other pass
    // leaves nothing to commit.
    for (int64_t i = 0; i < n_entries; ++i) {
        if (rows[i].count == 0) continue;
        HybridSequence& seq = *all[static_cast<size_t>(i)];
        const bool window = batch[static_cast<size_t>(i)].window;
        seq.window_pos0 = seq.n_past();
        seq.window_count = window ? rows[i].count : 0;
        if (window)
            for (LayerState& l : seq.layers) l.gdn_window.count = l.ple_window.count = 0;
    }
    int32_t* tokens = scratch_.take<int32_t>(n_rows);
    SequenceRows* active = scratch_.take<SequenceRows>(n_seq);
    for (int64_t i = 0, k = 0; i < n_entries; ++i) {
        if (rows[i].count == 0) continue;
        const std::span<const int32_t> t = batch[static_cast<size_t>(i)].tokens;
        std::copy(t.begin(), t.end(), tokens + rows[i].begin);
        active[k++] = rows[i];
    }

    // Residual rows for the entries that want them: the trunk writes every row's, each entry takes its own.
    const int64_t width = draft_residual_width();
    const bool single_residual = n_entries == 1 && !batch[0].residual.empty();
    float* residual_out = nullptr;
    if (single_residual) {
        residual_out = batch[0].residual.data();
    } else if (std::any_of(batch.begin(), batch.end(), [](const BatchEntry& e) { return !e.residual.empty(); })) {
        residual_out = scratch_.take<float>(n_rows * width);
    }
    float* hidden = scratch_.take<float>(n_rows * info_.n_embd);
    trunk({.sequences = {seqs, static_cast<size_t>(n_seq)},
           .rows = {active, static_cast<size_t>(n_seq)},
           .tokens = {tokens, static_cast<size_t>(n_rows)},
           .scratch = scratch_,
           .residual_out = residual_out},
          hidden);
    for (int64_t i = 0; i < n_seq; ++i) seqs[i]->n_past_ += active[i].count;
    if (residual_out && !single_residual)
        for (int64_t i = 0; i < n_entries; ++i)
            if (const BatchEntry& e = batch[static_cast<size_t>(i)]; !e.residual.empty() && rows[i].count > 0)
                std::copy_n(residual_out + rows[i].begin * width, rows[i].count * width, e.residual.data());
    head(batch, {rows, static_cast<size_t>(n_entries)}, hidden);
}

// The output head. Entries that want one row (last_only or a single token) share one pass over the head's weights;
// an entry that wants the logits of several rows gets its own, straight into its buffer (so the scratch never holds
// a prompt's worth of logits).
void HybridModel::head(std::span<const BatchEntry> batch, std::span<const SequenceRows> rows,
                       const float* hidden) const {
    const int64_t H = info_.n_embd, V = info_.n_vocab;
    int64_t n_single = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
        const BatchEntry& e = batch[i];
        if (e.logits.empty() || rows[i].count == 0) continue;
        if (e.last_only || rows[i].count == 1) {
            ++n_single;
        } else {
            cpu::matmul({.w = output_,
                         .x = hidden + rows[i].begin * H,
                         .y = e.logits.data(),
                         .n_tokens = rows[i].count,
                         .pool = &pool_});
        }
    }
    if (n_single == 0) return;
    auto last_row = [&](size_t i) { return hidden + (rows[i].begin + rows[i].count - 1) * H; };
    if (n_single == 1) {
        for (size_t i = 0; i < batch.size(); ++i) {
            const BatchEntry& e = batch[i];
            if (e.logits.empty() || rows[i].count == 0 || !(e.last_only || rows[i].count == 1)) continue;
            cpu::matmul({.w = output_, .x = last_row(i), .y = e.logits.data(), .n_tokens = 1, .pool = &pool_});
        }
        return;
    }
    float* x = scratch_.take<float>(n_single * H);
    float* y = scratch_.take<float>(n_single * V);
    int64_t k = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
        const BatchEntry& e = batch[i];
        if (e.logits.empty() || rows[i].count == 0 || !(e.last_only || rows[i].count == 1)) continue;
        std::copy_n(last_row(i), H, x + k++ * H);
    }
    cpu::matmul({.w = output_, .x = x, .y = y, .n_tokens = n_single, .pool = &pool_});
    k = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
        const BatchEntry& e = batch[i];
        if (e.logits.empty() || rows[i].count == 0 || !(e.last_only || rows[i].count == 1)) continue;
        std::copy_n(y + k++ * V, V, e.logits.data());
    }
}

}  // namespace strata
