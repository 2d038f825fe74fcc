// Sequence checkpoints of the CUDA trunk (the CPU trunk's model/checkpoint.cpp, same contract): the parts of a
// sequence that later tokens overwrite, copied on the device into a slot: each GDN block's recurrent state and conv
// history, each attention block's cache length, each PLE block's token and conv history; on the host n_past and the
// PLE history of rows read from the file. KV cells, raw indexer keys and pooled keys need no copy (cells below n_past
// are append-only, and pooled key b depends only on the cells of block b, pooled again when the block completes).
// The copies of one slot are captured once as a graph each way (Flash-Next: ~90 copies, 113 MB of GDN state, one
// launch), and a slot a checkpoint gives back is kept for the next: a speculation round takes a checkpoint each time.
#include <algorithm>
#include <cstdint>
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

}  // namespace strata::cuda_model
