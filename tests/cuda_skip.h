// The skip of the model-level CUDA tests (test_cuda_model, test_cuda_offload, test_cuda_speculation), which build
// with and without the CUDA backend: each test starts with SKIP_WITHOUT_CUDA_DEVICE(), which skips with a visible
// reason naming the file's kSkippedTests (a string the including file defines) when there is no device or no backend.
#pragma once

#include <gtest/gtest.h>

#if STRATA_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#define SKIP_WITHOUT_CUDA_DEVICE()                                                                                 \
    do {                                                                                                           \
        if (strata::cuda::device_count() == 0)                                                                     \
            GTEST_SKIP() << "no CUDA device (" << strata::cuda::no_device_reason() << "): " << kSkippedTests       \
                         << " skipped";                                                                            \
    } while (0)
#else
#define SKIP_WITHOUT_CUDA_DEVICE() \
    GTEST_SKIP() << "CUDA backend not compiled in (configure with -DSTRATA_CUDA=ON): " << kSkippedTests << " skipped"
#endif
