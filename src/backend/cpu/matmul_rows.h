// matmul() in its two halves, for callers that schedule the work themselves (runtime/cpu_expert_pool.h: CPU expert
// workers claiming (expert, row range) units): plan how a weight's activations are laid out for n tokens, quantize
// each token's row into that layout, then compute any range of output rows from them. The same kernels in the same
// order as matmul() (which is built on these), so the rows are bit-identical to matmul's for the same weight and
// tokens; nothing here allocates (the caller passes the scratch).
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cpu/quant_dot.h"
#include "core/tensor.h"

namespace strata::cpu {

struct PackedGemm;

struct MatmulRowsPlan {
    const Tensor* w = nullptr;  // 2-D {in, out}
    int64_t n_tokens = 0;
    Isa isa = Isa::Scalar;   // the instruction set planned for (active_isa() when planned)
    DType act = DType::F32;  // activation_type(w->type)
    uint8_t layout = 0;      // how the activations are laid out (matmul.cpp's ActLayout)
    size_t act_stride = 0;   // bytes of one token's activations
    int64_t row_align = 1;   // row ranges start at multiples of this (packed weights: a group of kPackRows rows)
    // Which kernel reads them (matmul.cpp's dispatch).
    DotFn kernel = nullptr;                     // null: the packed GEMM
    void (*gemm)(const PackedGemm&) = nullptr;  // the packed GEMM of this type and instruction set
    int cols = kDotCols;                        // columns per kernel call
    bool decode_once = false;                   // IQ2_XS with AVX-512: a unit's rows decoded once for all its tokens
    bool by_group = false;                      // ... in the AVX-512 by-group layout
    bool rows8 = false;                         // IQ2_XS with AVX2: rows decoded 8 at a time
    bool i16 = false;                           // Q8_0 prompts with AVX2 alone: a group widened to int16 at a time

    // Whether a plan's quantized activations serve this one too (an expert's gate and up share them).
    bool same_activations(const MatmulRowsPlan& o) const {
        return act == o.act && layout == o.layout && act_stride == o.act_stride && w->ne[0] == o.w->ne[0];
    }
};

// For w (2-D, any computable type) and n_tokens tokens, on active_isa().
MatmulRowsPlan plan_matmul_rows(const Tensor& w, int64_t n_tokens);

// One token's activations: the w->ne[0] floats at x quantized into dst (plan.act_stride bytes; dst 64-byte aligned).
// A token's activations are row t of an array whose rows are plan.act_stride bytes apart.
void quantize_matmul_row(const MatmulRowsPlan& plan, const float* x, uint8_t* dst);

// y[t * out + r] for t < plan.n_tokens and row_begin <= r < row_end (out = w->ne[1]; row_begin a multiple of
// plan.row_align): the outputs matmul() gives. `scratch` (64-byte aligned) holds at least
// matmul_rows_scratch_bytes(plan, row_end - row_begin) bytes.
void matmul_rows(const MatmulRowsPlan& plan, const uint8_t* act, float* y, int64_t row_begin, int64_t row_end,
                 uint8_t* scratch);
size_t matmul_rows_scratch_bytes(const MatmulRowsPlan& plan, int64_t n_rows);

// Bounds over every type and instruction set, for scratch sized up front: one token's activations of `in` values,
// and matmul_rows_scratch_bytes for n_rows rows of `in` values.
size_t matmul_rows_act_bytes_bound(int64_t in);
size_t matmul_rows_scratch_bound(int64_t in, int64_t n_rows);

}  // namespace strata::cpu
