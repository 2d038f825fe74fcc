// The two gated-delta kernels (GdnRecurrence::Column and ::Shuffle) timed against each other on one window of
// synthetic GDN inputs, with a bit-for-bit check of what they produce (issue 8, seed 001; `strata bench
// gdn-recurrence`). Like cuda_backend.h this header needs no CUDA headers.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_backend.h"

namespace strata::cuda {

// The window: flash-next's GDN shape by default (48 value heads over 16 key heads of 128 x 128, tiled).
struct GdnRecurrenceBenchOptions {
    int64_t tokens = 8192;
    int64_t heads = 48;
    int64_t key_heads = 16;
    int64_t dk = 128;
    int64_t dv = 128;
    bool tiled_value_heads = true;
    int repeats = 5;  // timed calls per kernel, after one warm-up call each
    uint64_t seed = 1;
};

struct GdnRecurrenceBenchResult {
    int64_t tokens = 0;
    double column_ms = 0, shuffle_ms = 0;  // median time of one call over the whole window (CUDA events)
    int64_t compared = 0;                  // values compared: final state, FP32 outputs, FP16 outputs
    int64_t mismatches = 0;                // of those, the ones whose bits differ between the kernels
};

// Inputs as the model feeds them (q and k L2-normalised per head, q scaled by 1/sqrt(dk), g in (-1.5, -0.01), beta in
// (0, 1)) from a fixed-seed generator. One call of each kernel from the same state writes the state, FP32 and FP16
// outputs that are compared; then the kernels are timed in alternation (FP32 outputs only, as the model calls them).
// Throws Error on a shape gated_delta refuses or when the device memory does not suffice.
GdnRecurrenceBenchResult time_gdn_recurrences(Context& ctx, const GdnRecurrenceBenchOptions& options);

}  // namespace strata::cuda
