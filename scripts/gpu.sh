#!/usr/bin/env bash
# The one script for the GPU machine (issue 7), run from the repository root with build-deps/ carried along (made on
# the dev machine by scripts/gpu_deps.sh): configures the CUDA build, builds the CUDA op tests (test_cuda_ops: matrix
# products; test_cuda_recurrent: the GDN/attention recurrent and elementwise ops; test_cuda_attention: the paged KV
# cache and QSA decode attention; test_cuda_model_ops: MoE, hyper-connections, PLE rows, sampling), runs them with
# the perf mode, and copies the logs to $OUT when it is set.
#   STRATA_CUDA_ARCH      CMAKE_CUDA_ARCHITECTURES (default 90: the H200; `native` works too)
#   STRATA_CUDA_BUILD     build folder (default build-cuda)
#   STRATA_CUDA_PERF      0 to skip the timing run (default 1)
#   STRATA_CUDA_SANITIZE  1 to also run the parity tests under compute-sanitizer's memcheck
#   STRATA_WERROR         ON to make warnings errors (default OFF: another nvcc may warn where ours does not)
#   STRATA_CUDA_FLAGS     CMAKE_CUDA_FLAGS (e.g. -D defines of a kernel variant being measured)
#   STRATA_CUDA_TEST_FILTER  a --gtest_filter for the test runs (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."
arch=${STRATA_CUDA_ARCH:-90}
build=${STRATA_CUDA_BUILD:-build-cuda}
deps=$PWD/build-deps
logs=${OUT:-$build/logs}
mkdir -p "$logs"

gtest_dir=$(ls -d "$deps"/lib/*/cmake/GTest 2>/dev/null | head -n1 || true)
if [[ -z "$gtest_dir" ]]; then
    echo "gpu.sh: no GoogleTest in $deps: run scripts/gpu_deps.sh on the dev machine and carry build-deps" >&2
    exit 2
fi
nvcc_path=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}

{
    echo "== machine"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv || true
    "$nvcc_path" --version | tail -n 2
    echo "== configure"
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_WERROR="${STRATA_WERROR:-OFF}" \
        -DSTRATA_CUDA=ON -DSTRATA_CUDA_ONLY_TESTS=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
        -DCMAKE_CUDA_COMPILER="$nvcc_path" -DGTest_DIR="$gtest_dir" \
        -DCMAKE_CUDA_FLAGS="${STRATA_CUDA_FLAGS:-}"
    echo "== build"
    time ninja -C "$build" -j"$(nproc)" test_cuda_ops test_cuda_recurrent test_cuda_attention test_cuda_model_ops
} 2>&1 | tee "$logs/build.log"

# Every program runs even when an earlier one fails; the script's status is the first failure's.
status=0
for program in test_cuda_model_ops test_cuda_attention test_cuda_recurrent test_cuda_ops; do
    echo "== $program$([[ ${STRATA_CUDA_PERF:-1} == 1 ]] && echo ' (tests and perf)')"
    STRATA_CUDA_PERF=${STRATA_CUDA_PERF:-1} "$build/$program" --gtest_filter="${STRATA_CUDA_TEST_FILTER:-*}" 2>&1 |
        tee "$logs/$program.log" || { rc=$?; [[ $status != 0 ]] || status=$rc; }
done

if [[ ${STRATA_CUDA_SANITIZE:-0} == 1 ]]; then
    echo "== compute-sanitizer memcheck (parity tests)"
    compute-sanitizer --tool memcheck --error-exitcode 1 "$build/test_cuda_ops" --gtest_filter='*CudaMatmul*' \
        2>&1 | tee "$logs/memcheck.log"
    compute-sanitizer --tool memcheck --error-exitcode 1 "$build/test_cuda_recurrent" --gtest_filter='-CudaPerf*' \
        2>&1 | tee "$logs/memcheck_recurrent.log"
    compute-sanitizer --tool memcheck --error-exitcode 1 "$build/test_cuda_attention" --gtest_filter='-CudaPerf*' \
        2>&1 | tee "$logs/memcheck_attention.log"
    compute-sanitizer --tool memcheck --error-exitcode 1 "$build/test_cuda_model_ops" --gtest_filter='-CudaPerf*' \
        2>&1 | tee "$logs/memcheck_model_ops.log"
fi
exit $status
