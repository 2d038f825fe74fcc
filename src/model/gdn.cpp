#include "model/gdn.h"

#include <algorithm>
#include <cmath>
#include <vector>

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

// The conv input (q | k | v), the output gate z and the raw beta/alpha logits of every row, whatever the layout.
struct GdnInputs {
    float *qkv, *z, *b, *a;
};

GdnInputs project(const GdnForwardArgs& args) {
    const GdnShape& s = args.shape;
    const GdnWeights& w = args.weights;
    const int64_t T = args.n_tokens;
    const int64_t nv = s.n_v_heads, nk = s.n_k_heads, per_group = nv / nk;
    Scratch& scratch = args.scratch;
    GdnInputs in{.qkv = scratch.take<float>(T * s.conv_dim()),
                 .z = scratch.take<float>(T * s.value_dim()),
                 .b = scratch.take<float>(T * nv),
                 .a = scratch.take<float>(T * nv)};
    // The projections run together in one parallel pass once all are listed (flush).
    cpu::MatmulJob jobs[4];
    size_t n_jobs = 0;
    auto mm = [&](const Tensor& t, float* y) { jobs[n_jobs++] = {.w = &t, .x = args.x, .y = y, .n_tokens = T}; };
    auto flush = [&] {
        cpu::matmul_many({jobs, n_jobs}, args.pool);
        n_jobs = 0;
    };
    if (w.projection == GdnProjection::LegacyFused) {
        // ssm_in: per key group g [q (dk) | k (dk) | v (per_group*dv) | z (per_group*dv)].
        const int64_t group_width = 2 * s.k_head_dim + 2 * per_group * s.v_head_dim;
        float* fused = scratch.take<float>(T * nk * group_width);
        mm(*w.ssm_in, fused);
        flush();
        const int64_t gv = per_group * s.v_head_dim;
        for (int64_t t = 0; t < T; ++t)
            for (int64_t g = 0; g < nk; ++g) {
                const float* src = fused + t * nk * group_width + g * group_width;
                float* qkv = in.qkv + t * s.conv_dim();
                std::copy(src, src + s.k_head_dim, qkv + g * s.k_head_dim);
                std::copy(src + s.k_head_dim, src + 2 * s.k_head_dim, qkv + s.key_dim() + g * s.k_head_dim);
                std::copy(src + 2 * s.k_head_dim, src + 2 * s.k_head_dim + gv, qkv + 2 * s.key_dim() + g * gv);
                std::copy(src + 2 * s.k_head_dim + gv, src + group_width, in.z + t * s.value_dim() + g * gv);
            }
    } else {
        mm(*w.qkv, in.qkv);
        mm(*w.gate, in.z);
    }
    if (w.projection == GdnProjection::Separate) {
        mm(*w.beta, in.b);
        mm(*w.alpha, in.a);
        flush();
    } else {
        // ssm_ba: per key group g [beta (per_group) | alpha (per_group)]; value head g * per_group + j.
        float* ba = scratch.take<float>(T * 2 * nv);
        mm(*w.ba, ba);
        flush();
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
    const int64_t CD = s.conv_dim(), VD = s.value_dim();
    const int64_t n_seq = static_cast<int64_t>(args.sequences.size());
    STRATA_ASSERT(nv % nk == 0);
    STRATA_ASSERT(args.states.size() == args.sequences.size());
    const GdnInputs in = project(args);
    auto window = [&](int64_t i) { return args.windows.empty() ? nullptr : args.windows[static_cast<size_t>(i)]; };
    for (int64_t i = 0; i < n_seq; ++i)
        if (GdnWindow* wl = window(i)) {
            const SequenceRows& rows = args.sequences[static_cast<size_t>(i)];
            const int64_t n = rows.count;
            wl->shape = s;  // field by field: the vectors keep their memory from window to window
            wl->count = n;
            wl->raw.assign(in.qkv + rows.begin * CD, in.qkv + (rows.begin + n) * CD);
            wl->conv.resize(static_cast<size_t>(n * CD));
            wl->g.resize(static_cast<size_t>(n * nv));
            wl->beta.resize(static_cast<size_t>(n * nv));
        }

    // The conv: one sequence at a time through its conv history.
    float* conv = args.scratch.take<float>(T * CD);
    auto conv_rows = [&](int64_t seq_begin, int64_t seq_end) {
        for (int64_t i = seq_begin; i < seq_end; ++i) {
            const SequenceRows& rows = args.sequences[static_cast<size_t>(i)];
            GdnState& state = *args.states[static_cast<size_t>(i)];
            for (int64_t t = rows.begin; t < rows.begin + rows.count; ++t)
                cpu::causal_conv_step({.x = in.qkv + t * CD,
                                       .w = w.conv.data(),
                                       .history = state.conv_history.data(),
                                       .out = conv + t * CD,
                                       .channels = CD,
                                       .kernel = s.conv_kernel,
                                       .dilation = 1});
        }
    };
    if (args.pool && n_seq > 1)
        args.pool->parallel_for(n_seq, conv_rows);
    else
        conv_rows(0, n_seq);
    // SiLU, then L2-normalised (and scaled) q/k: row by row, so a one-sequence prompt spreads over the threads too.
    const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
    parallel_each(args.pool, T, [&](int64_t t) {
        float* c = conv + t * CD;
        cpu::silu_inplace(c, CD);
        float* q = c;
        float* k = c + s.key_dim();
        for (int64_t h = 0; h < nk; ++h) {
            cpu::l2_norm(q + h * dk, dk, 1e-6f, q + h * dk);
            cpu::l2_norm(k + h * dk, dk, 1e-6f, k + h * dk);
            for (int64_t j = 0; j < dk; ++j) q[h * dk + j] *= q_scale;
        }
    });
    for (int64_t i = 0; i < n_seq; ++i)
        if (GdnWindow* wl = window(i)) {
            const SequenceRows& rows = args.sequences[static_cast<size_t>(i)];
            std::copy_n(conv + rows.begin * CD, rows.count * CD, wl->conv.data());
        }

    // The gated delta rule: each (sequence, value head) walks its rows in order on its own state.
    float* core = args.scratch.take<float>(T * VD);
    auto heads = [&](int64_t item_begin, int64_t item_end) {
        for (int64_t item = item_begin; item < item_end; ++item) {
            const int64_t i = item / nv, h = item % nv;
            const SequenceRows& rows = args.sequences[static_cast<size_t>(i)];
            float* state = args.states[static_cast<size_t>(i)]->recurrent.data() + h * dk * dv;
            const int64_t kh = s.tiled_value_heads ? h % nk : h / (nv / nk);
            GdnWindow* wl = window(i);
            for (int64_t t = rows.begin; t < rows.begin + rows.count; ++t) {
                const float* c = conv + t * CD;
                const float beta = cpu::sigmoid(in.b[t * nv + h]);
                const float g = w.a[h] * cpu::softplus(in.a[t * nv + h] + w.dt_bias[h]);
                if (wl) {
                    wl->g[static_cast<size_t>((t - rows.begin) * nv + h)] = g;
                    wl->beta[static_cast<size_t>((t - rows.begin) * nv + h)] = beta;
                }
                float* o = core + t * VD + h * dv;
                cpu::gated_delta_step({.state = state,
                                       .q = c + kh * dk,
                                       .k = c + s.key_dim() + kh * dk,
                                       .v = c + 2 * s.key_dim() + h * dv,
                                       .g = g,
                                       .beta = beta,
                                       .dk = dk,
                                       .dv = dv,
                                       .out = o});
                cpu::rms_norm(o, dv, w.norm.data(), s.eps, o);
                float* z = in.z + t * VD + h * dv;  // read only here: the gate goes in place
                if (s.output_gate == GateActivation::Sigmoid)
                    cpu::sigmoid_inplace(z, dv);
                else
                    cpu::silu_inplace(z, dv);
                for (int64_t j = 0; j < dv; ++j) o[j] *= z[j];
            }
        }
    };
    if (args.pool)
        args.pool->parallel_for(n_seq * nv, heads);
    else
        heads(0, n_seq * nv);
    cpu::matmul({.w = w.out, .x = core, .y = args.out, .n_tokens = T, .pool = args.pool});
}

void gdn_commit(GdnState& state, const GdnWindow& wl, int64_t n_keep) {
    const GdnShape& s = wl.shape;
    const int64_t nk = s.n_k_heads, nv = s.n_v_heads, dk = s.k_head_dim, dv = s.v_head_dim, CD = s.conv_dim();
    STRATA_ASSERT(n_keep >= 0 && n_keep <= wl.count);
    STRATA_ASSERT(std::ssize(state.recurrent) == nv * dk * dv);
    cpu::conv_history_push(state.conv_history.data(), std::ssize(state.conv_history) / CD, CD, wl.raw.data(), n_keep);
    std::vector<float> out(static_cast<size_t>(dv));
    for (int64_t h = 0; h < nv; ++h) {
        const int64_t kh = s.tiled_value_heads ? h % nk : h / (nv / nk);
        for (int64_t t = 0; t < n_keep; ++t) {
            const float* c = wl.conv.data() + t * CD;
            cpu::gated_delta_step({.state = state.recurrent.data() + h * dk * dv,
                                   .q = c + kh * dk,
                                   .k = c + s.key_dim() + kh * dk,
                                   .v = c + 2 * s.key_dim() + h * dv,
                                   .g = wl.g[static_cast<size_t>(t * nv + h)],
                                   .beta = wl.beta[static_cast<size_t>(t * nv + h)],
                                   .dk = dk,
                                   .dv = dv,
                                   .out = out.data()});
        }
    }
}

}  // namespace strata
