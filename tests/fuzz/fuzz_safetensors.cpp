// libFuzzer entry for the safetensors reader: any input must either parse or throw strata::Error, and every tensor
// of a parsed file must read without leaving the input.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "format/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::unique_ptr<strata::SafetensorsSet> set;
    try {
        set = strata::SafetensorsSet::open_memory(data, size, "fuzz.safetensors");
    } catch (const strata::Error&) {
        return 0;
    }
    for (const auto& name : set->names()) {
        const auto& info = set->get(name);
        if (info.n_bytes && (info.data < data || info.data + info.n_bytes > data + size)) {
            std::fprintf(stderr, "fuzz_safetensors: tensor %s outside the input\n", name.c_str());
            std::abort();
        }
        try {
            (void)set->read_f32(name);
        } catch (const strata::Error&) {
        }
        try {
            (void)set->read_i64(name);
        } catch (const strata::Error&) {
        }
    }
    return 0;
}
