#include "tokenizer/bpe.h"

#include <queue>

#include "core/error.h"
#include "format/hf_tokenizer.h"

namespace strata {

Bpe::Bpe(std::vector<int32_t> byte_token, const std::vector<Merge>& merges, const std::vector<int32_t>& merge_results,
         bool ignore_merges, std::unordered_map<std::string, int32_t> whole_words)
    : byte_token_(std::move(byte_token)), ignore_merges_(ignore_merges), whole_words_(std::move(whole_words)) {
    STRATA_ASSERT(byte_token_.size() == 256 && merges.size() == merge_results.size());
    pairs_.reserve(merges.size() * 2);
    for (size_t r = 0; r < merges.size(); ++r) {
        // a repeated pair keeps its first (lowest) rank, as HF's merge map does
        pairs_.emplace(key(merges[r].left, merges[r].right), PairInfo{static_cast<int32_t>(r), merge_results[r]});
    }
}

// Short words: repeatedly scan for the lowest-rank pair (leftmost on ties) and merge it in place.
void Bpe::merge_small(std::vector<int32_t>& syms) const {
    while (syms.size() > 1) {
        int32_t best_rank = INT32_MAX;
        size_t best = 0;
        int32_t best_result = -1;
        for (size_t i = 0; i + 1 < syms.size(); ++i) {
            const PairInfo* p = find_pair(syms[i], syms[i + 1]);
            if (p != nullptr && p->rank < best_rank) {
                best_rank = p->rank;
                best = i;
                best_result = p->result;
            }
        }
        if (best_result < 0) return;
        syms[best] = best_result;
        syms.erase(syms.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    }
}

// Long words: a linked list of symbols and a min-heap of candidate merges (rank, position); stale candidates are
// skipped when popped. Same order as merge_small: lowest rank first, leftmost first among equal ranks.
void Bpe::merge_large(std::vector<int32_t>& syms) const {
    const size_t n = syms.size();
    std::vector<int32_t> prev(n), next(n);
    std::vector<bool> alive(n, true);
    for (size_t i = 0; i < n; ++i) {
        prev[i] = static_cast<int32_t>(i) - 1;
        next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
    }
    struct Cand {
        int32_t rank, pos, left_id, right_id;
        bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
    auto push = [&](int32_t pos) {
        if (pos < 0 || next[static_cast<size_t>(pos)] < 0) return;
        const int32_t a = syms[static_cast<size_t>(pos)], b = syms[static_cast<size_t>(next[static_cast<size_t>(pos)])];
        if (const PairInfo* p = find_pair(a, b)) heap.push({p->rank, pos, a, b});
    };
    for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
    while (!heap.empty()) {
        Cand c = heap.top();
        heap.pop();
        const auto pos = static_cast<size_t>(c.pos);
        if (!alive[pos] || next[pos] < 0) continue;
        const auto right = static_cast<size_t>(next[pos]);
        if (syms[pos] != c.left_id || syms[right] != c.right_id) continue;  // stale
        syms[pos] = find_pair(c.left_id, c.right_id)->result;
        alive[right] = false;
        next[pos] = next[right];
        if (next[pos] >= 0) prev[static_cast<size_t>(next[pos])] = static_cast<int32_t>(pos);
        push(prev[pos]);
        push(static_cast<int32_t>(pos));
    }
    std::vector<int32_t> out;
    for (int32_t i = 0; i >= 0; i = next[static_cast<size_t>(i)]) out.push_back(syms[static_cast<size_t>(i)]);
    syms.swap(out);
}

void Bpe::encode_word(std::string_view word, std::vector<int32_t>& out) const {
    if (word.empty()) return;
    const bool cacheable = word.size() <= kCacheWordMax;
    if (cacheable) {
        std::lock_guard<std::mutex> lock(cache_mutex_);
        auto it = cache_.find(std::string(word));
        if (it != cache_.end()) {
            out.insert(out.end(), it->second.begin(), it->second.end());
            return;
        }
    }
    std::vector<int32_t> syms;
    if (ignore_merges_) {
        std::string mapped;
        const auto& table = byte_to_unicode_table();
        for (char ch : word) mapped += table[static_cast<uint8_t>(ch)];
        auto it = whole_words_.find(mapped);
        if (it != whole_words_.end()) syms.push_back(it->second);
    }
    if (syms.empty()) {
        syms.reserve(word.size());
        for (char ch : word) {
            const int32_t id = byte_token_[static_cast<uint8_t>(ch)];
            if (id >= 0) syms.push_back(id);
        }
        if (syms.size() <= 48)
            merge_small(syms);
        else
            merge_large(syms);
    }
    out.insert(out.end(), syms.begin(), syms.end());
    if (cacheable) {
        std::lock_guard<std::mutex> lock(cache_mutex_);
        if (cache_.size() >= kCacheMax) cache_.clear();
        cache_.emplace(std::string(word), std::move(syms));
    }
}

}  // namespace strata
