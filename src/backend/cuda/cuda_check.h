// Private to the CUDA backend: every CUDA runtime call goes through STRATA_CUDA_CHECK, and every kernel launch is
// followed by STRATA_CUDA_CHECK_LAUNCH, so a failure becomes a strata::Error with one line that names the call and
// carries CUDA's own error string.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "core/error.h"

namespace strata::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
    throw Error(std::string("CUDA error in ") + what + " (" + file + ":" + std::to_string(line) +
                "): " + cudaGetErrorString(err) + " [" + cudaGetErrorName(err) + "]");
}

}  // namespace strata::cuda

#define STRATA_CUDA_CHECK(call)                                                             \
    do {                                                                                    \
        const cudaError_t strata_cuda_err_ = (call);                                        \
        if (strata_cuda_err_ != cudaSuccess)                                                \
            ::strata::cuda::throw_cuda_error(strata_cuda_err_, #call, __FILE__, __LINE__);  \
    } while (0)

// After a <<<...>>> launch: configuration errors surface here, faults at the next synchronizing call.
#define STRATA_CUDA_CHECK_LAUNCH(kernel_name)                                                  \
    do {                                                                                       \
        const cudaError_t strata_cuda_err_ = cudaGetLastError();                               \
        if (strata_cuda_err_ != cudaSuccess)                                                   \
            ::strata::cuda::throw_cuda_error(strata_cuda_err_, kernel_name, __FILE__, __LINE__); \
    } while (0)
