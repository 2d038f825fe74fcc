// Reader for HF safetensors checkpoints: one `model.safetensors`, or shards listed by `model.safetensors.index.json`
// ({"weight_map": {tensor: file}}). Files are memory-mapped; every header field is checked against the file.
// Layout: u64 little-endian header length N, N bytes of JSON {name: {"dtype", "shape", "data_offsets": [b, e]}},
// then the data area (offsets are relative to its start). "__metadata__" is ignored.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/file_map.h"

namespace strata {

struct StInfo {
    std::string name;
    std::string dtype;            // as in the file: "F32", "F16", "BF16", "I64", "I32", ...
    std::vector<int64_t> shape;   // PyTorch order (outermost first); empty for a scalar
    const uint8_t* data = nullptr;  // into the mapped file; may be unaligned (read through memcpy)
    size_t n_bytes = 0;
    std::string file;             // the shard it lives in, for messages

    int64_t n_elements() const;
};

class SafetensorsSet {
public:
    // DIR/model.safetensors.index.json if present, else DIR/model.safetensors, else every *.safetensors in DIR.
    static std::unique_ptr<SafetensorsSet> open_dir(const std::string& dir);
    // One .safetensors file, or an .index.json (shards are looked up next to it).
    static std::unique_ptr<SafetensorsSet> open(const std::string& path);
    // One safetensors image in memory (`data` must outlive the set); `name` stands for the path in messages.
    static std::unique_ptr<SafetensorsSet> open_memory(const uint8_t* data, size_t size, const std::string& name);

    std::vector<std::string> names() const;  // sorted
    const StInfo* find(const std::string& name) const;
    const StInfo& get(const std::string& name) const;  // throws Error when absent

    // Converting reads. read_f32: F32, F16, BF16, F64. read_i64: I64, I32, I16, I8, U8, U16, U32, BOOL (U64 values
    // above INT64_MAX throw). Other dtypes throw Error naming the tensor.
    std::vector<float> read_f32(const std::string& name) const;
    std::vector<int64_t> read_i64(const std::string& name) const;
    // The same into caller memory of exactly n_elements() values.
    void read_f32_into(const StInfo& info, float* dst) const;
    void read_i64_into(const StInfo& info, int64_t* dst) const;

private:
    void add_file(const std::string& path);
    void add_image(const uint8_t* data, size_t size, const std::string& name);

    std::vector<FileMap> maps_;
    std::map<std::string, StInfo> tensors_;
};

// Bytes per element of a safetensors dtype string, or 0 if unknown.
size_t safetensors_dtype_size(const std::string& dtype);

}  // namespace strata
