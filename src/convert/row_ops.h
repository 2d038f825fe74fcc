// Building blocks for the rows of a GGUF tensor: stacked row segments of source tensors (expert stacking, splits,
// value-head reorder, shard concatenation), column permutation and concatenation, and element-wise maps.
#pragma once

#include <algorithm>
#include <memory>
#include <vector>

#include "convert/gguf_plan.h"
#include "convert/tensor_source.h"

namespace strata {

struct RowSegment {
    size_t src = 0;    // source tensor index
    int64_t row0 = 0;  // first source row
    int64_t n = 0;     // rows taken
};

// Rows of the segments, one after the other.
inline RowFn segment_rows(const TensorSource* source, std::vector<RowSegment> segments, int64_t width) {
    auto segs = std::make_shared<std::vector<RowSegment>>(std::move(segments));
    auto starts = std::make_shared<std::vector<int64_t>>();
    int64_t acc = 0;
    for (const RowSegment& s : *segs) {
        starts->push_back(acc);
        acc += s.n;
    }
    return [source, segs, starts, width](int64_t row0, int64_t n_rows, float* out) {
        size_t k = static_cast<size_t>(std::upper_bound(starts->begin(), starts->end(), row0) - starts->begin()) - 1;
        while (n_rows > 0) {
            const RowSegment& s = (*segs)[k];
            const int64_t off = row0 - (*starts)[k];
            const int64_t take = std::min(n_rows, s.n - off);
            source->read_rows(s.src, s.row0 + off, take, out);
            out += take * width;
            row0 += take;
            n_rows -= take;
            ++k;
        }
    };
}

// Output column c takes input column perm[c].
inline RowFn permute_columns(RowFn inner, std::vector<int64_t> perm) {
    auto p = std::make_shared<std::vector<int64_t>>(std::move(perm));
    return [inner = std::move(inner), p](int64_t row0, int64_t n_rows, float* out) {
        const size_t w = p->size();
        std::vector<float> buf(static_cast<size_t>(n_rows) * w);
        inner(row0, n_rows, buf.data());
        for (int64_t r = 0; r < n_rows; ++r)
            for (size_t c = 0; c < w; ++c)
                out[static_cast<size_t>(r) * w + c] = buf[static_cast<size_t>(r) * w + static_cast<size_t>((*p)[c])];
    };
}

// Each output row is [a row | b row].
inline RowFn concat_columns(RowFn a, int64_t wa, RowFn b, int64_t wb) {
    return [a = std::move(a), b = std::move(b), wa, wb](int64_t row0, int64_t n_rows, float* out) {
        std::vector<float> ba(static_cast<size_t>(n_rows * wa)), bb(static_cast<size_t>(n_rows * wb));
        a(row0, n_rows, ba.data());
        b(row0, n_rows, bb.data());
        for (int64_t r = 0; r < n_rows; ++r) {
            std::copy_n(ba.data() + r * wa, wa, out + r * (wa + wb));
            std::copy_n(bb.data() + r * wb, wb, out + r * (wa + wb) + wa);
        }
    };
}

template <class Op>
RowFn map_values(RowFn inner, int64_t width, Op op) {
    return [inner = std::move(inner), width, op](int64_t row0, int64_t n_rows, float* out) {
        inner(row0, n_rows, out);
        for (int64_t i = 0; i < n_rows * width; ++i) out[i] = op(out[i]);
    };
}

}  // namespace strata
