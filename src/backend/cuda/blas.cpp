#include "backend/cuda/blas.h"

#include <string>

#include "backend/cuda/cuda_check.h"

namespace strata::cuda {

void check_blas(cublasStatus_t status, const char* what) {
    if (status != CUBLAS_STATUS_SUCCESS)
        throw Error(std::string("cuBLAS error in ") + what + ": " + cublasGetStatusName(status) + " (" +
                    cublasGetStatusString(status) + ")");
}

BlasHandle::BlasHandle(Context& ctx) {
    STRATA_CUDA_CHECK(cudaSetDevice(ctx.info().index));
    workspace_ = ctx.allocate(kBlasWorkspaceBytes, "scratch");
    check_blas(cublasCreate(&handle_), "cublasCreate");
    try {
        check_blas(cublasSetStream(handle_, ctx.stream().handle()), "cublasSetStream");
        check_blas(cublasSetWorkspace(handle_, workspace_.data(), workspace_.size()), "cublasSetWorkspace");
        check_blas(cublasSetPointerMode(handle_, CUBLAS_POINTER_MODE_DEVICE), "cublasSetPointerMode");
    } catch (...) {
        cublasDestroy(handle_);
        throw;
    }
}

BlasHandle::~BlasHandle() {
    if (handle_) (void)cublasDestroy(handle_);
}

}  // namespace strata::cuda
