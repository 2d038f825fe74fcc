// How a batched pass lays out its sequences: every per-token buffer holds the rows of all sequences one after the
// other; sequence i owns rows [begin, begin + count), at positions pos0, pos0 + 1, ... of that sequence. Row-wise
// work (projections, norms, experts, the head) runs over all rows at once; what mixes tokens of one sequence (conv,
// recurrence, attention over the cache, n-gram history) runs per sequence on that sequence's own state.
#pragma once

#include <cstdint>

namespace strata {

struct SequenceRows {
    int64_t begin = 0;  // first row in the batch buffers
    int64_t count = 0;  // rows (tokens) of this sequence
    int64_t pos0 = 0;   // position of its first row (the tokens the sequence held before)
};

}  // namespace strata
