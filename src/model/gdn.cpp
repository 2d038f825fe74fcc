#include "model/gdn.h"

#include <cmath>

#include "backend/cpu/ops.h"
#include "core/error.h"

namespace strata {

GdnWeights bind_gdn(const TensorBinder& binder, int64_t block, const GdnShape& s) {
    auto name = [&](const char* n) { return block_tensor(block, n); };
    const int64_t H = s.n_embd;
    const int64_t nv = s.n_v_heads;
    GdnWeights w;
    if (binder.has(name("ssm_ba.weight"))) {
        w.ba = binder.require(name("ssm_ba.weight"), {H, 2 * nv});
        if (binder.has(name("attn_qkv.weight"))) {
            w.projection = GdnProjection::FusedBetaAlpha;
        } else {
            w.projection = GdnProjection::LegacyFused;
            w.ssm_in = binder.require(name("ssm_in.weight"), {H, 2 * s.key_dim() + 2 * s.value_dim()});
        }
    } else {
        w.projection = GdnProjection::Separate;
        w.beta = binder.require(name("ssm_beta.weight"), {H, nv});
        w.alpha = binder.require(name("ssm_alpha.weight"), {H, nv});
    }
    if (w.projection != GdnProjection::LegacyFused) {
        w.qkv = binder.require(name("attn_qkv.weight"), {H, s.conv_dim()});
        w.gate = binder.require(name("attn_gate.weight"), {H, s.value_dim()});
    }
    w.conv = binder.require_f32(name("ssm_conv1d.weight"), {s.conv_kernel, s.conv_dim()});
    w.dt_bias = binder.require_f32(name("ssm_dt.bias"), {nv});
    w.a = binder.require_f32(name("ssm_a"), {nv});
    w.norm = binder.require_f32(name("ssm_norm.weight"), {s.v_head_dim});
    w.out = binder.require(name("ssm_out.weight"), {s.value_dim(), H});
    return w;
}

void GdnState::init(const GdnShape& s) {
    conv_history.assign(static_cast<size_t>((s.conv_kernel - 1) * s.conv_dim()), 0.0f);
    recurrent.assign(static_cast<size_t>(s.n_v_heads * s.k_head_dim * s.v_head_dim), 0.0f);
}

namespace {

// The conv input (q | k | v), the output gate z and the raw beta/alpha logits of every token, whatever the layout.
struct GdnInputs {
    std::vector<float> qkv, z, b, a;
};

GdnInputs project(const GdnForwardArgs& args) {
    const GdnShape& s = args.shape;
    const GdnWeights& w = args.weights;
    const int64_t T = args.n_tokens;
    const int64_t nv = s.n_v_heads, nk = s.n_k_heads, per_group = nv / nk;
    GdnInputs in;
    in.qkv.resize(static_cast<size_t>(T * s.conv_dim()));
    in.z.resize(static_cast<size_t>(T * s.value_dim()));
    in.b.resize(static_cast<size_t>(T * nv));
    in.a.resize(static_cast<size_t>(T * nv));
    auto mm = [&](const Tensor& t, float* y) {
        cpu::matmul({.w = t, .x = args.x, .y = y, .n_tokens = T, .pool = args.pool});
    };
    if (w.projection == GdnProjection::LegacyFused) {
        // ssm_in: per key group g [q (dk) | k (dk) | v (per_group*dv) | z (per_group*dv)].
        const int64_t group_width = 2 * s.k_head_dim + 2 * per_group * s.v_head_dim;
        std::vector<float> fused(static_cast<size_t>(T * nk * group_width));
        mm(*w.ssm_in, fused.data());
        const int64_t gv = per_group * s.v_head_dim;
        for (int64_t t = 0; t < T; ++t)
            for (int64_t g = 0; g < nk; ++g) {
                const float* src = fused.data() + t * nk * group_width + g * group_width;
                float* qkv = in.qkv.data() + t * s.conv_dim();
                std::copy(src, src + s.k_head_dim, qkv + g * s.k_head_dim);
                std::copy(src + s.k_head_dim, src + 2 * s.k_head_dim, qkv + s.key_dim() + g * s.k_head_dim);
                std::copy(src + 2 * s.k_head_dim, src + 2 * s.k_head_dim + gv, qkv + 2 * s.key_dim() + g * gv);
                std::copy(src + 2 * s.k_head_dim + gv, src + group_width, in.z.data() + t * s.value_dim() + g * gv);
            }
    } else {
        mm(*w.qkv, in.qkv.data());
        mm(*w.gate, in.z.data());
    }
    if (w.projection == GdnProjection::Separate) {
        mm(*w.beta, in.b.data());
        mm(*w.alpha, in.a.data());
    } else {
        // ssm_ba: per key group g [beta (per_group) | alpha (per_group)]; value head g * per_group + j.
        std::vector<float> ba(static_cast<size_t>(T * 2 * nv));
        mm(*w.ba, ba.data());
        for (int64_t t = 0; t < T; ++t)
            for (int64_t g = 0; g < nk; ++g)
                for (int64_t j = 0; j < per_group; ++j) {
                    in.b[t * nv + g * per_group + j] = ba[t * 2 * nv + g * 2 * per_group + j];
                    in.a[t * nv + g * per_group + j] = ba[t * 2 * nv + g * 2 * per_group + per_group + j];
                }
    }
    return in;
}

}  // namespace

void gdn_forward(const GdnForwardArgs& args) {
    const GdnShape& s = args.shape;
    const GdnWeights& w = args.weights;
    const int64_t T = args.n_tokens;
    const int64_t nk = s.n_k_heads, nv = s.n_v_heads, dk = s.k_head_dim, dv = s.v_head_dim;
    const int64_t CD = s.conv_dim();
    STRATA_ASSERT(nv % nk == 0);
    GdnInputs in = project(args);

    std::vector<float> conv(static_cast<size_t>(CD));
    std::vector<float> core(static_cast<size_t>(T * s.value_dim()));
    const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
    for (int64_t t = 0; t < T; ++t) {
        cpu::causal_conv_step({.x = in.qkv.data() + t * CD,
                               .w = w.conv.data(),
                               .history = args.state.conv_history.data(),
                               .out = conv.data(),
                               .channels = CD,
                               .kernel = s.conv_kernel,
                               .dilation = 1});
        for (float& v : conv) v = cpu::silu(v);
        float* q = conv.data();
        float* k = conv.data() + s.key_dim();
        const float* v = conv.data() + 2 * s.key_dim();
        for (int64_t h = 0; h < nk; ++h) {
            cpu::l2_norm(q + h * dk, dk, 1e-6f, q + h * dk);
            cpu::l2_norm(k + h * dk, dk, 1e-6f, k + h * dk);
            for (int64_t i = 0; i < dk; ++i) q[h * dk + i] *= q_scale;
        }
        for (int64_t h = 0; h < nv; ++h) {
            const int64_t kh = s.tiled_value_heads ? h % nk : h / (nv / nk);
            const float beta = cpu::sigmoid(in.b[t * nv + h]);
            const float g = w.a[h] * cpu::softplus(in.a[t * nv + h] + w.dt_bias[h]);
            float* o = core.data() + t * s.value_dim() + h * dv;
            cpu::gated_delta_step({.state = args.state.recurrent.data() + h * dk * dv,
                                   .q = q + kh * dk,
                                   .k = k + kh * dk,
                                   .v = v + h * dv,
                                   .g = g,
                                   .beta = beta,
                                   .dk = dk,
                                   .dv = dv,
                                   .out = o});
            cpu::rms_norm(o, dv, w.norm.data(), s.eps, o);
            const float* z = in.z.data() + t * s.value_dim() + h * dv;
            for (int64_t j = 0; j < dv; ++j)
                o[j] *= s.output_gate == GateActivation::Sigmoid ? cpu::sigmoid(z[j]) : cpu::silu(z[j]);
        }
    }
    cpu::matmul({.w = w.out, .x = core.data(), .y = args.out, .n_tokens = T, .pool = args.pool});
}

}  // namespace strata
