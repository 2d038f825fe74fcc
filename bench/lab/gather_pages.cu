// Lab (issue 7): why the gathered MoE products run at ~550 GB/s when dense products of the same size reach 2+ TB/s.
// A Flash-Next decode token reads 20 expert slices of ~473 KB (gate and up of 10 experts) scattered over a multi-GB
// tensor. This file times one read of 20 such slices, each in its own 2 MB page, in five ways:
//   cold     pages no kernel touched for a while (L2 and TLB cold)
//   warm-tlb the other half of the same pages, right after "cold" (address translations warm, data not in L2)
//   packed   20 slices back to back in one 9.5 MB span (few pages)
//   prefetch cold pages, after a kernel that issues one prefetch.global.L2 per 64 KB of each slice (timed together)
//   dense    one 9.5 MB span read as one slice
// If "warm-tlb" and "packed" are much faster than "cold", translation misses, not bandwidth, bound the gather.
//
//   nvcc -O2 -arch=native bench/lab/gather_pages.cu -o /tmp/gather_pages && /tmp/gather_pages
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#define CHECK(call)                                                                                 \
    do {                                                                                            \
        cudaError_t e = (call);                                                                     \
        if (e != cudaSuccess) {                                                                     \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e)); \
            std::exit(1);                                                                           \
        }                                                                                           \
    } while (0)

constexpr size_t kPage = size_t{2} << 20;
constexpr int kSlices = 20;
constexpr size_t kSliceBytes = 640 * 740;  // one expert's gate rows in IQ2_XS at hidden 2560
constexpr int kThreads = 256;
constexpr int kBlocksPerSlice = 40;

struct Slices {
    const uint4* at[kSlices];
};

// Block (x, y) streams its 1/kBlocksPerSlice of slice y with 16-byte loads, 4 in flight per thread.
__global__ void read_slices(Slices s, size_t slice_bytes, unsigned* sink) {
    const size_t n = slice_bytes / 16;
    const size_t per_block = (n + gridDim.x - 1) / gridDim.x;
    const size_t begin = blockIdx.x * per_block, end = min(n, begin + per_block);
    const uint4* p = s.at[blockIdx.y];
    unsigned acc = 0;
    for (size_t i = begin + threadIdx.x; i < end; i += 4 * blockDim.x) {
        uint4 v[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) v[k] = i + k * blockDim.x < end ? __ldcs(p + i + k * blockDim.x) : uint4{};
#pragma unroll
        for (int k = 0; k < 4; ++k) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
    }
    if (acc == 0x12345678u) *sink = acc;  // keeps the loads
}

// One prefetch per 64 KB of every slice: the translations (and the first lines) start loading.
__global__ void prefetch_slices(Slices s, size_t slice_bytes) {
    const size_t step = 64 * 1024;
    const size_t per_slice = (slice_bytes + step - 1) / step;
    for (size_t i = threadIdx.x; i < per_slice * kSlices; i += blockDim.x) {
        const char* a = reinterpret_cast<const char*>(s.at[i / per_slice]) + (i % per_slice) * step;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
    }
}

int main() {
    size_t free_bytes = 0, total = 0;
    CHECK(cudaMemGetInfo(&free_bytes, &total));
    const size_t arena_bytes = std::min<size_t>(free_bytes - (size_t{8} << 30), size_t{64} << 30) / kPage * kPage;
    char* arena = nullptr;
    CHECK(cudaMalloc(&arena, arena_bytes));
    CHECK(cudaMemset(arena, 1, arena_bytes));
    const size_t n_pages = arena_bytes / kPage;
    std::printf("arena %.1f GB (%zu pages of 2 MB); %d slices of %zu bytes, %d blocks of %d threads each\n",
                arena_bytes / 1e9, n_pages, kSlices, kSliceBytes, kBlocksPerSlice, kThreads);
    unsigned* sink = nullptr;
    CHECK(cudaMalloc(&sink, 4));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    std::mt19937_64 rng(5);
    // Reading a fresh 256 MB region between trials evicts the L2 and much of the TLB.
    size_t flush_page = 0;
    auto flush = [&] {
        Slices f{};
        for (int k = 0; k < kSlices; ++k)
            f.at[k] = reinterpret_cast<const uint4*>(arena + (flush_page++ % n_pages) * kPage);
        read_slices<<<dim3(kBlocksPerSlice, kSlices), kThreads>>>(f, 6 * kPage, sink);
    };
    auto time_read = [&](const Slices& s, size_t bytes, bool with_prefetch) {
        CHECK(cudaEventRecord(e0));
        if (with_prefetch) prefetch_slices<<<1, 256>>>(s, bytes);
        // Slices: kBlocksPerSlice blocks each; one dense span: as many blocks in all.
        const bool one_span = bytes != kSliceBytes;
        read_slices<<<dim3(one_span ? kBlocksPerSlice * kSlices : kBlocksPerSlice, one_span ? 1 : kSlices),
                      kThreads>>>(s, bytes, sink);
        CHECK(cudaEventRecord(e1));
        CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        return ms * 1e3;
    };
    const char* names[] = {"cold", "warm-tlb", "packed", "prefetch", "dense"};
    std::vector<double> us[5];
    for (int trial = 0; trial < 41; ++trial) {
        Slices cold{}, warm{}, packed{}, pre{}, dense{};
        for (int k = 0; k < kSlices; ++k) {
            const size_t page = rng() % n_pages;
            cold.at[k] = reinterpret_cast<const uint4*>(arena + page * kPage);
            warm.at[k] = reinterpret_cast<const uint4*>(arena + page * kPage + kPage / 2);
            pre.at[k] = reinterpret_cast<const uint4*>(arena + (rng() % n_pages) * kPage);
        }
        const size_t packed_base = (rng() % (n_pages - 8)) * kPage;
        for (int k = 0; k < kSlices; ++k)
            packed.at[k] = reinterpret_cast<const uint4*>(arena + packed_base + k * kSliceBytes / 16 * 16);
        dense.at[0] = reinterpret_cast<const uint4*>(arena + (rng() % (n_pages - 8)) * kPage);
        flush();
        const double c = time_read(cold, kSliceBytes, false);
        const double w = time_read(warm, kSliceBytes, false);
        flush();
        const double p = time_read(packed, kSliceBytes, false);
        flush();
        const double f = time_read(pre, kSliceBytes, true);
        flush();
        const double d = time_read(dense, kSliceBytes * kSlices, false);
        if (trial == 0) continue;  // warm-up
        us[0].push_back(c);
        us[1].push_back(w);
        us[2].push_back(p);
        us[3].push_back(f);
        us[4].push_back(d);
    }
    std::printf("%-10s %10s %10s %10s\n", "read", "median us", "min us", "GB/s");
    for (int i = 0; i < 5; ++i) {
        std::sort(us[i].begin(), us[i].end());
        const double med = us[i][us[i].size() / 2];
        std::printf("%-10s %10.2f %10.2f %10.0f\n", names[i], med, us[i][0], kSlices * kSliceBytes / (med * 1e-6) / 1e9);
    }
    return 0;
}
