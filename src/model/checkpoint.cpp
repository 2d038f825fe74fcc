// Sequence checkpoints of the hybrid models. A checkpoint copies the part of a sequence that later tokens overwrite:
// GDN recurrent state and conv history, PLE token and conv history, the count of pooled QSA keys, n_past. The KV
// cells and raw indexer keys below n_past are append-only (later tokens write only above), and pooled key b depends
// only on cells of block b, so they need no copy: restore() rewinds the counters and the recurrent part, and the next
// tokens overwrite the cells above. Hyper-connections carry no state across tokens.
#include <algorithm>
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
    int64_t n_past() const override { return n_past_; }
    size_t memory_bytes() const override {
        size_t total = layers.capacity() * sizeof(LayerCheckpoint);
        for (const LayerCheckpoint& l : layers) total += l.gdn.bytes() + l.ple.bytes();
        return total;
    }

    const void* owner = nullptr;  // the model
    uint64_t sequence_id = 0;
    uint64_t generation = 0;
    size_t rollbacks_seen = 0;  // entries of the sequence's rollback log when taken
    int64_t n_past_ = 0;
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

std::unique_ptr<SequenceCheckpoint> HybridModel::checkpoint(const SequenceState& state) const {
    const auto* seq = dynamic_cast<const HybridSequence*>(&state);
    if (!seq || seq->owner() != this) throw Error("checkpoint: the sequence was not created by this model");
    auto cp = std::make_unique<HybridCheckpoint>();
    cp->owner = this;
    cp->sequence_id = seq->id();
    cp->generation = seq->generation();
    cp->rollbacks_seen = seq->rollbacks().size();
    cp->n_past_ = seq->n_past();
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
    if (cp->sequence_id != seq->id())
        throw Error("restore: the checkpoint was taken from another sequence; a checkpoint restores only its own");
    if (cp->generation != seq->generation())
        throw Error("restore: the sequence was reset since the checkpoint was taken");
    if (cp->n_past_ > seq->n_past())
        throw Error("restore: the checkpoint is at token " + std::to_string(cp->n_past_) +
                    ", ahead of the sequence, which holds " + std::to_string(seq->n_past()));
    // A restore since then to a point below this checkpoint let later tokens overwrite cells it relies on.
    const std::vector<int64_t>& log = seq->rollbacks();
    for (size_t i = cp->rollbacks_seen; i < log.size(); ++i)
        if (log[i] < cp->n_past_)
            throw Error("restore: the sequence was rolled back to token " + std::to_string(log[i]) +
                        " after this checkpoint (at token " + std::to_string(cp->n_past_) +
                        ") was taken, so its cache no longer holds the checkpoint's tokens");
    STRATA_ASSERT(cp->layers.size() == seq->layers.size());

    if (cp->n_past_ < seq->n_past()) seq->log_rollback(cp->n_past_);
    for (size_t il = 0; il < seq->layers.size(); ++il) {
        LayerState& l = seq->layers[il];
        const LayerCheckpoint& c = cp->layers[il];
        copy_into(l.gdn.conv_history, c.gdn.conv_history);
        copy_into(l.gdn.recurrent, c.gdn.recurrent);
        copy_into(l.ple.tokens, c.ple.tokens);
        copy_into(l.ple.conv_history, c.ple.conv_history);
        l.attention.n_pooled = c.n_pooled;
    }
    seq->n_past_ = cp->n_past_;
}

}  // namespace strata
