#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "core/error.h"
#include "runtime/sampler_kernels.h"

namespace strata {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// top-k up to this size goes through a bounded heap and an exact sort of the survivors; larger k (and no top-k) go
// through the logit histogram, which never sorts more than one bucket.
constexpr int32_t kSmallTopK = 1024;

// Histogram of l_max - l: 4096 buckets of 1/128 logit cover the top 32 logits (e^-32 ~ 1e-14 of the top token's
// weight); everything further down shares the last bucket.
constexpr int kBuckets = 4096;
constexpr float kBucketsPerLogit = 128.0f;

// (logit, id) in the order every truncation uses: larger logit first, ties to the lower id.
bool better(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// A prefix of that order, given by its last member: token (l, id) is inside when l > logit, or l == logit and
// id <= last_id. The default holds every token.
struct Cut {
    float logit = kNegInf;
    int32_t last_id = std::numeric_limits<int32_t>::max();
    bool holds(float l, int32_t id) const { return l > logit || (l == logit && id <= last_id); }
    bool tighter_than(const Cut& o) const { return logit > o.logit || (logit == o.logit && last_id < o.last_id); }
};

void check_param(bool ok, const std::string& message) {
    if (!ok) throw Error(message);
}

}  // namespace

int32_t argmax_lowest(std::span<const float> values) {
    bool saw_nan = false;
    const float m = sampler_kernels::max_value(values.data(), values.size(), &saw_nan);
    if (saw_nan || !(m > kNegInf)) return -1;
    for (size_t i = 0; i < values.size(); ++i)
        if (values[i] == m) return static_cast<int32_t>(i);
    return -1;
}

Sampler::Sampler(SamplingParams params, int64_t n_vocab) : params_(std::move(params)), n_vocab_(n_vocab) {
    const SamplingParams& p = params_;
    check_param(n_vocab > 0 && n_vocab <= std::numeric_limits<int32_t>::max(),
                "sampler: vocabulary size " + std::to_string(n_vocab) + " is out of range");
    check_param(std::isfinite(p.temperature) && p.temperature >= 0.0f,
                "temperature must be a finite number >= 0, got " + std::to_string(p.temperature));
    check_param(p.top_p > 0.0f && p.top_p <= 1.0f, "top-p must be in (0, 1], got " + std::to_string(p.top_p));
    check_param(p.min_p >= 0.0f && p.min_p <= 1.0f, "min-p must be in [0, 1], got " + std::to_string(p.min_p));
    check_param(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.0f,
                "repetition penalty must be > 0 (1 is off), got " + std::to_string(p.repetition_penalty));
    check_param(std::isfinite(p.presence_penalty),
                "presence penalty must be finite, got " + std::to_string(p.presence_penalty));
    check_param(std::isfinite(p.frequency_penalty),
                "frequency penalty must be finite, got " + std::to_string(p.frequency_penalty));
    check_param(p.penalty_last_n >= -1,
                "penalty window must be >= -1 (-1: all tokens), got " + std::to_string(p.penalty_last_n));
    for (const auto& [id, bias] : p.logit_bias) {
        check_param(id >= 0 && id < n_vocab, "logit bias names token " + std::to_string(id) +
                                                 ", outside the vocabulary of " + std::to_string(n_vocab));
        check_param(!std::isnan(bias) && bias != std::numeric_limits<float>::infinity(),
                    "logit bias of token " + std::to_string(id) + " must be a number or -inf (ban)");
    }
    rng_.seed(p.seed);
}

void Sampler::accept(int32_t token) {
    if (params_.penalty_last_n == 0) return;
    history_.push_back(token);
    if (params_.penalty_last_n > 0)
        while (history_.size() > static_cast<size_t>(params_.penalty_last_n)) history_.pop_front();
}

void Sampler::accept(std::span<const int32_t> tokens) {
    for (int32_t t : tokens) accept(t);
}

double Sampler::uniform01() {
    if (keyed_) {
        keyed_ = false;
        uint64_t z = key_;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        return static_cast<double>(z >> 11) * 0x1.0p-53;
    }
    return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

int32_t Sampler::sample_at(std::span<const float> logits, uint64_t position) {
    keyed_ = true;
    key_ = params_.seed ^ (position + 1) * 0x9E3779B97F4A7C15ull;
    const int32_t token = sample(logits);
    keyed_ = false;  // a greedy choice draws nothing
    return token;
}

void Sampler::apply_bias_and_penalties() {
    for (const auto& [id, bias] : params_.logit_bias) row_[id] += bias;

    const SamplingParams& p = params_;
    const bool any_penalty = p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
    if (!any_penalty || history_.empty()) return;
    window_.assign(history_.begin(), history_.end());
    std::sort(window_.begin(), window_.end());
    for (size_t i = 0; i < window_.size();) {
        size_t j = i;
        while (j < window_.size() && window_[j] == window_[i]) ++j;
        const int32_t id = window_[i];
        const auto count = static_cast<float>(j - i);
        i = j;
        if (id < 0 || id >= n_vocab_) continue;  // accepted ids come from the caller; ignore what cannot be indexed
        float& l = row_[id];
        l = l > 0.0f ? l / p.repetition_penalty : l * p.repetition_penalty;
        l -= p.presence_penalty + p.frequency_penalty * count;
    }
}

int32_t Sampler::sample(std::span<const float> logits) {
    if (static_cast<int64_t>(logits.size()) != n_vocab_)
        throw Error("sampler: got " + std::to_string(logits.size()) + " logits for a vocabulary of " +
                    std::to_string(n_vocab_));
    work_.resize(logits.size());
    std::memcpy(work_.data(), logits.data(), logits.size_bytes());
    return sample_in_place(work_);
}

int32_t Sampler::sample_in_place(std::span<float> logits) {
    if (static_cast<int64_t>(logits.size()) != n_vocab_)
        throw Error("sampler: got " + std::to_string(logits.size()) + " logits for a vocabulary of " +
                    std::to_string(n_vocab_));
    row_ = logits.data();
    apply_bias_and_penalties();

    bool saw_nan = false;
    const size_t n = logits.size();
    const float max_logit = sampler_kernels::max_value(row_, n, &saw_nan);
    if (saw_nan || !(max_logit > kNegInf) || max_logit == std::numeric_limits<float>::infinity())
        throw Error("the model produced non-finite logits (NaN, +inf or all -inf); cannot sample");

    if (params_.greedy || params_.temperature <= 0.0f)
        return static_cast<int32_t>(sampler_kernels::find_first(row_, n, max_logit));
    const bool small_top_k = params_.top_k > 0 && params_.top_k <= kSmallTopK && params_.top_k < n_vocab_;
    return small_top_k ? sample_top_k_small(max_logit) : sample_by_buckets(max_logit);
}

// top-k by a bounded heap whose root is the worst kept token, so the scan is one compare per token; the k survivors
// are then sorted and every later step is exact.
int32_t Sampler::sample_top_k_small(float max_logit) {
    const auto k = static_cast<size_t>(params_.top_k);
    auto& heap = candidates_;
    heap.clear();
    heap.reserve(k);
    const auto n = static_cast<int32_t>(n_vocab_);
    const auto n_vocab_size = static_cast<size_t>(n_vocab_);
    int32_t i = 0;
    const float* w = row_;
    for (; i < n && heap.size() < k; ++i) heap.emplace_back(w[i], i);
    std::make_heap(heap.begin(), heap.end(), better);
    float worst = heap.front().first;
    // Only a logit above the worst kept one enters (an equal one has a larger id, so it is worse); the vector scan
    // skips the rest.
    for (auto j = static_cast<size_t>(i); (j = sampler_kernels::find_greater(w, j, n_vocab_size, worst)) < n_vocab_size;
         ++j) {
        std::pop_heap(heap.begin(), heap.end(), better);
        heap.back() = {w[j], static_cast<int32_t>(j)};
        std::push_heap(heap.begin(), heap.end(), better);
        worst = heap.front().first;
    }
    std::sort(heap.begin(), heap.end(), better);

    // top-p on the softmax over the k survivors.
    size_t kept = heap.size();
    std::vector<double>& prob = probs_;
    prob.resize(kept);
    double total = 0.0;
    for (size_t j = 0; j < kept; ++j) total += prob[j] = std::exp(static_cast<double>(heap[j].first) - max_logit);
    if (params_.top_p < 1.0f) {
        const double target = static_cast<double>(params_.top_p) * total;
        double cumulative = 0.0;
        for (size_t j = 0; j < kept; ++j) {
            cumulative += prob[j];
            if (cumulative >= target) {
                kept = j + 1;
                break;
            }
        }
    }
    if (params_.min_p > 0.0f) {
        const float floor_logit = std::log(params_.min_p);
        while (kept > 1 && !(heap[kept - 1].first - max_logit >= floor_logit)) --kept;
    }

    // Temperature over the survivors, then one draw.
    const double inv_t = 1.0 / static_cast<double>(params_.temperature);
    double sum = 0.0;
    for (size_t j = 0; j < kept; ++j)
        sum += prob[j] = std::exp((static_cast<double>(heap[j].first) - max_logit) * inv_t);
    const double target = uniform01() * sum;
    double cumulative = 0.0;
    for (size_t j = 0; j < kept; ++j) {
        cumulative += prob[j];
        if (target < cumulative) return heap[j].second;
    }
    return heap[0].second;  // rounding carried the draw past the end: the most likely token is the honest answer
}

// No top-k (or a large one): one vector pass buckets every token by l_max - l and sums the bucket weights; top-k and
// top-p each find their boundary bucket from the counts and weights and sort only that bucket. The survivors are
// then drawn from in id order, so the kept set is never sorted.
int32_t Sampler::sample_by_buckets(float max_logit) {
    namespace k = sampler_kernels;
    const auto n = static_cast<size_t>(n_vocab_);
    const float* w = row_;
    const bool top_k = params_.top_k > 0 && params_.top_k < n_vocab_;
    weight_.resize(n);
    bucket_.resize(n);
    count_.assign(kBuckets, 0);
    mass_.assign(kBuckets, 0.0);
    scratch_.resize(2 * kBuckets);
    const k::Histogram histogram{.mass = mass_.data(),
                                 .count = top_k ? count_.data() : nullptr,
                                 .bucket = bucket_.data(),
                                 .scratch = scratch_.data(),
                                 .n_buckets = kBuckets,
                                 .per_logit = kBucketsPerLogit};
    // The histogram is only needed to find a top-k or top-p boundary.
    const bool truncate = top_k || params_.top_p < 1.0f;
    if (truncate) k::weigh_and_bucket(w, n, max_logit, weight_.data(), histogram);

    // The members of one bucket in truncation order.
    int gathered_bucket = -1;
    auto gather = [&](int bucket) -> const std::vector<std::pair<float, int32_t>>& {
        if (bucket != gathered_bucket) {
            candidates_.clear();
            members_.clear();
            k::find_bucket(bucket_.data(), n, static_cast<uint16_t>(bucket), members_);
            for (int32_t i : members_) candidates_.emplace_back(w[i], i);
            std::sort(candidates_.begin(), candidates_.end(), better);
            gathered_bucket = bucket;
        }
        return candidates_;
    };

    Cut cut;
    double kept_mass = 0.0;
    for (double m : mass_) kept_mass += m;

    if (top_k) {
        int64_t before = 0;
        double mass_before = 0.0;
        int b = 0;
        while (b < kBuckets - 1 && before + count_[b] < params_.top_k) {
            before += count_[b];
            mass_before += mass_[b];
            ++b;
        }
        const auto& members = gather(b);
        const auto take = static_cast<size_t>(params_.top_k - before);  // 1 .. count_[b]
        for (size_t j = 0; j < take; ++j) mass_before += weight_[static_cast<size_t>(members[j].second)];
        cut = {members[take - 1].first, members[take - 1].second};
        kept_mass = mass_before;
    }

    if (params_.top_p < 1.0f) {
        const double target = static_cast<double>(params_.top_p) * kept_mass;
        double cumulative = 0.0;
        int b = 0;
        while (b < kBuckets - 1 && cumulative + mass_[b] < target) cumulative += mass_[b++];
        const auto& members = gather(b);
        Cut top_p_cut;
        for (const auto& [l, id] : members) {
            if (!cut.holds(l, id)) break;  // rounding: never past the top-k boundary
            top_p_cut = {l, id};
            cumulative += weight_[static_cast<size_t>(id)];
            if (cumulative >= target) break;
        }
        if (!members.empty() && top_p_cut.tighter_than(cut)) cut = top_p_cut;
    }

    const float floor_logit = params_.min_p > 0.0f ? std::log(params_.min_p) : kNegInf;
    block_sum_.resize((n + k::kBlock - 1) / k::kBlock);
    const double total = k::keep_and_weigh(w, n,
                                           {.max_logit = max_logit,
                                            .cut_logit = cut.logit,
                                            .cut_last_id = cut.last_id,
                                            .floor_logit = floor_logit,
                                            .inv_temperature = 1.0f / params_.temperature,
                                            .unit_temperature = truncate && params_.temperature == 1.0f},
                                           weight_.data(), block_sum_.data());

    const double target = uniform01() * total;
    double cumulative = 0.0;
    for (size_t block = 0; block < block_sum_.size(); ++block) {
        if (target >= cumulative + block_sum_[block]) {
            cumulative += block_sum_[block];
            continue;
        }
        const size_t begin = block * k::kBlock, end = std::min(n, begin + k::kBlock);
        int32_t last_positive = -1;
        for (size_t i = begin; i < end; ++i) {
            if (weight_[i] <= 0.0f) continue;
            cumulative += weight_[i];
            last_positive = static_cast<int32_t>(i);
            if (target < cumulative) return last_positive;
        }
        if (last_positive >= 0) return last_positive;  // float block sum vs double walk: the block's last survivor
    }
    // Rounding carried the draw past the end: the most likely token.
    for (size_t i = 0; i < n; ++i)
        if (w[i] == max_logit) return static_cast<int32_t>(i);
    return 0;
}

}  // namespace strata
