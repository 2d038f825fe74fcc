// GGUF reader/writer: round trips, the byte layout against a hand-assembled image, split files, and malformed files
// built by hand from the format definition.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "test_util.h"
#include "core/dtype.h"
#include "core/error.h"
#include "format/gguf.h"

namespace strata {
namespace {

using gguf::File;
using gguf::Value;
using gguf::ValueType;
using gguf::Writer;
namespace fs = std::filesystem;
using strata::testing::TempDir;

std::vector<uint8_t> read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// Hand assembly of GGUF bytes straight from the format definition (independent of the writer).
struct Raw {
    std::vector<uint8_t> b;
    template <typename T>
    Raw& put(T v) {
        const size_t at = b.size();
        b.resize(at + sizeof(T));
        std::memcpy(b.data() + at, &v, sizeof(T));
        return *this;
    }
    Raw& u8(uint8_t v) { return put(v); }
    Raw& u32(uint32_t v) { return put(v); }
    Raw& u64(uint64_t v) { return put(v); }
    Raw& i64(int64_t v) { return put(v); }
    Raw& str(const std::string& s) {
        u64(s.size());
        b.insert(b.end(), s.begin(), s.end());
        return *this;
    }
    Raw& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
        b.insert(b.end(), {'G', 'G', 'U', 'F'});
        return u32(version).u64(n_tensors).u64(n_kv);
    }
    Raw& kv_u32(const std::string& key, uint32_t v) { return str(key).u32(4).u32(v); }
    Raw& kv_str(const std::string& key, const std::string& v) { return str(key).u32(8).str(v); }
    Raw& tensor(const std::string& name, std::vector<int64_t> ne, uint32_t type, uint64_t offset) {
        str(name).u32(static_cast<uint32_t>(ne.size()));
        for (auto d : ne) i64(d);
        return u32(type).u64(offset);
    }
    Raw& pad(size_t alignment) {
        b.resize((b.size() + alignment - 1) / alignment * alignment, 0);
        return *this;
    }
    Raw& zeros(size_t n) {
        b.resize(b.size() + n, 0);
        return *this;
    }
};

std::unique_ptr<File> open_mem(const std::vector<uint8_t>& b) {
    return File::open_memory(b.data(), b.size(), "mem.gguf");
}

// Expects an Error that starts with the name and contains `what`.
void expect_error(const std::vector<uint8_t>& bytes, const std::string& what) {
    try {
        open_mem(bytes);
        ADD_FAILURE() << "no error; expected one mentioning \"" << what << "\"";
    } catch (const Error& e) {
        const std::string msg = e.what();
        if (std::getenv("STRATA_PRINT_ERRORS")) std::printf("%s\n", msg.c_str());
        EXPECT_EQ(msg.rfind("mem.gguf: ", 0), 0u) << msg;
        EXPECT_NE(msg.find(what), std::string::npos) << "message: " << msg << "\nexpected to contain: " << what;
        EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
    }
}

Writer::Fill fill_bytes(std::vector<uint8_t> bytes) {
    return [bytes = std::move(bytes)](uint8_t* dst, size_t n) {
        ASSERT_EQ(n, bytes.size());
        std::memcpy(dst, bytes.data(), n);
    };
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
    std::vector<uint8_t> v(n);
    for (size_t k = 0; k < n; ++k) v[k] = static_cast<uint8_t>(seed + k * 7 + (k >> 3));
    return v;
}

template <typename T>
std::vector<uint8_t> as_bytes(const std::vector<T>& v) {
    std::vector<uint8_t> b(v.size() * sizeof(T));
    std::memcpy(b.data(), v.data(), b.size());
    return b;
}

// Every metadata type: scalars, arrays of every element type, strings, nested arrays, empties.
std::vector<std::pair<std::string, Value>> all_metadata() {
    std::vector<std::pair<std::string, Value>> m;
    m.emplace_back("t.u8", Value::of_u8(250));
    m.emplace_back("t.i8", Value::of_i8(-120));
    m.emplace_back("t.u16", Value::of_u16(65000));
    m.emplace_back("t.i16", Value::of_i16(-32000));
    m.emplace_back("t.u32", Value::of_u32(4000000000u));
    m.emplace_back("t.i32", Value::of_i32(-2000000000));
    m.emplace_back("t.u64", Value::of_u64(18000000000000000000ull));
    m.emplace_back("t.i64", Value::of_i64(-9000000000000000000ll));
    m.emplace_back("t.f32", Value::of_f32(3.25f));
    m.emplace_back("t.f32_neg_zero", Value::of_f32(-0.0f));
    m.emplace_back("t.f64", Value::of_f64(-1.0e300));
    m.emplace_back("t.bool_true", Value::of_bool(true));
    m.emplace_back("t.bool_false", Value::of_bool(false));
    m.emplace_back("t.str", Value::of_str("hello, gguf \xE2\x9C\x93"));
    m.emplace_back("t.str_empty", Value::of_str(""));
    m.emplace_back("t.arr_u8", Value::of_array(ValueType::U8, {Value::of_u8(0), Value::of_u8(255)}));
    m.emplace_back("t.arr_i8", Value::of_array(ValueType::I8, {Value::of_i8(-128), Value::of_i8(127)}));
    m.emplace_back("t.arr_u16", Value::of_array(ValueType::U16, {Value::of_u16(1), Value::of_u16(65535)}));
    m.emplace_back("t.arr_i16", Value::of_array(ValueType::I16, {Value::of_i16(-32768), Value::of_i16(5)}));
    m.emplace_back("t.arr_u32", Value::of_u32_array({0, 1, 4294967295u}));
    m.emplace_back("t.arr_i32", Value::of_i32_array({-2147483647 - 1, 0, 2147483647}));
    m.emplace_back("t.arr_u64", Value::of_u64_array({0, 18446744073709551615ull}));
    m.emplace_back("t.arr_i64", Value::of_array(ValueType::I64, {Value::of_i64(std::numeric_limits<int64_t>::min()),
                                                                 Value::of_i64(42)}));
    m.emplace_back("t.arr_f32", Value::of_f32_array({1.5f, -2.0f, std::numeric_limits<float>::infinity()}));
    m.emplace_back("t.arr_f64", Value::of_array(ValueType::F64, {Value::of_f64(0.1), Value::of_f64(-7.0)}));
    m.emplace_back("t.arr_bool", Value::of_bool_array({true, false, true}));
    m.emplace_back("t.arr_str", Value::of_str_array({"a", "", "longer string"}));
    m.emplace_back("t.arr_empty_u32", Value::of_u32_array({}));
    m.emplace_back("t.arr_empty_str", Value::of_str_array({}));
    m.emplace_back("t.arr_arr", Value::of_array(ValueType::ARRAY, {Value::of_u32_array({1, 2}),
                                                                   Value::of_str_array({"x"}),
                                                                   Value::of_array(ValueType::F32, {})}));
    m.emplace_back("t.arr_arr_arr",
                   Value::of_array(ValueType::ARRAY,
                                   {Value::of_array(ValueType::ARRAY, {Value::of_i32_array({-1}),
                                                                       Value::of_bool_array({false})}),
                                    Value::of_array(ValueType::ARRAY, {})}));
    return m;
}

TEST(GgufWriter, ByteLayoutMatchesHandAssembledImage) {
    TempDir dir;
    Writer w;
    w.set("a", Value::of_u32(7));
    w.set("name", Value::of_str("xy"));
    w.add_tensor("t", DType::F32, {2}, fill_bytes(as_bytes(std::vector<float>{1.0f, 2.0f})));
    w.add_tensor("q", DType::F16, {3, 2}, fill_bytes(pattern(12, 1)));
    const auto paths = w.write(dir / "x.gguf");
    ASSERT_EQ(paths, std::vector<std::string>{dir / "x.gguf"});

    Raw want;
    want.header(2, 2).kv_u32("a", 7).kv_str("name", "xy");
    want.tensor("t", {2}, 0, 0).tensor("q", {3, 2}, 1, 32).pad(32);
    const auto data = as_bytes(std::vector<float>{1.0f, 2.0f});
    want.b.insert(want.b.end(), data.begin(), data.end());
    want.pad(32);
    const auto q = pattern(12, 1);
    want.b.insert(want.b.end(), q.begin(), q.end());
    want.pad(32);
    EXPECT_EQ(read_bytes(dir / "x.gguf"), want.b);
    EXPECT_FALSE(fs::exists(dir / "x.gguf.tmp"));
}

TEST(GgufRoundTrip, EveryMetadataType) {
    TempDir dir;
    Writer w;
    const auto meta = all_metadata();
    for (const auto& [k, v] : meta) w.set(k, v);
    w.set("t.u32", Value::of_u32(123));  // replaces the earlier value, keeps its position
    w.write(dir / "m.gguf");

    const auto f = File::open(dir / "m.gguf");
    EXPECT_EQ(f->version(), 3u);
    EXPECT_EQ(f->alignment(), 32u);
    EXPECT_EQ(f->n_splits(), 1);
    ASSERT_EQ(f->kvs().size(), meta.size());
    for (size_t k = 0; k < meta.size(); ++k) {
        EXPECT_EQ(f->kvs()[k].key, meta[k].first);
        const Value& want = meta[k].first == "t.u32" ? Value::of_u32(123) : meta[k].second;
        EXPECT_TRUE(f->kvs()[k].value == want) << meta[k].first;
        ASSERT_NE(f->find(meta[k].first), nullptr);
    }
    EXPECT_EQ(f->find("nope"), nullptr);

    // Field-level checks (not only operator==).
    EXPECT_EQ(f->find("t.u64")->u, 18000000000000000000ull);
    EXPECT_EQ(f->find("t.i64")->i, -9000000000000000000ll);
    EXPECT_EQ(f->find("t.f32")->f, 3.25);
    EXPECT_TRUE(std::signbit(f->find("t.f32_neg_zero")->f));
    EXPECT_EQ(f->find("t.f64")->f, -1.0e300);
    EXPECT_TRUE(f->find("t.bool_true")->b);
    EXPECT_FALSE(f->find("t.bool_false")->b);
    EXPECT_EQ(f->get_str("t.str"), "hello, gguf \xE2\x9C\x93");
    EXPECT_EQ(f->get_str("t.str_empty"), "");
    EXPECT_EQ(f->get_str_array("t.arr_str"), (std::vector<std::string>{"a", "", "longer string"}));
    EXPECT_TRUE(f->get_str_array("t.arr_empty_str").empty());
    EXPECT_EQ(f->get_int_array("t.arr_i32"), (std::vector<int64_t>{-2147483648ll, 0, 2147483647}));
    EXPECT_EQ(f->get_u64_array("t.arr_u64"), (std::vector<uint64_t>{0, 18446744073709551615ull}));
    const Value* nested = f->find("t.arr_arr_arr");
    ASSERT_EQ(nested->arr.size(), 2u);
    EXPECT_EQ(nested->arr[0].elem_type, ValueType::ARRAY);
    EXPECT_EQ(nested->arr[0].arr[0].arr[0].i, -1);
    EXPECT_TRUE(nested->arr[1].arr.empty());
    EXPECT_TRUE(f->tensors().empty());
}

TEST(GgufRoundTrip, TypedGetters) {
    TempDir dir;
    Writer w;
    w.set("u8", Value::of_u8(9));
    w.set("i32", Value::of_i32(-1));
    w.set("u64big", Value::of_u64(1ull << 40));
    w.set("f32", Value::of_f32(0.5f));
    w.set("s", Value::of_str("x"));
    w.set("ints", Value::of_array(ValueType::I16, {Value::of_i16(-3), Value::of_i16(4)}));
    w.write(dir / "g.gguf");
    const auto f = File::open(dir / "g.gguf");
    EXPECT_EQ(f->get_u32("u8"), 9u);
    EXPECT_EQ(f->get_f32("f32"), 0.5f);
    EXPECT_EQ(f->get_u32_opt("absent"), std::nullopt);
    EXPECT_EQ(f->get_f32_opt("absent"), std::nullopt);
    EXPECT_EQ(f->get_u32_opt("u8"), 9u);
    EXPECT_EQ(f->get_int_array("ints"), (std::vector<int64_t>{-3, 4}));

    auto expect_msg = [](auto fn, const std::string& what) {
        try {
            fn();
            ADD_FAILURE() << "no error, expected " << what;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
        }
    };
    expect_msg([&] { f->get_str("absent"); }, "key absent missing");
    expect_msg([&] { f->get_str("u8"); }, "has type u8, expected string");
    expect_msg([&] { f->get_u32("i32"); }, "outside u32");
    expect_msg([&] { f->get_u32("u64big"); }, "outside u32");
    expect_msg([&] { f->get_u32("s"); }, "has type string");
    expect_msg([&] { f->get_f32_opt("s"); }, "expected f32");
    expect_msg([&] { f->get_str_array("ints"); }, "expected an array of strings");
    expect_msg([&] { f->get_u64_array("ints"); }, "negative");
    expect_msg([&] { f->get_int_array("u8"); }, "array of integers");
}

struct TensorSpec {
    std::string name;
    DType type;
    std::vector<int64_t> ne;
    std::vector<uint8_t> bytes;
};

std::vector<TensorSpec> sample_tensors() {
    std::vector<TensorSpec> t;
    std::vector<float> f32(6);
    for (size_t k = 0; k < f32.size(); ++k) f32[k] = 0.25f * static_cast<float>(k) - 1.0f;
    t.push_back({"blk.0.f32", DType::F32, {3, 2}, as_bytes(f32)});
    std::vector<uint16_t> f16 = {0x3C00, 0x7BFF, 0x0001, 0x8000, 0xC000};
    t.push_back({"blk.0.f16", DType::F16, {5}, as_bytes(f16)});
    std::vector<uint16_t> bf16 = {0x3F80, 0xBF80, 0x7F80, 0x0001, 0x4049, 0x1234, 0x0, 0xFFFF};
    t.push_back({"blk.0.bf16", DType::BF16, {2, 2, 2}, as_bytes(bf16)});
    // Q8_0: two rows of 64 elements = 4 blocks of 34 bytes, quantized by the reference quantizer.
    std::vector<float> x(128);
    for (size_t k = 0; k < x.size(); ++k) x[k] = std::sin(0.3f * static_cast<float>(k));
    std::vector<uint8_t> q8(4 * sizeof(BlockQ8_0));
    quantize_row(DType::Q8_0, x.data(), q8.data(), 128);
    t.push_back({"blk.1.q8_0", DType::Q8_0, {64, 2, 1, 1}, q8});
    t.push_back({"empty", DType::F32, {0, 4}, {}});
    return t;
}

void add_all(Writer& w, const std::vector<TensorSpec>& ts) {
    for (const auto& t : ts) w.add_tensor(t.name, t.type, t.ne, fill_bytes(t.bytes));
}

void expect_tensors(const File& f, const std::vector<TensorSpec>& ts, uint32_t alignment) {
    ASSERT_EQ(f.tensors().size(), ts.size());
    for (const auto& want : ts) {
        const auto* t = f.find_tensor(want.name);
        ASSERT_NE(t, nullptr) << want.name;
        EXPECT_EQ(t->type, want.type);
        EXPECT_EQ(t->n_dims, static_cast<int>(want.ne.size()));
        for (int d = 0; d < 4; ++d)
            EXPECT_EQ(t->ne[d], d < static_cast<int>(want.ne.size()) ? want.ne[d] : 1) << want.name;
        ASSERT_EQ(t->n_bytes, want.bytes.size()) << want.name;
        EXPECT_EQ(t->offset % alignment, 0u);
        // mmap bases are page-aligned, so the data pointer shows the file offset's alignment.
        if (t->n_bytes) {
            EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data) % alignment, 0u) << want.name;
            EXPECT_EQ(std::memcmp(t->data, want.bytes.data(), t->n_bytes), 0) << want.name;
        }
        const Tensor v = t->view();
        EXPECT_EQ(v.n_bytes(), want.bytes.size());
        EXPECT_EQ(v.data, t->data);
    }
}

TEST(GgufRoundTrip, TensorsDefaultAlignment) {
    TempDir dir;
    Writer w;
    const auto ts = sample_tensors();
    add_all(w, ts);
    w.set("general.architecture", Value::of_str("test"));
    w.write(dir / "t.gguf");
    const auto f = File::open(dir / "t.gguf");
    expect_tensors(*f, ts, 32);
    EXPECT_EQ(f->find("general.alignment"), nullptr);  // default: not written
    EXPECT_EQ(fs::file_size(dir / "t.gguf") % 32, 0u);
    // Q8_0 data dequantizes to the values that were quantized (within the format's error).
    const auto* q = f->find_tensor("blk.1.q8_0");
    std::vector<float> y(128);
    dequantize_row(DType::Q8_0, q->data, y.data(), 128);
    for (size_t k = 0; k < y.size(); ++k) EXPECT_NEAR(y[k], std::sin(0.3f * static_cast<float>(k)), 0.01f);
}

TEST(GgufRoundTrip, CustomAlignmentHonored) {
    TempDir dir;
    Writer w;
    const auto ts = sample_tensors();
    add_all(w, ts);
    w.set_alignment(64);
    w.write(dir / "a.gguf");
    const auto f = File::open(dir / "a.gguf");
    EXPECT_EQ(f->alignment(), 64u);
    EXPECT_EQ(f->get_u32("general.alignment"), 64u);
    EXPECT_EQ(f->find("general.alignment")->type, ValueType::U32);
    expect_tensors(*f, ts, 64);
    // Padding between tensors is zeros: check the gap after the first tensor.
    const auto bytes = read_bytes(dir / "a.gguf");
    const auto* t0 = f->find_tensor("blk.0.f32");
    const auto* t1 = f->find_tensor("blk.0.f16");
    EXPECT_EQ(t1->offset, 64u);
    for (const uint8_t* p = t0->data + t0->n_bytes; p < t1->data; ++p) EXPECT_EQ(*p, 0);
    EXPECT_EQ(bytes.size() % 64, 0u);
}

TEST(GgufRoundTrip, AlignmentViaSetKey) {
    TempDir dir;
    Writer w;
    w.set("general.alignment", Value::of_u32(128));
    w.add_tensor("x", DType::F32, {1}, fill_bytes(as_bytes(std::vector<float>{5.0f})));
    w.write(dir / "b.gguf");
    const auto f = File::open(dir / "b.gguf");
    EXPECT_EQ(f->alignment(), 128u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(f->tensors()[0].data) % 128, 0u);
    EXPECT_THROW(w.set("general.alignment", Value::of_u32(48)), Error);
    EXPECT_THROW(w.set("general.alignment", Value::of_i32(64)), Error);
}

TEST(GgufSplit, ThreeSplitsRoundTrip) {
    TempDir dir;
    const auto ts = sample_tensors();
    Writer w;
    add_all(w, ts);
    for (const auto& [k, v] : all_metadata()) w.set(k, v);
    w.set("split.count", Value::of_u16(9));  // stale split keys are dropped, not copied
    // Padded sizes: 32, 32, 32, 160, 0. A 64-byte limit gives {f32, f16}, {bf16}, {q8_0, empty}.
    const auto paths = w.write(dir / "model.gguf", 64);
    ASSERT_EQ(paths.size(), 3u);
    for (int k = 0; k < 3; ++k) {
        EXPECT_EQ(paths[k], gguf::split_path(dir / "model", k, 3));
        EXPECT_TRUE(fs::exists(paths[k]));
        EXPECT_FALSE(fs::exists(paths[k] + ".tmp"));
    }
    EXPECT_EQ(paths[1], dir / "model-00002-of-00003.gguf");
    EXPECT_FALSE(fs::exists(dir / "model.gguf"));

    Writer single;
    add_all(single, ts);
    for (const auto& [k, v] : all_metadata()) single.set(k, v);
    single.write(dir / "single.gguf");
    const auto ref = File::open(dir / "single.gguf");

    for (int open_index = 0; open_index < 3; ++open_index) {
        const auto f = File::open(paths[open_index]);
        EXPECT_EQ(f->n_splits(), 3);
        expect_tensors(*f, ts, 32);
        EXPECT_EQ(f->find_tensor("blk.0.f32")->split, 0);
        EXPECT_EQ(f->find_tensor("blk.0.bf16")->split, 1);
        EXPECT_EQ(f->find_tensor("blk.1.q8_0")->split, 2);
        // KVs are the first file's: everything the single file has, plus the split keys.
        std::vector<gguf::KeyValue> user;
        for (const auto& kv : f->kvs())
            if (kv.key.rfind("split.", 0) != 0) user.push_back(kv);
        ASSERT_EQ(user.size(), ref->kvs().size());
        for (size_t k = 0; k < user.size(); ++k) {
            EXPECT_EQ(user[k].key, ref->kvs()[k].key);
            EXPECT_TRUE(user[k].value == ref->kvs()[k].value) << user[k].key;
        }
        // llama.cpp's gguf-split types: split.no u16, split.count u16, split.tensors.count i32.
        EXPECT_TRUE(*f->find("split.no") == Value::of_u16(0));
        EXPECT_TRUE(*f->find("split.count") == Value::of_u16(3));
        EXPECT_TRUE(*f->find("split.tensors.count") == Value::of_i32(5));
    }
}

TEST(GgufSplit, NoSplitWhenUnderTheLimit) {
    TempDir dir;
    Writer w;
    add_all(w, sample_tensors());
    const auto paths = w.write(dir / "m.gguf", 1 << 20);
    ASSERT_EQ(paths, std::vector<std::string>{dir / "m.gguf"});
    const auto f = File::open(dir / "m.gguf");
    EXPECT_EQ(f->n_splits(), 1);
    EXPECT_EQ(f->find("split.count"), nullptr);
}

TEST(GgufSplit, MissingOrInconsistentParts) {
    TempDir dir;
    Writer w;
    add_all(w, sample_tensors());
    w.set_alignment(64);
    const auto paths = w.write(dir / "m.gguf", 64);
    ASSERT_EQ(paths.size(), 4u);  // 64-byte alignment: f32, f16, bf16, q8_0 + empty

    // Each part alone, in memory, is refused (it needs its siblings).
    const auto part = read_bytes(paths[1]);
    expect_error(part, "split set");

    // A renamed part cannot find its siblings.
    fs::copy_file(paths[0], dir / "renamed.gguf");
    try {
        File::open(dir / "renamed.gguf");
        ADD_FAILURE();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("NAME-0000N-of-0000M"), std::string::npos) << e.what();
    }

    // A part whose split.no disagrees with its name.
    fs::copy_file(paths[2], dir / "swap.gguf");
    fs::copy_file(paths[1], paths[2], fs::copy_options::overwrite_existing);
    try {
        File::open(paths[0]);
        ADD_FAILURE();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("inconsistent split keys"), std::string::npos) << e.what();
    }
    fs::copy_file(dir / "swap.gguf", paths[2], fs::copy_options::overwrite_existing);
    EXPECT_EQ(File::open(paths[3])->tensors().size(), 5u);

    fs::remove(paths[2]);
    try {
        File::open(paths[0]);
        ADD_FAILURE();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("split part 3 of 4 is missing"), std::string::npos) << e.what();
    }
}

TEST(GgufWriter, Errors) {
    TempDir dir;
    Writer w;
    w.add_tensor("a", DType::F32, {4}, fill_bytes(pattern(16, 0)));
    EXPECT_THROW(w.add_tensor("a", DType::F32, {4}, nullptr), Error);
    EXPECT_THROW(w.add_tensor("b", DType::Q8_0, {31}, nullptr), Error);
    EXPECT_THROW(w.add_tensor("c", DType::F32, {}, nullptr), Error);
    EXPECT_THROW(w.add_tensor("d", DType::F32, {1, 1, 1, 1, 1}, nullptr), Error);
    EXPECT_THROW(w.add_tensor("e", DType::F32, {-1}, nullptr), Error);
    EXPECT_THROW(w.add_tensor(std::string(64, 'n'), DType::F32, {1}, nullptr), Error);
    EXPECT_THROW(w.set("k", Value::of_array(ValueType::U32, {Value::of_str("x")})), Error);
    EXPECT_THROW(w.set("", Value::of_u32(1)), Error);
    Value deep = Value::of_u32_array({1});
    for (int k = 0; k < 8; ++k) deep = Value::of_array(ValueType::ARRAY, {deep});
    EXPECT_THROW(w.set("deep", deep), Error);

    // A fill that throws leaves neither the file nor its temporary behind.
    Writer bad;
    bad.add_tensor("x", DType::F32, {4}, [](uint8_t*, size_t) { throw Error("source failed"); });
    EXPECT_THROW(bad.write(dir / "bad.gguf"), Error);
    EXPECT_FALSE(fs::exists(dir / "bad.gguf"));
    EXPECT_FALSE(fs::exists(dir / "bad.gguf.tmp"));
}

// A small valid file whose last tensor ends exactly at the end of the file (no trailing padding), so that every
// truncation removes bytes something needs.
std::vector<uint8_t> small_valid_file() {
    Raw r;
    r.header(2, 4);
    r.kv_u32("general.alignment", 32);
    r.kv_str("general.name", "tiny");
    r.str("arr").u32(9).u32(8).u64(2).str("ab").str("");  // array of 2 strings
    r.str("nest").u32(9).u32(9).u64(1).u32(0).u64(3).u8(1).u8(2).u8(3);  // array of one u8 array
    r.tensor("q", {32}, 8, 0);    // Q8_0: 34 bytes, padded to 64
    r.tensor("w", {8, 2}, 0, 64);  // F32: 64 bytes
    r.pad(32);
    const auto q = pattern(34, 3);
    r.b.insert(r.b.end(), q.begin(), q.end());
    r.pad(32);
    const auto w = pattern(64, 9);
    r.b.insert(r.b.end(), w.begin(), w.end());
    return r.b;
}

TEST(GgufMalformed, SmallValidFileParses) {
    const auto b = small_valid_file();
    const auto f = open_mem(b);
    EXPECT_EQ(f->tensors().size(), 2u);
    EXPECT_EQ(f->get_str_array("arr"), (std::vector<std::string>{"ab", ""}));
    EXPECT_EQ(f->find("nest")->arr[0].arr[2].u, 3u);
    EXPECT_EQ(f->find_tensor("w")->data, b.data() + b.size() - 64);
}

TEST(GgufMalformed, TruncatedAtEveryOffset) {
    const auto full = small_valid_file();
    for (size_t n = 0; n < full.size(); ++n) {
        // An exact-size heap copy, so that an overread would leave the buffer (and trip ASan builds).
        std::vector<uint8_t> cut(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
        EXPECT_THROW(open_mem(cut), Error) << "truncated to " << n << " bytes";
    }
    TempDir dir;  // and a few through the file path
    for (size_t n : {size_t{0}, size_t{3}, size_t{20}, full.size() / 2, full.size() - 1}) {
        write_bytes(dir / "cut.gguf", std::vector<uint8_t>(full.begin(), full.begin() + static_cast<long>(n)));
        EXPECT_THROW(File::open(dir / "cut.gguf"), Error) << n;
    }
}

TEST(GgufMalformed, HeaderProblems) {
    auto b = small_valid_file();
    b[0] = 'X';
    expect_error(b, "not a GGUF file");
    expect_error(Raw().header(0, 0, 4).b, "unsupported GGUF version 4");
    expect_error(Raw().header(0, 0, 1).b, "version 1");
    expect_error(Raw().header(0, 0, 0x03000000).b, "big-endian");
    expect_error(Raw().header(0, 1ull << 62).b, "KV count");
    expect_error(Raw().header(~0ull, 0).b, "tensor count");
    expect_error(Raw().header(0, 1).u64(~0ull).zeros(16).b, "length");
    expect_error(Raw().header(0, 1).u64(1ull << 40).zeros(64).b, "length");
    EXPECT_NO_THROW(open_mem(Raw().header(0, 0, 2).b));  // v2 has the same layout
}

TEST(GgufMalformed, ValueProblems) {
    expect_error(Raw().header(0, 1).str("k").u32(13).u32(0).b, "unknown value type 13");
    expect_error(Raw().header(0, 1).str("k").u32(9).u32(77).u64(0).b, "unknown array element type 77");
    expect_error(Raw().header(0, 1).str("k").u32(9).u32(4).u64(1ull << 61).zeros(32).b, "array element count");
    expect_error(Raw().header(0, 1).str("k").u32(9).u32(8).u64(1000).zeros(64).b, "array element count");
    expect_error(Raw().header(0, 1).str("k").u32(8).u64(~0ull).b, "length");
    expect_error(Raw().header(0, 2).kv_u32("k", 1).kv_u32("k", 2).b, "duplicate key k");
    expect_error(Raw().header(0, 1).kv_u32("", 1).b, "empty key");
    expect_error(Raw().header(0, 1).kv_u32("general.alignment", 48).b, "not a power of two");
    expect_error(Raw().header(0, 1).kv_u32("general.alignment", 0).b, "not a power of two");
    expect_error(Raw().header(0, 1).str("general.alignment").u32(5).u32(64).b, "expected u32");

    // Nesting: 8 levels are fine, 9 are refused.
    auto nested = [](int levels) {
        Raw r;
        r.header(0, 1).str("deep").u32(9);
        for (int k = 1; k < levels; ++k) r.u32(9).u64(1);
        return r.u32(4).u64(1).u32(7).b;
    };
    EXPECT_NO_THROW(open_mem(nested(8)));
    expect_error(nested(9), "nested deeper than 8");
}

std::vector<uint8_t> one_tensor(std::vector<int64_t> ne, uint32_t type, uint64_t offset, size_t data_bytes,
                                uint32_t alignment = 32) {
    Raw r;
    r.header(1, alignment == 32 ? 0 : 1);
    if (alignment != 32) r.kv_u32("general.alignment", alignment);
    r.tensor("t", std::move(ne), type, offset).pad(alignment).zeros(data_bytes);
    return r.b;
}

TEST(GgufMalformed, TensorInfoProblems) {
    EXPECT_NO_THROW(open_mem(one_tensor({4}, 0, 0, 16)));
    expect_error(one_tensor({}, 0, 0, 16), "n_dims is 0");
    expect_error(one_tensor({1, 1, 1, 1, 1}, 0, 0, 16), "n_dims is 5");
    expect_error(one_tensor({4, -1}, 0, 0, 16), "dimension 1 is negative");
    expect_error(one_tensor({1ll << 40, 1ll << 40}, 0, 0, 16), "too many elements");
    expect_error(one_tensor({1ll << 62}, 0, 0, 16), "byte size");
    expect_error(one_tensor({4}, 4, 0, 16), "unknown ggml tensor type 4");  // Q4_2 was removed
    expect_error(one_tensor({4}, 99, 0, 16), "unknown ggml tensor type 99");
    expect_error(one_tensor({31}, 8, 0, 64), "not a multiple of the q8_0 block size 32");
    expect_error(one_tensor({4}, 0, 32, 16), "runs past the end");
    expect_error(one_tensor({4}, 0, 0, 15), "runs past the end");
    expect_error(one_tensor({4}, 0, ~0ull - 31, 16), "runs past the end");
    expect_error(one_tensor({4}, 0, 16, 64), "not a multiple of the alignment 32");
    expect_error(one_tensor({4}, 0, 32, 128, 64), "not a multiple of the alignment 64");
    EXPECT_NO_THROW(open_mem(one_tensor({4}, 0, 64, 128, 64)));
    // Header ends mid-way to the data section.
    auto b = one_tensor({4}, 0, 0, 16);
    b.resize(b.size() - 17);
    expect_error(b, "truncated");

    Raw dup;
    dup.header(2, 0).tensor("t", {4}, 0, 0).tensor("t", {4}, 0, 32).pad(32).zeros(64);
    expect_error(dup.b, "duplicate tensor name t");
    // A zero-element tensor needs no data.
    EXPECT_NO_THROW(open_mem(one_tensor({0, 3}, 0, 0, 0)));
}

}  // namespace
}  // namespace strata
