// When a sequence checkpoint may still be restored (the CPU trunk's model/checkpoint.cpp and the CUDA trunk's
// model/cuda/checkpoint_cuda.cpp): while the cells below its n_past are untouched. A reset makes every earlier
// checkpoint stale; a restore to an earlier point is logged, since the tokens fed after it overwrite the cells above
// it, so a checkpoint above that point can no longer be restored.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace strata {

class RollbackLog {
  public:
    // What a checkpoint records of its sequence when taken.
    struct Stamp {
        uint64_t sequence = 0;
        uint64_t generation = 0;
        size_t rollbacks_seen = 0;
        int64_t n_past = 0;
    };
    RollbackLog();  // a sequence id unique in the process (unlike an address)

    uint64_t id() const { return id_; }
    void reset() {
        ++generation_;
        rollbacks_.clear();
    }
    Stamp stamp(int64_t n_past) const { return {id_, generation_, rollbacks_.size(), n_past}; }
    // Throws Error naming why a checkpoint stamped `cp` cannot be restored into this sequence, which holds n_past
    // tokens (another sequence's, taken before a reset, ahead of it, or above a later rollback); else logs the
    // rollback to cp.n_past.
    void restore(const Stamp& cp, int64_t n_past);
    size_t bytes() const { return rollbacks_.capacity() * sizeof(int64_t); }

  private:
    uint64_t id_;
    uint64_t generation_ = 0;
    std::vector<int64_t> rollbacks_;  // positions restored to since the last reset, in order
};

}  // namespace strata
