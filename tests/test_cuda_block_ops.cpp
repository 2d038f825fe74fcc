// CUDA parity of the small per-token ops of the model's blocks (backend/cuda/block_ops.h, issue 7) against the CPU
// code each one stands for: embedding rows (cpu::get_row, F32 / F16 / Q8_0 / Q4_K / IQ2_XS tables, out-of-range tokens
// giving zeros, hc copies), NEOX rope at device positions (cpu::rope_neox), the GDN activations and gates and its gated
// output norm (the loops of model/gdn.cpp), row stores at positions and the QSA indexer's pooled keys (the loop of
// index_append in model/attention.cpp), the PLE gate and residual update (gate_and_conv in model/ple.cpp) and the
// residual add. Shapes include odd widths and strides; every output sits between poisoned sentinels that must stay
// poisoned, and values the op must not write are checked unchanged. A captured graph replayed with new tokens and
// positions must give the eager launches' bits (what the model's graph relies on).
//
// Without the CUDA backend compiled in (-DSTRATA_CUDA=ON) or without a GPU, every test skips with a message saying so.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"

#if STRATA_HAS_CUDA
#include <cuda_runtime.h>

#include "backend/cuda/block_ops.h"
#include "backend/cuda/cuda_backend.h"
#include "cuda_test_util.h"
#endif

namespace {

#if !STRATA_HAS_CUDA

TEST(CudaBlockOps, SkippedWithoutTheBackend) {
    GTEST_SKIP() << "CUDA backend not compiled in (configure with -DSTRATA_CUDA=ON): CUDA block-op tests skipped";
}

#else

using strata::DType;
namespace cuda = strata::cuda;
namespace cpu = strata::cpu;
using namespace strata::cuda_test;
constexpr const char* kDeviceTests = "CUDA block-op tests";

constexpr int64_t kSentinels = 64;  // poisoned values before and after every output

std::string str(int64_t v) {
    return std::to_string(v);
}

// The name of a rotation case: heads of head_dim values at head_stride, tokens at token_stride.
std::string rope_case(const char* op, int64_t tokens, int64_t heads, int64_t head_dim, int64_t n_rot,
                      int64_t head_stride, int64_t token_stride) {
    return std::string(op) + " tokens " + str(tokens) + " heads " + str(heads) + " dim " + str(head_dim) + " n_rot " +
           str(n_rot) + " strides " + str(head_stride) + "/" + str(token_stride);
}

// A device copy of `data` between kSentinels poisoned values on each side (for in-place ops the data is the input).
struct Guarded {
    size_t n = 0;
    cuda::DeviceBuffer buf;

    explicit Guarded(const std::vector<float>& data) : n(data.size()) {
        std::vector<float> all(n + 2 * kSentinels, poison());
        std::copy(data.begin(), data.end(), all.begin() + kSentinels);
        buf = context().upload(all.data(), all.size() * sizeof(float), "test");
    }
    static Guarded poisoned(size_t count) { return Guarded(std::vector<float>(count, poison())); }
    float* ptr() const { return buf.as<float>() + kSentinels; }

    // The values; adds a failure naming `what` if a sentinel changed (a write out of bounds).
    std::vector<float> read(const std::string& what) const {
        const std::vector<float> all = download<float>(buf.data(), n + 2 * kSentinels);
        int64_t clobbered = 0;
        for (int64_t i = 0; i < kSentinels; ++i)
            clobbered += !is_poison(all[static_cast<size_t>(i)]) + !is_poison(all[n + kSentinels + i]);
        EXPECT_EQ(clobbered, 0) << what << ": values written outside the output";
        return std::vector<float>(all.begin() + kSentinels, all.begin() + kSentinels + static_cast<std::ptrdiff_t>(n));
    }
};

// The largest |got - ref| / |ref| (|ref| floored at 1e-30 so exact zeros compare absolutely); infinite when got is
// not finite where ref is (a NaN, or a poisoned value left unwritten).
double max_relative_error(const std::vector<float>& got, const std::vector<float>& ref) {
    double worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        if (std::memcmp(&got[i], &ref[i], 4) == 0) continue;
        if (!std::isfinite(got[i])) return INFINITY;
        worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - ref[i]) /
                                    std::max(std::fabs(static_cast<double>(ref[i])), 1e-30));
    }
    return worst;
}

int64_t count_differing(const std::vector<float>& got, const std::vector<float>& ref) {
    int64_t n = 0;
    for (size_t i = 0; i < ref.size(); ++i) n += std::memcmp(&got[i], &ref[i], 4) != 0;
    return n;
}

int64_t count_non_finite(const std::vector<float>& v) {
    int64_t n = 0;
    for (float x : v) n += !std::isfinite(x);
    return n;
}

// How an op's output must agree with the CPU's.
enum class Agree { Bits, Relative, Nmse };

void expect_agrees(const std::string& what, const std::vector<float>& got, const std::vector<float>& ref, Agree how,
                   double bound = 0) {
    ASSERT_EQ(got.size(), ref.size()) << what;
    EXPECT_EQ(count_non_finite(got), count_non_finite(ref)) << what << ": NaN, inf or unwritten values";
    const int64_t differing = count_differing(got, ref);
    double err = 0;
    switch (how) {
        case Agree::Bits: EXPECT_EQ(differing, 0) << what << ": not bit-identical to the CPU"; break;
        case Agree::Relative:
            err = max_relative_error(got, ref);
            EXPECT_LE(err, bound) << what << ": max relative error";
            break;
        case Agree::Nmse:
            err = nmse(got, ref);
            EXPECT_LE(err, bound) << what << ": NMSE";
            break;
    }
    std::printf("[ cuda     ] %-58s %8lld values, %6lld differ in bits%s", what.c_str(),
                static_cast<long long>(ref.size()), static_cast<long long>(differing),
                how == Agree::Bits ? " (bit-exact expected)\n" : "");
    if (how == Agree::Relative) std::printf(", max relative error %.3g (bound %.2g)\n", err, bound);
    if (how == Agree::Nmse) std::printf(", NMSE %.3g (bound %.2g)\n", err, bound);
}

// ---- tolerances -----------------------------------------------------------------------------------------------------

// Activations: the host's expf (glibc, < 1 ulp) and the device's (within 2 ulp) differ by up to ~3 ulp; 1 + e, the
// division, log1pf (device within 1 ulp, host < 1 ulp) and the products add a rounding each: ~8 ulp (1e-6) relative
// at most for silu, sigmoid, softplus and the values scaled by them. A wrong formula, index or head is off by orders
// more.
constexpr double kActivationRelative = 1.5e-6;
// silu followed by an L2 or RMS norm: the sum of squares moves by at most the values' relative error (twice, squared;
// its double additions only in the order), so the scale by as much again; 4e-6 covers both.
constexpr double kNormedActivationRelative = 4e-6;
// NEOX rope: angles in double on both sides (the device's pow and sincos within 2 ulp of double, the host's < 1 ulp),
// so the float cos and sin agree except where the double value lies within ~1e-16 of a float rounding boundary; the
// products and the difference are rounded one by one on both sides (no FMA, as the baseline x86-64 reference), so
// nearly every value is bit-identical and a rare one is off by ~1 ulp of its inputs. Relative error is meaningless
// where x0 c - x1 s cancels, hence NMSE: a few 1-ulp values give ~1e-16; one wrong pair, position or frequency >= 1e-6.
constexpr double kRopeNmse = 1e-12;
// The pooled keys: the mean is bit-identical (the same float sums in the same order, IEEE division), the RMS scale
// within an ulp (the double sum of squares differs only in order), then the rope as above.
constexpr double kPooledNmse = 1e-12;
// Dequantized rows of types whose weights carry a minimum (Q4_K): the device forms scale * q + offset, which nvcc may
// fuse into one FMA where the CPU rounds dl * q before subtracting ml: an error of at most half an ulp of dl * q per
// value, NMSE ~1e-14 at most. IQ2_XS rows are d * grid * sign on both sides but are held to the same bound. A wrong
// block, scale or row costs ~1e-3 and more.
constexpr double kQuantRowNmse = 1e-12;
// The PLE residual: residual + (gated + silu(conv)) can cancel, so NMSE: silu within ~8 ulp (as above) gives ~1e-13.
constexpr double kResidualNmse = 1e-11;

// ---- embedding rows -------------------------------------------------------------------------------------------------

struct EmbedCase {
    DType type;
    int64_t width;
    int64_t rows;
};

// rows x width table of type t, each row quantized (or converted) from its own gaussian floats.
std::vector<uint8_t> random_table(DType t, int64_t rows, int64_t width, std::mt19937& rng) {
    const size_t rb = strata::row_bytes(t, width);
    std::vector<uint8_t> w(rb * static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
        const std::vector<float> src = gaussian(static_cast<size_t>(width), rng, 0.05f);
        strata::quantize_row(t, src.data(), w.data() + rb * static_cast<size_t>(r), width);
    }
    return w;
}

// F32, F16 and Q8_0 rows convert exactly on both sides (a copy, an exact half-to-float conversion, d * q which is
// exact in f32): bit-identical. Q4_K and IQ2_XS: kQuantRowNmse.
TEST(CudaEmbedRows, MatchesGetRowWithZerosOutOfRange) {
    SKIP_WITHOUT_DEVICE();
    cuda::Context& ctx = context();
    std::mt19937 rng(71);
    const EmbedCase cases[] = {{DType::F32, 37, 101},   {DType::F32, 256, 64},   {DType::F16, 37, 101},
                               {DType::F16, 2560, 50},  {DType::Q8_0, 96, 333},  {DType::Q8_0, 2560, 40},
                               {DType::Q4_K, 256, 77},  {DType::Q4_K, 2560, 30}, {DType::IQ2_XS, 256, 61},
                               {DType::IQ2_XS, 768, 29}};
    for (const EmbedCase& c : cases) {
        const std::vector<uint8_t> bytes = random_table(c.type, c.rows, c.width, rng);
        const int64_t ne[2] = {c.width, c.rows};
        const strata::Tensor host_table = strata::make_tensor("token_embd", c.type, 2, ne, bytes.data());
        const cuda::DeviceBuffer dev_bytes = ctx.upload(bytes.data(), bytes.size(), "test");
        strata::Tensor dev_table = strata::make_tensor("token_embd", c.type, 2, ne, dev_bytes.data());
        dev_table.device = strata::Device::Cuda;
        const bool exact = c.type == DType::F32 || c.type == DType::F16 || c.type == DType::Q8_0;
        for (const int64_t n_tokens : {1, 7, 33})
            for (const int64_t copies : {1, 4}) {
                const std::string what = std::string("embed_rows ") + strata::dtype_name(c.type) + " width " +
                                         str(c.width) + " tokens " + str(n_tokens) + " copies " + str(copies);
                SCOPED_TRACE(what);
                std::vector<int32_t> tokens(static_cast<size_t>(n_tokens));
                for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(c.rows));
                // Out of range: -1, rows, the extremes (zeros); the last valid row.
                const int32_t odd[] = {-1, static_cast<int32_t>(c.rows), std::numeric_limits<int32_t>::min(),
                                       std::numeric_limits<int32_t>::max(), static_cast<int32_t>(c.rows - 1)};
                if (n_tokens > 1)
                    for (size_t i = 0; i < std::size(odd) && i < tokens.size(); ++i)
                        tokens[(i * 5 + 3) % tokens.size()] = odd[i];
                std::vector<float> ref(static_cast<size_t>(n_tokens * copies * c.width), 0.0f);
                std::vector<float> row(static_cast<size_t>(c.width));
                for (int64_t t = 0; t < n_tokens; ++t) {
                    const int32_t tok = tokens[static_cast<size_t>(t)];
                    if (tok < 0 || tok >= c.rows) continue;
                    cpu::get_row(host_table, tok, row.data());
                    for (int64_t k = 0; k < copies; ++k)
                        std::copy(row.begin(), row.end(), ref.begin() + (t * copies + k) * c.width);
                }
                const cuda::DeviceBuffer dtok = upload(tokens);
                const cuda::DeviceBuffer staging =
                    ctx.allocate(std::max<size_t>(1, cuda::embed_staging_bytes(dev_table, n_tokens)), "test");
                const Guarded out = Guarded::poisoned(ref.size());
                cuda::embed_rows(ctx, {.table = &dev_table, .tokens = dtok.as<int32_t>(), .n_tokens = n_tokens,
                                       .copies = copies, .out = out.ptr(), .staging = staging.data()});
                std::vector<float> got = out.read(what);
                for (int64_t t = 0; t < n_tokens; ++t) {
                    const int32_t tok = tokens[static_cast<size_t>(t)];
                    if (tok >= 0 && tok < c.rows) continue;
                    int64_t non_zero = 0;
                    for (int64_t i = 0; i < copies * c.width; ++i) {
                        float& v = got[static_cast<size_t>(t * copies * c.width + i)];
                        non_zero += v != 0.0f;
                        if (v == 0.0f) v = 0.0f;  // a zero's sign is not part of the contract
                    }
                    EXPECT_EQ(non_zero, 0) << what << ": token " << tok << " (out of range) must give zeros";
                }
                if (exact)
                    expect_agrees(what, got, ref, Agree::Bits);
                else
                    expect_agrees(what, got, ref, Agree::Nmse, kQuantRowNmse);
            }
    }
}

// ---- rope -----------------------------------------------------------------------------------------------------------

struct RopeCase {
    int64_t tokens, heads, head_dim, n_rot, head_gap, token_gap;
    float base;
};

TEST(CudaRope, MatchesRopeNeoxAtDevicePositions) {
    SKIP_WITHOUT_DEVICE();
    cuda::Context& ctx = context();
    std::mt19937 rng(72);
    const RopeCase cases[] = {{1, 1, 64, 64, 0, 0, 10000.0f},          {7, 16, 128, 64, 0, 0, 10000000.0f},
                              {5, 3, 40, 40, 1, 3, 10000.0f},          {33, 2, 256, 64, 128, 0, 5000000.0f},
                              {64, 4, 128, 128, 128, 0, 1000000.0f},   {3, 5, 38, 2, 3, 7, 10000.0f}};
    for (const RopeCase& c : cases) {
        const int64_t head_stride = c.head_dim + c.head_gap, token_stride = c.heads * head_stride + c.token_gap;
        const std::string what =
            rope_case("rope_neox", c.tokens, c.heads, c.head_dim, c.n_rot, head_stride, token_stride);
        SCOPED_TRACE(what);
        const std::vector<float> x = gaussian(static_cast<size_t>(c.tokens * token_stride), rng, 2.0f);
        std::vector<int32_t> positions(static_cast<size_t>(c.tokens));
        for (int32_t& p : positions) p = static_cast<int32_t>(rng() % 262144);
        positions[0] = 0;
        if (c.tokens > 1) positions[1] = 262143;
        std::vector<float> ref = x;
        for (int64_t t = 0; t < c.tokens; ++t)
            for (int64_t h = 0; h < c.heads; ++h)
                cpu::rope_neox(ref.data() + t * token_stride + h * head_stride, c.n_rot,
                               positions[static_cast<size_t>(t)], c.base);
        const Guarded dx(x);
        const cuda::DeviceBuffer dpos = upload(positions);
        cuda::rope_neox(ctx, {.x = dx.ptr(), .n_tokens = c.tokens, .n_heads = c.heads, .token_stride = token_stride,
                              .head_stride = head_stride, .n_rot = c.n_rot, .positions = dpos.as<int32_t>(),
                              .freq_base = c.base});
        const std::vector<float> got = dx.read(what);
        // Values past n_rot in each head and the gaps between heads and tokens are never touched.
        int64_t touched = 0;
        for (int64_t t = 0; t < c.tokens; ++t)
            for (int64_t i = 0; i < token_stride; ++i) {
                const size_t at = static_cast<size_t>(t * token_stride + i);
                const bool rotated = i < c.heads * head_stride && i % head_stride < c.n_rot;
                if (!rotated) touched += std::memcmp(&got[at], &x[at], 4) != 0;
            }
        EXPECT_EQ(touched, 0) << what << ": values outside the rotated parts changed";
        expect_agrees(what, got, ref, Agree::Nmse, kRopeNmse);
    }
}

// rms_norm_rope against rms_norm_grouped then rope_neox: the same bits. Heads either gapped within a token (q with its
// gate between heads: one group a row) or packed with a gap between tokens (k: the heads are a row's groups).
TEST(CudaRope, NormRopeGivesTheSeparateOpsBits) {
    SKIP_WITHOUT_DEVICE();
    cuda::Context& ctx = context();
    std::mt19937 rng(78);
    struct Case {
        int64_t tokens, heads, head_dim, n_rot, head_gap, token_gap;
        bool gamma;
    };
    const Case cases[] = {{1, 16, 256, 64, 256, 0, true},
                          {8, 2, 256, 64, 0, 0, true},
                          {3, 5, 128, 128, 0, 7, false},
                          {2, 4, 40, 2, 40, 0, true},
                          {64, 3, 64, 32, 0, 0, true}};
    for (const Case& c : cases) {
        const int64_t head_stride = c.head_dim + c.head_gap, token_stride = c.heads * head_stride + c.token_gap;
        const std::string what =
            rope_case("rms_norm_rope", c.tokens, c.heads, c.head_dim, c.n_rot, head_stride, token_stride);
        SCOPED_TRACE(what);
        const std::vector<float> x = gaussian(static_cast<size_t>(c.tokens * token_stride), rng, 2.0f);
        const std::vector<float> gamma = gaussian(static_cast<size_t>(c.head_dim), rng, 1.0f);
        std::vector<int32_t> positions(static_cast<size_t>(c.tokens));
        for (int32_t& p : positions) p = static_cast<int32_t>(rng() % 262144);
        const cuda::DeviceBuffer dpos = upload(positions), dg = upload(gamma);
        const float* g = c.gamma ? dg.as<float>() : nullptr;
        std::vector<float> got[2];
        for (int fused = 0; fused < 2; ++fused) {
            const Guarded dx(x);
            const cuda::RopeArgs rope{.x = dx.ptr(),
                                      .n_tokens = c.tokens,
                                      .n_heads = c.heads,
                                      .token_stride = token_stride,
                                      .head_stride = head_stride,
                                      .n_rot = c.n_rot,
                                      .positions = dpos.as<int32_t>(),
                                      .freq_base = 1000000.0f};
            if (fused) {
                cuda::rms_norm_rope(ctx, {.rope = rope, .head_dim = c.head_dim, .gamma = g, .eps = 1e-6f});
            } else {
                const bool row_per_head = c.head_gap > 0;  // the cases give gaps either between heads or tokens
                cuda::rms_norm_grouped(ctx, {.x = dx.ptr(),
                                             .out = dx.ptr(),
                                             .n_tokens = row_per_head ? c.tokens * c.heads : c.tokens,
                                             .row_stride = row_per_head ? head_stride : token_stride,
                                             .n_groups = row_per_head ? 1 : c.heads,
                                             .group = c.head_dim,
                                             .gamma = g,
                                             .gamma_shared = true,
                                             .eps = 1e-6f});
                cuda::rope_neox(ctx, rope);
            }
            got[fused] = dx.read(what);
        }
        EXPECT_EQ(std::memcmp(got[0].data(), got[1].data(), got[0].size() * sizeof(float)), 0) << what << " differ";
    }
}

// Several sets in one rms_norm_rope launch (the attention block's q with its gate between heads, k, an empty set, the
// indexer's q): each set's bits as its own launch, which the test above checks against the separate ops. More sets
// than kMaxNormRopeSets are refused.
TEST(CudaRope, NormRopeSetsGiveEachSetsOwnBits) {
    SKIP_WITHOUT_DEVICE();
    cuda::Context& ctx = context();
    std::mt19937 rng(79);
    struct Set {
        int64_t heads, head_dim, head_stride;
    };
    const int64_t tokens = 3, n_rot = 64;
    const Set sets[] = {{6, 256, 512}, {2, 256, 256}, {0, 128, 128}, {4, 128, 128}};
    std::vector<int32_t> positions(static_cast<size_t>(tokens));
    for (int32_t& p : positions) p = static_cast<int32_t>(rng() % 262144);
    const cuda::DeviceBuffer dpos = upload(positions);
    std::vector<std::vector<float> > x, gamma;
    std::vector<cuda::DeviceBuffer> dgamma;
    for (const Set& s : sets) {
        x.push_back(gaussian(static_cast<size_t>(tokens * s.heads * s.head_stride), rng, 2.0f));
        gamma.push_back(gaussian(static_cast<size_t>(s.head_dim), rng, 1.0f));
        dgamma.push_back(upload(gamma.back()));
    }
    std::vector<float> got[2][std::size(sets)];
    for (int together = 0; together < 2; ++together) {
        std::vector<Guarded> dx;
        dx.reserve(std::size(sets));
        std::vector<cuda::NormRopeArgs> args;
        for (size_t i = 0; i < std::size(sets); ++i) {
            const Set& s = sets[i];
            dx.emplace_back(x[i]);
            args.push_back({.rope = {.x = dx.back().ptr(),
                                     .n_tokens = tokens,
                                     .n_heads = s.heads,
                                     .token_stride = s.heads * s.head_stride,
                                     .head_stride = s.head_stride,
                                     .n_rot = n_rot,
                                     .positions = dpos.as<int32_t>(),
                                     .freq_base = 1000000.0f},
                            .head_dim = s.head_dim,
                            .gamma = dgamma[i].as<float>(),
                            .eps = 1e-6f});
        }
        if (together)
            cuda::rms_norm_rope(ctx, args);
        else
            for (const cuda::NormRopeArgs& a : args) cuda::rms_norm_rope(ctx, a);
        for (size_t i = 0; i < std::size(sets); ++i) got[together][i] = dx[i].read("set " + str(int64_t(i)));
    }
    for (size_t i = 0; i < std::size(sets); ++i) {
        ASSERT_EQ(got[0][i].size(), got[1][i].size());
        EXPECT_EQ(std::memcmp(got[0][i].data(), got[1][i].data(), got[0][i].size() * sizeof(float)), 0)
            << "set " << i << " differs between one launch and its own";
        if (sets[i].heads > 0) {
            EXPECT_NE(got[1][i], x[i]) << "set " << i << " was not normed";
        }
    }
    std::vector<cuda::NormRopeArgs> too_many(cuda::kMaxNormRopeSets + 1);
    EXPECT_THROW(cuda::rms_norm_rope(ctx, too_many), strata::Error);
}

// ---- GDN ------------------------------------------------------------------------------------------------------------

struct GdnCase {
    int64_t tokens, key_heads, head_dim, value_dim;
};

TEST(CudaGdn, ActivateMatchesTheConvRowsLoop) {
    SKIP_WITHOUT_DEVICE();
    cuda::Context& ctx = context();
    std::mt19937 rng(73);
    const GdnCase cases[] = {{1, 16, 128, 4096}, {5, 16, 128, 4096}, {64, 2, 64, 240}, {7, 2, 37, 41}, {3, 1, 256, 0}};
    for (const GdnCase& c : cases) {
        const int64_t key_dim = c.key_heads * c.head_dim, conv_dim = 2 * key_dim + c.value_dim;
        const float q_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
        const std::string what = "gdn_activate tokens " + str(c.tokens) + " key heads " + str(c.key_heads) + " x " +
                                 str(c.head_dim) + " value dim " + str(c.value_dim);
        SCOPED_TRACE(what);
        const std::vector<float> x = gaussian(static_cast<size_t>(c.tokens * conv_dim), rng, 2.0f);
        // model/gdn.cpp, conv_rows after the conv step.
        std::vector<float> ref = x;
        for (int64_t t = 0; t < c.tokens; ++t) {
            float* row = ref.data() + t * conv_dim;
            for (int64_t j = 0; j < conv_dim; ++j) row[j] = cpu::silu(row[j]);
            float* q = row;
            float* k = row + key_dim;
            for (int64_t h = 0; h < c.key_heads; ++h) {
                cpu::l2_norm(q + h * c.head_dim, c.head_dim, 1e-6f, q + h * c.head_dim);
                cpu::l2_norm(k + h * c.head_dim, c.head_dim, 1e-6f, k + h * c.head_dim);
                for (int64_t j = 0; j < c.head_dim; ++j) q[h * c.head_dim + j] *= q_scale;
            }
        }
        const Guarded dx(x);
        cuda::gdn_activate(ctx, {.conv = dx.ptr(), .n_tokens = c.tokens, .conv_dim = conv_dim, .key_dim = key_dim,
                                 .head_dim = c.head_dim, .q_scale = q_scale});
        const std::vector<float> got = dx.read(what);
        expect_agrees(what, got, ref, Agree::Relative, kNormedActivationRelative);
    }
}

TEST(CudaGdn, GatesMatchTheHeadsLoop) {
    SKIP_WITHOUT_DEVICE();
    cuda::Context& ctx = context();
    std::mt19937 rng(74);
    for (const int64_t tokens : {1, 7, 64})
        for (const int64_t heads : {32, 3}) {
            const std::string what = "gdn_gates tokens " + str(tokens) + " heads " + str(heads);
            SCOPED_TRACE(what);
            const size_t n = static_cast<size_t>(tokens * heads);
            // Wide inputs so softplus takes both branches (x > 20 linear) and sigmoid saturates.
            const std::vector<float> beta = gaussian(n, rng, 6.0f), alpha = gaussian(n, rng, 10.0f);
            const std::vector<float> a_log = gaussian(static_cast<size_t>(heads), rng, 1.0f);
            const std::vector<float> dt_bias = gaussian(static_cast<size_t>(heads), rng, 3.0f);
            std::vector<float> a(a_log.size());
            for (size_t h = 0; h < a.size(); ++h) a[h] = -std::exp(a_log[h]);
            std::vector<float> ref_beta(n), ref_alpha(n);
            for (int64_t t = 0; t < tokens; ++t)
                for (int64_t h = 0; h < heads; ++h) {
                    const size_t i = static_cast<size_t>(t * heads + h);
                    ref_beta[i] = cpu::sigmoid(beta[i]);
                    ref_alpha[i] = a[static_cast<size_t>(h)] * cpu::softplus(alpha[i] + dt_bias[static_cast<size_t>(h)]);
                }
            const Guarded db(beta), da(alpha);
            const cuda::DeviceBuffer dA = upload(a), ddt = upload(dt_bias);
            cuda::gdn_gates(ctx, {.beta = db.ptr(), .alpha = da.ptr(), .a = dA.as<float>(),
                                  .dt_bias = ddt.as<float>(), .n_tokens = tokens, .n_heads = heads});
            expect_agrees(what + " beta", db.read(what + " beta"), ref_beta, Agree::Relative, kActivationRelative);
            expect_agrees(what + " alpha", da.read(what + " alpha"), ref_alpha, Agree::Relative,
                          kActivationRelative);
        }
}

struct ConvActivateCase {
    int64_t tokens, key_heads, head_dim, value_dim, kernel;
};

// The decode path's one launch against the three ops it replaces (each checked against the CPU above and in
// test_cuda_recurrent): the conv rows, the new history and the gates, bit for bit.
TEST(CudaGdn, ConvActivateGivesTheSeparateOpsBits) {
    SKIP_WITHOUT_DEVICE();
    cuda::Context& ctx = context();
    std::mt19937 rng(76);
    const ConvActivateCase cases[] = {
        {1, 16, 128, 6144, 4}, {3, 16, 128, 6144, 4}, {8, 2, 37, 41, 4}, {2, 1, 64, 0, 3}, {5, 3, 32, 100, 1}};
    for (const ConvActivateCase& c : cases) {
        const int64_t key_dim = c.key_heads * c.head_dim, conv_dim = 2 * key_dim + c.value_dim;
        const int64_t heads = c.key_heads * 2, hist_rows = c.kernel - 1;
        const std::string what = "gdn_conv_activate tokens " + str(c.tokens) + " key heads " + str(c.key_heads) +
                                 " x " + str(c.head_dim) + " value dim " + str(c.value_dim) + " kernel " +
                                 str(c.kernel);
        SCOPED_TRACE(what);
        const std::vector<float> x = gaussian(static_cast<size_t>(c.tokens * conv_dim), rng, 2.0f);
        const std::vector<float> w = gaussian(static_cast<size_t>(conv_dim * c.kernel), rng, 0.5f);
        const std::vector<float> hist = gaussian(static_cast<size_t>(std::max<int64_t>(hist_rows, 1) * conv_dim), rng);
        const std::vector<float> beta = gaussian(static_cast<size_t>(c.tokens * heads), rng, 6.0f);
        const std::vector<float> alpha = gaussian(static_cast<size_t>(c.tokens * heads), rng, 10.0f);
        const std::vector<float> a = gaussian(static_cast<size_t>(heads), rng, 1.0f);
        const std::vector<float> dt_bias = gaussian(static_cast<size_t>(heads), rng, 3.0f);
        const cuda::DeviceBuffer dx = upload(x), dw = upload(w), dA = upload(a), ddt = upload(dt_bias);
        const float q_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
        struct Run {
            Guarded out, history, beta, alpha;
        };
        auto make = [&] {
            return Run{Guarded::poisoned(static_cast<size_t>(c.tokens * conv_dim)), Guarded(hist), Guarded(beta),
                       Guarded(alpha)};
        };
        Run sep = make(), fused = make();
        auto args = [&](Run& r) {
            const cuda::ConvWindowArgs conv{.x = dx.as<float>(), .x_stride = conv_dim, .w = dw.as<float>(),
                                            .history = r.history.ptr(), .out = r.out.ptr(), .out_stride = conv_dim,
                                            .n_tokens = c.tokens, .channels = conv_dim, .kernel = c.kernel,
                                            .dilation = 1};
            const cuda::GdnActivateArgs act{.conv = r.out.ptr(), .n_tokens = c.tokens, .conv_dim = conv_dim,
                                            .key_dim = key_dim, .head_dim = c.head_dim, .q_scale = q_scale};
            const cuda::GdnGatesArgs gates{.beta = r.beta.ptr(), .alpha = r.alpha.ptr(), .a = dA.as<float>(),
                                           .dt_bias = ddt.as<float>(), .n_tokens = c.tokens, .n_heads = heads};
            return std::make_tuple(conv, act, gates);
        };
        const auto [conv_s, act_s, gates_s] = args(sep);
        cuda::causal_conv(ctx, conv_s);
        cuda::gdn_activate(ctx, act_s);
        cuda::gdn_gates(ctx, gates_s);
        const auto [conv_f, act_f, gates_f] = args(fused);
        cuda::gdn_conv_activate(ctx, conv_f, act_f, gates_f);
        for (const auto& [name, a_buf, b_buf] :
             {std::tuple{"rows", &sep.out, &fused.out}, std::tuple{"history", &sep.history, &fused.history},
              std::tuple{"beta", &sep.beta, &fused.beta}, std::tuple{"alpha", &sep.alpha, &fused.alpha}}) {
            const std::vector<float> want = a_buf->read(what + " separate " + name);
            const std::vector<float> got = b_buf->read(what + " fused " + name);
            ASSERT_EQ(got.size(), want.size());
            EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << name << " differ";
        }
    }
}

struct GatedNormCase {
    int64_t tokens, heads, head_dim;
    bool sigmoid_gate;
};

TEST(CudaGdn, GatedNormMatchesTheOutputNorm) {
    SKIP_WITHOUT_DEVICE();
    cuda::Context& ctx = context();
    std::mt19937 rng(75);
    const GatedNormCase cases[] = {{1, 32, 128, true}, {5, 32, 128, false}, {7, 3, 37, true}, {64, 2, 80, false}};
    for (const GatedNormCase& c : cases) {
        const std::string what = "gated_norm tokens " + str(c.tokens) + " heads " + str(c.heads) + " x " +
                                 str(c.head_dim) + (c.sigmoid_gate ? " sigmoid" : " silu");
        SCOPED_TRACE(what);
        const size_t n = static_cast<size_t>(c.tokens * c.heads * c.head_dim);
        const std::vector<float> x = gaussian(n, rng, 0.3f), z = gaussian(n, rng, 3.0f);
        const std::vector<float> gamma = gaussian(static_cast<size_t>(c.head_dim), rng, 1.0f);
        const float eps = 1e-6f;
        // model/gdn.cpp, after the delta step.
        std::vector<float> ref = x;
        for (int64_t r = 0; r < c.tokens * c.heads; ++r) {
            float* o = ref.data() + r * c.head_dim;
            const float* zr = z.data() + r * c.head_dim;
            cpu::rms_norm(o, c.head_dim, gamma.data(), eps, o);
            for (int64_t j = 0; j < c.head_dim; ++j) o[j] *= c.sigmoid_gate ? cpu::sigmoid(zr[j]) : cpu::silu(zr[j]);
        }
        const Guarded dx(x);
        const cuda::DeviceBuffer dz = upload(z), dg = upload(gamma);
        cuda::gated_norm(ctx, {.x = dx.ptr(), .z = dz.as<float>(), .gamma = dg.as<float>(), .n_tokens = c.tokens,
                               .n_heads = c.heads, .head_dim = c.head_dim, .sigmoid_gate = c.sigmoid_gate,
                               .eps = eps});
        expect_agrees(what, dx.read(what), ref, Agree::Relative, kNormedActivationRelative);
    }
}

// gated_norm_matmul against gated_norm then matmul: the same bits, fused (Q8_0-reading weights, heads of a multiple
// of 32, decode windows) or not (Q8_K-reading and float weights, a head of 40, a prompt window).
TEST(CudaGdn, GatedNormMatmulGivesTheSeparateOpsBits) {
    SKIP_WITHOUT_DEVICE();
    cuda::Context& ctx = context();
    std::mt19937 rng(77);
    struct Case {
        DType type;
        int64_t tokens, heads, head_dim, rows;
    };
    const Case cases[] = {{DType::Q8_0, 1, 32, 128, 2560}, {DType::Q8_0, 8, 4, 64, 96}, {DType::IQ4_NL, 3, 6, 32, 200},
                          {DType::Q4_K, 2, 2, 128, 64},    {DType::F16, 1, 4, 32, 48},  {DType::Q8_0, 1, 4, 40, 32},
                          {DType::Q8_0, 12, 2, 128, 64}};
    for (const Case& c : cases) {
        const int64_t width = c.heads * c.head_dim;
        const std::string what = std::string(strata::dtype_name(c.type)) + " tokens " + str(c.tokens) + " heads " +
                                 str(c.heads) + " x " + str(c.head_dim);
        SCOPED_TRACE(what);
        const size_t n = static_cast<size_t>(c.tokens * width);
        const std::vector<float> x = gaussian(n, rng, 0.3f), z = gaussian(n, rng, 3.0f);
        const std::vector<float> gamma = gaussian(static_cast<size_t>(c.head_dim), rng, 1.0f);
        const cuda::DeviceBuffer dz = upload(z), dg = upload(gamma);
        const std::vector<uint8_t> bytes = random_weights(c.type, c.rows, width, rng);
        const cuda::DeviceBuffer dw = ctx.upload(bytes.data(), bytes.size(), "test");
        const strata::Tensor w = matrix(c.type, width, c.rows, dw.data(), strata::Device::Cuda);
        std::vector<float> normed[2], product[2];
        for (int fused = 0; fused < 2; ++fused) {
            const Guarded dx(x), y = Guarded::poisoned(static_cast<size_t>(c.tokens * c.rows));
            const cuda::GatedNormArgs args{.x = dx.ptr(),
                                           .z = dz.as<float>(),
                                           .gamma = dg.as<float>(),
                                           .n_tokens = c.tokens,
                                           .n_heads = c.heads,
                                           .head_dim = c.head_dim};
            if (fused) {
                cuda::gated_norm_matmul(ctx, args, w, y.ptr());
            } else {
                cuda::gated_norm(ctx, args);
                cuda::matmul(ctx, {.w = w, .x = args.x, .y = y.ptr(), .n_tokens = c.tokens});
            }
            normed[fused] = dx.read(what + " x");
            product[fused] = y.read(what + " y");
        }
        EXPECT_EQ(std::memcmp(normed[0].data(), normed[1].data(), n * sizeof(float)), 0) << what << ": x differs";
        EXPECT_EQ(std::memcmp(product[0].data(), product[1].data(), product[0].size() * sizeof(float)), 0)
            << what << ": y differs";
    }
}

// ---- rows at positions and the QSA indexer --------------------------------------------------------------------------

struct IndexerCase {
    int64_t head_dim, ratio, n_rot, max_blocks, src_gap;
    float base;
};

// Calls in the order a sequence sees them (prefill pieces, then decode tokens), positions running on, with the last
// ones past both the raw array and max_blocks (skipped): after each call the raw rows and the pooled blocks complete
// so far must equal index_append's, and blocks not yet complete must still be poisoned. indexer_store_pool (one launch)
// on its own buffers must give the two ops' bits.
TEST(CudaIndexer, StoreRowsAndPoolMatchIndexAppend) {
    SKIP_WITHOUT_DEVICE();
    cuda::Context& ctx = context();
    std::mt19937 rng(76);
    const IndexerCase cases[] = {{128, 4, 64, 16, 0, 10000000.0f}, {40, 3, 16, 9, 5, 10000.0f},
                                 {64, 1, 64, 40, 3, 10000.0f}};
    for (const IndexerCase& c : cases) {
        const int64_t di = c.head_dim, raw_rows = c.max_blocks * c.ratio, src_stride = di + c.src_gap;
        const std::string shape = "head_dim " + str(di) + " ratio " + str(c.ratio) + " n_rot " + str(c.n_rot) +
                                  " max_blocks " + str(c.max_blocks);
        const std::vector<float> norm = gaussian(static_cast<size_t>(di), rng, 1.0f);
        const cuda::DeviceBuffer dnorm = upload(norm);
        const Guarded raw = Guarded::poisoned(static_cast<size_t>(raw_rows * di));
        const Guarded pooled = Guarded::poisoned(static_cast<size_t>(c.max_blocks * di));
        // The same sequence through indexer_store_pool (one launch): the bits of the two.
        const Guarded raw1 = Guarded::poisoned(static_cast<size_t>(raw_rows * di));
        const Guarded pooled1 = Guarded::poisoned(static_cast<size_t>(c.max_blocks * di));
        std::vector<float> ref_raw(static_cast<size_t>(raw_rows * di), poison());
        std::vector<float> ref_pooled(static_cast<size_t>(c.max_blocks * di), poison());
        int64_t pos0 = 0;
        for (const int64_t T : {7, 1, 1, 33, 1, 2, 30, 1}) {
            const std::string what = "indexer " + shape + " positions " + str(pos0) + ".." + str(pos0 + T - 1);
            SCOPED_TRACE(what);
            const std::vector<float> src = gaussian(static_cast<size_t>(T * src_stride), rng, 1.5f);
            std::vector<int32_t> positions(static_cast<size_t>(T));
            for (int64_t t = 0; t < T; ++t) positions[static_cast<size_t>(t)] = static_cast<int32_t>(pos0 + t);
            // model/attention.cpp, index_append: the rows stored, then every block completed by this call pooled.
            for (int64_t t = 0; t < T; ++t)
                if (pos0 + t < raw_rows)
                    std::copy_n(src.begin() + t * src_stride, di, ref_raw.begin() + (pos0 + t) * di);
            for (int64_t b = pos0 / c.ratio; b < std::min((pos0 + T) / c.ratio, c.max_blocks); ++b) {
                float* p = ref_pooled.data() + b * di;
                for (int64_t d = 0; d < di; ++d) {
                    float sum = 0.0f;
                    for (int64_t i2 = 0; i2 < c.ratio; ++i2) sum += ref_raw[static_cast<size_t>((b * c.ratio + i2) * di + d)];
                    p[d] = sum / static_cast<float>(c.ratio);
                }
                cpu::rms_norm(p, di, norm.data(), 1e-6f, p);
                cpu::rope_neox(p, c.n_rot, b * c.ratio, c.base);
            }
            const cuda::DeviceBuffer dsrc = upload(src), dpos = upload(positions);
            for (const bool one_launch : {false, true}) {
                const cuda::StoreRowsArgs store{.dst = (one_launch ? raw1 : raw).ptr(),
                                                .dst_rows = raw_rows,
                                                .src = dsrc.as<float>(),
                                                .src_stride = c.src_gap ? src_stride : 0,
                                                .width = di,
                                                .positions = dpos.as<int32_t>(),
                                                .n_tokens = T};
                const cuda::IndexerPoolArgs pool{.raw = store.dst,
                                                 .pooled = (one_launch ? pooled1 : pooled).ptr(),
                                                 .max_blocks = c.max_blocks,
                                                 .head_dim = di,
                                                 .ratio = c.ratio,
                                                 .k_norm = dnorm.as<float>(),
                                                 .eps = 1e-6f,
                                                 .n_rot = c.n_rot,
                                                 .freq_base = c.base,
                                                 .positions = dpos.as<int32_t>(),
                                                 .n_tokens = T};
                if (one_launch) {
                    cuda::indexer_store_pool(ctx, store, pool);
                } else {
                    cuda::store_rows(ctx, store);
                    cuda::indexer_pool(ctx, pool);
                }
            }
            const std::vector<float> got_raw = raw.read(what + " raw"), got_pooled = pooled.read(what + " pooled");
            EXPECT_EQ(count_differing(raw1.read(what + " raw, one launch"), got_raw), 0)
                << what << ": indexer_store_pool's raw rows differ from store_rows'";
            EXPECT_EQ(count_differing(pooled1.read(what + " pooled, one launch"), got_pooled), 0)
                << what << ": indexer_store_pool's pooled blocks differ from indexer_pool's";
            EXPECT_EQ(count_differing(got_raw, ref_raw), 0) << what << ": raw rows differ (a copy: bit-exact)";
            // Blocks complete so far against the reference; the rest still poisoned.
            const int64_t complete = std::min((pos0 + T) / c.ratio, c.max_blocks);
            const std::vector<float> done(got_pooled.begin(), got_pooled.begin() + complete * di),
                ref_done(ref_pooled.begin(), ref_pooled.begin() + complete * di);
            int64_t early = 0;
            for (size_t i = static_cast<size_t>(complete * di); i < got_pooled.size(); ++i)
                early += !is_poison(got_pooled[i]);
            EXPECT_EQ(early, 0) << what << ": blocks not yet complete were written";
            if (complete > 0) expect_agrees(what + " pooled", done, ref_done, Agree::Nmse, kPooledNmse);
            pos0 += T;
        }
    }
}

// ---- PLE ------------------------------------------------------------------------------------------------------------

struct PleCase {
    int64_t tokens, streams, width;
};

// The dot product is cpu::dot's own summation (eight interleaved partial sums in its order, products and sums rounded
// one by one), so g is bit-identical; only sigmoid's expf differs: kActivationRelative.
TEST(CudaPle, GateMatchesGateAndConv) {
    SKIP_WITHOUT_DEVICE();
    cuda::Context& ctx = context();
    std::mt19937 rng(77);
    const PleCase cases[] = {{1, 4, 2560}, {5, 4, 256}, {3, 3, 37}, {2, 1, 1}, {8, 2, 1003}};
    for (const PleCase& c : cases) {
        const int64_t H = c.width, HC = c.streams * H;
        const std::string what =
            "ple_gate tokens " + str(c.tokens) + " streams " + str(c.streams) + " width " + str(H);
        SCOPED_TRACE(what);
        // Normalised-looking keys and queries; stream 0 of token 0 has a zero key (g = 0: sign 0, gate 0.5) and
        // stream 1 a tiny one (|g| under 1e-6: the floor).
        std::vector<float> key = gaussian(static_cast<size_t>(c.tokens * HC), rng, 1.0f);
        const std::vector<float> query = gaussian(static_cast<size_t>(c.tokens * HC), rng, 1.0f);
        const std::vector<float> value = gaussian(static_cast<size_t>(c.tokens * H), rng, 0.5f);
        std::fill_n(key.begin(), H, 0.0f);
        if (c.streams > 1)
            for (int64_t j = 0; j < H; ++j) key[static_cast<size_t>(H + j)] *= 1e-9f;
        // model/ple.cpp, gate_and_conv.
        std::vector<float> ref(static_cast<size_t>(c.tokens * HC));
        const float inv_sqrt_h = 1.0f / std::sqrt(static_cast<float>(H));
        for (int64_t t = 0; t < c.tokens; ++t)
            for (int64_t st = 0; st < c.streams; ++st) {
                const float* k = key.data() + t * HC + st * H;
                const float* q = query.data() + t * HC + st * H;
                float g = cpu::dot(k, q, H) * inv_sqrt_h;
                g = std::sqrt(std::max(std::fabs(g), 1e-6f)) * (g > 0.0f ? 1.0f : (g < 0.0f ? -1.0f : 0.0f));
                const float gate = cpu::sigmoid(g);
                for (int64_t j = 0; j < H; ++j)
                    ref[static_cast<size_t>(t * HC + st * H + j)] = gate * value[static_cast<size_t>(t * H + j)];
            }
        const cuda::DeviceBuffer dk = upload(key), dq = upload(query), dv = upload(value);
        const Guarded out = Guarded::poisoned(ref.size());
        cuda::ple_gate(ctx, {.key = dk.as<float>(), .query = dq.as<float>(), .value = dv.as<float>(),
                             .gated = out.ptr(), .n_tokens = c.tokens, .n_streams = c.streams, .n_embd = H});
        expect_agrees(what, out.read(what), ref, Agree::Relative, kActivationRelative);
    }
}

TEST(CudaPle, ResidualAddAndAddInplaceMatchTheCpu) {
    SKIP_WITHOUT_DEVICE();
    cuda::Context& ctx = context();
    std::mt19937 rng(78);
    for (const int64_t n : {int64_t{1}, int64_t{1003}, (int64_t{1} << 20) + 3}) {
        const std::string what = "n " + str(n);
        SCOPED_TRACE(what);
        const size_t count = static_cast<size_t>(n);
        const std::vector<float> residual = gaussian(count, rng, 2.0f), gated = gaussian(count, rng, 0.5f),
                                 conv = gaussian(count, rng, 3.0f), y = gaussian(count, rng, 1.0f);
        // model/ple.cpp: res[j] += gated[j] + silu(conv[j]); the blocks' residual adds: x += y (bit-exact).
        std::vector<float> ref_ple = residual, ref_add = residual;
        for (size_t j = 0; j < count; ++j) {
            ref_ple[j] += gated[j] + cpu::silu(conv[j]);
            ref_add[j] += y[j];
        }
        const Guarded dr(residual), da(residual);
        const cuda::DeviceBuffer dg = upload(gated), dc = upload(conv), dy = upload(y);
        cuda::ple_residual_add(ctx, dr.ptr(), dg.as<float>(), dc.as<float>(), n);
        cuda::add_inplace(ctx, da.ptr(), dy.as<float>(), n);
        expect_agrees("ple_residual_add " + what, dr.read("ple_residual_add " + what), ref_ple, Agree::Nmse,
                      kResidualNmse);
        expect_agrees("add_inplace " + what, da.read("add_inplace " + what), ref_add, Agree::Bits);
    }
}

// ---- graph capture --------------------------------------------------------------------------------------------------

// Embedding, rope, row store and pooling captured once, then replayed with new tokens and positions written into the
// same device buffers: each replay must give the bits of eager launches on the same inputs (nothing in the ops reads
// a host value that changes per window, syncs or allocates).
TEST(CudaBlockGraph, ReplayWithNewPositionsEqualsEagerLaunches) {
    SKIP_WITHOUT_DEVICE();
    cuda::Context& ctx = context();
    cudaStream_t stream = ctx.stream().handle();
    std::mt19937 rng(79);
    constexpr int64_t kWidth = 256, kRows = 500, kTokens = 8, kHeadDim = 64, kRatio = 4, kBlocks = 16;
    const std::vector<uint8_t> bytes = random_table(DType::Q8_0, kRows, kWidth, rng);
    const int64_t ne[2] = {kWidth, kRows};
    const cuda::DeviceBuffer dev_bytes = ctx.upload(bytes.data(), bytes.size(), "test");
    strata::Tensor table = strata::make_tensor("token_embd", DType::Q8_0, 2, ne, dev_bytes.data());
    table.device = strata::Device::Cuda;
    const std::vector<float> norm = gaussian(kHeadDim, rng, 1.0f);
    const cuda::DeviceBuffer dnorm = upload(norm);
    const cuda::DeviceBuffer tokens = ctx.allocate(kTokens * 4, "test"), positions = ctx.allocate(kTokens * 4, "test");
    const cuda::DeviceBuffer staging = ctx.allocate(cuda::embed_staging_bytes(table, kTokens), "test");
    const cuda::DeviceBuffer emb = ctx.allocate(kTokens * 2 * kWidth * 4, "test");
    const cuda::DeviceBuffer raw = ctx.allocate(kBlocks * kRatio * kHeadDim * 4, "test");
    const cuda::DeviceBuffer pooled = ctx.allocate(kBlocks * kHeadDim * 4, "test");
    auto record = [&] {
        cuda::embed_rows(ctx, {.table = &table, .tokens = tokens.as<int32_t>(), .n_tokens = kTokens, .copies = 2,
                               .out = emb.as<float>(), .staging = staging.data()});
        cuda::rope_neox(ctx, {.x = emb.as<float>(), .n_tokens = kTokens, .n_heads = 2 * kWidth / kHeadDim,
                              .token_stride = 2 * kWidth, .head_stride = kHeadDim, .n_rot = kHeadDim,
                              .positions = positions.as<int32_t>(), .freq_base = 10000.0f});
        cuda::store_rows(ctx, {.dst = raw.as<float>(), .dst_rows = kBlocks * kRatio, .src = emb.as<float>(),
                               .src_stride = 2 * kWidth, .width = kHeadDim, .positions = positions.as<int32_t>(),
                               .n_tokens = kTokens});
        cuda::indexer_pool(ctx, {.raw = raw.as<float>(), .pooled = pooled.as<float>(), .max_blocks = kBlocks,
                                 .head_dim = kHeadDim, .ratio = kRatio, .k_norm = dnorm.as<float>(), .eps = 1e-6f,
                                 .n_rot = 32, .freq_base = 10000.0f, .positions = positions.as<int32_t>(),
                                 .n_tokens = kTokens});
    };
    auto write_inputs = [&](int window) {
        std::vector<int32_t> tok(kTokens), pos(kTokens);
        for (int64_t t = 0; t < kTokens; ++t) {
            tok[static_cast<size_t>(t)] = static_cast<int32_t>(rng() % kRows);
            pos[static_cast<size_t>(t)] = static_cast<int32_t>(window * kTokens + t);
        }
        // On the context's stream (a non-blocking stream does not wait for the legacy stream's copies).
        CHECK_CUDA(cudaMemcpyAsync(tokens.data(), tok.data(), kTokens * 4, cudaMemcpyHostToDevice, stream));
        CHECK_CUDA(cudaMemcpyAsync(positions.data(), pos.data(), kTokens * 4, cudaMemcpyHostToDevice, stream));
        CHECK_CUDA(cudaMemsetAsync(raw.data(), 0, raw.size(), stream));
        CHECK_CUDA(cudaMemsetAsync(pooled.data(), 0, pooled.size(), stream));
        ctx.synchronize();  // the host vectors go out of scope
    };
    auto outputs = [&] {
        std::vector<float> all = download<float>(emb.data(), emb.size() / 4);
        const std::vector<float> r = download<float>(raw.data(), raw.size() / 4),
                                 p = download<float>(pooled.data(), pooled.size() / 4);
        all.insert(all.end(), r.begin(), r.end());
        all.insert(all.end(), p.begin(), p.end());
        return all;
    };
    write_inputs(0);
    record();  // eager warm-up before capture
    ctx.synchronize();
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    record();
    CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int window = 1; window <= 3; ++window) {
        SCOPED_TRACE("window " + std::to_string(window));
        write_inputs(window);
        CHECK_CUDA(cudaGraphLaunch(exec, stream));
        ctx.synchronize();
        const std::vector<float> replayed = outputs();
        // The same inputs again (the tokens and positions are still in their buffers), eagerly.
        CHECK_CUDA(cudaMemsetAsync(raw.data(), 0, raw.size(), stream));
        CHECK_CUDA(cudaMemsetAsync(pooled.data(), 0, pooled.size(), stream));
        record();
        ctx.synchronize();
        const std::vector<float> eager = outputs();
        EXPECT_EQ(count_differing(replayed, eager), 0) << "graph replay differs from eager launches";
        EXPECT_EQ(count_non_finite(replayed), 0);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
}

// ---- bad shapes -----------------------------------------------------------------------------------------------------

TEST(CudaBlockOps, RejectBadShapes) {
    SKIP_WITHOUT_DEVICE();
    cuda::Context& ctx = context();
    const cuda::DeviceBuffer b = ctx.allocate(1 << 16, "test");
    float* p = b.as<float>();
    const auto* pos = b.as<int32_t>();
    std::vector<uint8_t> host_bytes(static_cast<size_t>(strata::row_bytes(DType::Q8_0, 64) * 4));
    const int64_t ne[2] = {64, 4};
    const strata::Tensor host_table = strata::make_tensor("token_embd", DType::Q8_0, 2, ne, host_bytes.data());
    expect_error([&] { cuda::embed_rows(ctx, {.table = &host_table, .tokens = pos, .n_tokens = 1, .out = p,
                                              .staging = p}); },
                 "host memory");
    strata::Tensor dev_table = strata::make_tensor("token_embd", DType::Q8_0, 2, ne, p);
    dev_table.device = strata::Device::Cuda;
    expect_error([&] { cuda::embed_rows(ctx, {.table = &dev_table, .tokens = pos, .n_tokens = 1, .copies = 0,
                                              .out = p, .staging = p}); },
                 "copies");
    expect_error([&] { cuda::rope_neox(ctx, {.x = p, .n_tokens = 1, .n_heads = 1, .n_rot = 63, .positions = pos}); },
                 "n_rot 63");
    expect_error([&] { cuda::rope_neox(ctx, {.x = p, .n_tokens = 1, .n_heads = 1, .n_rot = 64}); }, "null");
    expect_error([&] { cuda::gdn_activate(ctx, {.conv = p, .n_tokens = 1, .conv_dim = 100, .key_dim = 64,
                                                .head_dim = 64}); },
                 "key_dim");
    expect_error([&] { cuda::indexer_pool(ctx, {.raw = p, .pooled = p, .max_blocks = 4, .head_dim = 64, .ratio = 0,
                                                .n_rot = 64, .positions = pos, .n_tokens = 1}); },
                 "ratio");
    expect_error([&] { cuda::store_rows(ctx, {.dst = p, .dst_rows = 4, .src = p, .src_stride = 3, .width = 8,
                                              .positions = pos, .n_tokens = 2}); },
                 "src_stride");
    expect_error([&] { cuda::add_inplace(ctx, p, nullptr, 4); }, "null");
    expect_error([&] { cuda::ple_residual_add(ctx, p, p, p, -1); }, "negative");
    ctx.synchronize();
}

#endif  // STRATA_HAS_CUDA

}  // namespace
