// Private to the CUDA backend: kernel launches with programmatic dependent launch (PDL, sm_90+). A kernel launched by
// launch_dependent may start while the kernel before it on the stream still runs, so that its launch and first loads
// overlap that kernel's tail instead of following it. Such a kernel must call kernels::enter_dependent_grid() (or
// wait_for_previous_grid()) before it touches device memory that another kernel writes, and on every path through
// it: a grid that finishes without waiting would let the kernel after it overtake the one before. Kernels launched
// with <<<...>>> keep the plain stream order; for them the two device calls below are no-ops.
//
// Flash-Next decode on the H200 (bench/NOTES.md, session 11, one device call): every decode kernel launched so,
// 168.8 t/s; the matvec launches only, 159.2; none, 148.7.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/internal.h"

namespace strata::cuda {

namespace kernels {

// Waits until the grid this one depends on has finished and its writes are visible (a no-op without PDL).
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel on the stream launch now (it still waits for this grid before it reads what this one writes).
__device__ __forceinline__ void allow_next_grid_to_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// The first statement of a kernel launched by launch_dependent: wait for the kernel before, then let the next one
// launch (after the wait, so at most one grid waits ahead of the running one).
__device__ __forceinline__ void enter_dependent_grid() {
    wait_for_previous_grid();
    allow_next_grid_to_launch();
}

}  // namespace kernels

namespace detail {

template <typename... Params, typename... Args>
void launch_with_attributes(const char* name, unsigned cluster_blocks, void (*kernel)(Params...), dim3 grid, dim3 block,
                            size_t shared_bytes, cudaStream_t stream, Args&&... args) {
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = shared_bytes;
    config.stream = stream;
    cudaLaunchAttribute attributes[2] = {};
    attributes[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[0].val.programmaticStreamSerializationAllowed = programmatic_launch_supported() ? 1 : 0;
    config.attrs = attributes;
    config.numAttrs = 1;
    if (cluster_blocks > 0) {
        attributes[1].id = cudaLaunchAttributeClusterDimension;
        attributes[1].val.clusterDim.x = cluster_blocks;
        attributes[1].val.clusterDim.y = 1;
        attributes[1].val.clusterDim.z = 1;
        config.numAttrs = 2;
    }
    prefer_shared_memory_carveout(reinterpret_cast<const void*>(kernel));
    const cudaError_t err = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
    if (err != cudaSuccess) throw_cuda_error(err, name, __FILE__, __LINE__);
}

}  // namespace detail

// cudaLaunchKernelEx with the programmatic-serialization attribute where the device has it (else a plain launch);
// a launch error becomes a strata::Error naming the kernel.
template <typename... Params, typename... Args>
void launch_dependent(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                      cudaStream_t stream, Args&&... args) {
    detail::launch_with_attributes(name, 0, kernel, grid, block, shared_bytes, stream, std::forward<Args>(args)...);
}

// The same in thread-block clusters of cluster_blocks along x (sm_90+: clusters_supported; grid.x a multiple).
template <typename... Params, typename... Args>
void launch_dependent_clusters(const char* name, unsigned cluster_blocks, void (*kernel)(Params...), dim3 grid,
                               dim3 block, size_t shared_bytes, cudaStream_t stream, Args&&... args) {
    detail::launch_with_attributes(name, cluster_blocks, kernel, grid, block, shared_bytes, stream,
                                   std::forward<Args>(args)...);
}

}  // namespace strata::cuda
