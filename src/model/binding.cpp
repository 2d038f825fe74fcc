#include "model/binding.h"

#include <cctype>

#include "backend/cpu/ops.h"
#include "core/error.h"

namespace strata {

namespace {

std::string shape_of(std::initializer_list<int64_t> shape) {
    std::string s = "{";
    bool first = true;
    for (int64_t d : shape) {
        if (!first) s += ", ";
        s += std::to_string(d);
        first = false;
    }
    return s + "}";
}

int64_t value_as_int(const gguf::Value& v, const std::string& what) {
    if (v.type == gguf::ValueType::BOOL) return v.b ? 1 : 0;
    return v.as_int(what);
}

}  // namespace

int64_t HparamReader::u32(const std::string& suffix) const {
    return file_.get_u32(key(suffix));
}

int64_t HparamReader::u32_or(const std::string& suffix, int64_t fallback) const {
    const auto v = file_.get_u32_opt(key(suffix));
    return v ? static_cast<int64_t>(*v) : fallback;
}

int64_t HparamReader::positive(const std::string& suffix) const {
    const int64_t v = u32(suffix);
    if (v <= 0)
        throw Error(file_.path() + ": key " + key(suffix) + " must be greater than zero, got " + std::to_string(v));
    return v;
}

float HparamReader::f32(const std::string& suffix) const {
    return file_.get_f32(key(suffix));
}

float HparamReader::f32_or(const std::string& suffix, float fallback) const {
    const auto v = file_.get_f32_opt(key(suffix));
    return v ? *v : fallback;
}

bool HparamReader::has(const std::string& suffix) const {
    return file_.find(key(suffix)) != nullptr;
}

std::vector<int64_t> HparamReader::per_block(const std::string& suffix, int64_t n, int64_t fallback) const {
    const gguf::Value* v = file_.find(key(suffix));
    if (!v) return std::vector<int64_t>(static_cast<size_t>(n), fallback);
    if (v->type != gguf::ValueType::ARRAY)
        return std::vector<int64_t>(static_cast<size_t>(n), value_as_int(*v, key(suffix)));
    if (static_cast<int64_t>(v->arr.size()) < n)
        throw Error(file_.path() + ": key " + key(suffix) + " has " + std::to_string(v->arr.size()) +
                    " entries, expected at least " + std::to_string(n));
    std::vector<int64_t> out;
    for (int64_t i = 0; i < n; ++i) out.push_back(value_as_int(v->arr[static_cast<size_t>(i)], key(suffix)));
    return out;
}

std::optional<int64_t> HparamReader::strata_u32(const std::string& suffix) const {
    const auto v = file_.get_u32_opt(strata_key(suffix));
    return v ? std::optional<int64_t>(*v) : std::nullopt;
}

std::vector<int64_t> HparamReader::strata_int_array(const std::string& suffix) const {
    if (file_.find(strata_key(suffix)) == nullptr) return {};
    return file_.get_int_array(strata_key(suffix));
}

std::vector<uint64_t> HparamReader::strata_u64_array(const std::string& suffix) const {
    return file_.get_u64_array(strata_key(suffix));
}

std::vector<uint64_t> HparamReader::u64_array(const std::string& suffix) const {
    return file_.get_u64_array(key(suffix));
}

Tensor TensorBinder::check(const gguf::TensorInfo& info, std::initializer_list<int64_t> shape) const {
    Tensor t = info.view();
    bool ok = static_cast<int>(shape.size()) >= 1;
    int i = 0;
    for (int64_t d : shape) ok = ok && t.ne[i++] == d;
    for (; i < 4; ++i) ok = ok && t.ne[i] == 1;
    if (!ok)
        throw Error(file_.path() + ": tensor " + info.name + " has shape " + shape_string(t) + ", expected " +
                    shape_of(shape));
    if (!traits(t.type).can_compute)
        throw Error(file_.path() + ": tensor " + info.name + " has type " + dtype_name(t.type) +
                    ", which this build cannot compute yet");
    return t;
}

Tensor TensorBinder::find(const std::string& name, std::initializer_list<int64_t> shape) const {
    const gguf::TensorInfo* info = file_.find_tensor(name);
    if (!info) throw Error(file_.path() + ": tensor " + name + " is missing (expected shape " + shape_of(shape) + ")");
    return check(*info, shape);
}

Tensor TensorBinder::packed(Tensor t) const {
    if (packer_ != nullptr && packer_->pack(t)) file_.drop_pages(t.data, t.n_bytes());
    return t;
}

Tensor TensorBinder::require(const std::string& name, std::initializer_list<int64_t> shape) const {
    return packed(find(name, shape));
}

Tensor TensorBinder::require_table(const std::string& name, std::initializer_list<int64_t> shape) const {
    return find(name, shape);
}

Tensor TensorBinder::require_width(const std::string& name, int64_t ne0) const {
    const gguf::TensorInfo* info = file_.find_tensor(name);
    if (!info)
        throw Error(file_.path() + ": tensor " + name + " is missing (expected shape {" + std::to_string(ne0) +
                    ", rows})");
    return check(*info, {ne0, info->ne[1]});
}

std::optional<Tensor> TensorBinder::optional(const std::string& name, std::initializer_list<int64_t> shape) const {
    const gguf::TensorInfo* info = file_.find_tensor(name);
    if (!info) return std::nullopt;
    return packed(check(*info, shape));
}

std::vector<float> TensorBinder::require_f32(const std::string& name, std::initializer_list<int64_t> shape) const {
    return cpu::to_f32(find(name, shape));
}

bool is_mtp_block_tensor(const std::string& name, int64_t n_trunk) {
    if (name.rfind("blk.", 0) != 0) return false;
    // Digits after "blk.", read until the number reaches n_trunk (more digits only make it larger).
    int64_t block = 0;
    size_t i = 4;
    for (; i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])) && block < n_trunk; ++i)
        block = block * 10 + (name[i] - '0');
    return i > 4 && block >= n_trunk;
}

std::string block_tensor(int64_t block, const std::string& name) {
    return "blk." + std::to_string(block) + "." + name;
}

std::vector<bool> recurrent_layer_map(const HparamReader& hp, int64_t n_block_all, int64_t n_trunk) {
    std::vector<bool> recurrent(static_cast<size_t>(n_trunk));
    if (hp.has("attention.recurrent_layers")) {
        const auto flags = hp.per_block("attention.recurrent_layers", n_block_all, 0);
        for (int64_t i = 0; i < n_trunk; ++i) recurrent[static_cast<size_t>(i)] = flags[static_cast<size_t>(i)] != 0;
        return recurrent;
    }
    const int64_t interval = hp.u32_or("full_attention_interval", 4);
    if (interval <= 0) throw Error("key " + hp.key("full_attention_interval") + " must be greater than zero");
    for (int64_t i = 0; i < n_trunk; ++i) recurrent[static_cast<size_t>(i)] = (i + 1) % interval != 0;
    return recurrent;
}

}  // namespace strata
