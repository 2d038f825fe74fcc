// Sequence checkpoints of the CUDA trunk (the CPU trunk's model/checkpoint.cpp, same contract): the parts of a
// sequence that later tokens overwrite, copied on the device into a slot: each GDN block's recurrent state and conv
// history, each attention block's cache length, each PLE block's token and conv history; on the host n_past and the
// PLE history of rows read from the file. KV cells, raw indexer keys and pooled keys need no copy (cells below n_past
// are append-only, and pooled key b depends only on the cells of block b, pooled again when the block completes).
// The copies of one slot are captured once as a graph each way (Flash-Next: ~90 copies, 113 MB of GDN state, one
// launch), and a slot a checkpoint gives back is kept for the next: a speculation round takes a checkpoint each time.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/cuda/hybrid_cuda.h"

namespace strata::cuda_model {

// One device copy of a sequence's recurrent state, and the graphs that copy it in and out.
struct CheckpointSlot {
    cuda::DeviceBuffer state;
    cuda::Graph save, load;
};

struct CheckpointPool {
    std::mutex mutex;
    std::vector<std::unique_ptr<CheckpointSlot>> spare;
};

namespace {

class CudaCheckpoint final : public SequenceCheckpoint {
  public:
    ~CudaCheckpoint() override {
        if (!pool || !slot) return;
        std::lock_guard<std::mutex> lock(pool->mutex);
        pool->spare.push_back(std::move(slot));
    }
    int64_t n_past() const override { return stamp.n_past; }
    size_t memory_bytes() const override { return slot->state.size() + ple_history.size() * sizeof(int32_t); }

    const void* owner = nullptr;  // the model
    RollbackLog::Stamp stamp;
    std::vector<int32_t> ple_history;  // CudaSequence::ple_history
    std::unique_ptr<CheckpointSlot> slot;
    std::shared_ptr<CheckpointPool> pool;
};

// The device buffers a checkpoint copies, in order.
std::vector<const cuda::DeviceBuffer*> state_buffers(const CudaSequence& s) {
    std::vector<const cuda::DeviceBuffer*> out;
    for (const LayerDeviceState& l : s.layers)
        for (const cuda::DeviceBuffer* b :
             {&l.conv_history, &l.recurrent, &l.kv_length, &l.ple_tokens, &l.ple_conv_history})
            if (b->size()) out.push_back(b);
    return out;
}

size_t rounded(size_t bytes) {
    return (bytes + 255) / 256 * 256;
}

}  // namespace

std::unique_ptr<SequenceCheckpoint> CudaHybridModel::checkpoint(const SequenceState& state) const {
    CudaSequence& s = own(state, "checkpoint");
    std::lock_guard<std::mutex> lock(mutex_);
    if (!s.checkpoint_pool) s.checkpoint_pool = std::make_shared<CheckpointPool>();
    auto cp = std::make_unique<CudaCheckpoint>();
    cp->owner = this;
    cp->stamp = s.rollback.stamp(s.n_past_);
    cp->ple_history = s.ple_history;
    cp->pool = s.checkpoint_pool;
    {
        std::lock_guard<std::mutex> spare_lock(cp->pool->mutex);
        if (!cp->pool->spare.empty()) {
            cp->slot = std::move(cp->pool->spare.back());
            cp->pool->spare.pop_back();
        }
    }
    const std::vector<const cuda::DeviceBuffer*> buffers = state_buffers(s);
    if (!cp->slot) {
        size_t bytes = 0;
        for (const cuda::DeviceBuffer* b : buffers) bytes += rounded(b->size());
        cp->slot = std::make_unique<CheckpointSlot>();
        try {
            cp->slot->state = ctx_->allocate(std::max<size_t>(bytes, 1), "checkpoints");
        } catch (const Error& e) {
            cp->slot.reset();
            cp->pool.reset();  // nothing to give back
            throw Error(std::string("checkpoint: no device memory for a copy of the sequence's state (") + e.what() +
                        "); raise --vram-budget");
        }
        // Each way's copies, captured once: the slot and the sequence's buffers keep their addresses.
        auto copies = [&](bool in) {
            auto* at = static_cast<uint8_t*>(cp->slot->state.data());
            for (const cuda::DeviceBuffer* b : buffers) {
                if (in)
                    ctx_->copy_on_device(at, b->data(), b->size());
                else
                    ctx_->copy_on_device(b->data(), at, b->size());
                at += rounded(b->size());
            }
        };
        cp->slot->save.capture(*ctx_, [&] { copies(true); });
        cp->slot->load.capture(*ctx_, [&] { copies(false); });
    }
    // Queued on the stream: the next window, queued after it, runs once the copy is taken.
    cp->slot->save.replay(*ctx_);
    return cp;
}

void CudaHybridModel::restore(SequenceState& state, const SequenceCheckpoint& checkpoint) const {
    CudaSequence& s = own(state, "restore");
    const auto* cp = dynamic_cast<const CudaCheckpoint*>(&checkpoint);
    if (!cp || cp->owner != this) throw Error("restore: the checkpoint was taken by another model");
    std::lock_guard<std::mutex> lock(mutex_);
    s.rollback.restore(cp->stamp, s.n_past_);
    // Waited for, so that what the caller times next (bench --window-costs) does not include the copy.
    cp->slot->load.replay(*ctx_);
    ctx_->synchronize();
    s.ple_history = cp->ple_history;
    s.n_past_ = cp->stamp.n_past;
}

// Each GDN block: kWindow rows of the conv input and of q, k, v after it, and the decay and write strength per value
// head; each PLE block: kWindow rows of its conv input (runtime/memory_plan.cpp books the same).
bool CudaHybridModel::allocate_records(CudaSequence& s) const {
    const GdnShape& g = gdn_;
    const size_t rows = static_cast<size_t>(kWindow);
    try {
        size_t bytes = 0;
        for (size_t il = 0; il < layout_.size(); ++il) {
            LayerDeviceState& l = s.layers[il];
            if (layout_[il].recurrent) {
                l.window_raw = ctx_->allocate(rows * size_t(g.conv_dim()) * 4, "speculation window records");
                l.window_conv = ctx_->allocate(rows * size_t(g.conv_dim()) * 4, "speculation window records");
                l.window_alpha = ctx_->allocate(rows * size_t(g.n_v_heads) * 4, "speculation window records");
                l.window_beta = ctx_->allocate(rows * size_t(g.n_v_heads) * 4, "speculation window records");
            }
            if (layout_[il].has_ple)
                l.window_ple =
                    ctx_->allocate(rows * size_t(ple_.n_streams * ple_.n_embd) * 4, "speculation window records");
            for (const cuda::DeviceBuffer* b :
                 {&l.window_raw, &l.window_conv, &l.window_alpha, &l.window_beta, &l.window_ple})
                bytes += b->size();
        }
        s.bytes_ += bytes;
    } catch (const Error& e) {
        for (LayerDeviceState& l : s.layers)
            for (cuda::DeviceBuffer* b :
                 {&l.window_raw, &l.window_conv, &l.window_alpha, &l.window_beta, &l.window_ple})
                *b = cuda::DeviceBuffer();
        std::fprintf(stderr,
                     "strata: speculation re-feeds accepted drafts after a rejection (no device memory "
                     "to keep a window's inputs: %s)\n",
                     e.what());
        records_refused_ = true;
        return false;
    }
    // The captured windows write to the shared buffers: capture them again with the records.
    for (cuda::Graph& graph : s.graphs) graph.clear();
    s.records = true;
    return true;
}

void CudaHybridModel::forward_batch(std::span<const BatchEntry> batch) const {
    for (const BatchEntry& entry : batch) {
        if (!entry.window || entry.seq == nullptr) continue;
        CudaSequence& s = own(*entry.seq, "forward_batch");
        std::lock_guard<std::mutex> lock(mutex_);
        if (!s.records && !records_refused_) allocate_records(s);
    }
    Model::forward_batch(batch);
}

void CudaHybridModel::advance_history(float* history, int64_t rows, const float* in, int64_t n, int64_t width) const {
    const size_t row = static_cast<size_t>(width) * sizeof(float);
    if (n >= rows) {
        ctx_->copy_on_device(history, in + (n - rows) * width, static_cast<size_t>(rows) * row);
        return;
    }
    // The rows that stay move up by n, n rows a copy, oldest first (one copy of them all could overlap itself).
    for (int64_t r = 0; r < rows - n; r += n)
        ctx_->copy_on_device(history + r * width, history + (r + n) * width,
                             static_cast<size_t>(std::min(n, rows - n - r)) * row);
    ctx_->copy_on_device(history + (rows - n) * width, in, static_cast<size_t>(n) * row);
}

bool CudaHybridModel::commit(SequenceState& state, const SequenceCheckpoint& before, int64_t n_keep) const {
    CudaSequence& s = own(state, "commit");
    const auto* cp = dynamic_cast<const CudaCheckpoint*>(&before);
    if (!cp || cp->owner != this) throw Error("commit: the checkpoint was taken by another model");
    if (!s.records) return false;  // restore and re-feed
    const int64_t pos0 = s.window_pos0, count = s.window_count;
    if (count == 0 || cp->stamp.n_past != pos0 || s.n_past_ != pos0 + count)
        throw Error("commit: the sequence's last pass was not a verification window right after this checkpoint");
    if (n_keep < 0 || n_keep > count)
        throw Error("commit: " + std::to_string(n_keep) + " tokens to keep of a window of " + std::to_string(count));
    restore(state, before);
    std::lock_guard<std::mutex> lock(mutex_);
    s.window_count = 0;
    if (n_keep == 0) return true;
    const GdnShape& g = gdn_;
    const int64_t CD = g.conv_dim();
    const int32_t length = static_cast<int32_t>(pos0 + n_keep);
    for (LayerDeviceState& l : s.layers) {
        if (l.window_raw.size()) {
            // The conv history takes the recorded input rows, and the delta rule runs on their q, k, v, decay and
            // strength with the window's kernel, token by token as in the window.
            advance_history(l.conv_history.as<float>(), g.conv_kernel - 1, l.window_raw.as<float>(), n_keep, CD);
            delta_rule(l, l.window_conv.as<float>(), l.window_alpha.as<float>(), l.window_beta.as<float>(), n_keep);
        }
        // The kept tokens' KV cells were written by the window; the cells past them are overwritten later.
        if (l.kv_length.size()) ctx_->copy_to_device(l.kv_length.data(), &length, sizeof(length));
    }
    commit_ple(s, std::span<const int32_t>(s.window_tokens).first(static_cast<size_t>(n_keep)));
    s.n_past_ = pos0 + n_keep;
    return true;
}

}  // namespace strata::cuda_model
