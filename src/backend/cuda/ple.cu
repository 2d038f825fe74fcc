// PLE table rows from mapped host memory (model_ops.h): the n-gram hash of ple_rows_into on the device (one thread per
// token and head), the rows' bytes copied over the bus into a device staging buffer, then converted to f32 by the
// dequantize kernels of matvec_*.cu (the same conversion cpu::get_row does). A table read from the file has its rows
// hashed and read on the host (ple_rows_from_host): only the copy and the conversion run here.
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/internal.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/model_ops.h"

namespace strata::cuda {

MappedHostBuffer::MappedHostBuffer(size_t bytes, bool write_combined) : bytes_(bytes) {
    const unsigned flags = cudaHostAllocMapped | (write_combined ? cudaHostAllocWriteCombined : 0u);
    const cudaError_t err = cudaHostAlloc(&host_, bytes ? bytes : 1, flags);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        host_ = nullptr;
        throw Error("CUDA: cannot pin " + std::to_string(bytes) + " bytes of host memory: " + cudaGetErrorString(err));
    }
    STRATA_CUDA_CHECK(cudaHostGetDevicePointer(&device_, host_, 0));
}

MappedHostBuffer::~MappedHostBuffer() {
    if (host_ && cudaFreeHost(host_) != cudaSuccess) (void)cudaGetLastError();
}

namespace {

constexpr int kMaxNgram = 8;
constexpr int kHashThreads = 256;

// rows[t * n_heads + h] for every token of the call, then the history advanced past the call's tokens. One block.
__global__ void __launch_bounds__(kHashThreads)
    ple_hash_kernel(PleGatherArgs a, int64_t n_heads) {
    kernels::enter_dependent_grid();
    const int64_t N = a.ngram, T = a.n_tokens;
    // The n-gram window of token t: `concat` is the history (N - 1 tokens, oldest first) followed by the call's tokens.
    auto concat = [&](int64_t i) { return i < N - 1 ? a.history[i] : a.tokens[i - (N - 1)]; };
    for (int64_t t = threadIdx.x; t < T; t += kHashThreads) {
        uint64_t shifted[kMaxNgram];
        shifted[0] = static_cast<uint64_t>(static_cast<int64_t>(a.tokens[t]));
        bool cut = false;
        for (int64_t j = 1; j < N; ++j) {
            const int32_t prev = concat(N - 1 + t - j);
            shifted[j] = static_cast<uint64_t>(static_cast<int64_t>(cut ? a.eos : prev));
            if (prev == a.eos) cut = true;
        }
        uint64_t mixed = shifted[0] * a.multipliers[0];
        for (int64_t n = 2; n <= N; ++n) {
            mixed ^= shifted[n - 1] * a.multipliers[n - 1];
            for (int64_t g = 0; g < a.heads_per_ngram; ++g) {
                const int64_t h = (n - 2) * a.heads_per_ngram + g;
                const uint64_t size = a.sizes[h];
                // A size of 0 or a row past the table (bad constants) reads as row -1: zeros, never out of bounds.
                const uint64_t row = size ? mixed % size + a.offsets[h] : ~uint64_t{0};
                a.rows[t * n_heads + h] = row < static_cast<uint64_t>(a.table_rows) ? static_cast<int64_t>(row) : -1;
            }
        }
    }
    __syncthreads();
    if (threadIdx.x == 0 && N > 1) {
        int32_t next[kMaxNgram];
        for (int64_t i = 0; i < N - 1; ++i) next[i] = concat(T + i);
        for (int64_t i = 0; i < N - 1; ++i) a.history[i] = next[i];
    }
}

// Block i copies the bytes of row rows[i] into staging row i (zeros for row -1).
__global__ void ple_copy_rows_kernel(const uint8_t* table, size_t row_bytes, const int64_t* rows, uint8_t* staging) {
    kernels::enter_dependent_grid();
    const int64_t row = rows[blockIdx.x];
    uint8_t* dst = staging + blockIdx.x * row_bytes;
    const uint8_t* src = table + static_cast<size_t>(row < 0 ? 0 : row) * row_bytes;
    if (row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(table) % 16 == 0) {
        for (size_t i = threadIdx.x; i < row_bytes / 16; i += blockDim.x)
            reinterpret_cast<uint4*>(dst)[i] =
                row < 0 ? make_uint4(0, 0, 0, 0) : reinterpret_cast<const uint4*>(src)[i];
    } else {
        for (size_t i = threadIdx.x; i < row_bytes / 2; i += blockDim.x)
            reinterpret_cast<uint16_t*>(dst)[i] = row < 0 ? 0 : reinterpret_cast<const uint16_t*>(src)[i];
    }
}

}  // namespace

void ple_gather(Context& ctx, const PleGatherArgs& a) {
    if (a.n_tokens <= 0) return;
    if (a.ngram < 1 || a.ngram > kMaxNgram || a.heads_per_ngram < 0)
        throw Error("CUDA PLE gather: n-gram order must be 1.." + std::to_string(kMaxNgram));
    const int64_t n_heads = (a.ngram - 1) * a.heads_per_ngram;
    if (n_heads == 0) return;
    if (!a.multipliers || !a.offsets || !a.sizes || !a.table || !a.tokens || !a.rows || !a.staging || !a.out ||
        (a.ngram > 1 && !a.history))
        throw Error("CUDA PLE gather: null pointer among the constants, table, tokens, history or outputs");
    if (a.row_width <= 0 || a.table_rows <= 0 || a.row_width % traits(a.table_type).block_size != 0)
        throw Error("CUDA PLE gather: bad table shape");
    if (!supports_matmul(a.table_type) || (traits(a.table_type).block_size > 1 && a.row_width % 16 != 0))
        throw Error(std::string("CUDA PLE gather: table type ") + dtype_name(a.table_type) + " is not supported");
    const int64_t n_rows = a.n_tokens * n_heads;
    if (n_rows > 0x7fffffff) throw Error("CUDA PLE gather: too many rows in one call");
    STRATA_CUDA_CHECK(cudaSetDevice(ctx.info().index));
    cudaStream_t stream = ctx.stream().handle();
    launch_dependent("ple_hash_kernel", ple_hash_kernel, dim3(1), dim3(kHashThreads), 0, stream, a, n_heads);
    const size_t rb = row_bytes(a.table_type, a.row_width);
    launch_dependent("ple_copy_rows_kernel", ple_copy_rows_kernel, dim3(static_cast<unsigned>(n_rows)), dim3(128), 0,
                     stream, static_cast<const uint8_t*>(a.table), rb, a.rows, static_cast<uint8_t*>(a.staging));
    const DequantizeLaunch l{.type = a.table_type, .w = static_cast<const uint8_t*>(a.staging), .row_bytes = rb,
                             .rows = n_rows, .in = a.row_width, .out = a.out, .stream = stream};
    STRATA_ASSERT(launch_dequantize_any(l));
}

void ple_rows_from_host(Context& ctx, const PleHostRowsArgs& a) {
    if (a.n_rows <= 0) return;
    if (!a.host_rows || !a.staging || !a.out) throw Error("CUDA PLE rows from host: null rows, staging or output");
    if (a.row_width <= 0 || a.row_width % traits(a.table_type).block_size != 0)
        throw Error("CUDA PLE rows from host: bad table shape");
    if (!supports_matmul(a.table_type) || (traits(a.table_type).block_size > 1 && a.row_width % 16 != 0))
        throw Error(std::string("CUDA PLE rows from host: table type ") + dtype_name(a.table_type) +
                    " is not supported");
    if (a.n_rows > 0x7fffffff) throw Error("CUDA PLE rows from host: too many rows in one call");
    STRATA_CUDA_CHECK(cudaSetDevice(ctx.info().index));
    cudaStream_t stream = ctx.stream().handle();
    const size_t rb = row_bytes(a.table_type, a.row_width);
    STRATA_CUDA_CHECK(
        cudaMemcpyAsync(a.staging, a.host_rows, rb * static_cast<size_t>(a.n_rows), cudaMemcpyHostToDevice, stream));
    const DequantizeLaunch l{.type = a.table_type,
                             .w = static_cast<const uint8_t*>(a.staging),
                             .row_bytes = rb,
                             .rows = a.n_rows,
                             .in = a.row_width,
                             .out = a.out,
                             .stream = stream};
    STRATA_ASSERT(launch_dequantize_any(l));
}

}  // namespace strata::cuda
