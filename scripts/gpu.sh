#!/usr/bin/env bash
# The one script for the GPU machine (issue 7), run from the repository root with build-deps/ or build-deps.txz
# carried along (made on the dev machine by scripts/gpu_deps.sh): configures and builds with CUDA (see below), runs
# the CUDA op tests
# (test_cuda_ops: matrix products; test_cuda_recurrent: the GDN/attention recurrent and elementwise ops;
# test_cuda_attention: the paged KV cache and QSA decode attention; test_cuda_model_ops: MoE, hyper-connections, PLE
# rows, sampling; test_cuda_block_ops: the blocks' small per-token ops; test_cuda_doorbell and test_cuda_doorbell_wait:
# the doorbell ping-pong and the engine's doorbell; test_cuda_gdn_recurrence: the GDN recurrence's column and shuffle
# kernels bit for bit, and their timing; test_cuda_qsa_union: QSA attention over 8-position selection unions against
# the per-query kernel and FP64) with the perf mode, and copies the logs to $OUT when it is set.
# By default it builds the whole project with -DSTRATA_CUDA=ON (`strata` and every test program; PCRE2, utf8proc,
# nlohmann_json and cpp-httplib come from build-deps through -DSTRATA_DEPS_PREFIX) and then also runs every other
# test_cuda_* program the full build made (test_cuda_model...). STRATA_CUDA_ONLY_TESTS=1 builds only the CUDA op
# tests above (-DSTRATA_CUDA_ONLY_TESTS=ON: core, backend_cpu, backend_cuda; quicker, and needs only GoogleTest).
#   STRATA_CUDA_ONLY_TESTS  1 for the op tests alone (default 0: the whole project)
#   STRATA_CUDA_CTEST     1 to also run the whole ctest (full build only): the CPU tests too, not the Cuda* ones (they
#                         ran above); those that need node or llama.cpp skip themselves with a message. Log: ctest.log
#   STRATA_CUDA_ARCH      CMAKE_CUDA_ARCHITECTURES (default 90: the H200; `native` works too; 75-virtual runs the
#                         sm_75 (Turing) code on the H200, its PTX JIT-compiled by the driver: use another
#                         STRATA_CUDA_BUILD, and the first run of each kernel waits for its JIT)
#   STRATA_CUDA_BUILD     build folder (default build-cuda)
#   STRATA_CUDA_PERF      0 to skip the timing run (default 1)
#   STRATA_CUDA_SANITIZE  1 to also run the parity tests under compute-sanitizer's memcheck
#   STRATA_WERROR         ON to make warnings errors (default OFF: another nvcc may warn where ours does not)
#   STRATA_CUDA_FLAGS     CMAKE_CUDA_FLAGS (e.g. -D defines of a kernel variant being measured)
#   STRATA_CUDA_TEST_FILTER  a --gtest_filter for the test runs (default: all)
#   STRATA_CUDA_TESTS     0 to skip the test programs (a benchmark-only run)
#   STRATA_CUDA_TARGETS   ninja targets of the full build (default: all), e.g. "strata test_cuda_offload"
#   STRATA_CUDA_PROGRAMS  the test programs to run (default: the op tests, then every other test_cuda_* built)
#   STRATA_CUDA_BENCH     quick, depth, all (or offload, prompts, spec: see gpu_bench.sh): then scripts/gpu_bench.sh
#                         benchmarks the CUDA forward pass on synthesized qwen4exp-mid and flash-next files (full
#                         build only; log: bench.log)
set -euo pipefail
cd "$(dirname "$0")/.."
arch=${STRATA_CUDA_ARCH:-90}
build=${STRATA_CUDA_BUILD:-build-cuda}
deps=$PWD/build-deps
logs=${OUT:-$build/logs}
mkdir -p "$logs"

[[ -d $deps || ! -f build-deps.txz ]] || tar xJf build-deps.txz
gtest_dir=$(ls -d "$deps"/lib/*/cmake/GTest 2>/dev/null | head -n1 || true)
if [[ -z "$gtest_dir" ]]; then
    echo "gpu.sh: no GoogleTest in $deps: run scripts/gpu_deps.sh on the dev machine and carry build-deps" >&2
    exit 2
fi
only_tests=${STRATA_CUDA_ONLY_TESTS:-0}
full_args=()
bindir=$build  # where the test programs land: the full build puts them in tests/
if [[ $only_tests != 1 ]]; then
    for need in include/httplib.h include/pcre2.h include/utf8proc.h lib/libpcre2-8.a share/cmake/nlohmann_json; do
        [[ -e "$deps/$need" ]] || { echo "gpu.sh: $deps/$need missing: re-run scripts/gpu_deps.sh on the dev" \
            "machine (or STRATA_CUDA_ONLY_TESTS=1 for the op tests alone)" >&2; exit 2; }
    done
    full_args=(-DSTRATA_DEPS_PREFIX="$deps")
    bindir=$build/tests
fi
nvcc_path=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}

{
    echo "== machine"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv || true
    "$nvcc_path" --version | tail -n 2
    echo "== configure"
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_WERROR="${STRATA_WERROR:-OFF}" \
        -DSTRATA_CUDA=ON -DSTRATA_CUDA_ONLY_TESTS="$([[ $only_tests == 1 ]] && echo ON || echo OFF)" \
        -DCMAKE_CUDA_ARCHITECTURES="$arch" -DCMAKE_CUDA_COMPILER="$nvcc_path" -DGTest_DIR="$gtest_dir" \
        "${full_args[@]}" \
        -DCMAKE_CUDA_FLAGS="${STRATA_CUDA_FLAGS:-}"
    echo "== build"
    if [[ $only_tests == 1 ]]; then
        time ninja -C "$build" -j"$(nproc)" test_cuda_ops test_cuda_recurrent test_cuda_attention \
            test_cuda_model_ops test_cuda_block_ops test_cuda_doorbell test_cuda_doorbell_wait test_cuda_gdn_recurrence test_cuda_qsa_union
    else
        # shellcheck disable=SC2086 # a list of targets
        time ninja -C "$build" -j"$(nproc)" ${STRATA_CUDA_TARGETS:-}
    fi
} 2>&1 | tee "$logs/build.log"

# Every program runs even when an earlier one fails; the script's status is the first failure's.
status=0
more_programs=()  # the full build's other CUDA test programs, after the op tests
if [[ $only_tests != 1 ]]; then
    for path in "$bindir"/test_cuda_*; do
        name=$(basename "$path")
        case " test_cuda_block_ops test_cuda_model_ops test_cuda_attention test_cuda_recurrent test_cuda_ops test_cuda_doorbell test_cuda_doorbell_wait \
               test_cuda_gdn_recurrence test_cuda_qsa_union " in
            *" $name "*) ;;
            *) [[ -x "$path" ]] && more_programs+=("$name") ;;
        esac
    done
fi
programs=(test_cuda_block_ops test_cuda_model_ops test_cuda_attention test_cuda_recurrent test_cuda_ops
          test_cuda_doorbell test_cuda_doorbell_wait test_cuda_gdn_recurrence test_cuda_qsa_union "${more_programs[@]}")
# shellcheck disable=SC2206 # a list of programs
[[ -n ${STRATA_CUDA_PROGRAMS:-} ]] && programs=($STRATA_CUDA_PROGRAMS)
[[ ${STRATA_CUDA_TESTS:-1} == 0 ]] && programs=()
for program in "${programs[@]}"; do
    echo "== $program$([[ ${STRATA_CUDA_PERF:-1} == 1 ]] && echo ' (tests and perf)')"
    STRATA_CUDA_PERF=${STRATA_CUDA_PERF:-1} "$bindir/$program" --gtest_filter="${STRATA_CUDA_TEST_FILTER:-*}" 2>&1 |
        tee "$logs/$program.log" || { rc=$?; [[ $status != 0 ]] || status=$rc; }
done

if [[ $only_tests != 1 && ${STRATA_CUDA_CTEST:-0} == 1 ]]; then
    echo "== ctest (all but the Cuda* tests)"
    # Without CI set, the tests whose oracles are missing here (node, llama.cpp) skip instead of failing.
    env -u CI ctest --test-dir "$build" -j"$(nproc)" --output-on-failure -E '(^|/)Cuda' 2>&1 |
        tee "$logs/ctest.log" || { rc=$?; [[ $status != 0 ]] || status=$rc; }
fi

if [[ $only_tests != 1 && -n ${STRATA_CUDA_BENCH:-} ]]; then
    scripts/gpu_bench.sh "$build/strata" "$logs" || { rc=$?; [[ $status != 0 ]] || status=$rc; }
fi

if [[ ${STRATA_CUDA_SANITIZE:-0} == 1 ]]; then
    echo "== compute-sanitizer memcheck (parity tests)"
    compute-sanitizer --tool memcheck --error-exitcode 1 "$bindir/test_cuda_ops" --gtest_filter='*CudaMatmul*' \
        2>&1 | tee "$logs/memcheck.log"
    compute-sanitizer --tool memcheck --error-exitcode 1 "$bindir/test_cuda_recurrent" --gtest_filter='-CudaPerf*' \
        2>&1 | tee "$logs/memcheck_recurrent.log"
    compute-sanitizer --tool memcheck --error-exitcode 1 "$bindir/test_cuda_attention" --gtest_filter='-CudaPerf*' \
        2>&1 | tee "$logs/memcheck_attention.log"
    compute-sanitizer --tool memcheck --error-exitcode 1 "$bindir/test_cuda_model_ops" --gtest_filter='-CudaPerf*' \
        2>&1 | tee "$logs/memcheck_model_ops.log"
    compute-sanitizer --tool memcheck --error-exitcode 1 "$bindir/test_cuda_block_ops" \
        2>&1 | tee "$logs/memcheck_block_ops.log"
    compute-sanitizer --tool memcheck --error-exitcode 1 "$bindir/test_cuda_gdn_recurrence" \
        --gtest_filter='-CudaPerf*' 2>&1 | tee "$logs/memcheck_gdn_recurrence.log"
    compute-sanitizer --tool memcheck --error-exitcode 1 "$bindir/test_cuda_qsa_union" \
        2>&1 | tee "$logs/memcheck_qsa_union.log"
fi
exit $status
