#include "model/cuda/device_weights.h"

#include <algorithm>

#include "core/error.h"

namespace strata {

DeviceWeights::DeviceWeights(cuda::Context& ctx, const gguf::File& file) : ctx_(ctx), file_(file) {
    for (const gguf::TensorInfo& t : file.tensors())
        if (t.data != nullptr && t.n_bytes > 0) ranges_.push_back({t.data, &t});
    std::sort(ranges_.begin(), ranges_.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
}

const Tensor* DeviceWeights::tensor(const Tensor& host) {
    const auto* p = static_cast<const uint8_t*>(host.data);
    auto it = std::upper_bound(ranges_.begin(), ranges_.end(), p,
                               [](const uint8_t* ptr, const Range& r) { return ptr < r.begin; });
    if (it == ranges_.begin() || p >= (it - 1)->begin + (it - 1)->info->n_bytes)
        throw Error(file_.path() + ": tensor " + host.name + " does not lie in the file's data; cannot upload it");
    const gguf::TensorInfo& info = *(it - 1)->info;
    if (p + host.n_bytes() > info.data + info.n_bytes)
        throw Error(file_.path() + ": tensor " + host.name + " runs past " + info.name + "; cannot upload it");
    auto up = uploaded_.find(&info);
    if (up == uploaded_.end()) {
        up = uploaded_.emplace(&info, ctx_.upload(info.data, info.n_bytes, "weights")).first;
        uploaded_bytes_ += info.n_bytes;
    }
    Tensor device = host;
    device.data = static_cast<const uint8_t*>(up->second.data()) + (p - info.data);
    device.device = Device::Cuda;
    device.packed = nullptr;
    views_.push_back(device);
    return &views_.back();
}

size_t DeviceWeights::max_matmul_scratch(int64_t n_tokens, std::initializer_list<const Tensor*> except) const {
    size_t bytes = 0;
    for (const Tensor& t : views_)
        if (std::none_of(except.begin(), except.end(), [&](const Tensor* e) { return e && e->data == t.data; }) &&
            t.ne[2] == 1 && t.ne[3] == 1 && cuda::supports_matmul(t.type))
            bytes = std::max(bytes, cuda::matmul_scratch_bytes(t, n_tokens));
    return bytes;
}

const float* DeviceWeights::floats(const std::vector<float>& values) {
    if (values.empty()) return nullptr;
    arrays_.push_back(ctx_.upload(values.data(), values.size() * sizeof(float), "weights"));
    return arrays_.back().as<float>();
}

const uint64_t* DeviceWeights::u64s(const std::vector<uint64_t>& values) {
    if (values.empty()) return nullptr;
    arrays_.push_back(ctx_.upload(values.data(), values.size() * sizeof(uint64_t), "weights"));
    return arrays_.back().as<uint64_t>();
}

}  // namespace strata
