// Lab (issue 8, seed 000): the doorbell ping-pong as one standalone file, for a quick look at a new GPU, driver or
// host link without building the engine. The engine's version with every table row is `strata bench doorbell`
// (src/backend/cuda/doorbell.cu); this one answers the single question "does this device read see the host's store,
// and how fast" in the same way: the GPU waits for flag == i and answers ack = i, the host times each round, every
// wait on either side is bounded so a read that never sees the store shows up as timeouts, never as a hang.
//
//   nvcc -O2 -arch=native bench/lab/doorbell_pingpong.cu -o /tmp/doorbell_pingpong && /tmp/doorbell_pingpong [rounds]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(call)                                                                                 \
    do {                                                                                            \
        cudaError_t e = (call);                                                                     \
        if (e != cudaSuccess) {                                                                     \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e)); \
            std::exit(1);                                                                           \
        }                                                                                           \
    } while (0)

enum Read { kPlain, kVolatile, kAcquireSys, kRmwSys };
const char* kReadNames[] = {"plain load", "ld.volatile", "ld.acquire.sys", "atomicAdd_system(flag, 0)"};

__device__ unsigned read_flag(unsigned* flag, Read read) {
    unsigned v;
    switch (read) {
        case kPlain: return *flag;
        case kVolatile: return *reinterpret_cast<volatile unsigned*>(flag);
        case kAcquireSys: asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory"); return v;
        default: return atomicAdd_system(flag, 0u);
    }
}

// One thread: for each round wait (at most bound_ns of global time) for flag == i, then store ack = i.
__global__ void responder(unsigned* flag, unsigned* ack, unsigned rounds, Read read, unsigned long long bound_ns,
                          unsigned* timeouts) {
    for (unsigned i = 1; i <= rounds; ++i) {
        unsigned long long start, now;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
        while (read_flag(flag, read) != i) {
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
            if (now - start > bound_ns) {
                ++*timeouts;
                break;
            }
        }
        asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(ack), "r"(i) : "memory");
    }
}

int main(int argc, char** argv) {
    const unsigned rounds = argc > 1 ? static_cast<unsigned>(std::atoi(argv[1])) : 10000;
    if (rounds == 0) return std::fprintf(stderr, "usage: %s [rounds > 0]\n", argv[0]), 2;
    cudaDeviceProp prop{};
    CHECK(cudaGetDeviceProperties(&prop, 0));
    int native_atomics = 0;
    CHECK(cudaDeviceGetAttribute(&native_atomics, cudaDevAttrHostNativeAtomicSupported, 0));
    std::printf("%s, hostNativeAtomicSupported %d, %u rounds, device bound 1 ms, host bound 20 ms\n", prop.name,
                native_atomics, rounds);
    std::printf("| read | memory | median us | p90 us | max us | device timeouts | host misses |\n"
                "| --- | --- | ---: | ---: | ---: | ---: | ---: |\n");
    for (unsigned flags : {cudaHostAllocMapped, cudaHostAllocMapped | cudaHostAllocWriteCombined}) {
        for (Read read : {kPlain, kVolatile, kAcquireSys, kRmwSys}) {
            unsigned* host = nullptr;  // flag at [0], ack 64 bytes later
            CHECK(cudaHostAlloc(&host, 4096, flags));
            unsigned *dev = nullptr, *timeouts = nullptr;
            CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev), host, 0));
            CHECK(cudaMallocManaged(&timeouts, sizeof(unsigned)));
            volatile unsigned* flag = host;
            volatile unsigned* ack = host + 16;
            *flag = 0, *ack = 0, *timeouts = 0;
            responder<<<1, 1>>>(dev, dev + 16, rounds, read, 1000000ull, timeouts);
            CHECK(cudaGetLastError());
            std::vector<double> us;
            unsigned misses = 0;
            for (unsigned i = 1; i <= rounds; ++i) {
                const auto t0 = std::chrono::steady_clock::now();
                __atomic_store_n(flag, i, __ATOMIC_SEQ_CST);
                while (*ack < i && std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(20)) {
                }
                misses += *ack < i;
                us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
            }
            CHECK(cudaDeviceSynchronize());
            std::sort(us.begin(), us.end());
            std::printf("| %s | %s | %.2f | %.2f | %.1f | %u / %u | %u |\n", kReadNames[read],
                        flags & cudaHostAllocWriteCombined ? "write-combined" : "mapped", us[us.size() / 2],
                        us[us.size() * 9 / 10], us.back(), *timeouts, rounds, misses);
            CHECK(cudaFree(timeouts));
            CHECK(cudaFreeHost(host));
        }
    }
}
