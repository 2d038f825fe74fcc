// Private to the CUDA backend: cuBLAS for the dense products of long prompt windows (issue 26). One handle per
// context, made on the first such product, bound to the context's stream, with its workspace taken from the context's
// accountant (cuBLAS would otherwise allocate one outside the memory plan) and alpha and beta read from device memory
// (the window's activation scale is computed on the device).
#pragma once

#include <cublas_v2.h>

#include "backend/cuda/cuda_backend.h"

namespace strata::cuda {

// The workspace a handle books (the memory plan counts it: runtime/memory_plan.cpp kBlasWorkspace).
constexpr size_t kBlasWorkspaceBytes = size_t{32} << 20;

class BlasHandle {
public:
    explicit BlasHandle(Context& ctx);
    ~BlasHandle();
    BlasHandle(const BlasHandle&) = delete;
    BlasHandle& operator=(const BlasHandle&) = delete;
    cublasHandle_t get() const { return handle_; }

private:
    cublasHandle_t handle_ = nullptr;
    DeviceBuffer workspace_;
};

// Throws Error naming the call and cuBLAS's status when status is not success.
void check_blas(cublasStatus_t status, const char* what);

}  // namespace strata::cuda
