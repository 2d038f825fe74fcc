// Where the converter reads HF-named tensors from: a safetensors checkpoint, or (for `strata synth`) a generator of
// random weights with the same names and shapes. Tensors are read as rows: a tensor of PyTorch shape [d0, ..., dn]
// is viewed as prod(d0..dn-1) rows of dn values (a 1-D tensor is one row), which is also GGUF's row order.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace strata {

class SafetensorsSet;

class TensorSource {
  public:
    virtual ~TensorSource() = default;
    virtual size_t size() const = 0;
    virtual const std::string& name(size_t index) const = 0;
    virtual const std::vector<int64_t>& shape(size_t index) const = 0;  // PyTorch order
    virtual std::optional<size_t> find(const std::string& name) const = 0;
    // n_rows rows starting at row0, as f32, into out (n_rows * last-dim values).
    virtual void read_rows(size_t index, int64_t row0, int64_t n_rows, float* out) const = 0;
    // Integer tensors (the PLE hash buffers), exactly.
    virtual std::vector<int64_t> read_i64(size_t index) const = 0;
    // A label for messages ("model.safetensors", "synth")
    virtual std::string origin(size_t index) const = 0;
};

// Row width and row count of a PyTorch shape.
inline int64_t row_width(const std::vector<int64_t>& shape) {
    return shape.empty() ? 1 : shape.back();
}
inline int64_t row_count(const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (size_t i = 0; i + 1 < shape.size(); ++i) n *= shape[i];
    return n;
}

// Safetensors checkpoint folder (model.safetensors or an index.json with shards).
std::unique_ptr<TensorSource> open_safetensors_source(const std::string& dir);

}  // namespace strata
