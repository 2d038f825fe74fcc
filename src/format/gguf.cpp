// GGUF v2/v3 reader and streaming writer. Every read goes through a bounds-checked cursor over the mapped bytes, and
// every count from the file is checked against the bytes left before anything is allocated for it.
#include "format/gguf.h"

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include <unistd.h>

#include "core/error.h"

namespace strata::gguf {
namespace {

constexpr char kMagic[4] = {'G', 'G', 'U', 'F'};
constexpr uint32_t kWriteVersion = 3;
constexpr uint32_t kDefaultAlignment = 32;
constexpr int kMaxArrayDepth = 8;
// Real files hold a few million metadata values at most (vocabularies of ~250k tokens, merges, scores). Each value
// costs ~100 bytes in memory, so a cap keeps a hostile file from turning 1 byte into a large allocation.
constexpr uint64_t kMaxMetadataValues = uint64_t{1} << 24;
constexpr size_t kMaxTensorNameBytes = 63;  // llama.cpp's GGML_MAX_NAME - 1
constexpr const char* kAlignmentKey = "general.alignment";
constexpr const char* kSplitNoKey = "split.no";
constexpr const char* kSplitCountKey = "split.count";
constexpr const char* kSplitTensorsKey = "split.tensors.count";
constexpr int kMaxSplits = 99999;  // five digits in the file name

bool is_known_value_type(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::F64); }

bool is_unsigned_type(ValueType t) {
    return t == ValueType::U8 || t == ValueType::U16 || t == ValueType::U32 || t == ValueType::U64;
}
bool is_signed_type(ValueType t) {
    return t == ValueType::I8 || t == ValueType::I16 || t == ValueType::I32 || t == ValueType::I64;
}
bool is_integer_type(ValueType t) { return is_unsigned_type(t) || is_signed_type(t); }
bool is_float_type(ValueType t) { return t == ValueType::F32 || t == ValueType::F64; }

// Bytes one value of the type occupies at the least (strings and arrays: their length fields).
uint64_t min_encoded_size(ValueType t) {
    switch (t) {
        case ValueType::U8:
        case ValueType::I8:
        case ValueType::BOOL:
            return 1;
        case ValueType::U16:
        case ValueType::I16:
            return 2;
        case ValueType::U32:
        case ValueType::I32:
        case ValueType::F32:
            return 4;
        case ValueType::U64:
        case ValueType::I64:
        case ValueType::F64:
        case ValueType::STRING:
            return 8;
        case ValueType::ARRAY:
            return 12;
    }
    return 1;
}

std::string describe_type(const Value& v) {
    if (v.type != ValueType::ARRAY) return value_type_name(v.type);
    return std::string("array of ") + value_type_name(v.elem_type);
}

uint64_t align_up(uint64_t x, uint64_t alignment) { return (x + alignment - 1) / alignment * alignment; }

bool is_power_of_two(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

// ---------------------------------------------------------------------------------------------------------------
// Reading

// Bounds-checked little-endian cursor. Every failure is one line: "<name>: <problem>".
class Cursor {
public:
    Cursor(const uint8_t* data, size_t size, const std::string& name) : data_(data), size_(size), name_(name) {}

    [[noreturn]] void fail(const std::string& what) const { throw Error(name_ + ": " + what); }

    size_t pos() const { return pos_; }
    size_t remaining() const { return size_ - pos_; }

    void need(uint64_t n, const std::string& what) const {
        if (n > remaining())
            fail("file is truncated: " + what + " needs " + std::to_string(n) + " bytes at offset " +
                 std::to_string(pos_) + ", but only " + std::to_string(remaining()) + " remain");
    }

    template <typename T>
    T read(const std::string& what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, data_ + pos_, sizeof(T));
        pos_ += sizeof(T);
        return v;
    }

    std::string read_string(const std::string& what) {
        const auto n = read<uint64_t>(what + " length");
        if (n > remaining())
            fail("file is truncated or corrupt: " + what + " has length " + std::to_string(n) + " but only " +
                 std::to_string(remaining()) + " bytes remain");
        std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(n));
        pos_ += static_cast<size_t>(n);
        return s;
    }

    // A count of items each at least min_item_bytes long: must fit in what is left, checked before allocating.
    void check_count(uint64_t count, uint64_t min_item_bytes, const std::string& what) const {
        if (count > remaining() / min_item_bytes)
            fail(what + " count " + std::to_string(count) + " cannot fit in the " + std::to_string(remaining()) +
                 " bytes that remain (file truncated or corrupt)");
    }

private:
    const uint8_t* data_;
    size_t size_;
    size_t pos_ = 0;
    const std::string& name_;
};

struct ParsedFile {
    uint32_t version = 0;
    uint32_t alignment = kDefaultAlignment;
    std::vector<KeyValue> kvs;
    std::vector<TensorInfo> tensors;
};

class MetadataReader {
public:
    explicit MetadataReader(Cursor& cur) : cur_(cur) {}

    Value read_value(ValueType type, int depth, const std::string& key) {
        count_values(1, key);
        Value v;
        v.type = type;
        switch (type) {
            case ValueType::U8: v.u = cur_.read<uint8_t>("value of " + key); break;
            case ValueType::I8: v.i = cur_.read<int8_t>("value of " + key); break;
            case ValueType::U16: v.u = cur_.read<uint16_t>("value of " + key); break;
            case ValueType::I16: v.i = cur_.read<int16_t>("value of " + key); break;
            case ValueType::U32: v.u = cur_.read<uint32_t>("value of " + key); break;
            case ValueType::I32: v.i = cur_.read<int32_t>("value of " + key); break;
            case ValueType::U64: v.u = cur_.read<uint64_t>("value of " + key); break;
            case ValueType::I64: v.i = cur_.read<int64_t>("value of " + key); break;
            case ValueType::F32: v.f = cur_.read<float>("value of " + key); break;
            case ValueType::F64: v.f = cur_.read<double>("value of " + key); break;
            case ValueType::BOOL: v.b = cur_.read<uint8_t>("value of " + key) != 0; break;
            case ValueType::STRING: v.str = cur_.read_string("string value of " + key); break;
            case ValueType::ARRAY: read_array(v, depth, key); break;
        }
        return v;
    }

private:
    void read_array(Value& v, int depth, const std::string& key) {
        const auto elem = cur_.read<uint32_t>("array element type of " + key);
        if (!is_known_value_type(elem))
            cur_.fail("key " + key + ": unknown array element type " + std::to_string(elem));
        v.elem_type = static_cast<ValueType>(elem);
        if (v.elem_type == ValueType::ARRAY && depth + 1 >= kMaxArrayDepth)
            cur_.fail("key " + key + ": arrays nested deeper than " + std::to_string(kMaxArrayDepth) + " levels");
        const auto n = cur_.read<uint64_t>("array length of " + key);
        cur_.check_count(n, min_encoded_size(v.elem_type), "key " + key + ": array element");
        count_values(n, key);
        v.arr.reserve(static_cast<size_t>(n));
        for (uint64_t k = 0; k < n; ++k) v.arr.push_back(read_value(v.elem_type, depth + 1, key));
    }

    void count_values(uint64_t n, const std::string& key) {
        n_values_ += n;
        if (n_values_ > kMaxMetadataValues)
            cur_.fail("key " + key + ": more than " + std::to_string(kMaxMetadataValues) +
                      " metadata values in the file (corrupt or hostile file)");
    }

    Cursor& cur_;
    uint64_t n_values_ = 0;
};

std::string dims_string(int n_dims, const int64_t* ne) {
    std::string s = "{";
    for (int d = 0; d < n_dims; ++d) s += (d ? ", " : "") + std::to_string(ne[d]);
    return s + "}";
}

TensorInfo read_tensor_info(Cursor& cur, size_t index) {
    TensorInfo t;
    t.name = cur.read_string("name of tensor " + std::to_string(index));
    const std::string what = "tensor " + t.name;
    const auto n_dims = cur.read<uint32_t>("n_dims of " + what);
    if (n_dims < 1 || n_dims > 4)
        cur.fail(what + ": n_dims is " + std::to_string(n_dims) + ", expected 1 to 4");
    t.n_dims = static_cast<int>(n_dims);
    for (uint32_t d = 0; d < n_dims; ++d) {
        const auto ne = cur.read<int64_t>("dimensions of " + what);
        if (ne < 0) cur.fail(what + ": dimension " + std::to_string(d) + " is negative (" + std::to_string(ne) + ")");
        t.ne[d] = ne;
    }
    int64_t n_elements = 1;
    for (int d = 0; d < 4; ++d) {
        if (t.ne[d] != 0 && n_elements > std::numeric_limits<int64_t>::max() / t.ne[d])
            cur.fail(what + ": shape " + dims_string(t.n_dims, t.ne) + " has too many elements (int64 overflow)");
        n_elements *= t.ne[d];
    }
    const auto type_id = cur.read<uint32_t>("type of " + what);
    const auto tr = dtype_traits(type_id);
    if (!tr) cur.fail(what + ": unknown ggml tensor type " + std::to_string(type_id));
    t.type = static_cast<DType>(type_id);
    if (t.ne[0] % tr->block_size != 0)
        cur.fail(what + ": row length " + std::to_string(t.ne[0]) + " is not a multiple of the " + tr->name +
                 " block size " + std::to_string(tr->block_size));
    const uint64_t n_blocks = static_cast<uint64_t>(n_elements / tr->block_size);
    if (n_blocks > std::numeric_limits<uint64_t>::max() / tr->block_bytes ||
        n_blocks * tr->block_bytes > std::numeric_limits<size_t>::max())
        cur.fail(what + ": byte size of shape " + dims_string(t.n_dims, t.ne) + " overflows");
    t.n_bytes = static_cast<size_t>(n_blocks * tr->block_bytes);
    t.offset = cur.read<uint64_t>("data offset of " + what);
    return t;
}

// Parses one GGUF image. Tensor data pointers point into `data`.
ParsedFile parse_image(const uint8_t* data, size_t size, const std::string& name) {
    Cursor cur(data, size, name);
    ParsedFile out;

    cur.need(4, "the GGUF magic");
    if (std::memcmp(data, kMagic, 4) != 0) cur.fail("not a GGUF file (the first 4 bytes are not \"GGUF\")");
    cur.read<uint32_t>("magic");
    out.version = cur.read<uint32_t>("version");
    if (out.version != 2 && out.version != 3) {
        const uint32_t swapped = __builtin_bswap32(out.version);
        if (swapped == 2 || swapped == 3) cur.fail("big-endian GGUF files are not supported");
        if (out.version == 1) cur.fail("GGUF version 1 is not supported (re-convert the model to GGUF v3)");
        cur.fail("unsupported GGUF version " + std::to_string(out.version) + " (expected 2 or 3)");
    }
    const auto n_tensors = cur.read<uint64_t>("tensor count");
    const auto n_kv = cur.read<uint64_t>("KV count");
    // Smallest KV: key length (8) + 1-byte key + type (4) + 1-byte value.
    cur.check_count(n_kv, 14, "KV");

    MetadataReader meta(cur);
    std::set<std::string> keys;
    out.kvs.reserve(static_cast<size_t>(n_kv));
    for (uint64_t k = 0; k < n_kv; ++k) {
        KeyValue kv;
        kv.key = cur.read_string("key of KV " + std::to_string(k));
        if (kv.key.empty()) cur.fail("KV " + std::to_string(k) + " has an empty key");
        if (!keys.insert(kv.key).second) cur.fail("duplicate key " + kv.key);
        const auto type = cur.read<uint32_t>("value type of " + kv.key);
        if (!is_known_value_type(type))
            cur.fail("key " + kv.key + ": unknown value type " + std::to_string(type));
        kv.value = meta.read_value(static_cast<ValueType>(type), 0, kv.key);
        out.kvs.push_back(std::move(kv));
    }

    for (const auto& kv : out.kvs) {
        if (kv.key != kAlignmentKey) continue;
        if (kv.value.type != ValueType::U32)
            cur.fail(std::string(kAlignmentKey) + " has type " + describe_type(kv.value) + ", expected u32");
        if (!is_power_of_two(kv.value.u))
            cur.fail(std::string(kAlignmentKey) + " is " + std::to_string(kv.value.u) + ", not a power of two");
        out.alignment = static_cast<uint32_t>(kv.value.u);
    }

    // Smallest tensor info: name length (8) + n_dims (4) + one dim (8) + type (4) + offset (8).
    cur.check_count(n_tensors, 32, "tensor");
    std::set<std::string> names;
    out.tensors.reserve(static_cast<size_t>(n_tensors));
    for (uint64_t k = 0; k < n_tensors; ++k) {
        TensorInfo t = read_tensor_info(cur, static_cast<size_t>(k));
        if (!names.insert(t.name).second) cur.fail("duplicate tensor name " + t.name);
        out.tensors.push_back(std::move(t));
    }

    const uint64_t data_start = align_up(cur.pos(), out.alignment);
    if (n_tensors > 0 && data_start > size)
        cur.fail("file is truncated: the tensor data section would start at offset " + std::to_string(data_start) +
                 " but the file has " + std::to_string(size) + " bytes");
    const uint64_t data_size = data_start <= size ? size - data_start : 0;
    for (auto& t : out.tensors) {
        if (t.offset % out.alignment != 0)
            cur.fail("tensor " + t.name + ": data offset " + std::to_string(t.offset) +
                     " is not a multiple of the alignment " + std::to_string(out.alignment));
        if (t.offset > data_size || t.n_bytes > data_size - t.offset)
            cur.fail("tensor " + t.name + ": data [" + std::to_string(t.offset) + ", +" + std::to_string(t.n_bytes) +
                     ") runs past the end of the data section (" + std::to_string(data_size) +
                     " bytes; file truncated?)");
        t.data = data + data_start + t.offset;
    }
    return out;
}

// Optional integer key, range-checked; nullopt when absent.
std::optional<int64_t> int_key(const std::vector<KeyValue>& kvs, const char* key, int64_t lo, int64_t hi,
                               const std::string& name) {
    for (const auto& kv : kvs) {
        if (kv.key != key) continue;
        const int64_t v = kv.value.as_int(name + ": key " + key);
        if (v < lo || v > hi)
            throw Error(name + ": key " + key + " is " + std::to_string(v) + ", expected " + std::to_string(lo) +
                        " to " + std::to_string(hi));
        return v;
    }
    return std::nullopt;
}

struct SplitName {
    std::string prefix;
    int index = 0;  // 0-based
    int count = 0;
};

// "PREFIX-0000N-of-0000M.gguf" -> {PREFIX, N-1, M}.
std::optional<SplitName> parse_split_name(const std::string& path) {
    static constexpr std::string_view kTail = "-00000-of-00000.gguf";
    if (path.size() < kTail.size()) return std::nullopt;
    const std::string tail = path.substr(path.size() - kTail.size());
    int n = 0;
    int m = 0;
    for (size_t k = 0; k < kTail.size(); ++k) {
        const char c = tail[k];
        if (kTail[k] == '0') {
            if (c < '0' || c > '9') return std::nullopt;
            (k < 6 ? n : m) = (k < 6 ? n : m) * 10 + (c - '0');
        } else if (c != kTail[k]) {
            return std::nullopt;
        }
    }
    if (n < 1 || m < 1 || n > m) return std::nullopt;
    return SplitName{path.substr(0, path.size() - kTail.size()), n - 1, m};
}

// ---------------------------------------------------------------------------------------------------------------
// Writing

void check_value_shape(const Value& v, int depth, const std::string& key) {
    if (!is_known_value_type(static_cast<uint32_t>(v.type)))
        throw Error("gguf writer: key " + key + " has an invalid value type");
    if (v.type != ValueType::ARRAY) return;
    if (!is_known_value_type(static_cast<uint32_t>(v.elem_type)))
        throw Error("gguf writer: key " + key + " has an invalid array element type");
    if (v.elem_type == ValueType::ARRAY && depth + 1 >= kMaxArrayDepth)
        throw Error("gguf writer: key " + key + " nests arrays deeper than " + std::to_string(kMaxArrayDepth));
    for (const auto& e : v.arr) {
        if (e.type != v.elem_type)
            throw Error("gguf writer: key " + key + ": array of " + value_type_name(v.elem_type) + " holds a " +
                        value_type_name(e.type));
        check_value_shape(e, depth + 1, key);
    }
}

class ByteSink {
public:
    template <typename T>
    void put(T v) {
        const size_t at = bytes_.size();
        bytes_.resize(at + sizeof(T));
        std::memcpy(bytes_.data() + at, &v, sizeof(T));
    }
    void put_string(const std::string& s) {
        put<uint64_t>(s.size());
        bytes_.insert(bytes_.end(), s.begin(), s.end());
    }
    void put_value(const Value& v) {
        switch (v.type) {
            case ValueType::U8: put(static_cast<uint8_t>(v.u)); break;
            case ValueType::I8: put(static_cast<int8_t>(v.i)); break;
            case ValueType::U16: put(static_cast<uint16_t>(v.u)); break;
            case ValueType::I16: put(static_cast<int16_t>(v.i)); break;
            case ValueType::U32: put(static_cast<uint32_t>(v.u)); break;
            case ValueType::I32: put(static_cast<int32_t>(v.i)); break;
            case ValueType::U64: put(v.u); break;
            case ValueType::I64: put(v.i); break;
            case ValueType::F32: put(static_cast<float>(v.f)); break;
            case ValueType::F64: put(v.f); break;
            case ValueType::BOOL: put<uint8_t>(v.b ? 1 : 0); break;
            case ValueType::STRING: put_string(v.str); break;
            case ValueType::ARRAY:
                put(static_cast<uint32_t>(v.elem_type));
                put<uint64_t>(v.arr.size());
                for (const auto& e : v.arr) put_value(e);
                break;
        }
    }
    void pad_to(uint64_t alignment) { bytes_.resize(static_cast<size_t>(align_up(bytes_.size(), alignment)), 0); }
    const std::vector<uint8_t>& bytes() const { return bytes_; }

private:
    std::vector<uint8_t> bytes_;
};

// Owns an open output file; closes it (and removes it unless released) when destroyed.
class OutFile {
public:
    explicit OutFile(std::string path) : path_(std::move(path)) {
        f_ = std::fopen(path_.c_str(), "wb");
        if (!f_) throw Error("cannot create " + path_ + ": " + std::strerror(errno));
    }
    ~OutFile() {
        if (f_) std::fclose(f_);
    }
    OutFile(const OutFile&) = delete;
    OutFile& operator=(const OutFile&) = delete;

    void write(const void* p, size_t n) {
        if (n && std::fwrite(p, 1, n, f_) != n) throw Error("cannot write " + path_ + ": " + std::strerror(errno));
        written_ += n;
    }
    void pad_to(uint64_t alignment) {
        static constexpr uint8_t kZeros[256] = {};
        uint64_t pad = align_up(written_, alignment) - written_;
        while (pad > 0) {
            const size_t n = static_cast<size_t>(std::min<uint64_t>(pad, sizeof(kZeros)));
            write(kZeros, n);
            pad -= n;
        }
    }
    // n bytes left a hole: the file grows to cover them at close().
    void skip(uint64_t n) {
        if (n && ::fseeko(f_, static_cast<off_t>(n), SEEK_CUR) != 0)
            throw Error("cannot write " + path_ + ": " + std::strerror(errno));
        written_ += n;
    }
    void close() {
        FILE* f = std::exchange(f_, nullptr);
        const bool ok = std::fflush(f) == 0 && ::ftruncate(::fileno(f), static_cast<off_t>(written_)) == 0;
        const int err = errno;
        if (std::fclose(f) != 0 || !ok) throw Error("cannot write " + path_ + ": " + std::strerror(ok ? errno : err));
    }

private:
    std::string path_;
    FILE* f_ = nullptr;
    uint64_t written_ = 0;
};

// Removes the temporary files written so far unless the whole write succeeded.
struct TempFiles {
    std::vector<std::string> paths;
    bool committed = false;
    ~TempFiles() {
        if (!committed)
            for (const auto& p : paths) std::remove(p.c_str());
    }
};

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Values

const char* value_type_name(ValueType t) {
    switch (t) {
        case ValueType::U8: return "u8";
        case ValueType::I8: return "i8";
        case ValueType::U16: return "u16";
        case ValueType::I16: return "i16";
        case ValueType::U32: return "u32";
        case ValueType::I32: return "i32";
        case ValueType::F32: return "f32";
        case ValueType::BOOL: return "bool";
        case ValueType::STRING: return "string";
        case ValueType::ARRAY: return "array";
        case ValueType::U64: return "u64";
        case ValueType::I64: return "i64";
        case ValueType::F64: return "f64";
    }
    return "unknown";
}

namespace {
Value unsigned_value(ValueType t, uint64_t u) {
    Value v;
    v.type = t;
    v.u = u;
    return v;
}
Value signed_value(ValueType t, int64_t i) {
    Value v;
    v.type = t;
    v.i = i;
    return v;
}
Value float_value(ValueType t, double f) {
    Value v;
    v.type = t;
    v.f = f;
    return v;
}
}  // namespace

Value Value::of_u8(uint8_t v) { return unsigned_value(ValueType::U8, v); }
Value Value::of_i8(int8_t v) { return signed_value(ValueType::I8, v); }
Value Value::of_u16(uint16_t v) { return unsigned_value(ValueType::U16, v); }
Value Value::of_i16(int16_t v) { return signed_value(ValueType::I16, v); }
Value Value::of_u32(uint32_t v) { return unsigned_value(ValueType::U32, v); }
Value Value::of_i32(int32_t v) { return signed_value(ValueType::I32, v); }
Value Value::of_u64(uint64_t v) { return unsigned_value(ValueType::U64, v); }
Value Value::of_i64(int64_t v) { return signed_value(ValueType::I64, v); }
Value Value::of_f32(float v) { return float_value(ValueType::F32, v); }
Value Value::of_f64(double v) { return float_value(ValueType::F64, v); }

Value Value::of_bool(bool v) {
    Value r;
    r.type = ValueType::BOOL;
    r.b = v;
    return r;
}

Value Value::of_str(std::string v) {
    Value r;
    r.type = ValueType::STRING;
    r.str = std::move(v);
    return r;
}

Value Value::of_array(ValueType elem_type, std::vector<Value> elems) {
    Value r;
    r.type = ValueType::ARRAY;
    r.elem_type = elem_type;
    r.arr = std::move(elems);
    return r;
}

namespace {
template <typename T, typename Make>
Value array_of(ValueType elem_type, const std::vector<T>& src, Make make) {
    std::vector<Value> elems;
    elems.reserve(src.size());
    for (const auto& x : src) elems.push_back(make(x));
    return Value::of_array(elem_type, std::move(elems));
}
}  // namespace

Value Value::of_u32_array(const std::vector<uint32_t>& v) { return array_of(ValueType::U32, v, of_u32); }
Value Value::of_i32_array(const std::vector<int32_t>& v) { return array_of(ValueType::I32, v, of_i32); }
Value Value::of_u64_array(const std::vector<uint64_t>& v) { return array_of(ValueType::U64, v, of_u64); }
Value Value::of_f32_array(const std::vector<float>& v) { return array_of(ValueType::F32, v, of_f32); }
Value Value::of_bool_array(const std::vector<bool>& v) {
    return array_of(ValueType::BOOL, v, [](bool x) { return of_bool(x); });
}
Value Value::of_str_array(const std::vector<std::string>& v) {
    return array_of(ValueType::STRING, v, [](const std::string& s) { return of_str(s); });
}

bool Value::operator==(const Value& o) const {
    if (type != o.type) return false;
    switch (type) {
        case ValueType::U8:
        case ValueType::U16:
        case ValueType::U32:
        case ValueType::U64:
            return u == o.u;
        case ValueType::I8:
        case ValueType::I16:
        case ValueType::I32:
        case ValueType::I64:
            return i == o.i;
        case ValueType::F32:
        case ValueType::F64:  // bitwise, so that NaN payloads and signed zeros round-trip exactly
            return std::memcmp(&f, &o.f, sizeof(f)) == 0;
        case ValueType::BOOL:
            return b == o.b;
        case ValueType::STRING:
            return str == o.str;
        case ValueType::ARRAY:
            return elem_type == o.elem_type && arr == o.arr;
    }
    return false;
}

int64_t Value::as_int(const std::string& what) const {
    if (is_unsigned_type(type)) {
        if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
            throw Error(what + " is " + std::to_string(u) + ", too large for int64");
        return static_cast<int64_t>(u);
    }
    if (is_signed_type(type)) return i;
    throw Error(what + " has type " + describe_type(*this) + ", expected an integer");
}

double Value::as_float(const std::string& what) const {
    if (is_float_type(type)) return f;
    if (is_unsigned_type(type)) return static_cast<double>(u);
    if (is_signed_type(type)) return static_cast<double>(i);
    throw Error(what + " has type " + describe_type(*this) + ", expected a number");
}

Tensor TensorInfo::view() const { return make_tensor(name, type, n_dims, ne, data); }

// ---------------------------------------------------------------------------------------------------------------
// File

std::unique_ptr<File> File::open_memory(const uint8_t* data, size_t size, const std::string& name) {
    ParsedFile p = parse_image(data, size, name);
    const auto count = int_key(p.kvs, kSplitCountKey, 0, kMaxSplits, name);
    if (count && *count > 1)
        throw Error(name + ": part of a " + std::to_string(*count) + "-file split set; open it from disk");
    auto f = std::unique_ptr<File>(new File());
    f->path_ = name;
    f->version_ = p.version;
    f->alignment_ = p.alignment;
    f->maps_.emplace_back();  // no mapping: the caller owns the bytes
    f->kvs_ = std::move(p.kvs);
    f->tensors_ = std::move(p.tensors);
    for (size_t k = 0; k < f->kvs_.size(); ++k) f->kv_index_[f->kvs_[k].key] = k;
    for (size_t k = 0; k < f->tensors_.size(); ++k) f->tensor_index_[f->tensors_[k].name] = k;
    return f;
}

std::unique_ptr<File> File::open(const std::string& path) {
    FileMap first_map(path);
    ParsedFile first = parse_image(first_map.data(), first_map.size(), path);
    const auto count = int_key(first.kvs, kSplitCountKey, 0, kMaxSplits, path).value_or(1);

    auto f = std::unique_ptr<File>(new File());
    f->path_ = path;
    std::vector<ParsedFile> parts;
    if (count <= 1) {
        f->maps_.push_back(std::move(first_map));
        parts.push_back(std::move(first));
    } else {
        const auto name = parse_split_name(path);
        if (!name)
            throw Error(path + ": this file is part of a " + std::to_string(count) +
                        "-file split set, but its name does not follow NAME-0000N-of-0000M.gguf, so the other "
                        "parts cannot be found");
        if (name->count != count)
            throw Error(path + ": the name says " + std::to_string(name->count) + " split files but split.count is " +
                        std::to_string(count));
        const auto no = int_key(first.kvs, kSplitNoKey, 0, count - 1, path);
        if (no != name->index)
            throw Error(path + ": split.no is " + (no ? std::to_string(*no) : std::string("missing")) +
                        " but the file name says part " + std::to_string(name->index + 1));
        for (int k = 0; k < count; ++k) {
            if (k == name->index) {
                f->maps_.push_back(std::move(first_map));
                parts.push_back(std::move(first));
                continue;
            }
            const std::string part_path = split_path(name->prefix, k, static_cast<int>(count));
            try {
                f->maps_.emplace_back(part_path);
            } catch (const Error& e) {
                throw Error(path + ": split part " + std::to_string(k + 1) + " of " + std::to_string(count) +
                            " is missing: " + e.what());
            }
            parts.push_back(parse_image(f->maps_.back().data(), f->maps_.back().size(), part_path));
            const auto part_count = int_key(parts.back().kvs, kSplitCountKey, 0, kMaxSplits, part_path);
            const auto part_no = int_key(parts.back().kvs, kSplitNoKey, 0, kMaxSplits, part_path);
            if (part_count != count || part_no != k)
                throw Error(part_path + ": inconsistent split keys (split.no " +
                            (part_no ? std::to_string(*part_no) : "missing") + ", split.count " +
                            (part_count ? std::to_string(*part_count) : "missing") + "; expected " +
                            std::to_string(k) + " and " + std::to_string(count) + ")");
        }
    }

    f->version_ = parts[0].version;
    f->alignment_ = parts[0].alignment;
    f->kvs_ = std::move(parts[0].kvs);
    for (size_t k = 0; k < f->kvs_.size(); ++k) f->kv_index_[f->kvs_[k].key] = k;
    for (size_t s = 0; s < parts.size(); ++s) {
        for (auto& t : parts[s].tensors) {
            t.split = static_cast<int>(s);
            if (!f->tensor_index_.emplace(t.name, f->tensors_.size()).second)
                throw Error(path + ": tensor " + t.name + " appears in more than one split file");
            f->tensors_.push_back(std::move(t));
        }
    }
    if (count > 1) {
        const std::string first_path = f->maps_[0].path();
        const auto expected = int_key(f->kvs_, kSplitTensorsKey, 0, std::numeric_limits<int32_t>::max(),
                                      first_path);
        if (expected && static_cast<size_t>(*expected) != f->tensors_.size())
            throw Error(first_path + ": split.tensors.count is " + std::to_string(*expected) + " but the " +
                        std::to_string(count) + " split files hold " + std::to_string(f->tensors_.size()) +
                        " tensors");
    }
    return f;
}

const Value* File::find(const std::string& key) const {
    const auto it = kv_index_.find(key);
    return it == kv_index_.end() ? nullptr : &kvs_[it->second].value;
}

const TensorInfo* File::find_tensor(const std::string& name) const {
    const auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

void File::drop_pages(const void* p, size_t n) const {
    for (const FileMap& map : maps_) map.drop_pages(p, n);
}

std::optional<File::Location> File::locate(const void* p, size_t n) const {
    const auto at = reinterpret_cast<uintptr_t>(p);
    for (const FileMap& map : maps_) {
        const auto base = reinterpret_cast<uintptr_t>(map.data());
        if (map.data() && at >= base && n <= map.size() && at - base <= map.size() - n)
            return Location{map.path(), static_cast<uint64_t>(at - base)};
    }
    return std::nullopt;
}

namespace {
const Value& require(const File& f, const std::string& key) {
    const Value* v = f.find(key);
    if (!v) throw Error(f.path() + ": key " + key + " missing");
    return *v;
}

[[noreturn]] void wrong_type(const File& f, const std::string& key, const Value& v, const char* expected) {
    throw Error(f.path() + ": key " + key + " has type " + describe_type(v) + ", expected " + expected);
}

uint32_t to_u32(const File& f, const std::string& key, const Value& v) {
    if (!is_integer_type(v.type)) wrong_type(f, key, v, "an unsigned integer");
    const bool fits = is_unsigned_type(v.type) ? v.u <= std::numeric_limits<uint32_t>::max()
                                               : v.i >= 0 && v.i <= std::numeric_limits<uint32_t>::max();
    if (!fits)
        throw Error(f.path() + ": key " + key + " is " +
                    (is_unsigned_type(v.type) ? std::to_string(v.u) : std::to_string(v.i)) + ", outside u32");
    return static_cast<uint32_t>(is_unsigned_type(v.type) ? v.u : static_cast<uint64_t>(v.i));
}

float to_f32(const File& f, const std::string& key, const Value& v) {
    if (!is_float_type(v.type) && !is_integer_type(v.type)) wrong_type(f, key, v, "f32");
    return static_cast<float>(v.as_float(f.path() + ": key " + key));
}

const Value& require_array(const File& f, const std::string& key, bool (*elem_ok)(ValueType), const char* expected) {
    const Value& v = require(f, key);
    if (v.type != ValueType::ARRAY || !elem_ok(v.elem_type)) wrong_type(f, key, v, expected);
    return v;
}
}  // namespace

std::string File::get_str(const std::string& key) const {
    const Value& v = require(*this, key);
    if (v.type != ValueType::STRING) wrong_type(*this, key, v, "string");
    return v.str;
}

uint32_t File::get_u32(const std::string& key) const { return to_u32(*this, key, require(*this, key)); }

float File::get_f32(const std::string& key) const { return to_f32(*this, key, require(*this, key)); }

std::optional<uint32_t> File::get_u32_opt(const std::string& key) const {
    const Value* v = find(key);
    if (!v) return std::nullopt;
    return to_u32(*this, key, *v);
}

std::optional<float> File::get_f32_opt(const std::string& key) const {
    const Value* v = find(key);
    if (!v) return std::nullopt;
    return to_f32(*this, key, *v);
}

std::vector<int64_t> File::get_int_array(const std::string& key) const {
    const Value& v = require_array(*this, key, is_integer_type, "an array of integers");
    std::vector<int64_t> out;
    out.reserve(v.arr.size());
    for (const auto& e : v.arr) out.push_back(e.as_int(path_ + ": key " + key));
    return out;
}

std::vector<uint64_t> File::get_u64_array(const std::string& key) const {
    const Value& v = require_array(*this, key, is_integer_type, "an array of unsigned integers");
    std::vector<uint64_t> out;
    out.reserve(v.arr.size());
    for (const auto& e : v.arr) {
        if (is_signed_type(e.type) && e.i < 0)
            throw Error(path_ + ": key " + key + " holds the negative value " + std::to_string(e.i));
        out.push_back(is_unsigned_type(e.type) ? e.u : static_cast<uint64_t>(e.i));
    }
    return out;
}

std::vector<std::string> File::get_str_array(const std::string& key) const {
    const Value& v = require_array(
        *this, key, [](ValueType t) { return t == ValueType::STRING; }, "an array of strings");
    std::vector<std::string> out;
    out.reserve(v.arr.size());
    for (const auto& e : v.arr) out.push_back(e.str);
    return out;
}

// ---------------------------------------------------------------------------------------------------------------
// Writer

void Writer::set(const std::string& key, Value value) {
    if (key.empty()) throw Error("gguf writer: empty metadata key");
    check_value_shape(value, 0, key);
    if (key == kAlignmentKey) {
        if (value.type != ValueType::U32 || !is_power_of_two(value.u))
            throw Error(std::string("gguf writer: ") + kAlignmentKey + " must be a u32 power of two");
        alignment_ = static_cast<uint32_t>(value.u);
    }
    for (auto& kv : kvs_) {
        if (kv.key == key) {
            kv.value = std::move(value);
            return;
        }
    }
    kvs_.push_back({key, std::move(value)});
}

void Writer::add_tensor(const std::string& name, DType type, std::vector<int64_t> ne, Fill fill) {
    const std::string what = "gguf writer: tensor " + name;
    if (name.empty()) throw Error("gguf writer: empty tensor name");
    if (name.size() > kMaxTensorNameBytes)
        throw Error(what + ": name longer than " + std::to_string(kMaxTensorNameBytes) +
                    " bytes (llama.cpp cannot load it)");
    for (const auto& t : tensors_)
        if (t.name == name) throw Error(what + " added twice");
    const auto tr = dtype_traits(static_cast<uint32_t>(type));
    if (!tr) throw Error(what + ": unknown tensor type");
    if (ne.empty() || ne.size() > 4) throw Error(what + ": needs 1 to 4 dimensions, got " + std::to_string(ne.size()));
    int64_t n_elements = 1;
    for (const int64_t d : ne) {
        if (d < 0) throw Error(what + ": negative dimension " + std::to_string(d));
        if (d != 0 && n_elements > std::numeric_limits<int64_t>::max() / d) throw Error(what + ": too many elements");
        n_elements *= d;
    }
    if (ne[0] % tr->block_size != 0)
        throw Error(what + ": row length " + std::to_string(ne[0]) + " is not a multiple of the " + tr->name +
                    " block size " + std::to_string(tr->block_size));
    const auto n_bytes = static_cast<size_t>(n_elements / tr->block_size) * tr->block_bytes;
    tensors_.push_back({name, type, std::move(ne), n_bytes, std::move(fill)});
}

std::vector<std::string> Writer::write(const std::string& path, uint64_t split_max_bytes) const {
    if (!is_power_of_two(alignment_))
        throw Error("gguf writer: alignment " + std::to_string(alignment_) + " is not a power of two");

    // Tensors per output file: greedy, a new file when the next tensor would pass the limit (never split a tensor).
    std::vector<std::vector<size_t>> groups(1);
    uint64_t group_bytes = 0;
    for (size_t k = 0; k < tensors_.size(); ++k) {
        const uint64_t padded = align_up(tensors_[k].n_bytes, alignment_);
        if (split_max_bytes > 0 && padded > 0 && !groups.back().empty() && group_bytes + padded > split_max_bytes) {
            groups.emplace_back();
            group_bytes = 0;
        }
        groups.back().push_back(k);
        group_bytes += padded;
    }
    const int n_files = static_cast<int>(groups.size());
    if (n_files > kMaxSplits) throw Error("gguf writer: more than " + std::to_string(kMaxSplits) + " split files");
    if (tensors_.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
        throw Error("gguf writer: too many tensors");

    // The caller's metadata, without stale split keys, with the alignment the data will really use.
    std::vector<KeyValue> base;
    bool has_alignment = false;
    for (const auto& kv : kvs_) {
        if (kv.key == kSplitNoKey || kv.key == kSplitCountKey || kv.key == kSplitTensorsKey) continue;
        if (kv.key == kAlignmentKey) {
            has_alignment = true;
            base.push_back({kv.key, Value::of_u32(alignment_)});
            continue;
        }
        base.push_back(kv);
    }
    if (!has_alignment && alignment_ != kDefaultAlignment) base.push_back({kAlignmentKey, Value::of_u32(alignment_)});

    std::vector<std::string> paths;
    if (n_files == 1) {
        paths.push_back(path);
    } else {
        static constexpr std::string_view kExt = ".gguf";
        const bool has_ext = path.size() > kExt.size() && path.ends_with(kExt);
        const std::string prefix = has_ext ? path.substr(0, path.size() - kExt.size()) : path;
        for (int k = 0; k < n_files; ++k) paths.push_back(split_path(prefix, k, n_files));
    }

    TempFiles temps;
    std::vector<uint8_t> buffer;
    for (int s = 0; s < n_files; ++s) {
        std::vector<KeyValue> kvs;
        if (s == 0) {
            kvs = base;
        } else if (alignment_ != kDefaultAlignment) {
            kvs.push_back({kAlignmentKey, Value::of_u32(alignment_)});
        }
        if (n_files > 1) {
            kvs.push_back({kSplitNoKey, Value::of_u16(static_cast<uint16_t>(s))});
            kvs.push_back({kSplitCountKey, Value::of_u16(static_cast<uint16_t>(n_files))});
            kvs.push_back({kSplitTensorsKey, Value::of_i32(static_cast<int32_t>(tensors_.size()))});
        }

        ByteSink header;
        for (const char c : kMagic) header.put(c);
        header.put(kWriteVersion);
        header.put<uint64_t>(groups[s].size());
        header.put<uint64_t>(kvs.size());
        for (const auto& kv : kvs) {
            header.put_string(kv.key);
            header.put(static_cast<uint32_t>(kv.value.type));
            header.put_value(kv.value);
        }
        uint64_t offset = 0;
        for (const size_t k : groups[s]) {
            const PendingTensor& t = tensors_[k];
            header.put_string(t.name);
            header.put<uint32_t>(static_cast<uint32_t>(t.ne.size()));
            for (const int64_t d : t.ne) header.put(d);
            header.put(static_cast<uint32_t>(t.type));
            header.put(offset);
            offset += align_up(t.n_bytes, alignment_);
        }

        const std::string tmp = paths[s] + ".tmp";
        temps.paths.push_back(tmp);
        OutFile out(tmp);
        out.write(header.bytes().data(), header.bytes().size());
        out.pad_to(alignment_);
        for (const size_t k : groups[s]) {
            const PendingTensor& t = tensors_[k];
            if (holes_) {
                out.skip(t.n_bytes);
                out.skip(align_up(t.n_bytes, alignment_) - t.n_bytes);
                continue;
            }
            if (buffer.size() < t.n_bytes) buffer.resize(t.n_bytes);
            if (t.n_bytes > 0) {
                if (!t.fill) throw Error("gguf writer: tensor " + t.name + " has no data source");
                t.fill(buffer.data(), t.n_bytes);
            }
            out.write(buffer.data(), t.n_bytes);
            out.pad_to(alignment_);
        }
        out.close();
    }
    for (size_t s = 0; s < paths.size(); ++s) {
        if (std::rename(temps.paths[s].c_str(), paths[s].c_str()) != 0)
            throw Error("cannot rename " + temps.paths[s] + " to " + paths[s] + ": " + std::strerror(errno));
    }
    temps.committed = true;
    return paths;
}

std::string split_path(const std::string& prefix, int index, int count) {
    char tail[64];
    std::snprintf(tail, sizeof(tail), "-%05d-of-%05d.gguf", index + 1, count);
    return prefix + tail;
}

}  // namespace strata::gguf
