// Which of the fat binary's architectures the driver loaded for the current device: the host asks it before it takes a
// path whose device code exists only for sm_90+ (clusters, programmatic launches), so a build for 75-virtual, whose
// PTX an H200 JIT-compiles, runs the sm_75 code on the host side too.
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/internal.h"

namespace strata::cuda {

namespace {

__global__ void kernel_arch_probe() {}

}  // namespace

int loaded_kernel_arch() {
    // ptxVersion is the virtual architecture the loaded code was compiled from (CUB's PtxVersion asks the same way);
    // every .cu file is built for the same list, so this kernel's answer holds for all of them.
    cudaFuncAttributes attributes{};
    const cudaError_t err = cudaFuncGetAttributes(&attributes, kernel_arch_probe);
    if (err == cudaErrorNoKernelImageForDevice) {
        (void)cudaGetLastError();
        return 0;
    }
    STRATA_CUDA_CHECK(err);
    return attributes.ptxVersion * 10;
}

}  // namespace strata::cuda
