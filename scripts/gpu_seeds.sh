#!/usr/bin/env bash
# Issue 8's benchmarks on the GPU machine (docs/seeds-on-cuda.md has the tables they gave), after scripts/gpu.sh has
# built the full project: the doorbell ping-pong (seed 000), the GDN recurrence's two kernels (seed 001), QSA prompt
# attention per query against the union kernel (seed 003), prompt tokens/s with each switch on and off (the bundled
# model, and Flash-Next synthesized with random IQ2_XS weights as scripts/gpu_bench.sh does), and the NLL arms of
# scripts/gpu_nll.sh. Logs go to $OUT (or the build's logs folder).
#   STRATA_SEEDS_SKIP   space-separated parts to leave out: doorbell gdn qsa bundled flash-next nll
#   STRATA_CUDA_BUILD   build folder (default build-cuda)
#   STRATA_BENCH_MODELS folder for the synthesized Flash-Next file (default /tmp/strata-bench; ~50 GB)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${STRATA_CUDA_BUILD:-build-cuda}
strata=$build/strata
logs=${OUT:-$build/logs}
models=${STRATA_BENCH_MODELS:-/tmp/strata-bench}
skip=" ${STRATA_SEEDS_SKIP:-} "
[[ -x $strata ]] || { echo "gpu_seeds.sh: $strata missing: run scripts/gpu.sh first" >&2; exit 2; }
mkdir -p "$logs" "$models"
want() { [[ $skip != *" $1 "* ]]; }
prompt_bench() {  # model, then the flags of one arm
    local model=$1; shift
    echo "-- $*"
    "$strata" bench --model "$model" --backend cuda -n 0 "$@" 2>&1 | grep -E '^\| .* pp|apply|union' || true
}

{
    if want doorbell; then echo "== doorbell"; "$strata" bench doorbell; fi
    if want gdn; then echo "== gdn-recurrence"; "$strata" bench gdn-recurrence; fi
    if want qsa; then
        echo "== qsa-union, int8 KV"; "$strata" bench qsa-union
        echo "== qsa-union, fp16 KV"; "$strata" bench qsa-union --kv-cache f16
    fi
    if want bundled; then
        echo "== bundled model, pp4096"
        bundled=assets/strata-code-19m.gguf
        for arm in "" "--qsa-union" "--kv-cache int8" "--kv-cache int8 --qsa-union" "--gdn-recurrence column"; do
            # shellcheck disable=SC2086  # an arm is several flags
            prompt_bench "$bundled" -p 4096 -r 3 $arm
        done
    fi
    if want flash-next; then
        echo "== flash-next (random IQ2_XS weights), pp4096"
        fn=$models/flash-next.gguf
        [[ -s $fn ]] || "$strata" synth --preset flash-next --type iq2_xs --ple-vocab-base 200000 --fast --out "$fn" \
            > /dev/null
        for arm in "--kv-cache int8" "--kv-cache int8 --qsa-union"; do
            # shellcheck disable=SC2086
            prompt_bench "$fn" -p 4096 -r 1 $arm
        done
    fi
} 2>&1 | tee -a "$logs/seeds.log"
if want nll; then scripts/gpu_nll.sh 2>&1 | tee -a "$logs/seeds.log"; fi
