#include "core/tensor.h"

#include "core/error.h"

namespace strata {

Tensor make_tensor(std::string name, DType type, int n_dims, const int64_t* ne, const void* data) {
    STRATA_ASSERT(n_dims >= 1 && n_dims <= 4);
    Tensor t;
    t.name = std::move(name);
    t.type = type;
    t.n_dims = n_dims;
    for (int i = 0; i < 4; ++i) t.ne[i] = i < n_dims ? ne[i] : 1;
    t.nb[0] = traits(type).block_bytes;
    t.nb[1] = row_bytes(type, t.ne[0]);
    for (int i = 2; i < 4; ++i) t.nb[i] = t.nb[i - 1] * static_cast<size_t>(t.ne[i - 1]);
    t.data = data;
    return t;
}

std::string shape_string(const Tensor& t) {
    std::string s = "{";
    for (int i = 0; i < t.n_dims; ++i) {
        if (i) s += ", ";
        s += std::to_string(t.ne[i]);
    }
    return s + "}";
}

}  // namespace strata
