// A view of an n-dimensional array: ggml's conventions (ne[0] is the contiguous dimension, nb[] are byte strides).
// A Tensor never owns its data; weights point into a mapped file, activations into buffers their owner holds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace strata {

enum class Device : uint8_t { Host = 0, Cuda = 1 };

struct Tensor {
    std::string name;
    DType type = DType::F32;
    int n_dims = 0;
    int64_t ne[4] = {1, 1, 1, 1};
    size_t nb[4] = {0, 0, 0, 0};
    const void* data = nullptr;
    Device device = Device::Host;
    // The CPU backend's copy of these weights with rows interleaved for its GEMM (backend/cpu/packed.h), or null.
    // `data` stays valid either way: code that reads rows uses it, only the matmul reads `packed`.
    const void* packed = nullptr;

    int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
    int64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
    size_t n_bytes() const { return nb[3] * static_cast<size_t>(ne[3]); }
    // Row r of a tensor with contiguous rows (ne[1..3] flattened).
    const uint8_t* row(int64_t r) const { return static_cast<const uint8_t*>(data) + static_cast<size_t>(r) * nb[1]; }
};

// Fills ne/nb for a contiguous tensor of the given shape (dims in ggml order, ne0 first).
Tensor make_tensor(std::string name, DType type, int n_dims, const int64_t* ne, const void* data);

// "{64, 32, 8}" for messages.
std::string shape_string(const Tensor& t);

}  // namespace strata
