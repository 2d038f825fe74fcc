#include "format/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"

namespace strata {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// The reference implementation refuses headers above 100 MB; real ones are a few MB at most.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;
constexpr int kMaxJsonDepth = 16;

struct DTypeSize {
    const char* name;
    size_t bytes;
};
constexpr DTypeSize kDTypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1}, {"I16", 2}, {"U16", 2},
    {"F16", 2},  {"BF16", 2}, {"I32", 4}, {"U32", 4},     {"F32", 4},     {"I64", 8},     {"U64", 8}, {"F64", 8},
};

// Parses JSON text, refusing nesting deeper than kMaxJsonDepth and anything that is not an object.
json parse_json_object(const char* begin, const char* end, const std::string& what) {
    bool too_deep = false;
    const json::parser_callback_t limit_depth = [&too_deep](int depth, json::parse_event_t, json&) {
        if (depth > kMaxJsonDepth) too_deep = true;
        return !too_deep;
    };
    json j = json::parse(begin, end, limit_depth, /*allow_exceptions=*/false);
    if (too_deep) throw Error(what + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    if (j.is_discarded()) throw Error(what + ": not valid JSON");
    if (!j.is_object()) throw Error(what + ": JSON is not an object");
    return j;
}

uint64_t json_u64(const json& j, const std::string& what) {
    if (!j.is_number_unsigned()) {
        if (j.is_number_integer() && j.get<int64_t>() >= 0) return static_cast<uint64_t>(j.get<int64_t>());
        throw Error(what + " is not a non-negative integer");
    }
    return j.get<uint64_t>();
}

std::string read_text_file(const std::string& path) {
    const FileMap m(path);
    if (m.size() == 0) return {};
    return std::string(reinterpret_cast<const char*>(m.data()), m.size());
}

template <typename T>
T load(const uint8_t* p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
}

[[noreturn]] void wrong_dtype(const StInfo& info, const char* expected) {
    throw Error(info.file + ": tensor " + info.name + " has dtype " + info.dtype + ", expected " + expected);
}

}  // namespace

size_t safetensors_dtype_size(const std::string& dtype) {
    for (const auto& d : kDTypes)
        if (dtype == d.name) return d.bytes;
    return 0;
}

int64_t StInfo::n_elements() const {
    int64_t n = 1;
    for (const int64_t d : shape) n *= d;  // checked against overflow when the header was read
    return n;
}

void SafetensorsSet::add_image(const uint8_t* data, size_t size, const std::string& name) {
    if (size < 8)
        throw Error(name + ": file is truncated: " + std::to_string(size) + " bytes, too short for a safetensors header");
    const auto header_len = load<uint64_t>(data);
    if (header_len > size - 8)
        throw Error(name + ": header length " + std::to_string(header_len) + " runs past the end of the file (" +
                    std::to_string(size) + " bytes; truncated or not a safetensors file)");
    if (header_len > kMaxHeaderBytes)
        throw Error(name + ": header length " + std::to_string(header_len) + " is larger than the 100 MB limit");
    const char* text = reinterpret_cast<const char*>(data + 8);
    const json header = parse_json_object(text, text + header_len, name + ": header");

    const uint8_t* area = data + 8 + header_len;
    const uint64_t area_size = size - 8 - header_len;
    for (const auto& [tensor_name, entry] : header.items()) {
        if (tensor_name == "__metadata__") continue;
        const std::string what = name + ": tensor " + tensor_name;
        if (!entry.is_object()) throw Error(what + ": entry is not a JSON object");
        const auto dtype_it = entry.find("dtype");
        const auto shape_it = entry.find("shape");
        const auto offsets_it = entry.find("data_offsets");
        if (dtype_it == entry.end() || !dtype_it->is_string()) throw Error(what + ": missing or non-string dtype");
        if (shape_it == entry.end() || !shape_it->is_array()) throw Error(what + ": missing or non-array shape");
        if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2)
            throw Error(what + ": data_offsets must be an array [begin, end]");

        StInfo info;
        info.name = tensor_name;
        info.file = name;
        info.dtype = dtype_it->get<std::string>();
        const size_t elem_bytes = safetensors_dtype_size(info.dtype);
        if (elem_bytes == 0) throw Error(what + ": unknown dtype " + info.dtype);

        uint64_t n_elements = 1;
        for (const auto& d : *shape_it) {
            const uint64_t dim = json_u64(d, what + ": a shape dimension");
            if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
                throw Error(what + ": shape dimension " + std::to_string(dim) + " is too large");
            if (dim != 0 && n_elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / dim)
                throw Error(what + ": shape has too many elements (overflow)");
            n_elements *= dim;
            info.shape.push_back(static_cast<int64_t>(dim));
        }
        if (n_elements > std::numeric_limits<uint64_t>::max() / elem_bytes)
            throw Error(what + ": byte size overflows");
        const uint64_t expected_bytes = n_elements * elem_bytes;

        const uint64_t begin = json_u64((*offsets_it)[0], what + ": data_offsets[0]");
        const uint64_t end = json_u64((*offsets_it)[1], what + ": data_offsets[1]");
        if (begin > end || end > area_size)
            throw Error(what + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                        ") out of range (the data area has " + std::to_string(area_size) + " bytes)");
        if (end - begin != expected_bytes)
            throw Error(what + ": data_offsets cover " + std::to_string(end - begin) + " bytes, but " + info.dtype +
                        " with " + std::to_string(n_elements) + " elements needs " + std::to_string(expected_bytes));
        info.data = area + begin;
        info.n_bytes = static_cast<size_t>(expected_bytes);
        if (tensors_.count(tensor_name))
            throw Error(what + ": also present in " + tensors_.at(tensor_name).file);
        tensors_.emplace(tensor_name, std::move(info));
    }
}

void SafetensorsSet::add_file(const std::string& path) {
    maps_.emplace_back(path);
    add_image(maps_.back().data(), maps_.back().size(), path);
}

std::unique_ptr<SafetensorsSet> SafetensorsSet::open_memory(const uint8_t* data, size_t size,
                                                            const std::string& name) {
    auto set = std::unique_ptr<SafetensorsSet>(new SafetensorsSet());
    set->add_image(data, size, name);
    return set;
}

std::unique_ptr<SafetensorsSet> SafetensorsSet::open(const std::string& path) {
    auto set = std::unique_ptr<SafetensorsSet>(new SafetensorsSet());
    if (!path.ends_with(".json")) {
        set->add_file(path);
        return set;
    }

    const std::string text = read_text_file(path);
    const json index = parse_json_object(text.data(), text.data() + text.size(), path);
    const auto map_it = index.find("weight_map");
    if (map_it == index.end() || !map_it->is_object()) throw Error(path + ": no \"weight_map\" object");
    const fs::path dir = fs::path(path).parent_path();

    // Shards in the order they are first named, each opened once.
    std::vector<std::string> shards;
    std::set<std::string> seen;
    for (const auto& [tensor_name, file] : map_it->items()) {
        if (!file.is_string()) throw Error(path + ": weight_map entry " + tensor_name + " is not a file name");
        const std::string shard = file.get<std::string>();
        const fs::path rel(shard);
        if (shard.empty() || rel.is_absolute() || std::find(rel.begin(), rel.end(), "..") != rel.end())
            throw Error(path + ": weight_map entry " + tensor_name + " names the file \"" + shard +
                        "\", which is not a plain file name next to the index");
        if (seen.insert(shard).second) shards.push_back(shard);
    }
    for (const auto& shard : shards) {
        const std::string shard_path = (dir / shard).string();
        try {
            set->add_file(shard_path);
        } catch (const Error& e) {
            if (!fs::exists(shard_path)) throw Error(path + ": shard " + shard + " is missing: " + e.what());
            throw;
        }
    }
    for (const auto& [tensor_name, file] : map_it->items()) {
        const StInfo* info = set->find(tensor_name);
        const std::string shard_path = (dir / file.get<std::string>()).string();
        if (!info || info->file != shard_path)
            throw Error(path + ": weight_map puts tensor " + tensor_name + " in " + file.get<std::string>() +
                        ", but that file does not hold it");
    }
    return set;
}

std::unique_ptr<SafetensorsSet> SafetensorsSet::open_dir(const std::string& dir) {
    const fs::path d(dir);
    if (!fs::is_directory(d)) throw Error(dir + ": not a directory");
    if (fs::exists(d / "model.safetensors.index.json")) return open((d / "model.safetensors.index.json").string());
    if (fs::exists(d / "model.safetensors")) return open((d / "model.safetensors").string());

    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(d))
        if (e.is_regular_file() && e.path().extension() == ".safetensors") files.push_back(e.path().string());
    if (files.empty()) throw Error(dir + ": no model.safetensors, model.safetensors.index.json or *.safetensors");
    std::sort(files.begin(), files.end());
    auto set = std::unique_ptr<SafetensorsSet>(new SafetensorsSet());
    for (const auto& f : files) set->add_file(f);
    return set;
}

std::vector<std::string> SafetensorsSet::names() const {
    std::vector<std::string> out;
    out.reserve(tensors_.size());
    for (const auto& [name, info] : tensors_) out.push_back(name);
    return out;
}

const StInfo* SafetensorsSet::find(const std::string& name) const {
    const auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
}

const StInfo& SafetensorsSet::get(const std::string& name) const {
    const StInfo* info = find(name);
    if (!info) throw Error("safetensors: tensor " + name + " not found");
    return *info;
}

void SafetensorsSet::read_f32_into(const StInfo& info, float* dst) const {
    const size_t n = static_cast<size_t>(info.n_elements());
    const uint8_t* p = info.data;
    if (info.dtype == "F32") {
        if (n) std::memcpy(dst, p, n * 4);
    } else if (info.dtype == "F16") {
        for (size_t k = 0; k < n; ++k) dst[k] = f16_to_f32(load<uint16_t>(p + 2 * k));
    } else if (info.dtype == "BF16") {
        for (size_t k = 0; k < n; ++k) dst[k] = bf16_to_f32(load<uint16_t>(p + 2 * k));
    } else if (info.dtype == "F64") {
        for (size_t k = 0; k < n; ++k) dst[k] = static_cast<float>(load<double>(p + 8 * k));
    } else {
        wrong_dtype(info, "a float type (F32, F16, BF16, F64)");
    }
}

void SafetensorsSet::read_i64_into(const StInfo& info, int64_t* dst) const {
    const size_t n = static_cast<size_t>(info.n_elements());
    const uint8_t* p = info.data;
    if (info.dtype == "I64") {
        if (n) std::memcpy(dst, p, n * 8);
    } else if (info.dtype == "I32") {
        for (size_t k = 0; k < n; ++k) dst[k] = load<int32_t>(p + 4 * k);
    } else if (info.dtype == "I16") {
        for (size_t k = 0; k < n; ++k) dst[k] = load<int16_t>(p + 2 * k);
    } else if (info.dtype == "I8") {
        for (size_t k = 0; k < n; ++k) dst[k] = static_cast<int8_t>(p[k]);
    } else if (info.dtype == "U8" || info.dtype == "BOOL") {
        for (size_t k = 0; k < n; ++k) dst[k] = p[k];
    } else if (info.dtype == "U16") {
        for (size_t k = 0; k < n; ++k) dst[k] = load<uint16_t>(p + 2 * k);
    } else if (info.dtype == "U32") {
        for (size_t k = 0; k < n; ++k) dst[k] = load<uint32_t>(p + 4 * k);
    } else if (info.dtype == "U64") {
        for (size_t k = 0; k < n; ++k) {
            const auto v = load<uint64_t>(p + 8 * k);
            if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
                throw Error(info.file + ": tensor " + info.name + " holds " + std::to_string(v) + ", above int64");
            dst[k] = static_cast<int64_t>(v);
        }
    } else {
        wrong_dtype(info, "an integer type");
    }
}

std::vector<float> SafetensorsSet::read_f32(const std::string& name) const {
    const StInfo& info = get(name);
    std::vector<float> out(static_cast<size_t>(info.n_elements()));
    read_f32_into(info, out.data());
    return out;
}

std::vector<int64_t> SafetensorsSet::read_i64(const std::string& name) const {
    const StInfo& info = get(name);
    std::vector<int64_t> out(static_cast<size_t>(info.n_elements()));
    read_i64_into(info, out.data());
    return out;
}

}  // namespace strata
