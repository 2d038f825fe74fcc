#include "model/scratch.h"

#include <algorithm>

namespace strata {

namespace {
constexpr size_t kAlign = 64;
constexpr size_t kMinBlock = size_t{1} << 20;
size_t round_up(size_t n) {
    return (n + kAlign - 1) / kAlign * kAlign;
}
}  // namespace

void* Scratch::take_bytes(size_t n) {
    n = round_up(std::max<size_t>(n, 1));
    while (block_ < blocks_.size() && used_ + n > blocks_[block_].size) {
        ++block_;
        used_ = 0;
    }
    if (block_ == blocks_.size()) {
        // operator new[] of std::byte is aligned to __STDCPP_DEFAULT_NEW_ALIGNMENT__ only: over-allocate and align.
        const size_t size = std::max({n, kMinBlock, taken_});
        blocks_.push_back({std::make_unique<std::byte[]>(size + kAlign), size});
        used_ = 0;
    }
    Block& b = blocks_[block_];
    std::byte* base = b.data.get();
    const size_t misalign = reinterpret_cast<uintptr_t>(base) % kAlign;
    std::byte* p = base + (misalign ? kAlign - misalign : 0) + used_;
    used_ += n;
    taken_ += n;
    return p;
}

void Scratch::reset() {
    if (blocks_.size() > 1) {
        size_t total = 0;
        for (const Block& b : blocks_) total += b.size;
        blocks_.clear();
        blocks_.push_back({std::make_unique<std::byte[]>(total + kAlign), total});
    }
    block_ = 0;
    used_ = 0;
    taken_ = 0;
}

size_t Scratch::capacity_bytes() const {
    size_t total = 0;
    for (const Block& b : blocks_) total += b.size + kAlign;
    return total;
}

}  // namespace strata
