// Byte-level BPE over one pre-tokenized word: the word's bytes start as one symbol each (GPT-2 byte-to-unicode
// tokens), then the adjacent pair of lowest merge rank is merged, leftmost first, until no pair has a rank.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace strata {

class Bpe {
public:
    struct Merge {
        int32_t left, right;  // token ids
    };
    // byte_token[b]: the id of the token for byte b (-1 when the vocabulary lacks it: the byte is dropped, as HF
    // does without an unknown token). merges in rank order; result_of(merge) is the merged token's id.
    Bpe(std::vector<int32_t> byte_token, const std::vector<Merge>& merges, const std::vector<int32_t>& merge_results,
        bool ignore_merges, std::unordered_map<std::string, int32_t> whole_words);

    // Appends the ids of `word` (raw bytes) to out. Thread-safe.
    void encode_word(std::string_view word, std::vector<int32_t>& out) const;

private:
    struct PairInfo {
        int32_t rank;
        int32_t result;
    };
    static uint64_t key(int32_t a, int32_t b) {
        return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
    }
    const PairInfo* find_pair(int32_t a, int32_t b) const {
        auto it = pairs_.find(key(a, b));
        return it == pairs_.end() ? nullptr : &it->second;
    }
    void merge_small(std::vector<int32_t>& syms) const;
    void merge_large(std::vector<int32_t>& syms) const;

    std::vector<int32_t> byte_token_;
    std::unordered_map<uint64_t, PairInfo> pairs_;
    bool ignore_merges_;
    std::unordered_map<std::string, int32_t> whole_words_;  // ignore_merges only: byte-level word -> id

    // Per-word cache (words repeat a lot in text). Bounded: cleared when it grows past kCacheMax entries.
    static constexpr size_t kCacheMax = 1 << 18;
    static constexpr size_t kCacheWordMax = 64;  // longer words are not cached
    mutable std::mutex cache_mutex_;
    mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace strata
