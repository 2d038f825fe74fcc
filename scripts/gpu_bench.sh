#!/usr/bin/env bash
# The CUDA forward pass's benchmarks (issue 7), run by scripts/gpu.sh when STRATA_CUDA_BENCH is set, or alone after
# it has built: `scripts/gpu_bench.sh STRATA_BINARY LOG_DIR`. It synthesizes qwen4exp-mid and flash-next with IQ2_XS
# experts (`--fast`: random quant blocks; flash-next's PLE table shrunk with --ple-vocab-base so the file fits the GPU
# machine's 64 GB disk: decode reads 16 of its rows per token either way) and runs `strata bench --backend cuda`,
# which prints each decode figure next to its roofline (bytes a token reads / measured copy bandwidth).
#   STRATA_CUDA_BENCH    quick: tg128, pp512 and the time per token by op kind; depth: pp4096 and tg32 at 8K and
#                        32K tokens of context; all: both
#   STRATA_BENCH_MODELS  folder for the synthesized files (default /tmp/strata-bench; ~50 GB for flash-next)
#   STRATA_BENCH_ONLY    mid or flash-next: that model alone
set -euo pipefail
strata=$1
logs=$2
mode=${STRATA_CUDA_BENCH:-quick}
dir=${STRATA_BENCH_MODELS:-/tmp/strata-bench}
mkdir -p "$dir"

synth() {  # name, then synth arguments
    local out=$dir/$1.gguf
    shift
    [[ -s $out ]] || { echo "== synth $out"; time "$strata" synth "$@" --fast --out "$out"; }
}

run() {  # name, then bench arguments
    local model=$dir/$1.gguf
    shift
    echo "== bench $(basename "$model") $*"
    "$strata" bench --model "$model" --backend cuda "$@" 2>&1 | grep -v '^  [a-z]*: \|^strata: CUDA NVIDIA'
}

models=(mid flash-next)
[[ -n ${STRATA_BENCH_ONLY:-} ]] && models=("$STRATA_BENCH_ONLY")
{
    df -h "$dir" | tail -n 1
    for m in "${models[@]}"; do
        case $m in
            mid) synth mid --preset qwen4exp-mid --type iq2_xs ;;
            flash-next) synth flash-next --preset flash-next --type iq2_xs --ple-vocab-base 200000 ;;
        esac
        if [[ $mode == quick || $mode == all ]]; then
            run "$m" -p 512 -n 128 -r 3
            run "$m" -p 0 -n 16 -r 1 --profile
        fi
        if [[ $mode == depth || $mode == all ]]; then
            run "$m" -p 4096 -n 0 -r 1
            run "$m" -p 0 -n 32 -r 1 -d 8192
            run "$m" -p 0 -n 32 -r 1 -d 32768
        fi
    done
} 2>&1 | tee -a "$logs/bench.log"
