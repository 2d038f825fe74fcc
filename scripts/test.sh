#!/usr/bin/env bash
# Builds Strata with warnings as errors (build-test/), runs every test with ctest, then the fuzz smoke run when
# tests/fuzz/run_fuzz.sh exists, then (in CI, or with STRATA_CUDA_CHECK=1) compiles the CUDA backend for sm_75
# (scripts/cuda_compile_check.sh; skipped, and said so, without nvcc). Ends with one summary line; exit status 0 only
# when everything passed.
#   STRATA_JOBS=N        build parallelism (default: nproc)
#   STRATA_FUZZ_SECONDS  length of the fuzz smoke run (default 60)
#   STRATA_CUDA_CHECK    1 to run the CUDA compile check, 0 not to (default: 1 when CI is set, else 0)
set -uo pipefail
cd "$(dirname "$0")/.."

build=build-test
jobs=${STRATA_JOBS:-$(nproc)}
fuzz_seconds=${STRATA_FUZZ_SECONDS:-60}
cuda_check=${STRATA_CUDA_CHECK:-$([[ -n ${CI:-} ]] && echo 1 || echo 0)}
build_status=FAIL ctest_status="not run" fuzz_status="not run" cuda_status="not run"
failed=0

summary() {
  echo
  if (( failed )); then verdict=FAILED; else verdict=PASSED; fi
  echo "strata tests: $verdict (build: $build_status; ctest: $ctest_status; fuzz: $fuzz_status;" \
       "cuda sm_75 compile: $cuda_status)"
}
trap summary EXIT

if cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_WERROR=ON && ninja -C "$build" -j "$jobs"
then
  build_status=ok
else
  failed=1
  exit 1
fi

log=$(mktemp)
ctest --test-dir "$build" --output-on-failure --no-tests=error -j2 2>&1 | tee "$log"
ctest_rc=${PIPESTATUS[0]}
result=$(grep -E 'tests passed, [0-9]+ tests? failed out of' "$log" | tail -1)
if (( ctest_rc == 0 )); then
  ctest_status="${result:-ok}"
else
  ctest_status="${result:-ctest failed (status $ctest_rc)}"
  failed=1
fi
skipped=$(grep -cE '\(Skipped\)$' "$log" || true)
if (( skipped )); then ctest_status+=", $skipped skipped (listed above)"; fi
rm -f "$log"

if [ -x tests/fuzz/run_fuzz.sh ]; then
  if tests/fuzz/run_fuzz.sh "$fuzz_seconds"; then fuzz_status=ok; else fuzz_status=FAILED; failed=1; fi
else
  fuzz_status="skipped (no tests/fuzz/run_fuzz.sh)"
fi

if [[ $cuda_check == 1 ]]; then
  scripts/cuda_compile_check.sh
  case $? in
    0) cuda_status=ok ;;
    77) cuda_status="SKIPPED (no nvcc)" ;;
    *) cuda_status=FAILED; failed=1 ;;
  esac
else
  cuda_status="not run (STRATA_CUDA_CHECK=1 runs it)"
fi
exit "$failed"
