// Reading a model out of a GGUF: typed hyperparameters by key and tensors by name with shape checks. Every failure is
// an Error that names the key or tensor, what was expected and what the file has.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "backend/cpu/packed.h"
#include "core/tensor.h"
#include "format/gguf.h"

namespace strata {

// Metadata keys of one architecture: "{arch}.{suffix}" lookups.
class HparamReader {
  public:
    HparamReader(const gguf::File& file, std::string arch) : file_(file), arch_(std::move(arch)) {}
    const std::string& arch() const { return arch_; }
    std::string key(const std::string& suffix) const { return arch_ + "." + suffix; }

    int64_t u32(const std::string& suffix) const;                       // required
    int64_t u32_or(const std::string& suffix, int64_t fallback) const;  // optional
    int64_t positive(const std::string& suffix) const;                  // required and > 0
    float f32(const std::string& suffix) const;
    float f32_or(const std::string& suffix, float fallback) const;
    bool has(const std::string& suffix) const;
    // A key that may be a scalar (applies to every block) or an array of n values; a missing key gives `fallback`.
    std::vector<int64_t> per_block(const std::string& suffix, int64_t n, int64_t fallback) const;
    std::vector<uint64_t> u64_array(const std::string& suffix) const;
    // strata.{arch}.* keys: hyperparameters llama.cpp's keys cannot carry (the converter writes them only then:
    // convert/gguf_keys.cpp). nullopt when absent.
    std::string strata_key(const std::string& suffix) const { return "strata." + arch_ + "." + suffix; }
    std::optional<int64_t> strata_u32(const std::string& suffix) const;
    std::vector<int64_t> strata_int_array(const std::string& suffix) const;     // empty when absent
    std::vector<uint64_t> strata_u64_array(const std::string& suffix) const;    // required

  private:
    const gguf::File& file_;
    std::string arch_;
};

// Tensor lookup with exact shape checks (dims in ggml order, ne0 first). Given a PackedWeights, the weights that
// require() and optional() return are also packed for the CPU's GEMM where it has a packed form (backend/cpu/packed.h),
// and the file pages read to pack them are handed back to the page cache.
class TensorBinder {
  public:
    explicit TensorBinder(const gguf::File& file, cpu::PackedWeights* packer = nullptr)
        : file_(file), packer_(packer) {}

    // Matrices the model multiplies by.
    Tensor require(const std::string& name, std::initializer_list<int64_t> shape) const;
    std::optional<Tensor> optional(const std::string& name, std::initializer_list<int64_t> shape) const;
    // A table read by rows (token embeddings): never packed.
    Tensor require_table(const std::string& name, std::initializer_list<int64_t> shape) const;
    // A 2-D tensor whose row width must be ne0 and whose row count is free (tables padded past what is used).
    Tensor require_width(const std::string& name, int64_t ne0) const;
    bool has(const std::string& name) const { return file_.find_tensor(name) != nullptr; }
    // A small tensor (norms, conv taps, per-head scalars) copied out as f32.
    std::vector<float> require_f32(const std::string& name, std::initializer_list<int64_t> shape) const;

  private:
    Tensor check(const gguf::TensorInfo& info, std::initializer_list<int64_t> shape) const;
    Tensor find(const std::string& name, std::initializer_list<int64_t> shape) const;
    Tensor packed(Tensor t) const;
    const gguf::File& file_;
    cpu::PackedWeights* packer_;
};

// "blk.3.attn_q.weight"
std::string block_tensor(int64_t block, const std::string& name);

// Whether a tensor belongs to block n_trunk or later ("blk.N." with N >= n_trunk): the MTP blocks, which the trunk
// never reads.
bool is_mtp_block_tensor(const std::string& name, int64_t n_trunk);

// Which trunk blocks are recurrent (GDN): `attention.recurrent_layers` if present, else every block i with
// (i + 1) % full_attention_interval != 0.
std::vector<bool> recurrent_layer_map(const HparamReader& hp, int64_t n_block_all, int64_t n_trunk);

}  // namespace strata
