// Private to the CPU backend: generic loops compiled three times (x86-64-v4, x86-64-v3, baseline) and called in the
// copy that matches active_isa(). GCC's target_clones picks by CPUID alone, so `STRATA_ISA=avx2-novnni` on an
// AVX-512 machine still ran the AVX-512 copies: the loops were faster there than on a real AVX2 machine.
#pragma once

#include "backend/cpu/quant_dot.h"

// Defines `ret name params` over `static inline ret name##_body params` (defined before, always inlined so that each
// copy vectorizes its loops for its own instruction set); `args` is the parenthesised argument list.
#define STRATA_ISA_CLONES(ret, name, params, args)                          \
    __attribute__((target("arch=x86-64-v4"))) static ret name##_v4 params { \
        return name##_body args;                                            \
    }                                                                       \
    __attribute__((target("arch=x86-64-v3"))) static ret name##_v3 params { \
        return name##_body args;                                            \
    }                                                                       \
    ret name params {                                                       \
        switch (::strata::cpu::active_isa()) {                              \
            case ::strata::cpu::Isa::Avx512:                                \
                return name##_v4 args;                                      \
            case ::strata::cpu::Isa::Avx2:                                  \
            case ::strata::cpu::Isa::Avx2Vnni:                              \
                return name##_v3 args;                                      \
            case ::strata::cpu::Isa::Scalar:                                \
                break;                                                      \
        }                                                                   \
        return name##_body args;                                            \
    }
