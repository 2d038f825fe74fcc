// The paged KV cache: allocation and the append kernel (attention.h states the layout and the int8 rule).
#include <cuda_fp16.h>

#include <string>

#include "backend/cuda/attention.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.cuh"

namespace strata::cuda {

namespace {

void check_shape(const KvCacheShape& s, const char* who) {
    const bool dim_ok = s.storage == KvStorage::F16
                            ? (s.head_dim == 32 || s.head_dim == 64 || s.head_dim == 128 || s.head_dim == 256)
                            : (s.head_dim == 64 || s.head_dim == 128 || s.head_dim == 256);
    if (!dim_ok)
        throw Error(std::string("CUDA ") + who + ": head_dim " + std::to_string(s.head_dim) + " is not supported (" +
                    (s.storage == KvStorage::F16 ? "32, 64, 128, 256" : "int8: 64, 128, 256") + ")");
    if (s.n_head_kv <= 0 || s.n_head_kv > 1024)
        throw Error(std::string("CUDA ") + who + ": n_head_kv must be in 1..1024");
    if (s.n_pages <= 0 || s.n_pages > (int64_t{1} << 30))
        throw Error(std::string("CUDA ") + who + ": page count must be in 1..2^30");
}

constexpr int kAppendThreads = 256;

// Block (t, h): token t's row of kv head h, K then V. Int8: one warp per group of 64 values (two per lane), the group's
// absolute maximum by shuffles; F16: each thread converts its values.
__global__ void __launch_bounds__(kAppendThreads) kv_append_kernel(KvCacheView c, PageTable table, const float* k,
                                                                   const float* v, int64_t k_stride, int64_t v_stride,
                                                                   const int32_t* positions, int32_t* n_cells) {
    kernels::enter_dependent_grid();
    const int64_t t = blockIdx.x, h = blockIdx.y;
    const int64_t nkv = c.shape.n_head_kv, hd = c.shape.head_dim;
    const int32_t pos = positions[t];
    if (pos < 0 || pos >= table.n_logical_pages * kKvPageCells) return;
    const int32_t page = table.pages[pos / kKvPageCells];
    if (page < 0 || page >= c.shape.n_pages) return;
    if (h == 0 && threadIdx.x == 0) atomicMax(n_cells, pos + 1);
    const int64_t row = (static_cast<int64_t>(page) * nkv + h) * kKvPageCells + pos % kKvPageCells;
    for (int which = 0; which < 2; ++which) {
        const float* x = (which == 0 ? k + t * k_stride : v + t * v_stride) + h * hd;
        if (c.shape.storage == KvStorage::F16) {
            __half* dst = static_cast<__half*>(which == 0 ? c.k : c.v) + row * hd;
            for (int64_t d = threadIdx.x; d < hd; d += kAppendThreads) dst[d] = __float2half_rn(x[d]);
        } else {
            const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
            int8_t* dst = static_cast<int8_t*>(which == 0 ? c.k : c.v) + row * hd;
            uint16_t* scales = (which == 0 ? c.k_scales : c.v_scales) + row * (hd / kKvInt8Group);
            for (int64_t g = warp; g < hd / kKvInt8Group; g += kAppendThreads / 32) {
                const float x0 = x[g * kKvInt8Group + lane], x1 = x[g * kKvInt8Group + 32 + lane];
                float amax = fmaxf(fabsf(x0), fabsf(x1));
#pragma unroll
                for (int off = 16; off > 0; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
                const float d = amax / 127.0f;
                const float id = d != 0.0f ? 1.0f / d : 0.0f;
                const float q0 = fminf(fmaxf(roundf(__fmul_rn(x0, id)), -127.0f), 127.0f);
                const float q1 = fminf(fmaxf(roundf(__fmul_rn(x1, id)), -127.0f), 127.0f);
                dst[g * kKvInt8Group + lane] = static_cast<int8_t>(q0);
                dst[g * kKvInt8Group + 32 + lane] = static_cast<int8_t>(q1);
                if (lane == 0) scales[g] = __half_as_ushort(__float2half_rn(d));
            }
        }
    }
}

}  // namespace

size_t KvCache::value_bytes_per_page(const KvCacheShape& s) {
    return static_cast<size_t>(s.n_head_kv * kKvPageCells * s.head_dim) * (s.storage == KvStorage::F16 ? 2 : 1);
}

size_t KvCache::scale_bytes_per_page(const KvCacheShape& s) {
    return s.storage == KvStorage::F16 ? 0
                                       : static_cast<size_t>(s.n_head_kv * kKvPageCells * (s.head_dim / kKvInt8Group)) *
                                             2;
}

KvCache::KvCache(Context& ctx, const KvCacheShape& shape) {
    check_shape(shape, "KvCache");
    const size_t values = value_bytes_per_page(shape) * static_cast<size_t>(shape.n_pages);
    k_ = ctx.allocate(values, "kv cache");
    v_ = ctx.allocate(values, "kv cache");
    view_.shape = shape;
    view_.k = k_.data();
    view_.v = v_.data();
    if (shape.storage == KvStorage::Int8) {
        const size_t scales = scale_bytes_per_page(shape) * static_cast<size_t>(shape.n_pages);
        k_scales_ = ctx.allocate(scales, "kv cache");
        v_scales_ = ctx.allocate(scales, "kv cache");
        view_.k_scales = k_scales_.as<uint16_t>();
        view_.v_scales = v_scales_.as<uint16_t>();
    }
}

void kv_append(Context& ctx, const KvAppendArgs& a) {
    check_shape(a.cache.shape, "kv_append");
    if (a.n_tokens < 0) throw Error("CUDA kv_append: n_tokens is negative");
    if (a.n_tokens == 0) return;
    if (a.n_tokens > 0x7fffffff) throw Error("CUDA kv_append: too many tokens in one call");
    if (!a.cache.k || !a.cache.v || (a.cache.shape.storage == KvStorage::Int8 && (!a.cache.k_scales ||
                                                                                   !a.cache.v_scales)))
        throw Error("CUDA kv_append: the cache has no storage");
    if (!a.k || !a.v || !a.positions || !a.n_cells || !a.table.pages)
        throw Error("CUDA kv_append: a null pointer among k, v, positions, n_cells, page table");
    if (a.table.n_logical_pages <= 0) throw Error("CUDA kv_append: the page table is empty");
    const int64_t width = a.cache.shape.n_head_kv * a.cache.shape.head_dim;
    const int64_t k_stride = a.k_stride ? a.k_stride : width, v_stride = a.v_stride ? a.v_stride : width;
    if (k_stride < width || v_stride < width) throw Error("CUDA kv_append: token strides shorter than a row");
    STRATA_CUDA_CHECK(cudaSetDevice(ctx.info().index));
    const dim3 grid(static_cast<unsigned>(a.n_tokens), static_cast<unsigned>(a.cache.shape.n_head_kv));
    launch_dependent("kv_append_kernel", kv_append_kernel, grid, dim3(kAppendThreads), 0, ctx.stream().handle(),
                     a.cache, a.table, a.k, a.v, k_stride, v_stride, a.positions, a.n_cells);
}

}  // namespace strata::cuda
