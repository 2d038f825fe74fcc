// The scalar reference ops against straightforward double-precision formulas on random inputs (the formulas are
// transcribed from the transformers modules they stand for), plus properties the other backends rely on:
// thread-count independence and quantized weights read exactly as their dequantized values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/quant_dot.h"
#include "core/dtype.h"
#include "model/attention.h"
#include "model/ple.h"

using namespace strata;

namespace {

std::vector<float> random_vec(std::mt19937& rng, size_t n, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
}

// Relative error of a against a double reference: max |a - b| / max(max |b|, tiny).
double rel_err(const std::vector<float>& a, const std::vector<double>& b) {
    double num = 0, den = 1e-30;
    for (size_t i = 0; i < a.size(); ++i) {
        num = std::max(num, std::fabs(a[i] - b[i]));
        den = std::max(den, std::fabs(b[i]));
    }
    return num / den;
}

// The instruction sets this CPU runs, each made the active one for the ops while fn runs.
template <class Fn>
void on_each_isa(Fn fn) {
    for (auto isa : {cpu::Isa::Scalar, cpu::Isa::Avx2, cpu::Isa::Avx512}) {
        if (!cpu::supports_isa(isa)) continue;
        SCOPED_TRACE(cpu::isa_name(isa));
        struct Held {  // released however the checks end
            explicit Held(cpu::Isa i) { cpu::override_active_isa(i); }
            ~Held() { cpu::override_active_isa(std::nullopt); }
        } held(isa);
        fn(isa);
    }
}

struct QuantWeight {
    std::vector<uint8_t> bytes;
    Tensor tensor;
};

QuantWeight make_weight(DType type, const std::vector<float>& values, int64_t in, int64_t out) {
    QuantWeight w;
    w.bytes.resize(row_bytes(type, in) * static_cast<size_t>(out));
    for (int64_t r = 0; r < out; ++r)
        quantize_row(type, values.data() + r * in, w.bytes.data() + row_bytes(type, in) * r, in);
    const int64_t ne[2] = {in, out};
    w.tensor = make_tensor("w", type, 2, ne, w.bytes.data());
    return w;
}

}  // namespace

TEST(Ops, MatmulMatchesDoubleAndIsThreadIndependent) {
    std::mt19937 rng(1);
    const int64_t in = 96, out = 77, T = 5;
    const auto wv = random_vec(rng, in * out), x = random_vec(rng, in * T);
    QuantWeight w = make_weight(DType::F32, wv, in, out);
    std::vector<double> ref(out * T);
    for (int64_t t = 0; t < T; ++t)
        for (int64_t o = 0; o < out; ++o) {
            double s = 0;
            for (int64_t i = 0; i < in; ++i) s += static_cast<double>(wv[o * in + i]) * x[t * in + i];
            ref[t * out + o] = s;
        }
    std::vector<float> y1(out * T), y3(out * T);
    cpu::matmul({.w = w.tensor, .x = x.data(), .y = y1.data(), .n_tokens = T});
    EXPECT_LT(rel_err(y1, ref), 1e-6);
    ThreadPool pool(3);
    // Large enough to go parallel.
    const int64_t big_out = 1024;
    const auto bw = random_vec(rng, in * big_out);
    QuantWeight big = make_weight(DType::F32, bw, in, big_out);
    std::vector<float> a(big_out * T), b(big_out * T);
    cpu::matmul({.w = big.tensor, .x = x.data(), .y = a.data(), .n_tokens = T});
    cpu::matmul({.w = big.tensor, .x = x.data(), .y = b.data(), .n_tokens = T, .pool = &pool});
    EXPECT_EQ(a, b);
    // One token at a time gives the same bits as the batch (prefill == incremental relies on it).
    for (int64_t t = 0; t < T; ++t) {
        std::vector<float> one(big_out);
        cpu::matmul({.w = big.tensor, .x = x.data() + t * in, .y = one.data(), .n_tokens = 1, .pool = &pool});
        EXPECT_TRUE(std::equal(one.begin(), one.end(), a.begin() + t * big_out));
    }
}

TEST(Ops, QuantizedWeightsReadAsTheirDequantizedValues) {
    std::mt19937 rng(2);
    const int64_t in = 128, out = 40, T = 3;
    const auto wv = random_vec(rng, in * out, 0.05f), x = random_vec(rng, in * T);
    for (DType type : {DType::Q8_0, DType::F16, DType::BF16}) {
        QuantWeight q = make_weight(type, wv, in, out);
        std::vector<float> deq(in * out);
        for (int64_t r = 0; r < out; ++r) dequantize_row(type, q.tensor.row(r), deq.data() + r * in, in);
        // The matmul reads the weights as their dequantized values and the activations as their quantized form in
        // the weight type's activation type (llama.cpp's vec_dot_type): equal to that double-precision product up
        // to float summation order.
        const DType act = cpu::activation_type(type);
        std::vector<uint8_t> xq(row_bytes(act, in));
        std::vector<float> xd(in * T);
        for (int64_t t = 0; t < T; ++t) {
            cpu::quantize_activations(act, x.data() + t * in, xq.data(), in);
            dequantize_row(act, xq.data(), xd.data() + t * in, in);
        }
        std::vector<double> exact(out * T);
        for (int64_t t = 0; t < T; ++t)
            for (int64_t o = 0; o < out; ++o) {
                double sum = 0;
                for (int64_t i = 0; i < in; ++i) sum += static_cast<double>(deq[o * in + i]) * xd[t * in + i];
                exact[t * out + o] = sum;
            }
        std::vector<float> yq(out * T);
        cpu::matmul({.w = q.tensor, .x = x.data(), .y = yq.data(), .n_tokens = T});
        EXPECT_LT(rel_err(yq, exact), 1e-6) << dtype_name(type);
        // And close to the unquantized product (Q8_0 keeps ~2-3 significant digits per weight).
        std::vector<double> ref(out * T);
        for (int64_t t = 0; t < T; ++t)
            for (int64_t o = 0; o < out; ++o) {
                double s = 0;
                for (int64_t i = 0; i < in; ++i) s += static_cast<double>(wv[o * in + i]) * x[t * in + i];
                ref[t * out + o] = s;
            }
        EXPECT_LT(rel_err(yq, ref), type == DType::F16 ? 2e-3 : 2e-2) << dtype_name(type);
    }
}

TEST(Ops, MatrixViewSelectsExpertAndRows) {
    std::mt19937 rng(3);
    const int64_t in = 32, rows = 6, E = 3;
    const auto v = random_vec(rng, in * rows * E);
    const int64_t ne[3] = {in, rows, E};
    Tensor t = make_tensor("e", DType::F32, 3, ne, v.data());
    Tensor view = cpu::matrix_view(t, 2, 3, 2);
    std::vector<float> row(in);
    cpu::get_row(view, 1, row.data());
    EXPECT_TRUE(std::equal(row.begin(), row.end(), v.begin() + (2 * rows + 4) * in));
}

TEST(Ops, RmsNormPlainAndGrouped) {
    std::mt19937 rng(4);
    const int64_t group = 24, groups = 3;
    const auto x = random_vec(rng, group * groups, 3.0f), g = random_vec(rng, group * groups);
    const float eps = 1e-6f;
    std::vector<float> out(x.size());
    cpu::rms_norm_grouped(x.data(), groups, group, g.data(), eps, out.data());
    std::vector<double> ref(x.size());
    for (int64_t k = 0; k < groups; ++k) {
        double ms = 0;
        for (int64_t i = 0; i < group; ++i) ms += static_cast<double>(x[k * group + i]) * x[k * group + i];
        ms /= group;
        for (int64_t i = 0; i < group; ++i)
            ref[k * group + i] = x[k * group + i] / std::sqrt(ms + eps) * g[k * group + i];
    }
    EXPECT_LT(rel_err(out, ref), 1e-6);
    cpu::rms_norm(x.data(), group, nullptr, eps, out.data());
    double ms = 0;
    for (int64_t i = 0; i < group; ++i) ms += static_cast<double>(x[i]) * x[i];
    for (int64_t i = 0; i < group; ++i) EXPECT_NEAR(out[i], x[i] / std::sqrt(ms / group + eps), 1e-5);
}

TEST(Ops, L2Norm) {
    std::mt19937 rng(5);
    const auto x = random_vec(rng, 37, 2.0f);
    std::vector<float> out(x.size());
    cpu::l2_norm(x.data(), 37, 1e-6f, out.data());
    double ss = 0;
    for (float v : x) ss += static_cast<double>(v) * v;
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(out[i], x[i] / std::sqrt(ss + 1e-6), 1e-6);
}

TEST(Ops, RopeNeoxPartialMatchesRotateHalf) {
    // transformers: inv_freq = base^(-arange(0, d, 2)/d); emb = cat(freqs, freqs);
    // x_rope = x * cos(emb) + rotate_half(x) * sin(emb) over the first d dims, the rest untouched.
    std::mt19937 rng(6);
    const int64_t head = 32, n_rot = 8;
    const float base = 1e6f;
    for (int64_t pos : {0, 1, 7, 123, 4000}) {
        auto x = random_vec(rng, head);
        std::vector<double> ref(x.begin(), x.end());
        for (int64_t i = 0; i < n_rot; ++i) {
            const int64_t f = i % (n_rot / 2);
            const double angle = pos * std::pow(static_cast<double>(base), -2.0 * f / n_rot);
            const double rot = i < n_rot / 2 ? -static_cast<double>(x[i + n_rot / 2]) : x[i - n_rot / 2];
            ref[i] = x[i] * std::cos(angle) + rot * std::sin(angle);
        }
        cpu::rope_neox(x.data(), n_rot, pos, base);
        EXPECT_LT(rel_err(x, ref), 1e-6) << "pos " << pos;
    }
}

TEST(Ops, SoftmaxAndTopK) {
    std::vector<float> x = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f};
    std::vector<float> s = x;
    cpu::softmax(s.data(), 5);
    double z = 0;
    for (float v : x) z += std::exp(static_cast<double>(v));
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(s[i], std::exp(static_cast<double>(x[i])) / z, 1e-7);
    const auto top = cpu::top_k(x.data(), 5, 3);
    EXPECT_EQ(top, (std::vector<int32_t>{1, 3, 0}));  // ties: lower index first
}

TEST(Ops, DilatedCausalConvStepMatchesFullConv) {
    // torch conv1d(padding=(K-1)*d, dilation=d)[:T]: y[t,c] = sum_j w[c,j] * x[t - (K-1-j)*d, c], zero before 0.
    std::mt19937 rng(7);
    const int64_t C = 5, K = 3, T = 20;
    for (int64_t d : {1, 3}) {
        const auto x = random_vec(rng, T * C), w = random_vec(rng, K * C);
        std::vector<float> hist((K - 1) * d * C, 0.0f), y(T * C);
        for (int64_t t = 0; t < T; ++t)
            cpu::causal_conv_step({.x = x.data() + t * C,
                                   .w = w.data(),
                                   .history = hist.data(),
                                   .out = y.data() + t * C,
                                   .channels = C,
                                   .kernel = K,
                                   .dilation = d});
        std::vector<double> ref(T * C, 0.0);
        for (int64_t t = 0; t < T; ++t)
            for (int64_t c = 0; c < C; ++c)
                for (int64_t j = 0; j < K; ++j) {
                    const int64_t src = t - (K - 1 - j) * d;
                    if (src >= 0) ref[t * C + c] += static_cast<double>(w[c * K + j]) * x[src * C + c];
                }
        EXPECT_LT(rel_err(y, ref), 1e-6) << "dilation " << d;
    }
}

// Value heads of 64 and 128 take the AVX-512 form, multiples of 32 the AVX2 one; 6 the generic loop. On every
// instruction set this CPU has; the AVX2 and AVX-512 forms promise the same bits, checked after.
TEST(Ops, GatedDeltaRuleMatchesRecurrentFormula) {
    std::vector<std::vector<float>> outs[cpu::kIsaCount];
    on_each_isa([&](cpu::Isa isa) {
        // torch_recurrent_gated_delta_rule: S *= exp(g); kv = S^T k; delta = (v - kv) * beta; S += k delta^T;
        // o = S^T q.
        std::mt19937 rng(8);
        for (const auto& [dk, dv] : {std::pair<int64_t, int64_t>{8, 6}, {64, 64}, {128, 128}, {16, 128}, {24, 96}}) {
            SCOPED_TRACE("dk " + std::to_string(dk) + ", dv " + std::to_string(dv));
            const int64_t T = 12;
            std::vector<float> state(dk * dv, 0.0f);
            std::vector<double> ref_state(dk * dv, 0.0);
            std::uniform_real_distribution<float> ug(-2.0f, 0.0f), ub(0.0f, 1.0f);
            for (int64_t t = 0; t < T; ++t) {
                auto q = random_vec(rng, dk), k = random_vec(rng, dk), v = random_vec(rng, dv);
                cpu::l2_norm(q.data(), dk, 1e-6f, q.data());
                cpu::l2_norm(k.data(), dk, 1e-6f, k.data());
                const float g = ug(rng), beta = ub(rng);
                std::vector<float> out(dv);
                cpu::gated_delta_step({.state = state.data(),
                                       .q = q.data(),
                                       .k = k.data(),
                                       .v = v.data(),
                                       .g = g,
                                       .beta = beta,
                                       .dk = dk,
                                       .dv = dv,
                                       .out = out.data()});
                for (double& s : ref_state) s *= std::exp(static_cast<double>(g));
                std::vector<double> delta(dv, 0.0), ref_out(dv, 0.0);
                for (int64_t j = 0; j < dv; ++j) {
                    double kv = 0;
                    for (int64_t i = 0; i < dk; ++i) kv += ref_state[i * dv + j] * k[i];
                    delta[j] = (v[j] - kv) * beta;
                }
                for (int64_t i = 0; i < dk; ++i)
                    for (int64_t j = 0; j < dv; ++j) ref_state[i * dv + j] += k[i] * delta[j];
                for (int64_t j = 0; j < dv; ++j)
                    for (int64_t i = 0; i < dk; ++i) ref_out[j] += ref_state[i * dv + j] * q[i];
                EXPECT_LT(rel_err(out, ref_out), 1e-5) << "token " << t;
                if (dv == 64 || dv == 128) outs[static_cast<int>(isa)].push_back(out);
            }
        }
    });
    const auto& avx2 = outs[static_cast<int>(cpu::Isa::Avx2)];
    const auto& avx512 = outs[static_cast<int>(cpu::Isa::Avx512)];
    if (!avx2.empty() && !avx512.empty()) {
        EXPECT_TRUE(avx2 == avx512) << "AVX2 and AVX-512 steps differ in bits";
    }
}

// Head sizes 64, 128 and 256 take the AVX-512 form, and the AVX2 one, on their instruction sets (four cells per
// step, then a tail): cell counts around multiples of 4 and a strided, shuffled selection; 16 the scalar loop.
TEST(Ops, AttendOverSelectedCells) {
    on_each_isa([](cpu::Isa) {
        std::mt19937 rng(9);
        for (const int64_t hd : {16, 64, 128, 256}) {
            for (const int64_t n_sel : {1, 3, 4, 5, 9, 67}) {
                SCOPED_TRACE("head_dim " + std::to_string(hd) + ", " + std::to_string(n_sel) + " cells");
                const int64_t stride = hd + 24, n_cells = 2 * n_sel + 1;
                const auto q = random_vec(rng, hd), kv = random_vec(rng, n_cells * stride * 2);
                const float* keys = kv.data() + 3;
                const float* values = kv.data() + n_cells * stride + 5;
                std::vector<int32_t> cells;
                for (int64_t c = 0; c < n_sel; ++c) cells.push_back(static_cast<int32_t>((7 * c + 2) % n_cells));
                std::vector<float> out(hd);
                const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
                cpu::attend({.q = q.data(),
                             .keys = keys,
                             .values = values,
                             .row_stride = stride,
                             .head_dim = hd,
                             .cells = cells,
                             .scale = scale,
                             .out = out.data()});
                std::vector<double> w;
                double z = 0;
                for (int32_t c : cells) {
                    double s = 0;
                    for (int64_t d = 0; d < hd; ++d) s += static_cast<double>(q[d]) * keys[c * stride + d];
                    w.push_back(std::exp(scale * s));
                    z += w.back();
                }
                std::vector<double> ref(hd, 0.0);
                for (size_t i = 0; i < cells.size(); ++i)
                    for (int64_t d = 0; d < hd; ++d) ref[d] += w[i] / z * values[cells[i] * stride + d];
                // float sums of up to 256 products and 67 weighted rows against double: a few ulp each.
                EXPECT_LT(rel_err(out, ref), 1e-6);
            }
        }
    });
}

TEST(Ops, PleRowsFollowShiftRightIgnoreEos) {
    // Qwen4ExpTextNGramEmbedding._shift_right_ignore_eos over [EOS x (N-1), tokens...]: the token `shift` places back
    // if no EOS sits in between (the predecessor itself included), else EOS. Written here with the cummax formulation.
    PleShape s;
    s.ngram = 4;
    s.heads_per_ngram = 2;
    s.eos = 7;
    s.multipliers = {0x1234567ULL, 0x89abcdefULL * 3 + 1, 0xfedcba987ULL, 0x55555ULL};
    for (int64_t h = 0; h < s.n_heads(); ++h) {
        s.sizes.push_back(101 + 2 * h);
        s.offsets.push_back(h == 0 ? 0 : s.offsets.back() + s.sizes[h - 1]);
    }
    const std::vector<int32_t> tokens = {3, 9, 7, 7, 12, 5, 7, 1, 2, 3, 4, 100};
    const int64_t N = s.ngram, T = static_cast<int64_t>(tokens.size());
    std::vector<int32_t> hist(N - 1, s.eos);
    hist.insert(hist.end(), tokens.begin(), tokens.end());
    const int64_t L = static_cast<int64_t>(hist.size());
    std::vector<int64_t> prev_eos(L);  // last EOS position strictly before p
    int64_t last = -1;
    for (int64_t p = 0; p < L; ++p) {
        prev_eos[p] = last;
        if (hist[p] == s.eos) last = p;
    }
    std::vector<int32_t> window(hist.begin(), hist.begin() + (N - 1));
    for (int64_t t = 0; t < T; ++t) {
        const int64_t p = t + N - 1;
        std::vector<uint64_t> shifted(N);
        for (int64_t sh = 0; sh < N; ++sh) {
            const bool valid = p - (prev_eos[p] + 1) >= sh && p - sh >= 0;
            shifted[sh] = static_cast<uint64_t>(valid ? hist[p - sh] : s.eos);
        }
        std::vector<int64_t> expect;
        for (int64_t n = 2; n <= N; ++n) {
            uint64_t mixed = shifted[0] * s.multipliers[0];
            for (int64_t j = 1; j < n; ++j) mixed ^= shifted[j] * s.multipliers[j];
            for (int64_t g = 0; g < s.heads_per_ngram; ++g) {
                const int64_t h = (n - 2) * s.heads_per_ngram + g;
                expect.push_back(static_cast<int64_t>(mixed % s.sizes[h] + s.offsets[h]));
            }
        }
        EXPECT_EQ(ple_rows(s, window.data(), tokens[t]), expect) << "token " << t;
        window.erase(window.begin());
        window.push_back(tokens[t]);
    }
}

TEST(Ops, QsaSelectKeepsTopBlocksAndTail) {
    // Qwen4ExpTextQSAIndexer for one query: complete blocks of `ratio` visible cells scored by
    // sum_h relu(q_h . k_b) / sqrt(d); the best budget/ratio blocks plus the partial tail.
    std::mt19937 rng(10);
    IndexerShape s{.n_head = 2, .head_dim = 8, .budget = 8, .ratio = 4};
    const int64_t pos = 21;  // 22 visible cells: 5 complete blocks + tail of 2
    const auto q = random_vec(rng, s.n_head * s.head_dim), pooled = random_vec(rng, 5 * s.head_dim);
    std::vector<std::pair<double, int>> scores;
    for (int b = 0; b < 5; ++b) {
        double sum = 0;
        for (int h = 0; h < 2; ++h) {
            double d = 0;
            for (int i = 0; i < 8; ++i) d += static_cast<double>(q[h * 8 + i]) * pooled[b * 8 + i];
            sum += std::max(0.0, d);
        }
        scores.push_back({-sum, b});
    }
    std::sort(scores.begin(), scores.end());
    std::vector<int32_t> expect;
    std::vector<int> blocks = {scores[0].second, scores[1].second};
    std::sort(blocks.begin(), blocks.end());
    for (int b : blocks)
        for (int i = 0; i < 4; ++i) expect.push_back(b * 4 + i);
    expect.push_back(20);
    expect.push_back(21);
    EXPECT_EQ(qsa_select(s, q.data(), pooled.data(), pos), expect);
    // Fewer complete blocks than the budget: everything visible.
    const auto all = qsa_select(s, q.data(), pooled.data(), 6);
    EXPECT_EQ(all, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6}));
}

namespace {

// n tokens of one head through the recurrent formula in double precision (transformers'
// torch_recurrent_gated_delta_rule), with q, k, v rows `stride` floats apart; returns the outputs, updates state.
std::vector<double> delta_rule_reference(std::vector<double>& state, const std::vector<float>& q,
                                         const std::vector<float>& k, const std::vector<float>& v,
                                         const std::vector<float>& g, const std::vector<float>& beta, int64_t n,
                                         int64_t dk, int64_t dv, int64_t stride) {
    std::vector<double> out(static_cast<size_t>(n * dv), 0.0);
    for (int64_t t = 0; t < n; ++t) {
        for (double& s : state) s *= std::exp(static_cast<double>(g[t]));
        std::vector<double> delta(dv, 0.0);
        for (int64_t j = 0; j < dv; ++j) {
            double kv = 0;
            for (int64_t i = 0; i < dk; ++i) kv += state[i * dv + j] * k[t * stride + i];
            delta[j] = (v[t * stride + j] - kv) * beta[t];
        }
        for (int64_t i = 0; i < dk; ++i)
            for (int64_t j = 0; j < dv; ++j) state[i * dv + j] += k[t * stride + i] * delta[j];
        for (int64_t j = 0; j < dv; ++j)
            for (int64_t i = 0; i < dk; ++i) out[t * dv + j] += state[i * dv + j] * q[t * stride + i];
    }
    return out;
}

}  // namespace

TEST(Ops, ChunkedGatedDeltaRuleMatchesRecurrentFormula) {
    // The chunked (WY) form against the token-by-token recurrence, over lengths below, at and across the chunk size,
    // from a non-zero incoming state, with strong and weak decay. Tolerance: both are exact formulas for the same
    // quantity; only float rounding (over up to kDeltaChunk-term sums) separates them, so 1e-4 relative.
    std::mt19937 rng(21);
    for (const int64_t n : {1, 5, 63, 64, 65, 150}) {
        for (const float decay_floor : {-3.0f, -0.05f}) {
            const int64_t dk = 16, dv = 24, stride = 48;
            std::vector<float> q(n * stride), k(n * stride), v(n * stride), g(n), beta(n);
            std::uniform_real_distribution<float> ug(decay_floor, 0.0f), ub(0.0f, 1.0f);
            for (int64_t t = 0; t < n; ++t) {
                auto qt = random_vec(rng, dk), kt = random_vec(rng, dk), vt = random_vec(rng, dv);
                cpu::l2_norm(qt.data(), dk, 1e-6f, qt.data());
                cpu::l2_norm(kt.data(), dk, 1e-6f, kt.data());
                std::copy(qt.begin(), qt.end(), q.begin() + t * stride);
                std::copy(kt.begin(), kt.end(), k.begin() + t * stride);
                std::copy(vt.begin(), vt.end(), v.begin() + t * stride);
                g[t] = ug(rng);
                beta[t] = ub(rng);
            }
            const auto init = random_vec(rng, dk * dv, 0.3f);
            std::vector<float> state = init;
            std::vector<double> ref_state(init.begin(), init.end());
            const auto ref = delta_rule_reference(ref_state, q, k, v, g, beta, n, dk, dv, stride);
            std::vector<float> out(n * dv, -1.0f);
            cpu::gated_delta_chunked({.state = state.data(),
                                      .q = q.data(),
                                      .k = k.data(),
                                      .v = v.data(),
                                      .q_stride = stride,
                                      .k_stride = stride,
                                      .v_stride = stride,
                                      .g = g.data(),
                                      .beta = beta.data(),
                                      .n = n,
                                      .dk = dk,
                                      .dv = dv,
                                      .out = out.data(),
                                      .out_stride = dv});
            EXPECT_LT(rel_err(out, ref), 1e-4) << "n " << n << " decay floor " << decay_floor;
            EXPECT_LT(rel_err(state, ref_state), 1e-4) << "state, n " << n << " decay floor " << decay_floor;
        }
    }
}

TEST(Ops, QsaRadixSelectKeepsTorchsBlocksOnTiesAndRandomScores) {
    // The radix select against torch.topk's own algorithm on the CPU (libstdc++'s std::nth_element, or
    // std::partial_sort when k * 64 <= n, over (score, block) pairs by greater score) on pooled keys built to produce
    // many exact ties (repeated rows) and on random ones; the chosen cells must be the same set, ascending.
    std::mt19937 rng(22);
    for (int trial = 0; trial < 40; ++trial) {
        IndexerShape s{.n_head = 2, .head_dim = 8, .budget = 4 * (1 + trial % 7), .ratio = 4};
        const int64_t pos = 20 + trial * (trial % 5 == 4 ? 97 : 13);
        const int64_t n_blocks = (pos + 1) / s.ratio;
        const auto q = random_vec(rng, s.n_head * s.head_dim);
        auto pooled = random_vec(rng, n_blocks * s.head_dim);
        if (trial % 2 == 0)  // every block a copy of one of three rows: ties everywhere, some at zero score
            for (int64_t b = 0; b < n_blocks; ++b)
                std::copy_n(pooled.begin() + (b % 3) * s.head_dim, s.head_dim, pooled.begin() + b * s.head_dim);
        std::vector<std::pair<double, int64_t>> scored;
        for (int64_t b = 0; b < n_blocks; ++b) {
            float sum = 0.0f;
            for (int64_t h = 0; h < s.n_head; ++h)
                sum += std::max(0.0f, cpu::dot(q.data() + h * s.head_dim, pooled.data() + b * s.head_dim, s.head_dim));
            scored.push_back({sum * (1.0f / std::sqrt(static_cast<float>(s.head_dim))), b});
        }
        const int64_t k = std::min<int64_t>(s.budget / s.ratio, n_blocks);
        const auto greater = [](const auto& a, const auto& b) { return a.first > b.first; };
        if (k * 64 <= n_blocks) std::partial_sort(scored.begin(), scored.begin() + k, scored.end(), greater);
        else std::nth_element(scored.begin(), scored.begin() + k - 1, scored.end(), greater);
        std::vector<int64_t> blocks;
        for (int64_t j = 0; j < k; ++j) blocks.push_back(scored[j].second);
        std::sort(blocks.begin(), blocks.end());
        std::vector<int32_t> expect;
        for (int64_t b : blocks)
            for (int64_t i = 0; i < s.ratio; ++i) expect.push_back(static_cast<int32_t>(b * s.ratio + i));
        for (int64_t c = n_blocks * s.ratio; c <= pos; ++c) expect.push_back(static_cast<int32_t>(c));
        EXPECT_EQ(qsa_select(s, q.data(), pooled.data(), pos), expect) << "trial " << trial;
    }
}

// The array forms of sigmoid and SiLU (the AVX-512 polynomial exp where the matmuls run AVX-512) against the scalar
// functions over libm's expf: within a few ulp everywhere, the tails included, and the same for any split.
TEST(ArrayActivations, MatchTheScalarFunctions) {
    on_each_isa([](cpu::Isa) {
        std::vector<float> x;
        for (float v = -100.0f; v <= 100.0f; v += 0.01953125f) x.push_back(v);
        for (float v : {-1e30f, -88.0f, -87.0f, -20.5f, -1e-30f, 0.0f, 1e-30f, 20.5f, 87.0f, 88.0f, 1e30f})
            x.push_back(v);
        const int64_t n = static_cast<int64_t>(x.size());
        std::vector<float> sig = x;
        strata::cpu::sigmoid_inplace(sig.data(), n);
        std::vector<float> silu = x, ones(x.size(), 1.0f), silu_split = x, silu_alone = x;
        strata::cpu::silu_mul(silu.data(), ones.data(), n);
        strata::cpu::silu_inplace(silu_alone.data(), n);
        strata::cpu::silu_mul(silu_split.data(), ones.data(), 7);  // a short head, then the rest
        strata::cpu::silu_mul(silu_split.data() + 7, ones.data() + 7, n - 7);
        for (int64_t i = 0; i < n; ++i) {
            const float want_sig = strata::cpu::sigmoid(x[i]), want_silu = strata::cpu::silu(x[i]);
            // 4 ulp relative, and an absolute floor where the values underflow (sigmoid(-88) ~ 6e-39 is subnormal).
            EXPECT_NEAR(sig[i], want_sig, 4.8e-7 * std::fabs(want_sig) + 1e-37) << "sigmoid(" << x[i] << ")";
            EXPECT_NEAR(silu[i], want_silu, 4.8e-7 * std::fabs(want_silu) + 1e-35) << "silu(" << x[i] << ")";
            EXPECT_EQ(silu_split[i], silu[i]) << "silu(" << x[i] << ") depends on the split";
            EXPECT_EQ(silu_alone[i], silu[i]) << "silu_inplace(" << x[i] << ") is not silu_mul by 1";
        }
    });
}
