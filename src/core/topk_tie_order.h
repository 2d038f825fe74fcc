// The k largest of n keys with ties broken exactly as torch.topk breaks them on the CPU, which is what the
// transformers oracle's QSA indexer calls (`scores.topk(k)`). Where the k-th and (k+1)-th largest scores are equal
// (the indexer's ReLU makes whole runs of exact zeros), which of the equal blocks are kept is decided by the
// algorithm's swaps, not by a rule such as "lowest index first". torch's CPU kernel (aten topk_impl_loop) fills a
// vector of (value, index) pairs and runs libstdc++'s std::partial_sort when k * 64 <= n and std::nth_element
// otherwise, with the comparator "a.value > b.value". The functions below replay those two algorithms step for step
// (introselect: median-of-three pivot, unguarded partition, depth limit 2 log2 n, insertion sort below 4 elements;
// heap select through __adjust_heap / __push_heap), so the kept set is the same as torch's for any input.
// tests/test_qsa_select.cpp checks them against std::nth_element / std::partial_sort and against torch itself.
//
// Host and device: the CUDA selection kernel runs the same code in one thread when a tie straddles the cut.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define STRATA_TOPK_FN __host__ __device__ inline
#else
#define STRATA_TOPK_FN inline
#endif

namespace strata::topk_tie_order {

// The pairs live in two parallel arrays (keys ordered like the values, their original indices).
struct Pairs {
    uint32_t* key;
    int32_t* index;
};

STRATA_TOPK_FN bool before(const Pairs& p, int64_t a, int64_t b) { return p.key[a] > p.key[b]; }

STRATA_TOPK_FN void swap_at(const Pairs& p, int64_t a, int64_t b) {
    const uint32_t k = p.key[a];
    p.key[a] = p.key[b];
    p.key[b] = k;
    const int32_t i = p.index[a];
    p.index[a] = p.index[b];
    p.index[b] = i;
}

STRATA_TOPK_FN void move_to(const Pairs& p, int64_t to, int64_t from) {
    p.key[to] = p.key[from];
    p.index[to] = p.index[from];
}

// libstdc++ __push_heap: the held pair climbs from `hole` towards `top`.
STRATA_TOPK_FN void push_heap(const Pairs& p, int64_t first, int64_t hole, int64_t top, uint32_t key, int32_t index) {
    int64_t parent = (hole - 1) / 2;
    while (hole > top && p.key[first + parent] > key) {
        move_to(p, first + hole, first + parent);
        hole = parent;
        parent = (hole - 1) / 2;
    }
    p.key[first + hole] = key;
    p.index[first + hole] = index;
}

// libstdc++ __adjust_heap: the hole sinks to a leaf along the preferred children, then the held pair climbs back.
STRATA_TOPK_FN void adjust_heap(const Pairs& p, int64_t first, int64_t hole, int64_t len, uint32_t key,
                                int32_t index) {
    const int64_t top = hole;
    int64_t child = hole;
    while (child < (len - 1) / 2) {
        child = 2 * (child + 1);
        if (before(p, first + child, first + child - 1)) --child;
        move_to(p, first + hole, first + child);
        hole = child;
    }
    if ((len & 1) == 0 && child == (len - 2) / 2) {
        child = 2 * (child + 1);
        move_to(p, first + hole, first + child - 1);
        hole = child - 1;
    }
    push_heap(p, first, hole, top, key, index);
}

STRATA_TOPK_FN void make_heap(const Pairs& p, int64_t first, int64_t last) {
    const int64_t len = last - first;
    if (len < 2) return;
    for (int64_t parent = (len - 2) / 2;; --parent) {
        adjust_heap(p, first, parent, len, p.key[first + parent], p.index[first + parent]);
        if (parent == 0) return;
    }
}

// libstdc++ __heap_select: [first, middle) becomes a heap of the best (middle - first) seen.
STRATA_TOPK_FN void heap_select(const Pairs& p, int64_t first, int64_t middle, int64_t last) {
    make_heap(p, first, middle);
    for (int64_t i = middle; i < last; ++i) {
        if (before(p, i, first)) {
            // __pop_heap(first, middle, i): the pair at i is held, the top moves to i, the held pair re-enters.
            const uint32_t key = p.key[i];
            const int32_t index = p.index[i];
            move_to(p, i, first);
            adjust_heap(p, first, 0, middle - first, key, index);
        }
    }
}

STRATA_TOPK_FN void move_median_to_first(const Pairs& p, int64_t result, int64_t a, int64_t b, int64_t c) {
    if (before(p, a, b)) {
        if (before(p, b, c)) swap_at(p, result, b);
        else if (before(p, a, c)) swap_at(p, result, c);
        else swap_at(p, result, a);
    } else if (before(p, a, c)) {
        swap_at(p, result, a);
    } else if (before(p, b, c)) {
        swap_at(p, result, c);
    } else {
        swap_at(p, result, b);
    }
}

STRATA_TOPK_FN int64_t unguarded_partition(const Pairs& p, int64_t first, int64_t last, int64_t pivot) {
    while (true) {
        while (before(p, first, pivot)) ++first;
        --last;
        while (before(p, pivot, last)) --last;
        if (!(first < last)) return first;
        swap_at(p, first, last);
        ++first;
    }
}

STRATA_TOPK_FN void insertion_sort(const Pairs& p, int64_t first, int64_t last) {
    if (first == last) return;
    for (int64_t i = first + 1; i != last; ++i) {
        const uint32_t key = p.key[i];
        const int32_t index = p.index[i];
        if (key > p.key[first]) {
            for (int64_t j = i; j > first; --j) move_to(p, j, j - 1);
            p.key[first] = key;
            p.index[first] = index;
        } else {
            int64_t hole = i;
            for (int64_t next = i - 1; key > p.key[next]; --next) {
                move_to(p, hole, next);
                hole = next;
            }
            p.key[hole] = key;
            p.index[hole] = index;
        }
    }
}

STRATA_TOPK_FN int64_t floor_log2(int64_t n) {
    int64_t r = 0;
    while (n > 1) {
        n >>= 1;
        ++r;
    }
    return r;
}

// std::nth_element(first, first + nth, first + n, greater) as libstdc++ runs it.
STRATA_TOPK_FN void nth_element(const Pairs& p, int64_t nth, int64_t n) {
    if (n == 0 || nth == n) return;
    int64_t first = 0, last = n, depth = floor_log2(n) * 2;
    while (last - first > 3) {
        if (depth == 0) {
            heap_select(p, first, nth + 1, last);
            swap_at(p, first, nth);
            return;
        }
        --depth;
        const int64_t mid = first + (last - first) / 2;
        move_median_to_first(p, first, first + 1, mid, last - 1);
        const int64_t cut = unguarded_partition(p, first + 1, last, first);
        if (cut <= nth) first = cut;
        else last = cut;
    }
    insertion_sort(p, first, last);
}

// torch.topk(k) on the CPU: afterwards p holds the kept pairs in [0, k) (in no particular order). The pairs must
// start as (key[i], i). 0 < k <= n.
STRATA_TOPK_FN void select(const Pairs& p, int64_t k, int64_t n) {
    if (k * 64 <= n) heap_select(p, 0, k, n);  // std::partial_sort's selection (its final sort_heap only reorders)
    else nth_element(p, k - 1, n);
}

}  // namespace strata::topk_tie_order

#undef STRATA_TOPK_FN
