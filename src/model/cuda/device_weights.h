// The CUDA model's weights: each file tensor the model binds is copied to device memory once, on first use, and a
// host view (a Tensor pointing into the mapped file, or a view into such a tensor) is translated to the same bytes on
// the device. Small f32 and u64 arrays the binder copied out (norms, conv taps, hash constants) are uploaded as is.
#pragma once

#include <cstdint>
#include <deque>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "format/gguf.h"

namespace strata {

class DeviceWeights {
  public:
    DeviceWeights(cuda::Context& ctx, const gguf::File& file);

    // The device view of a host tensor that lies in the file (uploading the file tensor that holds it). The returned
    // pointer stays valid as long as this object.
    const Tensor* tensor(const Tensor& host);
    const Tensor* tensor(const std::optional<Tensor>& host) { return host ? tensor(*host) : nullptr; }
    // Device copies of host arrays (null for an empty one).
    const float* floats(const std::vector<float>& values);
    const uint64_t* u64s(const std::vector<uint64_t>& values);

    size_t uploaded_bytes() const { return uploaded_bytes_; }
    // The largest context scratch a product of n_tokens takes over the 2-D matrices handed out so far, but those that
    // view the same bytes as one of `except` (the head and the embedding table: their products take fewer tokens).
    size_t max_matmul_scratch(int64_t n_tokens, std::initializer_list<const Tensor*> except = {}) const;

  private:
    struct Range {
        const uint8_t* begin;
        const gguf::TensorInfo* info;
    };
    cuda::Context& ctx_;
    const gguf::File& file_;
    std::vector<Range> ranges_;  // the file's tensors by address
    std::map<const gguf::TensorInfo*, cuda::DeviceBuffer> uploaded_;
    std::deque<Tensor> views_;  // stable addresses for the Tensor* the backend's weight structs hold
    std::vector<cuda::DeviceBuffer> arrays_;
    size_t uploaded_bytes_ = 0;
};

}  // namespace strata
