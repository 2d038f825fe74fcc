// Working memory for one forward pass, reused from call to call so that the decode loop does not go to the heap: a
// bump allocator whose blocks stay alive until reset(), which rewinds it (and, after a pass that outgrew the first
// block, merges everything into one block of the size that pass needed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>


namespace strata {

class Scratch {
  public:
    // n uninitialised values, 64-byte aligned, valid until reset().
    template <class T>
    T* take(int64_t n) {
        static_assert(std::is_trivially_copyable_v<T>);
        return static_cast<T*>(take_bytes(static_cast<size_t>(n < 0 ? 0 : n) * sizeof(T)));
    }
    template <class T>
    T* take_zeroed(int64_t n) {
        T* p = take<T>(n);
        for (int64_t i = 0; i < n; ++i) p[i] = T{};
        return p;
    }
    void reset();
    size_t capacity_bytes() const;

    // What was taken after mark() is given back by rewind(mark): one block's buffers reuse the previous block's.
    struct Mark {
        size_t block, used, taken;
    };
    Mark mark() const { return {block_, used_, taken_}; }
    void rewind(const Mark& m) {
        block_ = m.block;
        used_ = m.used;
        taken_ = m.taken;
    }

  private:
    void* take_bytes(size_t n);
    struct Block {
        std::unique_ptr<std::byte[]> data;
        size_t size = 0;
    };
    std::vector<Block> blocks_;
    size_t block_ = 0;  // the block being filled
    size_t used_ = 0;   // bytes taken from it
    size_t taken_ = 0;  // bytes taken since reset, over all blocks
};

// Rewinds the scratch to where it was at construction.
class ScratchFrame {
  public:
    explicit ScratchFrame(Scratch& scratch) : scratch_(scratch), mark_(scratch.mark()) {}
    ~ScratchFrame() { scratch_.rewind(mark_); }
    ScratchFrame(const ScratchFrame&) = delete;
    ScratchFrame& operator=(const ScratchFrame&) = delete;

  private:
    Scratch& scratch_;
    Scratch::Mark mark_;
};

}  // namespace strata
