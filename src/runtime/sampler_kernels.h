// The sampler's passes over a whole row of logits, vectorized (vec_math.h) and dispatched at run time to AVX2 where
// the CPU has it. Both widths give bit-identical results.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace strata::sampler_kernels {

// Tests only: run the baseline (4-wide) kernels even where AVX2 is present, to check that both widths agree.
void use_baseline_for_testing(bool baseline);
// "avx2" or "baseline": the kernels in use.
const char* kernel_width_name();

// Largest value of data[0, n); NaN anywhere sets *saw_nan.
float max_value(const float* data, size_t n, bool* saw_nan);
// The first index i with data[i] == value, n when none.
size_t find_first(const float* data, size_t n, float value);
// The first index i >= begin with data[i] > value, n when none.
size_t find_greater(const float* data, size_t begin, size_t n, float value);

// weight[i] = e^(logits[i] - max_logit); the histogram of max_logit - logits[i] in buckets of 1/per_logit (the last
// bucket takes everything further down) gets each token's weight in mass[] and, when count is not null, its count;
// bucket[i] records the bucket of token i. n_buckets <= 65536.
struct Histogram {
    double* mass;
    int64_t* count;    // may be null
    uint16_t* bucket;  // the bucket of each token (n entries)
    float* scratch;    // 2 * n_buckets floats
    int n_buckets;
    float per_logit;
};
void weigh_and_bucket(const float* logits, size_t n, float max_logit, float* weight, const Histogram& histogram);

// Appends to `out` every i with bucket[i] == which, in increasing order.
void find_bucket(const uint16_t* bucket, size_t n, uint16_t which, std::vector<int32_t>& out);

// Final weights: for kept tokens (logit > cut_logit, or == cut_logit and id <= cut_last_id; and
// logit - max_logit >= floor_logit) e^((logit - max_logit) * inv_temperature), or weight[i] as it is when
// unit_temperature; 0 for the rest. block_sum[b] gets the sum over tokens [64 b, 64 b + 64) in a fixed order (lane j%4
// accumulators, then (l0 + l1) + (l2 + l3)). Returns the sum of the block sums (in order, in double).
struct KeepRule {
    float max_logit;
    float cut_logit;
    int32_t cut_last_id;
    float floor_logit;
    float inv_temperature;
    bool unit_temperature;
};
constexpr size_t kBlock = 64;
double keep_and_weigh(const float* logits, size_t n, const KeepRule& rule, float* weight, double* block_sum);

}  // namespace strata::sampler_kernels
