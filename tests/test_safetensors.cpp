// safetensors reader: files assembled by hand from the format definition (u64 LE header length, JSON header, data).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "test_util.h"
#include "core/error.h"
#include "format/safetensors.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using strata::testing::TempDir;
using strata::testing::expect_error;

template <typename T>
void append(std::vector<uint8_t>& b, const std::vector<T>& v) {
    const size_t at = b.size();
    b.resize(at + v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(b.data() + at, v.data(), v.size() * sizeof(T));
}

// header_json verbatim, then the data bytes.
std::vector<uint8_t> st_image(const std::string& header_json, const std::vector<uint8_t>& data) {
    std::vector<uint8_t> b;
    append(b, std::vector<uint64_t>{header_json.size()});
    b.insert(b.end(), header_json.begin(), header_json.end());
    b.insert(b.end(), data.begin(), data.end());
    return b;
}

void write_file(const std::string& path, const std::vector<uint8_t>& b) {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

void write_text(const std::string& path, const std::string& s) { std::ofstream(path) << s; }

void expect_memory_error(const std::vector<uint8_t>& b, const std::string& what) {
    expect_error([&] { SafetensorsSet::open_memory(b.data(), b.size(), "mem.safetensors"); }, what);
}

// One file with every supported dtype. The header length is odd (a trailing space), so the data are unaligned.
std::vector<uint8_t> sample_file() {
    std::vector<uint8_t> data;
    append(data, std::vector<float>{1.5f, -2.0f, 0.0f, 3.0f, 1e-3f, -7.25f});        // w.f32 [2,3]: 0..24
    append(data, std::vector<uint16_t>{0x3C00, 0x7BFF, 0x0001, 0xC000});              // w.f16 [4]: 24..32
    append(data, std::vector<uint16_t>{0x3F80, 0xC040, 0x7F80, 0x0000});              // w.bf16 [2,2]: 32..40
    append(data, std::vector<int64_t>{-1, 1ll << 40, 0});                             // h.i64 [3]: 40..64
    append(data, std::vector<int32_t>{-7, 2147483647});                               // h.i32 [2]: 64..72
    append(data, std::vector<float>{42.0f});                                          // s.scalar []: 72..76
    std::string header =
        R"({"__metadata__":{"format":"pt"},)"
        R"("w.f32":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
        R"("w.f16":{"dtype":"F16","shape":[4],"data_offsets":[24,32]},)"
        R"("w.bf16":{"dtype":"BF16","shape":[2,2],"data_offsets":[32,40]},)"
        R"("h.i64":{"dtype":"I64","shape":[3],"data_offsets":[40,64]},)"
        R"("h.i32":{"dtype":"I32","shape":[2],"data_offsets":[64,72]},)"
        R"("s.scalar":{"dtype":"F32","shape":[],"data_offsets":[72,76]},)"
        R"("z.empty":{"dtype":"F16","shape":[0,5],"data_offsets":[76,76]}})";
    if (header.size() % 2 == 0) header += ' ';
    return st_image(header, data);
}

void expect_sample(const SafetensorsSet& s) {
    EXPECT_EQ(s.names(),
              (std::vector<std::string>{"h.i32", "h.i64", "s.scalar", "w.bf16", "w.f16", "w.f32", "z.empty"}));
    const StInfo* f = s.find("w.f32");
    ASSERT_NE(f, nullptr);
    EXPECT_EQ(f->dtype, "F32");
    EXPECT_EQ(f->shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(f->n_bytes, 24u);
    EXPECT_EQ(f->n_elements(), 6);
    EXPECT_EQ(s.read_f32("w.f32"), (std::vector<float>{1.5f, -2.0f, 0.0f, 3.0f, 1e-3f, -7.25f}));
    // F16 by definition: 0x3C00 = 1, 0x7BFF = 65504, 0x0001 = 2^-24, 0xC000 = -2.
    EXPECT_EQ(s.read_f32("w.f16"), (std::vector<float>{1.0f, 65504.0f, 0x1p-24f, -2.0f}));
    // BF16 is the top half of an f32: 0x3F80 = 1, 0xC040 = -3, 0x7F80 = inf.
    const auto bf = s.read_f32("w.bf16");
    EXPECT_EQ(bf[0], 1.0f);
    EXPECT_EQ(bf[1], -3.0f);
    EXPECT_TRUE(std::isinf(bf[2]) && bf[2] > 0);
    EXPECT_EQ(bf[3], 0.0f);
    EXPECT_EQ(s.read_i64("h.i64"), (std::vector<int64_t>{-1, 1ll << 40, 0}));
    EXPECT_EQ(s.read_i64("h.i32"), (std::vector<int64_t>{-7, 2147483647}));
    EXPECT_EQ(s.find("s.scalar")->shape.size(), 0u);
    EXPECT_EQ(s.read_f32("s.scalar"), std::vector<float>{42.0f});
    EXPECT_TRUE(s.read_f32("z.empty").empty());
    EXPECT_EQ(s.find("__metadata__"), nullptr);
    EXPECT_EQ(s.find("missing"), nullptr);

    expect_error([&] { s.read_f32("h.i64"); }, "tensor h.i64 has dtype I64, expected a float type");
    expect_error([&] { s.read_i64("w.f32"); }, "tensor w.f32 has dtype F32, expected an integer type");
    expect_error([&] { s.get("missing"); }, "tensor missing not found");
}

TEST(Safetensors, SingleFileInMemoryUnaligned) {
    const auto b = sample_file();
    ASSERT_EQ(b.size() % 2, 1u);  // 8 + odd header + 76 data bytes: the data area starts at an odd offset
    const auto s = SafetensorsSet::open_memory(b.data(), b.size(), "mem.safetensors");
    EXPECT_EQ(reinterpret_cast<uintptr_t>(s->find("w.f32")->data) % 2, 1u);
    expect_sample(*s);
}

TEST(Safetensors, SingleFileFromDir) {
    TempDir dir;
    write_file(dir / "model.safetensors", sample_file());
    write_text(dir / "config.json", "{}");
    const auto s = SafetensorsSet::open_dir(dir.path());
    expect_sample(*s);
    EXPECT_EQ(s->find("w.f32")->file, dir / "model.safetensors");
    expect_sample(*SafetensorsSet::open(dir / "model.safetensors"));
}

TEST(Safetensors, ShardedWithIndex) {
    TempDir dir;
    std::vector<uint8_t> d1;
    append(d1, std::vector<float>{1, 2, 3, 4});
    write_file(dir / "model-00001-of-00002.safetensors",
               st_image(R"({"a.weight":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})", d1));
    std::vector<uint8_t> d2;
    append(d2, std::vector<uint16_t>{0x4000, 0x3800});  // bf16 2.0, f16 0.5
    append(d2, std::vector<int64_t>{5, -6});
    write_file(dir / "model-00002-of-00002.safetensors",
               st_image(R"({"b.weight":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]},)"
                        R"("c.weight":{"dtype":"F16","shape":[1],"data_offsets":[2,4]},)"
                        R"("d.hash":{"dtype":"I64","shape":[2],"data_offsets":[4,20]}})",
                        d2));
    write_text(dir / "model.safetensors.index.json",
               R"({"metadata":{"total_size":36},"weight_map":{"a.weight":"model-00001-of-00002.safetensors",)"
               R"("b.weight":"model-00002-of-00002.safetensors","c.weight":"model-00002-of-00002.safetensors",)"
               R"("d.hash":"model-00002-of-00002.safetensors"}})");
    const auto s = SafetensorsSet::open_dir(dir.path());
    EXPECT_EQ(s->names(), (std::vector<std::string>{"a.weight", "b.weight", "c.weight", "d.hash"}));
    EXPECT_EQ(s->read_f32("a.weight"), (std::vector<float>{1, 2, 3, 4}));
    EXPECT_EQ(s->read_f32("b.weight"), std::vector<float>{2.0f});
    EXPECT_EQ(s->read_f32("c.weight"), std::vector<float>{0.5f});
    EXPECT_EQ(s->read_i64("d.hash"), (std::vector<int64_t>{5, -6}));
    EXPECT_EQ(s->find("d.hash")->file, dir / "model-00002-of-00002.safetensors");

    // The index points a tensor at the wrong shard.
    write_text(dir / "bad.index.json",
               R"({"weight_map":{"a.weight":"model-00002-of-00002.safetensors"}})");
    expect_error([&] { SafetensorsSet::open(dir / "bad.index.json"); }, "does not hold it");
    write_text(dir / "missing.index.json", R"({"weight_map":{"a.weight":"nope.safetensors"}})");
    expect_error([&] { SafetensorsSet::open(dir / "missing.index.json"); }, "shard nope.safetensors is missing");
    write_text(dir / "escape.index.json", R"({"weight_map":{"a.weight":"../x.safetensors"}})");
    expect_error([&] { SafetensorsSet::open(dir / "escape.index.json"); }, "not a plain file name");
    write_text(dir / "nomap.index.json", R"({"metadata":{}})");
    expect_error([&] { SafetensorsSet::open(dir / "nomap.index.json"); }, "no \"weight_map\"");
    write_text(dir / "broken.index.json", R"({"weight_map":)");
    expect_error([&] { SafetensorsSet::open(dir / "broken.index.json"); }, "not valid JSON");
}

TEST(Safetensors, DirectoryWithoutIndexLoadsEveryFile) {
    TempDir dir;
    std::vector<uint8_t> d;
    append(d, std::vector<float>{9});
    write_file(dir / "x.safetensors", st_image(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", d));
    write_file(dir / "y.safetensors", st_image(R"({"y":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", d));
    EXPECT_EQ(SafetensorsSet::open_dir(dir.path())->names(), (std::vector<std::string>{"x", "y"}));
    write_file(dir / "z.safetensors", st_image(R"({"y":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", d));
    expect_error([&] { SafetensorsSet::open_dir(dir.path()); }, "also present in");
    TempDir empty;
    expect_error([&] { SafetensorsSet::open_dir(empty.path()); }, "no model.safetensors");
}

TEST(Safetensors, Malformed) {
    auto one = [](const std::string& entry, size_t data_bytes) {
        return st_image("{\"t\":" + entry + "}", std::vector<uint8_t>(data_bytes, 0));
    };
    expect_memory_error({1, 2, 3}, "too short");
    // Header length past the end of the file.
    auto b = one(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4]})", 4);
    b[0] = static_cast<uint8_t>(b.size());
    expect_memory_error(b, "runs past the end of the file");
    b[0] = 0xFF;
    b[7] = 0xFF;
    expect_memory_error(b, "runs past the end of the file");
    expect_memory_error(one(R"({"dtype":"F32","shape":[1],"data_offsets":[0,8]})", 4), "out of range");
    expect_memory_error(one(R"({"dtype":"F32","shape":[1],"data_offsets":[4,8]})", 4), "out of range");
    expect_memory_error(one(R"({"dtype":"F32","shape":[1],"data_offsets":[4,0]})", 4), "out of range");
    expect_memory_error(one(R"({"dtype":"F32","shape":[1],"data_offsets":[0,18446744073709551615]})", 4),
                        "out of range");
    expect_memory_error(one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,4]})", 4), "needs 8");
    expect_memory_error(one(R"({"dtype":"F16","shape":[1],"data_offsets":[0,4]})", 4), "needs 2");
    expect_memory_error(one(R"({"dtype":"Q99","shape":[1],"data_offsets":[0,4]})", 4), "unknown dtype Q99");
    expect_memory_error(one(R"({"dtype":"F32","shape":[-1],"data_offsets":[0,4]})", 4), "non-negative");
    expect_memory_error(one(R"({"dtype":"F32","shape":[1.5],"data_offsets":[0,4]})", 4), "non-negative");
    expect_memory_error(one(R"({"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,4]})", 4),
                        "too many elements");
    expect_memory_error(one(R"({"dtype":"F32","shape":[1],"data_offsets":[0]})", 4), "data_offsets");
    expect_memory_error(one(R"({"shape":[1],"data_offsets":[0,4]})", 4), "dtype");
    expect_memory_error(one(R"({"dtype":"F32","data_offsets":[0,4]})", 4), "shape");
    expect_memory_error(one(R"([1,2])", 4), "not a JSON object");
    expect_memory_error(st_image("[1]", {}), "JSON is not an object");
    expect_memory_error(st_image("{\"t\":", {}), "not valid JSON");
    expect_memory_error(st_image(std::string(100, '[') + std::string(100, ']'), {}), "nested deeper");
}

}  // namespace
}  // namespace strata
