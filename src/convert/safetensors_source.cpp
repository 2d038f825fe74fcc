// TensorSource over a safetensors checkpoint: rows are decoded straight from the mapped file, so converting a
// tensor never holds more than the rows asked for.
#include <cstring>
#include <map>

#include "convert/tensor_source.h"
#include "core/dtype.h"
#include "core/error.h"
#include "format/safetensors.h"

namespace strata {

namespace {

class SafetensorsSource : public TensorSource {
  public:
    explicit SafetensorsSource(std::unique_ptr<SafetensorsSet> set) : set_(std::move(set)) {
        for (const std::string& n : set_->names()) {
            const StInfo* info = set_->find(n);
            STRATA_ASSERT(info);
            index_[n] = infos_.size();
            infos_.push_back(info);
        }
    }

    size_t size() const override { return infos_.size(); }
    const std::string& name(size_t i) const override { return infos_.at(i)->name; }
    const std::vector<int64_t>& shape(size_t i) const override { return infos_.at(i)->shape; }
    std::optional<size_t> find(const std::string& n) const override {
        auto it = index_.find(n);
        if (it == index_.end()) return std::nullopt;
        return it->second;
    }
    std::string origin(size_t i) const override { return infos_.at(i)->file; }

    void read_rows(size_t i, int64_t row0, int64_t n_rows, float* out) const override {
        const StInfo& info = *infos_.at(i);
        const int64_t width = row_width(info.shape);
        const int64_t rows = row_count(info.shape);
        STRATA_ASSERT(row0 >= 0 && n_rows >= 0 && row0 + n_rows <= rows);
        const size_t esize = safetensors_dtype_size(info.dtype);
        const size_t first = static_cast<size_t>(row0 * width);
        const size_t count = static_cast<size_t>(n_rows * width);
        if (esize == 0 || (first + count) * esize > info.n_bytes)
            throw Error(info.file + ": tensor " + info.name + " has dtype " + info.dtype +
                        " or a size that does not match its shape");
        const uint8_t* src = info.data + first * esize;
        if (info.dtype == "F32") {
            std::memcpy(out, src, count * 4);
        } else if (info.dtype == "F16" || info.dtype == "BF16") {
            const bool bf = info.dtype == "BF16";
            for (size_t k = 0; k < count; ++k) {
                uint16_t h;
                std::memcpy(&h, src + 2 * k, 2);
                out[k] = bf ? bf16_to_f32(h) : f16_to_f32(h);
            }
        } else if (info.dtype == "F64") {
            for (size_t k = 0; k < count; ++k) {
                double d;
                std::memcpy(&d, src + 8 * k, 8);
                out[k] = static_cast<float>(d);
            }
        } else {
            throw Error(info.file + ": tensor " + info.name + " has dtype " + info.dtype +
                        ", expected a floating-point weight (F32, F16, BF16, F64)");
        }
    }

    std::vector<int64_t> read_i64(size_t i) const override { return set_->read_i64(infos_.at(i)->name); }

  private:
    std::unique_ptr<SafetensorsSet> set_;
    std::vector<const StInfo*> infos_;
    std::map<std::string, size_t> index_;
};

}  // namespace

std::unique_ptr<TensorSource> open_safetensors_source(const std::string& dir) {
    return std::make_unique<SafetensorsSource>(SafetensorsSet::open_dir(dir));
}

}  // namespace strata
