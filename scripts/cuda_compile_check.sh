#!/usr/bin/env bash
# Compiles the CUDA backend and its test programs for the oldest architecture of the default list (sm_75, Turing)
# with warnings as errors, so an sm_80+-only instruction without an sm_75 path (cp.async, mma m16n8k16, ...) fails CI
# here instead of in a user's `-DSTRATA_CUDA=ON` build. Nothing runs: this machine needs no GPU, only nvcc.
# Without nvcc it says so and exits 77 (skipped); scripts/test.sh reports that in its summary line.
#   STRATA_CUDA_CHECK_ARCH   the architectures to compile for (default 75)
#   STRATA_CUDA_CHECK_BUILD  build folder (default build-cuda-check)
#   STRATA_JOBS              build parallelism (default: nproc)
set -euo pipefail
cd "$(dirname "$0")/.."

arch=${STRATA_CUDA_CHECK_ARCH:-75}
build=${STRATA_CUDA_CHECK_BUILD:-build-cuda-check}
jobs=${STRATA_JOBS:-$(nproc)}

nvcc=${CUDACXX:-}
if [[ -z $nvcc ]]; then nvcc=$(command -v nvcc || true); fi
if [[ -z $nvcc && -x /usr/local/cuda/bin/nvcc ]]; then nvcc=/usr/local/cuda/bin/nvcc; fi
if [[ -z $nvcc ]]; then
  echo "cuda_compile_check.sh: SKIPPED: no nvcc (not in CUDACXX, on PATH or at /usr/local/cuda/bin/nvcc)" >&2
  exit 77
fi
echo "cuda_compile_check.sh: $("$nvcc" --version | tail -n 1), architectures $arch"

launcher=()
if command -v ccache >/dev/null 2>&1; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
start=$SECONDS
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_WERROR=ON -DSTRATA_CUDA=ON \
  -DSTRATA_CUDA_ONLY_TESTS=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" -DCMAKE_CUDA_COMPILER="$nvcc" "${launcher[@]}"
# The CUDA test programs of -DSTRATA_CUDA_ONLY_TESTS=ON (CMakeLists.txt): they link strata_backend_cuda, every .cu.
ninja -C "$build" -j "$jobs" strata_backend_cuda test_cuda_ops test_cuda_recurrent test_cuda_attention \
  test_cuda_model_ops test_cuda_block_ops test_cuda_doorbell test_cuda_doorbell_wait test_cuda_gdn_recurrence \
  test_cuda_qsa_union
echo "cuda_compile_check.sh: compiled for $arch in $((SECONDS - start)) s"
