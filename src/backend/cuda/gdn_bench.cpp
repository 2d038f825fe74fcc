// `strata bench gdn-recurrence`: the column and shuffle gated-delta kernels on the same window (gdn_bench.h).
#include "backend/cuda/gdn_bench.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "core/error.h"

namespace strata::cuda {

namespace {

// splitmix64: fast enough for the ~335M values of a 32K-token window, and the same stream on every run.
class Random {
  public:
    explicit Random(uint64_t seed) : state_(seed) {}
    // Uniform in [0, 1).
    float uniform() {
        state_ += 0x9e3779b97f4a7c15ULL;
        uint64_t z = state_;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        z ^= z >> 31;
        return static_cast<float>(z >> 40) * 0x1.0p-24f;
    }
    float symmetric() { return 2.0f * uniform() - 1.0f; }

  private:
    uint64_t state_;
};

// Two CUDA events around the work queued between start() and stop().
class EventTimer {
  public:
    EventTimer() {
        STRATA_CUDA_CHECK(cudaEventCreate(&start_));
        STRATA_CUDA_CHECK(cudaEventCreate(&stop_));
    }
    ~EventTimer() {
        if (cudaEventDestroy(start_) != cudaSuccess || cudaEventDestroy(stop_) != cudaSuccess) (void)cudaGetLastError();
    }
    EventTimer(const EventTimer&) = delete;
    EventTimer& operator=(const EventTimer&) = delete;
    void start(cudaStream_t s) { STRATA_CUDA_CHECK(cudaEventRecord(start_, s)); }
    void stop(cudaStream_t s) { STRATA_CUDA_CHECK(cudaEventRecord(stop_, s)); }
    double elapsed_ms() const {
        STRATA_CUDA_CHECK(cudaEventSynchronize(stop_));
        float ms = 0;
        STRATA_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
        return ms;
    }

  private:
    cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// Values whose bytes differ between two device arrays of n elements of `size` bytes, compared in host chunks.
int64_t count_mismatches(const Context& ctx, const void* a, const void* b, int64_t n, size_t size) {
    constexpr int64_t kChunk = int64_t{1} << 24;
    std::vector<unsigned char> ha, hb;
    int64_t differ = 0;
    for (int64_t first = 0; first < n; first += kChunk) {
        const size_t count = static_cast<size_t>(std::min(kChunk, n - first)), bytes = count * size;
        ha.resize(bytes);
        hb.resize(bytes);
        ctx.download(static_cast<const unsigned char*>(a) + static_cast<size_t>(first) * size, ha.data(), bytes);
        ctx.download(static_cast<const unsigned char*>(b) + static_cast<size_t>(first) * size, hb.data(), bytes);
        for (size_t i = 0; i < count; ++i) differ += std::memcmp(ha.data() + i * size, hb.data() + i * size, size) != 0;
    }
    return differ;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

}  // namespace

GdnRecurrenceBenchResult time_gdn_recurrences(Context& ctx, const GdnRecurrenceBenchOptions& o) {
    if (o.tokens < 1 || o.heads < 1 || o.key_heads < 1 || o.dk < 1 || o.dv < 1 || o.repeats < 1)
        throw Error("bench gdn-recurrence: tokens, heads, key heads, dk, dv and repeats must be positive");
    const int64_t key_dim = o.key_heads * o.dk, row = 2 * key_dim + o.heads * o.dv, out_row = o.heads * o.dv;
    const int64_t n_state = o.heads * o.dk * o.dv, n_out = o.tokens * out_row;
    const auto bytes = [](int64_t n, size_t size) { return static_cast<size_t>(n) * size; };

    // Token rows as the model's conv output lays them out: [q heads | k heads | v heads], generated and uploaded in
    // chunks so the host holds a few MB at a time.
    DeviceBuffer rows = ctx.allocate(bytes(o.tokens * row, 4), "bench gdn inputs");
    Random rng(o.seed);
    constexpr int64_t kChunkTokens = 256;
    std::vector<float> chunk;
    for (int64_t t0 = 0; t0 < o.tokens; t0 += kChunkTokens) {
        const int64_t n = std::min(kChunkTokens, o.tokens - t0);
        chunk.resize(static_cast<size_t>(n * row));
        for (float& x : chunk) x = rng.symmetric();
        for (int64_t t = 0; t < n; ++t)
            for (int64_t head = 0; head < 2 * o.key_heads; ++head) {  // q heads, then k heads
                float* x = chunk.data() + t * row + head * o.dk;
                double sum = 0;
                for (int64_t i = 0; i < o.dk; ++i) sum += static_cast<double>(x[i]) * x[i];
                const float scale = static_cast<float>(1.0 / std::sqrt(std::max(sum, 1e-12))) *
                                    (head < o.key_heads ? 1.0f / std::sqrt(static_cast<float>(o.dk)) : 1.0f);
                for (int64_t i = 0; i < o.dk; ++i) x[i] *= scale;
            }
        ctx.copy_to_device(rows.as<float>() + t0 * row, chunk.data(), bytes(n * row, 4));
    }
    std::vector<float> g(static_cast<size_t>(o.tokens * o.heads)), beta(g.size()), state(static_cast<size_t>(n_state));
    for (size_t i = 0; i < g.size(); ++i) g[i] = -0.01f - 1.49f * rng.uniform(), beta[i] = rng.uniform();
    for (float& x : state) x = 0.5f * rng.symmetric();
    const DeviceBuffer d_g = ctx.upload(g.data(), bytes(static_cast<int64_t>(g.size()), 4), "bench gdn inputs");
    const DeviceBuffer d_beta =
        ctx.upload(beta.data(), bytes(static_cast<int64_t>(beta.size()), 4), "bench gdn inputs");
    const DeviceBuffer state0 = ctx.upload(state.data(), bytes(n_state, 4), "bench gdn state");

    struct Side {
        GdnRecurrence recurrence;
        DeviceBuffer state, out, out_f16;
    };
    Side sides[2] = {
        {GdnRecurrence::Column, ctx.allocate(bytes(n_state, 4), "bench gdn state"),
         ctx.allocate(bytes(n_out, 4), "bench gdn outputs"), ctx.allocate(bytes(n_out, 2), "bench gdn outputs")},
        {GdnRecurrence::Shuffle, ctx.allocate(bytes(n_state, 4), "bench gdn state"),
         ctx.allocate(bytes(n_out, 4), "bench gdn outputs"), ctx.allocate(bytes(n_out, 2), "bench gdn outputs")}};
    cudaStream_t stream = ctx.stream().handle();
    const auto call = [&](Side& side, bool with_f16) {
        const float* r = rows.as<float>();
        gated_delta(ctx, {.state = side.state.as<float>(),
                          .q = r,
                          .k = r + key_dim,
                          .v = r + 2 * key_dim,
                          .q_stride = row,
                          .k_stride = row,
                          .v_stride = row,
                          .g = d_g.as<float>(),
                          .beta = d_beta.as<float>(),
                          .out = side.out.as<float>(),
                          .out_stride = out_row,
                          .n_tokens = o.tokens,
                          .heads = o.heads,
                          .key_heads = o.key_heads,
                          .tiled_value_heads = o.tiled_value_heads,
                          .dk = o.dk,
                          .dv = o.dv,
                          .out_f16 = with_f16 ? side.out_f16.as<uint16_t>() : nullptr,
                          .recurrence = side.recurrence});
    };

    // The check: both from the same state, every output in both precisions.
    for (Side& side : sides) {
        STRATA_CUDA_CHECK(
            cudaMemcpyAsync(side.state.data(), state0.data(), bytes(n_state, 4), cudaMemcpyDeviceToDevice, stream));
        call(side, true);
    }
    ctx.synchronize();
    GdnRecurrenceBenchResult result{.tokens = o.tokens};
    result.compared = n_state + 2 * n_out;
    result.mismatches = count_mismatches(ctx, sides[0].state.data(), sides[1].state.data(), n_state, 4) +
                        count_mismatches(ctx, sides[0].out.data(), sides[1].out.data(), n_out, 4) +
                        count_mismatches(ctx, sides[0].out_f16.data(), sides[1].out_f16.data(), n_out, 2);

    // The timing: a warm-up call each, then the kernels in alternation so clock and thermal drift hit both alike. Each
    // call carries on from the state the previous one left (the decay keeps it bounded).
    EventTimer timer;
    std::vector<double> times[2];
    for (int rep = -1; rep < o.repeats; ++rep)
        for (int s = 0; s < 2; ++s) {
            timer.start(stream);
            call(sides[s], false);
            timer.stop(stream);
            const double ms = timer.elapsed_ms();
            if (rep >= 0) times[s].push_back(ms);
        }
    result.column_ms = median(times[0]);
    result.shuffle_ms = median(times[1]);
    return result;
}

}  // namespace strata::cuda
