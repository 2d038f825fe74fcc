// The chunked form of the gated delta rule (see ops.h). Notation per chunk of n tokens: G_i = sum_{j<=i} g_j,
// decay(i, j) = exp(G_i - G_j) (<= 1 for j <= i, so nothing overflows however long the decay has run).
//   A[i][j] = -beta_i (k_i . k_j) decay(i, j) for j < i;  T = (I - A)^-1 by forward substitution
//   U = T (beta v),  W = T (beta k exp(G))
//   V' = U - W S                           (the chunk's corrected values against the incoming state S)
//   out_i = exp(G_i) q_i S + sum_{j<=i} (q_i . k_j) decay(i, j) V'_j
//   S <- exp(G_last) S + sum_j exp(G_last - G_j) k_j V'_j^T
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/ops.h"

namespace strata::cpu {

namespace {

struct ChunkBuffers {
    std::vector<float> G, t, u, w, vp;
    void reserve(int64_t n, int64_t dk, int64_t dv) {
        G.resize(static_cast<size_t>(n));
        t.resize(static_cast<size_t>(n * n));
        u.resize(static_cast<size_t>(n * dv));
        vp.resize(static_cast<size_t>(n * dv));
        w.resize(static_cast<size_t>(n * dk));
    }
};

float dot_strided(const float* a, const float* b, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
    return s;
}

void one_chunk(const DeltaChunkArgs& a, int64_t first, int64_t n, ChunkBuffers& b) {
    const int64_t dk = a.dk, dv = a.dv;
    auto q = [&](int64_t i) { return a.q + (first + i) * a.q_stride; };
    auto k = [&](int64_t i) { return a.k + (first + i) * a.k_stride; };
    auto v = [&](int64_t i) { return a.v + (first + i) * a.v_stride; };
    const float* g = a.g + first;
    const float* beta = a.beta + first;
    float* G = b.G.data();
    float* T = b.t.data();   // n x n, lower triangle used
    float* U = b.u.data();   // n x dv
    float* W = b.w.data();   // n x dk
    float* VP = b.vp.data(); // n x dv
    float* S = a.state;      // dk x dv

    float sum = 0.0f;
    for (int64_t i = 0; i < n; ++i) G[i] = sum += g[i];

    // T = (I - A)^-1 by forward substitution: row i becomes A's row i plus A's row i times the rows above it (already
    // done). Going through j upwards, row[m] for m > j still holds A's value when row[j] is formed, as it must.
    for (int64_t i = 0; i < n; ++i) {
        float* row = T + i * n;
        for (int64_t j = 0; j < i; ++j) row[j] = -beta[i] * dot_strided(k(i), k(j), dk) * std::exp(G[i] - G[j]);
        for (int64_t j = 0; j < i; ++j) {
            float acc = row[j];
            for (int64_t m = j + 1; m < i; ++m) acc += row[m] * T[m * n + j];
            row[j] = acc;
        }
        row[i] = 1.0f;
    }

    // U = T (beta v), W = T (beta k exp(G)).
    for (int64_t i = 0; i < n; ++i) {
        float* u = U + i * dv;
        float* w = W + i * dk;
        std::fill(u, u + dv, 0.0f);
        std::fill(w, w + dk, 0.0f);
        for (int64_t j = 0; j <= i; ++j) {
            const float tij = T[i * n + j];
            const float cv = tij * beta[j];
            const float ck = cv * std::exp(G[j]);
            const float* vj = v(j);
            const float* kj = k(j);
            for (int64_t d = 0; d < dv; ++d) u[d] += cv * vj[d];
            for (int64_t d = 0; d < dk; ++d) w[d] += ck * kj[d];
        }
    }
    // V' = U - W S;  out_i = exp(G_i) q_i S (the part from the incoming state).
    for (int64_t i = 0; i < n; ++i) {
        float* vp = VP + i * dv;
        float* o = a.out + (first + i) * a.out_stride;
        std::copy(U + i * dv, U + (i + 1) * dv, vp);
        std::fill(o, o + dv, 0.0f);
        const float* w = W + i * dk;
        const float* qi = q(i);
        const float eg = std::exp(G[i]);
        for (int64_t r = 0; r < dk; ++r) {
            const float* srow = S + r * dv;
            const float wr = w[r], qr = qi[r] * eg;
            for (int64_t d = 0; d < dv; ++d) {
                vp[d] -= wr * srow[d];
                o[d] += qr * srow[d];
            }
        }
    }
    // out_i += sum_{j<=i} (q_i . k_j) decay(i, j) V'_j.
    for (int64_t i = 0; i < n; ++i) {
        float* o = a.out + (first + i) * a.out_stride;
        for (int64_t j = 0; j <= i; ++j) {
            const float c = dot_strided(q(i), k(j), dk) * std::exp(G[i] - G[j]);
            const float* vp = VP + j * dv;
            for (int64_t d = 0; d < dv; ++d) o[d] += c * vp[d];
        }
    }
    // S <- exp(G_last) S + sum_j exp(G_last - G_j) k_j V'_j^T.
    const float last = G[n - 1];
    const float decay = std::exp(last);
    for (int64_t i = 0; i < dk * dv; ++i) S[i] *= decay;
    for (int64_t j = 0; j < n; ++j) {
        const float* kj = k(j);
        const float* vp = VP + j * dv;
        const float e = std::exp(last - G[j]);
        for (int64_t r = 0; r < dk; ++r) {
            const float c = kj[r] * e;
            float* srow = S + r * dv;
            for (int64_t d = 0; d < dv; ++d) srow[d] += c * vp[d];
        }
    }
}

}  // namespace

void gated_delta_chunked(const DeltaChunkArgs& a) {
    thread_local ChunkBuffers buffers;  // grows once; no allocation per call after that
    buffers.reserve(kDeltaChunk, a.dk, a.dv);
    for (int64_t first = 0; first < a.n; first += kDeltaChunk)
        one_chunk(a, first, std::min(kDeltaChunk, a.n - first), buffers);
}

}  // namespace strata::cpu
