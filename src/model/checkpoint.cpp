// Sequence checkpoints of the hybrid models. A checkpoint copies the part of a sequence that later tokens overwrite:
// GDN recurrent state and conv history, PLE token and conv history, the count of pooled QSA keys, n_past. The KV
// cells and raw indexer keys below n_past are append-only (later tokens write only above), and pooled key b depends
// only on cells of block b, so they need no copy: restore() rewinds the counters and the recurrent part, and the next
// tokens overwrite the cells above. Hyper-connections carry no state across tokens.
#include <algorithm>
#include <atomic>
#include <string>

#include "core/error.h"
#include "model/hybrid.h"

namespace strata {

namespace {

struct LayerCheckpoint {
    GdnState gdn;
    PleState ple;
    int64_t n_pooled = 0;
};

class HybridCheckpoint final : public SequenceCheckpoint {
  public:
    size_t memory_bytes() const override {
        size_t total = layers.capacity() * sizeof(LayerCheckpoint);
        for (const LayerCheckpoint& l : layers) total += l.gdn.bytes() + l.ple.bytes();
        return total;
    }

    int64_t n_past() const override { return stamp.n_past; }
    const void* owner = nullptr;  // the model
    RollbackLog::Stamp stamp;
    std::vector<LayerCheckpoint> layers;
};

// Copies into dst's buffers (same sizes: same model and sequence), so a restore does not allocate.
template <class T>
void copy_into(std::vector<T>& dst, const std::vector<T>& src) {
    if (dst.size() == src.size())
        std::copy(src.begin(), src.end(), dst.begin());
    else
        dst = src;
}

}  // namespace

RollbackLog::RollbackLog() {
    static std::atomic<uint64_t> next_id{1};
    id_ = next_id.fetch_add(1);
}

void RollbackLog::restore(const Stamp& cp, int64_t n_past) {
    if (cp.sequence != id_)
        throw Error("restore: the checkpoint was taken from another sequence; a checkpoint restores only its own");
    if (cp.generation != generation_) throw Error("restore: the sequence was reset since the checkpoint was taken");
    if (cp.n_past > n_past)
        throw Error("restore: the checkpoint is at token " + std::to_string(cp.n_past) +
                    ", ahead of the sequence, which holds " + std::to_string(n_past));
    // A restore since then to a point below this checkpoint let later tokens overwrite cells it relies on.
    for (size_t i = cp.rollbacks_seen; i < rollbacks_.size(); ++i)
        if (rollbacks_[i] < cp.n_past)
            throw Error("restore: the sequence was rolled back to token " + std::to_string(rollbacks_[i]) +
                        " after this checkpoint (at token " + std::to_string(cp.n_past) +
                        ") was taken, so its cache no longer holds the checkpoint's tokens");
    if (cp.n_past < n_past) rollbacks_.push_back(cp.n_past);
}

std::unique_ptr<SequenceCheckpoint> HybridModel::checkpoint(const SequenceState& state) const {
    const auto* seq = dynamic_cast<const HybridSequence*>(&state);
    if (!seq || seq->owner() != this) throw Error("checkpoint: the sequence was not created by this model");
    auto cp = std::make_unique<HybridCheckpoint>();
    cp->owner = this;
    cp->stamp = seq->rollback.stamp(seq->n_past());
    cp->layers.resize(seq->layers.size());
    for (size_t il = 0; il < seq->layers.size(); ++il) {
        const LayerState& l = seq->layers[il];
        cp->layers[il] = {.gdn = l.gdn, .ple = l.ple, .n_pooled = l.attention.n_pooled};
    }
    return cp;
}

void HybridModel::restore(SequenceState& state, const SequenceCheckpoint& checkpoint) const {
    auto* seq = dynamic_cast<HybridSequence*>(&state);
    if (!seq || seq->owner() != this) throw Error("restore: the sequence was not created by this model");
    const auto* cp = dynamic_cast<const HybridCheckpoint*>(&checkpoint);
    if (!cp || cp->owner != this) throw Error("restore: the checkpoint was taken by another model");
    STRATA_ASSERT(cp->layers.size() == seq->layers.size());
    seq->rollback.restore(cp->stamp, seq->n_past());
    for (size_t il = 0; il < seq->layers.size(); ++il) {
        LayerState& l = seq->layers[il];
        const LayerCheckpoint& c = cp->layers[il];
        copy_into(l.gdn.conv_history, c.gdn.conv_history);
        copy_into(l.gdn.recurrent, c.gdn.recurrent);
        copy_into(l.ple.tokens, c.ple.tokens);
        copy_into(l.ple.conv_history, c.ple.conv_history);
        l.attention.n_pooled = c.n_pooled;
    }
    seq->n_past_ = cp->stamp.n_past;
    seq->window_count = 0;
}

// Restores the recurrent part to `before` and replays the kept tokens' recorded inputs on it: the conv histories,
// the delta rule and the n-gram history. KV cells and raw indexer keys of the kept tokens are the window's; the count
// of pooled keys stays the checkpoint's, so the next pass pools the blocks completed since from those raw keys.
bool HybridModel::commit(SequenceState& state, const SequenceCheckpoint& before, int64_t n_keep) const {
    auto* seq = dynamic_cast<HybridSequence*>(&state);
    if (!seq || seq->owner() != this) throw Error("commit: the sequence was not created by this model");
    const auto* cp = dynamic_cast<const HybridCheckpoint*>(&before);
    if (!cp || cp->owner != this) throw Error("commit: the checkpoint was taken by another model");
    const int64_t pos0 = seq->window_pos0, count = seq->window_count;
    if (count == 0 || cp->stamp.n_past != pos0 || seq->n_past() != pos0 + count)
        throw Error("commit: the sequence's last pass was not a verification window right after this checkpoint");
    if (n_keep < 0 || n_keep > count)
        throw Error("commit: " + std::to_string(n_keep) + " tokens to keep of a window of " + std::to_string(count));
    const auto has_ple = [](const LayerState& l) { return !l.ple.tokens.empty() || !l.ple.conv_history.empty(); };
    // A block that did not record the window (a trunk without window logs): restore and re-feed instead.
    for (const LayerState& l : seq->layers)
        if ((!l.gdn.recurrent.empty() && l.gdn_window.count != count) || (has_ple(l) && l.ple_window.count != count))
            return false;
    restore(state, before);
    for (LayerState& l : seq->layers) {
        if (!l.gdn.recurrent.empty()) gdn_commit(l.gdn, l.gdn_window, n_keep);
        if (has_ple(l)) ple_commit(l.ple, l.ple_window, n_keep);
    }
    seq->n_past_ = pos0 + n_keep;
    return true;
}

}  // namespace strata
