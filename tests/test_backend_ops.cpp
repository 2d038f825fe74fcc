// Op parity in the pattern of llama.cpp's test-backend-ops (issue 5): a table of cases {op, weight type, shape} runs
// against a backend and is checked against references that do not share its code. The backend abstraction is two
// calls (a row dot product, a matmul); today its only implementations are the CPU kernel sets, one per instruction
// set (backend/cpu/quant_dot.h), and a GPU backend joins by implementing the same two calls.
//
// Checks, per weight type and backend:
//   (a) the kernel against the scalar kernel of the same type (float reassociation only);
//   (b) the scalar kernel against the definition: a double-precision dot of dequantize_row(weight) and
//       dequantize_row(activation);
//   (c) the kernel against an f32 dot with the activations before their 8-bit quantization (llama.cpp's numerics);
//   (d) out[c] of a call with n_cols columns equals the n_cols = 1 call on that column, bit for bit;
//   (e) cpu::matmul against a reference matmul of dequantized rows in double, and independent of the thread count
//       and of how tokens are grouped (token t's row is the same alone or in a batch, in matmul and matmul_many);
// and quantize_activations against quantize_row and the Q8 formats' own definitions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/packed.h"
#include "backend/cpu/quant_dot.h"
#include "core/dtype.h"
#include "core/quant_blocks.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "test_util.h"

// Readable parameters in gtest's and ctest's output (found by argument-dependent lookup).
namespace strata {
void PrintTo(DType t, std::ostream* os) {
    *os << dtype_name(t);
}
namespace cpu {
void PrintTo(Isa isa, std::ostream* os) {
    *os << isa_name(isa);
}
}  // namespace cpu
}  // namespace strata

namespace {

using strata::DType;
using strata::cpu::Isa;
using strata::testing::gaussian_with_outliers;
namespace cpu = strata::cpu;

const DType kWeightTypes[] = {DType::F32,    DType::F16,     DType::BF16,  DType::Q8_0, DType::Q4_0,   DType::Q2_K,
                              DType::Q3_K,   DType::Q4_K,    DType::Q5_K,  DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS,
                              DType::IQ2_XS, DType::IQ3_XXS, DType::IQ3_S, DType::IQ1_M};
const Isa kIsas[] = {Isa::Scalar, Isa::Avx2, Isa::Avx2Vnni, Isa::Avx512};

// ---- thresholds (NMSE = sum (got - ref)^2 / sum ref^2 over all dots of one row length) ----------------------------

// (a), (b), (e): both sides compute the same products, exactly in integers for the quant types; what differs is the
// order in which f32 adds the per-block (or, for float weights, per-element) terms. Rounding in any order is a random
// walk of relative steps of 2^-24 ~ 6e-8: over N terms of random sign the relative error of a dot is about
// 6e-8 * sqrt(N), at most ~4e-6 for N = 4103, an NMSE near 1e-11. 1e-9 leaves two orders of headroom, while one
// misread block among the 135 of the longest rows already gives ~1/135 ~ 7e-3.
constexpr double kReassociationNmse = 1e-9;
// (c): rounding a gaussian activation to 8 bits adds uniform noise of step s = max|x| / 127 per block, so the dot
// gains noise of variance sum_i w_i^2 s^2 / 12 against a signal of about sum_i w_i^2 sigma^2: NMSE ~ (max/127)^2 / 12.
// For Q8_0 (blocks of 32, E max|x| ~ 2.1 sigma) that is ~2.3e-5, for Q8_K (blocks of 256, ~2.9 sigma) ~4.3e-5.
// The thresholds are ~4x those expectations: the statistic over a few hundred dots fluctuates well within that, and
// a wrong activation scale or a dropped correction term (mins, the -32 offset of Q6_K) costs 1e-3 or more.
constexpr double kQ8_0ActivationNmse = 1e-4;
constexpr double kQ8_KActivationNmse = 2e-4;
// (c) for float weights (F32 activations, nothing quantized): reassociation only, as (a).
constexpr double kF32ActivationNmse = kReassociationNmse;

struct Nmse {
    double err2 = 0, ref2 = 0;
    size_t n = 0;
    void add(double got, double ref) {
        err2 += (got - ref) * (got - ref);
        ref2 += ref * ref;
        ++n;
    }
    double value() const { return ref2 > 0 ? err2 / ref2 : err2; }
};

// ---- the backend abstraction ----------------------------------------------------------------------------------------

enum class Op { Dot, Matmul };

// out[c] = weight row . activation row c for c < n_cols; activation rows hold activation_type(type) blocks and start
// a_stride bytes apart.
struct DotCall {
    DType type;
    int64_t n;
    const void* w;
    const void* a;
    size_t a_stride;
    float* out;
    int n_cols;
};

// y = W x over n_tokens f32 rows (the op the models call), on `threads` threads (1: no pool).
struct MatmulCall {
    const strata::Tensor& w;
    const float* x;
    float* y;
    int64_t n_tokens;
    int threads;
};

class Backend {
  public:
    virtual ~Backend() = default;
    virtual std::string name() const = 0;
    // Why this backend cannot run `op` on weight type t on this machine (the test is skipped with these words), or
    // empty when it can.
    virtual std::string unsupported(Op op, DType t) const = 0;
    virtual void dot(const DotCall& call) const = 0;
    virtual void matmul(const MatmulCall& call) const = 0;
};

strata::ThreadPool* pool_of(int threads) {
    static strata::ThreadPool pool2(2), pool3(3);  // 3 > cores on small machines: rows still land on every thread
    if (threads <= 1) return nullptr;
    return threads == 2 ? &pool2 : &pool3;
}

// The CPU dot-product kernels of one instruction set.
class CpuBackend final : public Backend {
  public:
    explicit CpuBackend(Isa isa) : isa_(isa) {}
    std::string name() const override { return std::string("cpu-") + cpu::isa_name(isa_); }
    std::string unsupported(Op op, DType t) const override {
        if (!cpu::supports_isa(isa_))
            return std::string("this CPU has no ") + cpu::isa_name(isa_) +
                   " (detected: " + cpu::isa_name(cpu::detected_isa()) + ")";
        if (op == Op::Dot && !cpu::has_native_dot(t, isa_))
            return std::string("no ") + cpu::isa_name(isa_) + " kernel registered for " + strata::dtype_name(t) +
                   " (dot_kernel falls back to a lower instruction set, tested under that one)";
        return "";
    }
    void dot(const DotCall& c) const override {
        cpu::dot_kernel(c.type, isa_)(c.n, c.w, c.a, c.a_stride, c.out, c.n_cols);
    }
    void matmul(const MatmulCall& c) const override {
        cpu::override_active_isa(isa_);  // the matmul on this instruction set, whatever STRATA_ISA says
        cpu::matmul({.w = c.w, .x = c.x, .y = c.y, .n_tokens = c.n_tokens, .pool = pool_of(c.threads)});
        cpu::override_active_isa(std::nullopt);
    }

  private:
    Isa isa_;
};

// ---- inputs ---------------------------------------------------------------------------------------------------------

int64_t block_of(DType t) {
    return strata::traits(t).block_size;
}

bool is_float(DType t) {
    return t == DType::F32 || t == DType::F16 || t == DType::BF16;
}

// Whether a reference quantizer exists for t (the grid i-quants may dequantize only).
bool has_quantizer(DType t) {
    return is_float(t) || t == DType::Q8_0 || strata::quant::row_functions(t).from_f32 != nullptr;
}

// Activations: gaussian (the kind (c)'s threshold is derived for), gaussian with outliers, and +-1 of random sign
// (every 8-bit value at +-127, where a kernel's 16-bit intermediate sums come closest to saturating).
enum class ActKind { Gaussian, Outliers, Saturating };

std::vector<float> activation_values(ActKind kind, int64_t n, std::mt19937& rng) {
    if (kind == ActKind::Outliers) return gaussian_with_outliers(n, rng);
    std::vector<float> x(static_cast<size_t>(n));
    std::normal_distribution<float> gauss;
    for (float& v : x) v = kind == ActKind::Gaussian ? gauss(rng) : (rng() & 1 ? 1.0f : -1.0f);
    return x;
}

// Byte offsets of the f16 scale fields of a block of t (format facts: quant_blocks.h).
std::vector<size_t> f16_scale_offsets(DType t) {
    switch (t) {
        case DType::Q2_K:
            return {offsetof(strata::BlockQ2_K, d), offsetof(strata::BlockQ2_K, dmin)};
        case DType::Q3_K:
            return {offsetof(strata::BlockQ3_K, d)};
        case DType::Q4_K:
            return {offsetof(strata::BlockQ4_K, d), offsetof(strata::BlockQ4_K, dmin)};
        case DType::Q5_K:
            return {offsetof(strata::BlockQ5_K, d), offsetof(strata::BlockQ5_K, dmin)};
        case DType::Q6_K:
            return {offsetof(strata::BlockQ6_K, d)};
        case DType::IQ1_M:
            return {};  // d is spread over the top nibbles of scales: see random_blocks
        default:
            return {0};  // Q8_0, Q4_0, IQ4_NL, IQ4_XS, IQ2_XS, IQ3_XXS, IQ3_S: d comes first
    }
}

// n elements of random blocks of t: every field random (all bit patterns are valid blocks), except that the f16
// scales are kept finite and below 2 in magnitude (exponent's top bit clear), so the check is about the layout and
// not about infinities.
std::vector<uint8_t> random_blocks(DType t, int64_t n, std::mt19937& rng) {
    const size_t block_bytes = strata::traits(t).block_bytes;
    std::vector<uint8_t> bytes(strata::row_bytes(t, n));
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
    for (size_t at = 0; at < bytes.size(); at += block_bytes) {
        if (t == DType::IQ1_M) bytes[at + 55] &= 0xBF;  // d's top exponent bit: bit 14 of the last scales uint16
        for (size_t off : f16_scale_offsets(t)) bytes[at + off + 1] &= 0xBF;
    }
    return bytes;
}

// R weight rows of n elements, contiguous as in a tensor (so odd block counts leave rows unaligned, as in a GGUF),
// with their dequantized values.
struct WeightRows {
    int64_t n = 0;
    int rows = 0;
    size_t row_bytes = 0;
    std::vector<uint8_t> bytes;
    std::vector<float> values;  // rows x n, dequantize_row of the bytes
    const uint8_t* row(int r) const { return bytes.data() + static_cast<size_t>(r) * row_bytes; }
    const float* row_values(int r) const { return values.data() + static_cast<size_t>(r) * static_cast<size_t>(n); }
};

// Half the rows quantize gaussian values with outliers (the production path), half are random blocks (every code,
// scale and sign pattern); types without a quantizer get random blocks only, float types quantized values only.
WeightRows make_weight_rows(DType t, int64_t n, int rows, uint32_t seed) {
    std::mt19937 rng(seed);
    WeightRows w{.n = n, .rows = rows, .row_bytes = strata::row_bytes(t, n)};
    w.bytes.resize(w.row_bytes * static_cast<size_t>(rows));
    for (int r = 0; r < rows; ++r) {
        uint8_t* dst = w.bytes.data() + static_cast<size_t>(r) * w.row_bytes;
        const bool quantized = has_quantizer(t) && (is_float(t) || r % 2 == 0);
        if (quantized) {
            const std::vector<float> x = gaussian_with_outliers(n, rng);
            strata::quantize_row(t, x.data(), dst, n);
        } else {
            const std::vector<uint8_t> blocks = random_blocks(t, n, rng);
            std::memcpy(dst, blocks.data(), blocks.size());
        }
    }
    w.values.resize(static_cast<size_t>(n) * static_cast<size_t>(rows));
    for (int r = 0; r < rows; ++r) strata::dequantize_row(t, w.row(r), w.values.data() + r * n, n);
    return w;
}

// Rows are made once per (type, length) for the whole program (the grid quantizers search and are slow).
const WeightRows& weight_rows(DType t, int64_t n) {
    static std::map<std::pair<DType, int64_t>, std::unique_ptr<WeightRows>> cache;
    auto& slot = cache[{t, n}];
    if (!slot) slot = std::make_unique<WeightRows>(make_weight_rows(t, n, 16, static_cast<uint32_t>(n * 131 + 7)));
    return *slot;
}

double dot_double(const float* a, const float* b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * static_cast<double>(b[i]);
    return s;
}

// ---- the case table -------------------------------------------------------------------------------------------------

struct OpCase {
    Op op;
    int64_t n;       // Dot: elements per row; Matmul: the input width
    int n_cols = 1;  // Dot: columns per kernel call (1..dot_columns)
    size_t pad = 0;  // Dot: bytes between activation rows beyond the row itself
    ActKind kind = ActKind::Gaussian;
    int64_t out = 0;  // Matmul: output rows
};

// Row lengths: one block, 7 blocks (odd: the tail of any unrolled loop), 4096, and 4096 + 7 blocks. Float types
// (block 1) thereby get 1, 7 and 4103 elements: a vector loop's tail with no full vector at all, and one after many.
std::vector<int64_t> dot_lengths(DType t) {
    const int64_t b = block_of(t);
    return {b, 7 * b, 4096, 4096 + 7 * b};
}

std::vector<OpCase> op_cases(DType t) {
    std::vector<OpCase> cases;
    // Activation padding: none (rows back to back), 12 bytes (rows lose their block alignment) and 100 bytes.
    const std::pair<size_t, ActKind> layouts[] = {
        {0, ActKind::Gaussian}, {12, ActKind::Gaussian}, {100, ActKind::Outliers}, {12, ActKind::Saturating}};
    for (int64_t n : dot_lengths(t))
        for (int cols : {1, 2, 3, 4, 7, 16})
            for (const auto& [pad, kind] : layouts)
                cases.push_back({.op = Op::Dot, .n = n, .n_cols = cols, .pad = pad, .kind = kind});
    // Matmul: widths that every type's block divides; output counts that do not divide the row units.
    for (const auto& [in, out] : {std::pair<int64_t, int64_t>{768, 5}, {1792, 67}})
        cases.push_back({.op = Op::Matmul, .n = in, .out = out});
    return cases;
}

// One Dot case run: the backend's outputs with the references they are checked against.
struct DotResult {
    std::vector<float> got;            // rows x n_cols, from the backend
    std::vector<float> scalar;         // the scalar kernel of the type
    std::vector<float> columns_alone;  // the backend with n_cols = 1 on each column
    std::vector<double> exact;         // double dot of the dequantized weight and activation rows
    std::vector<double> unquantized;   // double dot of the dequantized weight and the f32 activations
};

DotResult run_dot_case(const Backend& backend, DType t, const OpCase& c, uint32_t seed) {
    const WeightRows& w = weight_rows(t, c.n);
    const DType act = cpu::activation_type(t);
    const size_t act_row = strata::row_bytes(act, c.n);
    const size_t stride = act_row + c.pad;
    // Exactly as large as the last row needs, so that a kernel reading past it meets the allocation's end.
    std::vector<uint8_t> a(stride * static_cast<size_t>(c.n_cols - 1) + act_row, 0xA5);
    std::vector<std::vector<float>> x, x_rounded;
    std::mt19937 rng(seed);
    for (int col = 0; col < c.n_cols; ++col) {
        x.push_back(activation_values(c.kind, c.n, rng));
        cpu::quantize_activations(act, x.back().data(), a.data() + col * stride, c.n);
        x_rounded.emplace_back(static_cast<size_t>(c.n));
        strata::dequantize_row(act, a.data() + col * stride, x_rounded.back().data(), c.n);
    }
    DotResult r;
    const size_t cells = static_cast<size_t>(w.rows * c.n_cols);
    r.got.resize(cells);
    r.scalar.resize(cells);
    r.columns_alone.resize(cells);
    const cpu::DotFn scalar = cpu::dot_kernel(t, Isa::Scalar);
    for (int row = 0; row < w.rows; ++row) {
        float* out = r.got.data() + row * c.n_cols;
        backend.dot(
            {.type = t, .n = c.n, .w = w.row(row), .a = a.data(), .a_stride = stride, .out = out, .n_cols = c.n_cols});
        for (int col = 0; col < c.n_cols; col += cpu::kDotCols)  // every kernel takes kDotCols columns
            scalar(c.n, w.row(row), a.data() + col * stride, stride, r.scalar.data() + row * c.n_cols + col,
                   std::min(cpu::kDotCols, c.n_cols - col));
        for (int col = 0; col < c.n_cols; ++col) {
            // The stride of a one-column call is never read; a wrong one must not matter.
            backend.dot({.type = t,
                         .n = c.n,
                         .w = w.row(row),
                         .a = a.data() + col * stride,
                         .a_stride = 1,
                         .out = r.columns_alone.data() + row * c.n_cols + col,
                         .n_cols = 1});
            r.exact.push_back(dot_double(w.row_values(row), x_rounded[static_cast<size_t>(col)].data(), c.n));
            r.unquantized.push_back(dot_double(w.row_values(row), x[static_cast<size_t>(col)].data(), c.n));
        }
    }
    return r;
}

std::string case_name(const OpCase& c) {
    static const char* kinds[] = {"gaussian", "outliers", "saturating"};
    return "n " + std::to_string(c.n) + ", " + std::to_string(c.n_cols) + " cols, pad " + std::to_string(c.pad) + ", " +
           kinds[static_cast<int>(c.kind)];
}

// ---- (a), (c), (d): the dot kernels of every (type, instruction set) ------------------------------------------------

using TypeIsa = std::tuple<DType, Isa>;

std::string type_isa_name(const ::testing::TestParamInfo<TypeIsa>& info) {
    std::string name =
        std::string(strata::dtype_name(std::get<0>(info.param))) + "_" + cpu::isa_name(std::get<1>(info.param));
    std::replace(name.begin(), name.end(), '-', '_');  // gtest names: letters, digits and underscores
    return name;
}

struct CaseResult {
    OpCase c;
    DotResult r;
};

// Every Dot case of type t on one backend, run once per program and shared by the checks below.
const std::vector<CaseResult>& dot_results(DType t, Isa isa) {
    static std::map<std::pair<DType, Isa>, std::vector<CaseResult>> cache;
    auto [it, fresh] = cache.try_emplace({t, isa});
    if (fresh) {
        const CpuBackend backend(isa);
        uint32_t seed = 1;
        const int max_cols = backend.unsupported(Op::Dot, t).empty() ? cpu::dot_columns(t, isa) : cpu::kDotCols;
        for (const OpCase& c : op_cases(t))
            if (c.op == Op::Dot && c.n_cols <= max_cols) it->second.push_back({c, run_dot_case(backend, t, c, seed++)});
    }
    return it->second;
}

class DotParity : public ::testing::TestWithParam<TypeIsa> {
  protected:
    void SetUp() override {
        type_ = std::get<0>(GetParam());
        backend_ = std::make_unique<CpuBackend>(std::get<1>(GetParam()));
        if (std::string why = backend_->unsupported(Op::Dot, type_); !why.empty()) GTEST_SKIP() << why;
    }
    // fn(case, result) for every Dot case.
    template <class Fn>
    void for_each_dot_case(Fn fn) {
        for (const CaseResult& cr : dot_results(type_, std::get<1>(GetParam()))) {
            SCOPED_TRACE(case_name(cr.c));
            fn(cr.c, cr.r);
        }
    }
    DType type_{};
    std::unique_ptr<Backend> backend_;
};

TEST_P(DotParity, MatchesTheScalarKernel) {
    std::map<int64_t, Nmse> by_length;
    for_each_dot_case([&](const OpCase& c, const DotResult& r) {
        for (size_t i = 0; i < r.got.size(); ++i) by_length[c.n].add(r.got[i], r.scalar[i]);
    });
    for (const auto& [n, e] : by_length)
        EXPECT_LE(e.value(), kReassociationNmse)
            << backend_->name() << " vs scalar, rows of " << n << " (" << e.n << " dots)";
}

TEST_P(DotParity, MatchesF32DotOfUnquantizedActivations) {
    const DType act = cpu::activation_type(type_);
    const double limit = act == DType::F32    ? kF32ActivationNmse
                         : act == DType::Q8_0 ? kQ8_0ActivationNmse
                                              : kQ8_KActivationNmse;
    std::map<int64_t, Nmse> by_length;
    for_each_dot_case([&](const OpCase& c, const DotResult& r) {
        if (c.kind != ActKind::Gaussian) return;  // the threshold is derived for gaussian activations
        for (size_t i = 0; i < r.got.size(); ++i) by_length[c.n].add(r.got[i], r.unquantized[i]);
    });
    double worst = 0;
    for (const auto& [n, e] : by_length) {
        worst = std::max(worst, e.value());
        EXPECT_LE(e.value(), limit) << backend_->name() << ", activations " << strata::dtype_name(act) << ", rows of "
                                    << n << " (" << e.n << " dots)";
    }
    std::printf("[backend-ops] %-8s %-11s activations %-4s NMSE vs f32: %.2e (limit %.0e)\n", strata::dtype_name(type_),
                backend_->name().c_str(), strata::dtype_name(act), worst, limit);
}

TEST_P(DotParity, ColumnsAreBitIdenticalToOneColumnCalls) {
    for_each_dot_case([&](const OpCase& c, const DotResult& r) {
        for (size_t i = 0; i < r.got.size(); ++i) {
            // Bit patterns, not values: -0 vs +0 or a NaN would be a difference too.
            uint32_t got = 0, alone = 0;
            std::memcpy(&got, &r.got[i], 4);
            std::memcpy(&alone, &r.columns_alone[i], 4);
            ASSERT_EQ(got, alone) << "row " << i / static_cast<size_t>(c.n_cols) << " col "
                                  << i % static_cast<size_t>(c.n_cols) << ": " << r.got[i] << " vs "
                                  << r.columns_alone[i];
        }
    });
}

INSTANTIATE_TEST_SUITE_P(Ops, DotParity,
                         ::testing::Combine(::testing::ValuesIn(kWeightTypes), ::testing::ValuesIn(kIsas)),
                         type_isa_name);

// ---- (b): the scalar kernels against the definition -----------------------------------------------------------------

class ScalarDot : public ::testing::TestWithParam<DType> {};

TEST_P(ScalarDot, MatchesDoubleDotOfDequantizedRows) {
    const DType t = GetParam();
    if (!cpu::has_native_dot(t, Isa::Scalar))
        GTEST_SKIP() << "no scalar kernel registered for " << strata::dtype_name(t)
                     << " (dot_kernel dequantizes both rows: the definition itself)";
    std::map<int64_t, Nmse> by_length;
    for (const CaseResult& cr : dot_results(t, Isa::Scalar))
        for (size_t i = 0; i < cr.r.got.size(); ++i) by_length[cr.c.n].add(cr.r.got[i], cr.r.exact[i]);
    // The scalar kernel sums exact integer products per block and then f32 block terms; the definition sums the same
    // products in double: reassociation and the f32 rounding of the dequantized values only.
    for (const auto& [n, e] : by_length)
        EXPECT_LE(e.value(), kReassociationNmse) << "rows of " << n << " (" << e.n << " dots)";
}

std::string type_name(const ::testing::TestParamInfo<DType>& info) {
    return strata::dtype_name(info.param);
}

INSTANTIATE_TEST_SUITE_P(Ops, ScalarDot, ::testing::ValuesIn(kWeightTypes), type_name);

// ---- (e): matmul ----------------------------------------------------------------------------------------------------

class MatmulParity : public ::testing::TestWithParam<TypeIsa> {};

// y[t] of the reference: dequantized weight rows against the activations quantized as matmul quantizes them and
// dequantized again, dotted in double.
std::vector<double> reference_matmul(const WeightRows& w, DType t, const float* x, int64_t n_tokens) {
    const DType act = cpu::activation_type(t);
    std::vector<uint8_t> q(strata::row_bytes(act, w.n));
    std::vector<float> rounded(static_cast<size_t>(w.n));
    std::vector<double> y;
    for (int64_t tok = 0; tok < n_tokens; ++tok) {
        cpu::quantize_activations(act, x + tok * w.n, q.data(), w.n);
        strata::dequantize_row(act, q.data(), rounded.data(), w.n);
        for (int r = 0; r < w.rows; ++r) y.push_back(dot_double(w.row_values(r), rounded.data(), w.n));
    }
    return y;
}

bool same_bits(const float* a, const float* b, size_t n) {
    return std::memcmp(a, b, n * sizeof(float)) == 0;
}

// Each of max_tokens tokens alone, no pool (the rows every other grouping must reproduce bit for bit), against the
// reference: the same integer products summed in another order. Then each (tokens, threads) grouping must give those
// bits. Returns the tokens computed alone.
std::vector<float> expect_reference_in_any_grouping(const CpuBackend& backend, const strata::Tensor& w,
                                                    const WeightRows& rows, DType t, const OpCase& c,
                                                    const std::vector<float>& x, int64_t max_tokens,
                                                    std::initializer_list<std::pair<int64_t, int>> groupings,
                                                    const char* what) {
    const size_t out = static_cast<size_t>(c.out);
    std::vector<float> alone(out * static_cast<size_t>(max_tokens));
    for (int64_t tok = 0; tok < max_tokens; ++tok)
        backend.matmul(
            {.w = w, .x = x.data() + tok * c.n, .y = alone.data() + tok * c.out, .n_tokens = 1, .threads = 1});
    const std::vector<double> ref = reference_matmul(rows, t, x.data(), max_tokens);
    Nmse e;
    for (size_t i = 0; i < alone.size(); ++i) e.add(alone[i], ref[i]);
    EXPECT_LE(e.value(), kReassociationNmse) << what << " vs reference";
    for (const auto& [n_tokens, threads] : groupings) {
        std::vector<float> y(out * static_cast<size_t>(n_tokens), -1.0f);
        backend.matmul({.w = w, .x = x.data(), .y = y.data(), .n_tokens = n_tokens, .threads = threads});
        EXPECT_TRUE(same_bits(y.data(), alone.data(), y.size()))
            << what << ": " << n_tokens << " tokens on " << threads << " threads differ from the tokens computed alone";
    }
    return alone;
}

TEST_P(MatmulParity, MatchesReferenceForAnyThreadsAndGrouping) {
    const DType t = std::get<0>(GetParam());
    const CpuBackend backend(std::get<1>(GetParam()));
    if (std::string why = backend.unsupported(Op::Matmul, t); !why.empty()) GTEST_SKIP() << why;
    constexpr int64_t kMaxTokens = 17;
    uint32_t seed = 5000;
    for (const OpCase& c : op_cases(t)) {
        if (c.op != Op::Matmul) continue;
        SCOPED_TRACE("W {" + std::to_string(c.n) + ", " + std::to_string(c.out) + "}");
        const auto rows = std::make_unique<WeightRows>(make_weight_rows(t, c.n, static_cast<int>(c.out), seed++));
        const int64_t ne[2] = {c.n, c.out};
        const strata::Tensor w = strata::make_tensor("w", t, 2, ne, rows->bytes.data());
        std::mt19937 rng(seed++);
        const std::vector<float> x = activation_values(ActKind::Gaussian, c.n * kMaxTokens, rng);
        const size_t out = static_cast<size_t>(c.out);

        // As (a)/(b). Token counts below, at and above the columns per kernel call (4, or 16 for the grid i-quants);
        // thread counts 1 (no pool), 2, and 3 (more threads than this machine has cores, so ranges are claimed out of
        // order).
        const std::vector<float> alone = expect_reference_in_any_grouping(
            backend, w, *rows, t, c, x, kMaxTokens,
            {{1, 2}, {3, 1}, {3, 3}, {kMaxTokens, 1}, {kMaxTokens, 2}, {kMaxTokens, 3}}, "matmul");

        // matmul_many: two weights reading the same x (gate and up) plus a shorter job on that x share one quantized
        // copy; each must still give exactly what it gives alone.
        const auto rows2 = std::make_unique<WeightRows>(make_weight_rows(t, c.n, static_cast<int>(c.out), seed++));
        const strata::Tensor w2 = strata::make_tensor("w2", t, 2, ne, rows2->bytes.data());
        std::vector<float> alone2(out * kMaxTokens);
        backend.matmul({.w = w2, .x = x.data(), .y = alone2.data(), .n_tokens = kMaxTokens, .threads = 1});
        std::vector<float> y1(out * kMaxTokens), y2(out * kMaxTokens), y3(out * 3);
        const cpu::MatmulJob jobs[] = {{.w = &w, .x = x.data(), .y = y1.data(), .n_tokens = kMaxTokens},
                                       {.w = &w2, .x = x.data(), .y = y2.data(), .n_tokens = kMaxTokens},
                                       {.w = &w, .x = x.data(), .y = y3.data(), .n_tokens = 3}};
        cpu::override_active_isa(std::get<1>(GetParam()));
        cpu::matmul_many(jobs, pool_of(2));
        cpu::override_active_isa(std::nullopt);
        EXPECT_TRUE(same_bits(y1.data(), alone.data(), y1.size())) << "matmul_many job 1";
        EXPECT_TRUE(same_bits(y2.data(), alone2.data(), y2.size())) << "matmul_many job 2";
        EXPECT_TRUE(same_bits(y3.data(), alone.data(), y3.size())) << "matmul_many job 3 (3 tokens of the same x)";
    }
}

// The same checks with the weights packed at load where this instruction set packs the type (packed.h: the GEMMs over
// 16-row groups): the packed GEMM against the reference, and the same bits for any token grouping and thread count.
TEST_P(MatmulParity, PackedMatchesReferenceForAnyThreadsAndGrouping) {
    const DType t = std::get<0>(GetParam());
    const Isa isa = std::get<1>(GetParam());
    const CpuBackend backend(isa);
    if (std::string why = backend.unsupported(Op::Matmul, t); !why.empty()) GTEST_SKIP() << why;
    if (!cpu::has_packed_gemm(t, isa)) GTEST_SKIP() << "no packed GEMM for this type on " << cpu::isa_name(isa);
    constexpr int64_t kMaxTokens = 17;
    uint32_t seed = 7000;
    for (const OpCase& c : op_cases(t)) {
        if (c.op != Op::Matmul) continue;
        SCOPED_TRACE("W {" + std::to_string(c.n) + ", " + std::to_string(c.out) + "}");
        const auto rows = std::make_unique<WeightRows>(make_weight_rows(t, c.n, static_cast<int>(c.out), seed++));
        const int64_t ne[2] = {c.n, c.out};
        strata::Tensor w = strata::make_tensor("w", t, 2, ne, rows->bytes.data());
        cpu::PackedWeights packer;
        cpu::override_active_isa(isa);  // packable() asks the active instruction set
        const bool packed = packer.pack(w);
        cpu::override_active_isa(std::nullopt);
        ASSERT_TRUE(packed);
        std::mt19937 rng(seed++);
        const std::vector<float> x = activation_values(ActKind::Gaussian, c.n * kMaxTokens, rng);
        expect_reference_in_any_grouping(backend, w, *rows, t, c, x, kMaxTokens,
                                         {{3, 1}, {kMaxTokens, 1}, {kMaxTokens, 2}, {kMaxTokens, 3}}, "packed matmul");
    }
}

INSTANTIATE_TEST_SUITE_P(Ops, MatmulParity,
                         ::testing::Combine(::testing::ValuesIn(kWeightTypes), ::testing::ValuesIn(kIsas)),
                         type_isa_name);

// ---- activation quantization ----------------------------------------------------------------------------------------

TEST(QuantizeActivations, EqualsQuantizeRowAndTheFormatsDefinition) {
    std::mt19937 rng(99);
    for (Isa isa : kIsas)
        for (DType act : {DType::Q8_0, DType::Q8_K}) {
            if (!cpu::supports_isa(isa)) continue;
            struct Held {  // the quantizer of this instruction set, released however the checks end
                explicit Held(Isa i) { cpu::override_active_isa(i); }
                ~Held() { cpu::override_active_isa(std::nullopt); }
            } held(isa);
            SCOPED_TRACE(std::string(strata::dtype_name(act)) + " on " + cpu::isa_name(isa));
            for (int64_t n : {block_of(act), 7 * block_of(act), int64_t{4096}})
                for (ActKind kind : {ActKind::Gaussian, ActKind::Outliers, ActKind::Saturating}) {
                    const std::vector<float> x = activation_values(kind, n, rng);
                    std::vector<uint8_t> ours(strata::row_bytes(act, n)), row(ours.size());
                    cpu::quantize_activations(act, x.data(), ours.data(), n);
                    strata::quantize_row(act, x.data(), row.data(), n);
                    ASSERT_EQ(ours, row) << "n " << n;
                    // The definition: each value within half a step of x (plus, for Q8_0, the f16 rounding of the
                    // step times |q| <= 127: 2^-11 relative); Q8_K's bsums are the sums of each 16 values.
                    std::vector<float> back(static_cast<size_t>(n));
                    strata::dequantize_row(act, ours.data(), back.data(), n);
                    for (int64_t b = 0; b < n / block_of(act); ++b) {
                        float d = 0;
                        const uint8_t* block = ours.data() + static_cast<size_t>(b) * strata::traits(act).block_bytes;
                        if (act == DType::Q8_0) {
                            uint16_t h = 0;
                            std::memcpy(&h, block, 2);
                            d = strata::f16_to_f32(h);
                        } else {
                            const auto* q8k = reinterpret_cast<const strata::BlockQ8_K*>(block);
                            d = q8k->d;
                            for (int j = 0; j < 16; ++j) {
                                int sum = 0;
                                for (int k = 0; k < 16; ++k) sum += q8k->qs[16 * j + k];
                                ASSERT_EQ(q8k->bsums[j], sum) << "block " << b << " bsum " << j;
                            }
                        }
                        const double slack = act == DType::Q8_0 ? 0.5 + 127.0 / 2048.0 : 0.5 + 1e-4;
                        for (int64_t i = b * block_of(act); i < (b + 1) * block_of(act); ++i)
                            ASSERT_LE(std::fabs(static_cast<double>(back[i]) - x[i]), slack * std::fabs(d) + 1e-30)
                                << "n " << n << " element " << i;
                    }
                }
        }
    // F32 activations (float weights) are the values themselves.
    const std::vector<float> x = activation_values(ActKind::Gaussian, 83, rng);
    std::vector<float> copy(x.size());
    cpu::quantize_activations(DType::F32, x.data(), copy.data(), 83);
    EXPECT_EQ(copy, x);
}

}  // namespace
