#include "backend/cpu/quant_dot.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <utility>

#include "backend/cpu/dot_kernels.h"
#include "backend/cpu/gemm_packed.h"
#include "core/error.h"

namespace strata::cpu {

const char* isa_name(Isa isa) {
    switch (isa) {
        case Isa::Scalar: return "scalar";
        case Isa::Avx2: return "avx2";
        case Isa::Avx2Vnni: return "avx2-vnni";
        case Isa::Avx512: return "avx512";
    }
    return "?";
}

Isa detected_isa() {
    static const Isa isa = [] {
        __builtin_cpu_init();
        // The wide kernel files are compiled with -mavx2 -mfma -mf16c -mbmi2: all four must be there.
        const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2");
        if (!avx2) return Isa::Scalar;
        const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                            __builtin_cpu_supports("avx512vnni");
        if (avx512) return Isa::Avx512;
        return __builtin_cpu_supports("avxvnni") ? Isa::Avx2Vnni : Isa::Avx2;
    }();
    return isa;
}

namespace {
std::atomic<int> g_isa_override{-1};

// `want` where this CPU has it, else the best it has below: an AVX-512 CPU without AVX-VNNI (Skylake-X, Ice Lake)
// capped at Avx2Vnni runs plain AVX2.
Isa capped(Isa want) {
    const Isa best = detected_isa();
    if (static_cast<int>(want) >= static_cast<int>(best)) return best;
    if (want == Isa::Avx2Vnni && !__builtin_cpu_supports("avxvnni")) return Isa::Avx2;
    return want;
}
}  // namespace

bool supports_isa(Isa isa) { return capped(isa) == isa; }

void override_active_isa(std::optional<Isa> isa) {
    if (isa) isa = capped(*isa);
    g_isa_override.store(isa ? static_cast<int>(*isa) : -1);
}

Isa active_isa() {
    if (const int o = g_isa_override.load(std::memory_order_relaxed); o >= 0) return static_cast<Isa>(o);
    static const Isa isa = [] {
        const Isa best = detected_isa();
        const char* env = std::getenv("STRATA_ISA");
        if (!env || !*env) return best;
        const std::string_view want(env);
        Isa cap = best;
        if (want == "scalar") cap = Isa::Scalar;
        else if (want == "avx2-novnni") cap = Isa::Avx2;
        else if (want == "avx2" || want == "avx2-vnni") cap = Isa::Avx2Vnni;
        else if (want == "avx512") cap = Isa::Avx512;
        else
            std::fprintf(stderr, "strata: ignoring STRATA_ISA=%s (known: scalar, avx2-novnni, avx2, avx512); using %s\n",
                         env, isa_name(best));
        return capped(cap);
    }();
    return isa;
}

DType activation_type(DType weight) {
    switch (weight) {
        case DType::F32:
        case DType::F16:
        case DType::BF16: return DType::F32;
        case DType::Q8_0:
        case DType::Q4_0:
        case DType::IQ4_NL: return DType::Q8_0;
        default: return DType::Q8_K;
    }
}

void quantize_activations(DType act, const float* x, void* dst, int64_t n) {
    if (act == DType::F32) {
        std::memcpy(dst, x, static_cast<size_t>(n) * sizeof(float));
        return;
    }
    if (act == DType::Q8_K && active_isa() == Isa::Avx512) return quantize_q8_k_avx512(x, dst, n);
    if (act == DType::Q8_K && active_isa() != Isa::Scalar) return quantize_q8_k_avx2(x, dst, n);
    quantize_row(act, x, dst, n);
}

namespace {

struct Registry {
    DotTable native[kIsaCount];
    Registry() {
        register_dots_basic_scalar(native[0]);
        register_dots_kquant_scalar(native[0]);
        register_dots_klow_scalar(native[0]);
        register_dots_iq2_scalar(native[0]);
        register_dots_iq3_scalar(native[0]);
        register_dots_basic_avx2(native[1]);
        register_dots_kquant_avx2(native[1]);
        register_dots_klow_avx2(native[1]);
        register_dots_iq2_avx2(native[1]);
        register_dots_iq3_avx2(native[1]);
        // native[2], Avx2Vnni: no dot kernels of its own (AVX2's serve it); its packed GEMMs are in matmul.cpp.
        register_dots_basic_avx512(native[3]);
        register_dots_kquant_avx512(native[3]);
        register_dots_klow_avx512(native[3]);
        register_dots_iq2_avx512(native[3]);
        register_dots_iq3_avx512(native[3]);
    }
};

const Registry& registry() {
    static const Registry r;
    return r;
}

}  // namespace

bool has_native_dot(DType w, Isa isa) {
    const int id = static_cast<int>(w);
    return id < kMaxDTypeId && registry().native[static_cast<int>(isa)].fn[id] != nullptr;
}

namespace {

// The table entry dot_kernel(w, isa) uses.
std::pair<const DotTable*, int> kernel_entry(DType w, Isa isa) {
    const int id = static_cast<int>(w);
    if (id >= kMaxDTypeId) throw Error(std::string("no dot product for type ") + dtype_name(w));
    for (int i = static_cast<int>(isa); i >= 0; --i)
        if (registry().native[i].fn[id]) return {&registry().native[i], id};
    throw Error(std::string("no dot product for type ") + dtype_name(w));
}

}  // namespace

DotFn dot_kernel(DType w, Isa isa) {
    const auto [table, id] = kernel_entry(w, isa);
    return table->fn[id];
}

int dot_columns(DType w, Isa isa) {
    const auto [table, id] = kernel_entry(w, isa);
    return table->cols[id];
}

}  // namespace strata::cpu
