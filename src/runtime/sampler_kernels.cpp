#include "runtime/sampler_kernels.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>

#include "runtime/vec_math.h"

#pragma GCC diagnostic ignored "-Wpsabi"

namespace strata::sampler_kernels {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

template <int W>
[[gnu::always_inline]] inline float max_value_w(const float* data, size_t n, bool* saw_nan) {
    using F = typename vec::Lanes<W>::f;
    using I = typename vec::Lanes<W>::i;
    F m0 = vec::splat<W>(kNegInf), m1 = m0;
    I nan_mask = {};
    const size_t n_vec = n - n % (2 * W);
    for (size_t i = 0; i < n_vec; i += 2 * W) {
        const F a = vec::load<W>(data + i), b = vec::load<W>(data + i + W);
        nan_mask |= (a != a) | (b != b);
        m0 = a > m0 ? a : m0;
        m1 = b > m1 ? b : m1;
    }
    float m = kNegInf;
    bool nan = false;
    for (int k = 0; k < W; ++k) {
        nan = nan || nan_mask[k] != 0;
        m = m0[k] > m ? m0[k] : m;
        m = m1[k] > m ? m1[k] : m;
    }
    for (size_t j = n_vec; j < n; ++j) {
        nan = nan || data[j] != data[j];
        m = data[j] > m ? data[j] : m;
    }
    *saw_nan = nan;
    return m;
}

template <int W>
[[gnu::always_inline]] inline size_t find_first_w(const float* data, size_t n, float value) {
    using F = typename vec::Lanes<W>::f;
    using I = typename vec::Lanes<W>::i;
    const F v = vec::splat<W>(value);
    const size_t n_vec = n - n % (2 * W);
    size_t i = 0;
    for (; i < n_vec; i += 2 * W) {
        const I hit = (vec::load<W>(data + i) == v) | (vec::load<W>(data + i + W) == v);
        bool any = false;
        for (int k = 0; k < W; ++k) any = any || hit[k] != 0;
        if (any) break;
    }
    for (; i < n; ++i)
        if (data[i] == value) return i;
    return n;
}

template <int W>
[[gnu::always_inline]] inline size_t find_greater_w(const float* data, size_t begin, size_t n, float value) {
    using F = typename vec::Lanes<W>::f;
    using I = typename vec::Lanes<W>::i;
    const F v = vec::splat<W>(value);
    size_t i = begin;
    for (; i < n && i % W != 0; ++i)  // up to a multiple of W, so blocks line up whatever begin is
        if (data[i] > value) return i;
    for (; i + 2 * W <= n; i += 2 * W) {
        const I hit = (vec::load<W>(data + i) > v) | (vec::load<W>(data + i + W) > v);
        bool any = false;
        for (int k = 0; k < W; ++k) any = any || hit[k] != 0;
        if (any) break;
    }
    for (; i < n; ++i)
        if (data[i] > value) return i;
    return n;
}

template <int W>
[[gnu::always_inline]] inline void find_bucket_w(const uint16_t* bucket, size_t n, uint16_t which,
                                                 std::vector<int32_t>& out) {
    using U = typename vec::Lanes<W>::u16;
    using S = typename vec::Lanes<W>::s16;
    using Q = typename vec::Lanes<W>::u64;
    constexpr size_t kLanes = 2 * W;
    U target;
    for (size_t k = 0; k < kLanes; ++k) target[k] = which;
    const size_t n_vec = n - n % kLanes;
    for (size_t i = 0; i < n_vec; i += kLanes) {
        U v;
        std::memcpy(&v, bucket + i, sizeof(v));
        const S hit = v == target;
        Q q;
        std::memcpy(&q, &hit, sizeof(q));
        uint64_t any = 0;
        for (int k = 0; k < W / 2; ++k) any |= q[k];
        if (any == 0) continue;
        for (size_t k = 0; k < kLanes; ++k)
            if (bucket[i + k] == which) out.push_back(static_cast<int32_t>(i + k));
    }
    for (size_t i = n_vec; i < n; ++i)
        if (bucket[i] == which) out.push_back(static_cast<int32_t>(i));
}

template <int W>
[[gnu::always_inline]] inline void weigh_and_bucket_w(const float* logits, size_t n, float max_logit, float* weight,
                                                      const Histogram& h) {
    using F = typename vec::Lanes<W>::f;
    using I = typename vec::Lanes<W>::i;
    const F vmax = vec::splat<W>(max_logit);
    const F vscale = vec::splat<W>(h.per_logit);
    const F vlast = vec::splat<W>(static_cast<float>(h.n_buckets - 1));
    const size_t n_vec = n - n % W;
    for (size_t i = 0; i < n_vec; i += W) {
        const F x = vec::load<W>(logits + i) - vmax;
        const F e = vec::exp_nonpositive<W>(x);
        vec::store<W>(weight + i, e);
        F b = -x * vscale;
        b = b < vlast ? b : vlast;  // also catches +infinity (a banned token)
        const I bi = __builtin_convertvector(b, I);
        typedef uint16_t U __attribute__((vector_size(W * 2)));
        const U bu = __builtin_convertvector(bi, U);
        std::memcpy(h.bucket + i, &bu, sizeof(bu));
    }
    for (size_t j = n_vec; j < n; ++j) {
        const float e = vec::exp_nonpositive_scalar(logits[j] - max_logit);
        weight[j] = e;
        const float bf = std::min(-(logits[j] - max_logit) * h.per_logit, static_cast<float>(h.n_buckets - 1));
        const int b = static_cast<int>(bf);
        h.bucket[j] = static_cast<uint16_t>(b);
    }
    // The histogram from the stored arrays: a tight scalar loop (scatter has no vector form before AVX-512).
    // Two interleaved float histograms (even and odd tokens) keep neighbouring updates independent; they are added
    // in double at the end, in a fixed order.
    float* __restrict even = h.scratch;
    float* __restrict odd = h.scratch + h.n_buckets;
    std::fill(even, even + 2 * h.n_buckets, 0.0f);
    const uint16_t* __restrict bucket = h.bucket;
    size_t i = 0;
    for (; i + 2 <= n; i += 2) {
        even[bucket[i]] += weight[i];
        odd[bucket[i + 1]] += weight[i + 1];
    }
    if (i < n) even[bucket[i]] += weight[i];
    for (int b = 0; b < h.n_buckets; ++b) h.mass[b] = static_cast<double>(even[b]) + static_cast<double>(odd[b]);
    if (h.count) {
        int64_t* __restrict count = h.count;
        for (size_t j = 0; j < n; ++j) count[bucket[j]] += 1;
    }
}

template <int W>
[[gnu::always_inline]] inline double keep_and_weigh_w(const float* logits, size_t n, const KeepRule& rule,
                                                      float* weight, double* block_sum) {
    using F = typename vec::Lanes<W>::f;
    using I = typename vec::Lanes<W>::i;
    using F4 = vec::Lanes<4>::f;
    const F vmax = vec::splat<W>(rule.max_logit);
    const F vfloor = vec::splat<W>(rule.floor_logit);
    const F vinv_t = vec::splat<W>(rule.inv_temperature);
    const F vcut = vec::splat<W>(rule.cut_logit);
    I vcut_id, iota;
    for (int k = 0; k < W; ++k) {
        vcut_id[k] = rule.cut_last_id;
        iota[k] = k;
    }
    auto keep_scalar = [&](size_t i) {
        const float l = logits[i];
        const bool inside = l > rule.cut_logit || (l == rule.cut_logit && static_cast<int32_t>(i) <= rule.cut_last_id);
        if (!inside || !(l - rule.max_logit >= rule.floor_logit)) return 0.0f;
        return rule.unit_temperature ? weight[i]
                                     : vec::exp_nonpositive_scalar((l - rule.max_logit) * rule.inv_temperature);
    };
    double total = 0.0;
    const size_t n_blocks = (n + kBlock - 1) / kBlock;
    for (size_t block = 0; block < n_blocks; ++block) {
        const size_t begin = block * kBlock, end = std::min(n, begin + kBlock);
        F4 acc = {0.0f, 0.0f, 0.0f, 0.0f};
        size_t i = begin;
        if (end - begin == kBlock) {
            for (; i < end; i += W) {
                const F l = vec::load<W>(logits + i);
                const I ids = iota + static_cast<int32_t>(i);
                const I keep = ((l > vcut) | ((l == vcut) & (ids <= vcut_id))) & ((l - vmax) >= vfloor);
                F e = rule.unit_temperature ? vec::load<W>(weight + i) : vec::exp_nonpositive<W>((l - vmax) * vinv_t);
                e = keep ? e : vec::splat<W>(0.0f);
                vec::store<W>(weight + i, e);
                for (int half = 0; half < W / 4; ++half) {
                    F4 part;
                    std::memcpy(&part, reinterpret_cast<const char*>(&e) + 16 * half, sizeof(part));
                    acc += part;
                }
            }
        }
        for (; i < end; ++i) {  // the short last block: same lane order, one token at a time
            const float e = keep_scalar(i);
            weight[i] = e;
            acc[(i - begin) % 4] += e;
        }
        const float sum = (acc[0] + acc[1]) + (acc[2] + acc[3]);
        block_sum[block] = sum;
        total += sum;
    }
    return total;
}

#if defined(__x86_64__) && defined(__GNUC__)
#define STRATA_SAMPLER_AVX2 1
__attribute__((target("avx2"))) float max_value_avx2(const float* d, size_t n, bool* nan) {
    return max_value_w<8>(d, n, nan);
}
__attribute__((target("avx2"))) size_t find_first_avx2(const float* d, size_t n, float v) {
    return find_first_w<8>(d, n, v);
}
__attribute__((target("avx2"))) size_t find_greater_avx2(const float* d, size_t b, size_t n, float v) {
    return find_greater_w<8>(d, b, n, v);
}
__attribute__((target("avx2"))) void find_bucket_avx2(const uint16_t* b, size_t n, uint16_t w,
                                                      std::vector<int32_t>& out) {
    find_bucket_w<8>(b, n, w, out);
}
__attribute__((target("avx2"))) void weigh_and_bucket_avx2(const float* l, size_t n, float m, float* w,
                                                           const Histogram& h) {
    weigh_and_bucket_w<8>(l, n, m, w, h);
}
__attribute__((target("avx2"))) double keep_and_weigh_avx2(const float* l, size_t n, const KeepRule& r, float* w,
                                                           double* b) {
    return keep_and_weigh_w<8>(l, n, r, w, b);
}
std::atomic<bool> g_baseline_only{false};
bool has_avx2() {
    static const bool yes = __builtin_cpu_supports("avx2");
    return yes && !g_baseline_only.load(std::memory_order_relaxed);
}
#endif

}  // namespace

void use_baseline_for_testing(bool baseline) {
#ifdef STRATA_SAMPLER_AVX2
    g_baseline_only.store(baseline);
#else
    (void)baseline;
#endif
}

const char* kernel_width_name() {
#ifdef STRATA_SAMPLER_AVX2
    if (has_avx2()) return "avx2";
#endif
    return "baseline";
}

float max_value(const float* data, size_t n, bool* saw_nan) {
#ifdef STRATA_SAMPLER_AVX2
    if (has_avx2()) return max_value_avx2(data, n, saw_nan);
#endif
    return max_value_w<4>(data, n, saw_nan);
}

size_t find_first(const float* data, size_t n, float value) {
#ifdef STRATA_SAMPLER_AVX2
    if (has_avx2()) return find_first_avx2(data, n, value);
#endif
    return find_first_w<4>(data, n, value);
}

size_t find_greater(const float* data, size_t begin, size_t n, float value) {
#ifdef STRATA_SAMPLER_AVX2
    if (has_avx2()) return find_greater_avx2(data, begin, n, value);
#endif
    return find_greater_w<4>(data, begin, n, value);
}

void find_bucket(const uint16_t* bucket, size_t n, uint16_t which, std::vector<int32_t>& out) {
#ifdef STRATA_SAMPLER_AVX2
    if (has_avx2()) return find_bucket_avx2(bucket, n, which, out);
#endif
    find_bucket_w<4>(bucket, n, which, out);
}

void weigh_and_bucket(const float* logits, size_t n, float max_logit, float* weight, const Histogram& histogram) {
#ifdef STRATA_SAMPLER_AVX2
    if (has_avx2()) return weigh_and_bucket_avx2(logits, n, max_logit, weight, histogram);
#endif
    weigh_and_bucket_w<4>(logits, n, max_logit, weight, histogram);
}

double keep_and_weigh(const float* logits, size_t n, const KeepRule& rule, float* weight, double* block_sum) {
#ifdef STRATA_SAMPLER_AVX2
    if (has_avx2()) return keep_and_weigh_avx2(logits, n, rule, weight, block_sum);
#endif
    return keep_and_weigh_w<4>(logits, n, rule, weight, block_sum);
}

}  // namespace strata::sampler_kernels
