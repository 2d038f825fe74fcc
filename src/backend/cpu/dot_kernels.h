// Private to the CPU backend: the table the kernel files fill in. Each file registers the kernels it defines for one
// instruction set; quant_dot.cpp calls the register functions once. Kernel files compiled with -mavx2 / -mavxvnni /
// -mavx512* (the _avx2.cpp / _avxvnni.cpp / _avx512.cpp suffixes, see CMakeLists.txt) must keep every function they define in an anonymous
// namespace and use no inline templates shared with other files, so no wide instruction leaks into a common symbol.
#pragma once

#include "backend/cpu/quant_dot.h"

namespace strata::cpu {

constexpr int kMaxDTypeId = 40;
struct DotTable {
    DotFn fn[kMaxDTypeId] = {};
    int cols[kMaxDTypeId] = {};
    void set(DType t, DotFn f, int max_cols = kDotCols) {
        fn[static_cast<int>(t)] = f;
        cols[static_cast<int>(t)] = max_cols;
    }
};

// One register function per family and instruction set (file dot_<family>_<isa>.cpp). Scalar kernels are
// llama.cpp's generic integer dot products; they are the fallback where no wider kernel exists.
void register_dots_basic_scalar(DotTable& t);  // F32, F16, BF16, Q8_0, Q4_0, IQ4_NL, IQ4_XS
void register_dots_kquant_scalar(DotTable& t);  // Q4_K, Q5_K, Q6_K
void register_dots_klow_scalar(DotTable& t);  // Q2_K, Q3_K
void register_dots_iq2_scalar(DotTable& t);  // IQ2_XS, IQ1_M
void register_dots_iq3_scalar(DotTable& t);  // IQ3_XXS, IQ3_S

void register_dots_basic_avx2(DotTable& t);  // F32, F16, BF16, Q8_0, Q4_0, IQ4_NL, IQ4_XS
void register_dots_kquant_avx2(DotTable& t);  // Q4_K, Q5_K, Q6_K
void register_dots_klow_avx2(DotTable& t);  // Q2_K, Q3_K
void register_dots_iq2_avx2(DotTable& t);  // IQ2_XS, IQ1_M
void register_dots_iq3_avx2(DotTable& t);  // IQ3_XXS, IQ3_S

void register_dots_basic_avx512(DotTable& t);  // F32, F16, BF16, Q8_0, Q4_0, IQ4_NL, IQ4_XS
void register_dots_kquant_avx512(DotTable& t);  // Q4_K, Q5_K, Q6_K
void register_dots_klow_avx512(DotTable& t);  // Q2_K, Q3_K
void register_dots_iq2_avx512(DotTable& t);  // IQ2_XS, IQ1_M
void register_dots_iq3_avx512(DotTable& t);  // IQ3_XXS, IQ3_S

}  // namespace strata::cpu
