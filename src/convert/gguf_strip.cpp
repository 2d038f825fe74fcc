// `strata convert --gguf IN.gguf --no-mtp`: a copy of a GGUF without its MTP (nextn) blocks, for llama.cpp builds
// that refuse qwen4exp files carrying one (v0.4.0, our interop oracle). Tensors are copied byte for byte.
#include <algorithm>
#include <string>
#include <vector>

#include "convert/convert.h"
#include "core/error.h"
#include "format/gguf.h"

namespace strata {

void strip_mtp_gguf(const std::string& in_path, const std::string& out_path) {
    const std::unique_ptr<gguf::File> in = gguf::File::open(in_path);
    const std::string arch = in->get_str("general.architecture");
    const std::string nextn_key = arch + ".nextn_predict_layers";
    const int64_t n_mtp = in->get_u32_opt(nextn_key).value_or(0);
    if (n_mtp == 0) throw Error(in_path + ": has no MTP block (no " + nextn_key + "), nothing to leave out");
    const std::string count_key = arch + ".block_count";
    const int64_t blocks = in->get_u32(count_key);
    if (n_mtp >= blocks) throw Error(in_path + ": " + nextn_key + " must be below " + count_key);
    const int64_t trunk = blocks - n_mtp;

    gguf::Writer out;
    out.set_alignment(in->alignment());
    for (const gguf::KeyValue& kv : in->kvs()) {
        if (kv.key == nextn_key) continue;
        gguf::Value value = kv.value;
        if (kv.key == count_key) {
            value = gguf::Value::of_u32(static_cast<uint32_t>(trunk));
        } else if (kv.key.rfind(arch + ".", 0) == 0 && value.type == gguf::ValueType::ARRAY &&
                   static_cast<int64_t>(value.arr.size()) == blocks) {
            value.arr.resize(static_cast<size_t>(trunk));  // per-block arrays (block_count entries) lose the MTP rows
        }
        out.set(kv.key, std::move(value));
    }
    int64_t dropped = 0;
    for (const gguf::TensorInfo& t : in->tensors()) {
        if (t.name.rfind("blk.", 0) == 0) {
            const size_t dot = t.name.find('.', 4);
            const int64_t block = std::stoll(t.name.substr(4, dot - 4));
            if (block >= trunk) {
                ++dropped;
                continue;
            }
        }
        std::vector<int64_t> ne(t.ne, t.ne + t.n_dims);
        const uint8_t* src = t.data;
        out.add_tensor(t.name, t.type, ne, [src](uint8_t* dst, size_t n) { std::copy(src, src + n, dst); });
    }
    if (dropped == 0) throw Error(in_path + ": " + nextn_key + " is set but no blk." + std::to_string(trunk) + ".* tensors exist");
    out.write(out_path);
}

}  // namespace strata
