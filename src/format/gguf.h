// GGUF v3: reader (bounds-checked, split files) and streaming writer. Layout facts: shared/reference/gguf-qwen4exp.md
// section 0 and llama.cpp's gguf.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/file_map.h"
#include "core/tensor.h"

namespace strata::gguf {

enum class ValueType : uint32_t {
    U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7, STRING = 8, ARRAY = 9, U64 = 10, I64 = 11,
    F64 = 12,
};
const char* value_type_name(ValueType t);

// One metadata value. Integers are kept in `u` (unsigned types) or `i` (signed), floats in `f`; an array holds its
// element type and its elements (arrays of arrays nest).
struct Value {
    ValueType type = ValueType::U32;
    uint64_t u = 0;
    int64_t i = 0;
    double f = 0.0;
    bool b = false;
    std::string str;
    ValueType elem_type = ValueType::U8;  // arrays only
    std::vector<Value> arr;               // arrays only

    static Value of_u8(uint8_t v);
    static Value of_i8(int8_t v);
    static Value of_u16(uint16_t v);
    static Value of_i16(int16_t v);
    static Value of_u32(uint32_t v);
    static Value of_i32(int32_t v);
    static Value of_u64(uint64_t v);
    static Value of_i64(int64_t v);
    static Value of_f32(float v);
    static Value of_f64(double v);
    static Value of_bool(bool v);
    static Value of_str(std::string v);
    static Value of_array(ValueType elem_type, std::vector<Value> elems);
    static Value of_u32_array(const std::vector<uint32_t>& v);
    static Value of_i32_array(const std::vector<int32_t>& v);
    static Value of_u64_array(const std::vector<uint64_t>& v);
    static Value of_f32_array(const std::vector<float>& v);
    static Value of_bool_array(const std::vector<bool>& v);
    static Value of_str_array(const std::vector<std::string>& v);

    bool operator==(const Value& o) const;
    // Any integer type as int64 (u64 values above INT64_MAX throw). Throws Error naming `what` on a non-integer.
    int64_t as_int(const std::string& what) const;
    double as_float(const std::string& what) const;  // f32/f64 or any integer
};

struct KeyValue {
    std::string key;
    Value value;
};

struct TensorInfo {
    std::string name;
    DType type = DType::F32;
    int n_dims = 0;
    int64_t ne[4] = {1, 1, 1, 1};
    uint64_t offset = 0;       // from the start of the data section of its file
    size_t n_bytes = 0;
    const uint8_t* data = nullptr;  // into the mapped file
    int split = 0;                  // which file of a split set

    Tensor view() const;  // a Tensor over the mapped data
};

// A GGUF file (or a set of split files, opened from any one of them: NAME-0000N-of-0000M.gguf). Every read is
// bounds-checked; a malformed file throws Error with one line naming the file and the problem.
class File {
public:
    static std::unique_ptr<File> open(const std::string& path);
    // Parses one GGUF image in memory (no split files are followed; a split part is refused). `data` must outlive
    // the File; `name` stands for the path in messages. For fuzzing and tests.
    static std::unique_ptr<File> open_memory(const uint8_t* data, size_t size, const std::string& name);

    uint32_t version() const { return version_; }
    uint32_t alignment() const { return alignment_; }
    const std::vector<KeyValue>& kvs() const { return kvs_; }
    const std::vector<TensorInfo>& tensors() const { return tensors_; }
    int n_splits() const { return static_cast<int>(maps_.size()); }
    const std::string& path() const { return path_; }

    const Value* find(const std::string& key) const;
    const TensorInfo* find_tensor(const std::string& name) const;
    // FileMap::drop_pages on the map holding [p, p + n); nothing for a File parsed from memory.
    void drop_pages(const void* p, size_t n) const;
    // Where the mapped bytes [p, p + n) lie on disk: the file (a split set's part) and the offset from its start, for
    // reading them without the map (the PLE row reader). nullopt for a File parsed from memory or bytes it does not
    // map.
    struct Location {
        std::string path;
        uint64_t offset = 0;
    };
    std::optional<Location> locate(const void* p, size_t n) const;

    // Typed getters: throw Error ("<file>: key K missing" / "has type T, expected U") when absent or mistyped.
    std::string get_str(const std::string& key) const;
    uint32_t get_u32(const std::string& key) const;  // accepts any non-negative integer type that fits
    float get_f32(const std::string& key) const;
    std::optional<uint32_t> get_u32_opt(const std::string& key) const;
    std::optional<float> get_f32_opt(const std::string& key) const;
    std::vector<int64_t> get_int_array(const std::string& key) const;
    std::vector<uint64_t> get_u64_array(const std::string& key) const;
    std::vector<std::string> get_str_array(const std::string& key) const;

private:
    std::string path_;
    uint32_t version_ = 0;
    uint32_t alignment_ = 32;
    std::vector<FileMap> maps_;
    std::vector<KeyValue> kvs_;
    std::vector<TensorInfo> tensors_;
    std::map<std::string, size_t> kv_index_;
    std::map<std::string, size_t> tensor_index_;
};

// Streaming writer: metadata and tensor descriptions first, then each tensor's bytes are produced on demand, so a
// file much larger than RAM can be written one tensor at a time.
class Writer {
public:
    using Fill = std::function<void(uint8_t* dst, size_t n_bytes)>;

    void set(const std::string& key, Value value);  // replaces an earlier value of the same key
    // dims in ggml order (ne0 first). Throws Error on a duplicate name or a row size that is not a block multiple.
    void add_tensor(const std::string& name, DType type, std::vector<int64_t> ne, Fill fill);
    void set_alignment(uint32_t alignment) { alignment_ = alignment; }
    // Leaves every tensor's bytes a hole (no fill is called): the file has its full size and reads as zeros, but as a
    // sparse file it takes only the header's disk space. For memory plans of models too large to write.
    void set_data_holes(bool holes) { holes_ = holes; }

    // Writes one file, or split files NAME-0000N-of-0000M.gguf when split_max_bytes > 0 and the data exceed it
    // (llama.cpp's split.* keys). Returns the paths written. Writes to a temporary name and renames at the end.
    std::vector<std::string> write(const std::string& path, uint64_t split_max_bytes = 0) const;

private:
    struct PendingTensor {
        std::string name;
        DType type;
        std::vector<int64_t> ne;
        size_t n_bytes;
        Fill fill;
    };
    uint32_t alignment_ = 32;
    bool holes_ = false;
    std::vector<KeyValue> kvs_;
    std::vector<PendingTensor> tensors_;
};

// "NAME-00002-of-00005.gguf" for split index 1 of 5 (0-based index).
std::string split_path(const std::string& prefix, int index, int count);

}  // namespace strata::gguf
