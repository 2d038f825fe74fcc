#include "runtime/prompt_lookup.h"

#include <algorithm>

namespace strata {

std::vector<int32_t> prompt_lookup_draft(std::span<const int32_t> history, const PromptLookupOptions& o) {
    const int64_t size = static_cast<int64_t>(history.size());
    if (o.max_draft <= 0 || o.min_ngram <= 0) return {};
    for (int64_t n = std::min<int64_t>(o.max_ngram, size - 1); n >= o.min_ngram; --n) {
        const int32_t* suffix = history.data() + size - n;
        // The latest occurrence that ends before the last token: starts at `start`, start + n <= size - 1.
        for (int64_t start = size - n - 1; start >= 0; --start) {
            if (!std::equal(suffix, suffix + n, history.data() + start)) continue;
            const int64_t from = start + n, count = std::min<int64_t>(o.max_draft, size - from);
            return {history.begin() + from, history.begin() + from + count};
        }
    }
    return {};
}

}  // namespace strata
