#!/usr/bin/env bash
# The CUDA forward pass's benchmarks (issue 7), run by scripts/gpu.sh when STRATA_CUDA_BENCH is set, or alone after
# it has built: `scripts/gpu_bench.sh STRATA_BINARY LOG_DIR`. It synthesizes qwen4exp-mid and flash-next with IQ2_XS
# experts (`--fast`: random quant blocks; flash-next's PLE table shrunk with --ple-vocab-base so the file fits the GPU
# machine's 64 GB disk: decode reads 16 of its rows per token either way) and runs `strata bench --backend cuda`,
# which prints each decode figure next to its roofline (bytes a token reads / measured copy bandwidth).
#   STRATA_CUDA_BENCH    quick: tg128, pp512 and the time per token by op kind; depth: pp4096 and tg32 at 8K and
#                        32K tokens of context; all: both; offload: experts in host RAM (issue 25) on flash-next
#                        with --router-skew 1 and uniform (one file at a time: the disk holds one), --vram-budget
#                        12G and 24G, with and without CPU workers, tg64, pp512, pp4096, tg32 at 8K and 32K; with
#                        LLAMA_BENCH=path/to/llama-bench (shared/tools/llamacpp-cuda/build.sh) its -ncmoe 40 / 48
#                        runs on the same files
#   STRATA_PROMPT_RUNS   with STRATA_CUDA_BENCH=prompts (issue 26), on the offload mode's --router-skew 1 file:
#                        "vram" (all in VRAM: pp512 + tg128, pp4096), "12G" (pp512 + tg64, pp4096 at --vram-budget
#                        12G); default both
#   STRATA_OFFLOAD_SKEWS, STRATA_OFFLOAD_BUDGETS, STRATA_OFFLOAD_RUNS  the offload mode's parts: default "1 0",
#                        "12G 24G" ("all": every expert in VRAM) and "tg tg-pcie pp512 pp4096 d8k d32k" (also
#                        pp512-profile; pp4096-ring8 and pp4096-ring16: --expert-ring 8 / 16; file: --ram-budget 8G,
#                        so the experts are read from the mapped file). One call of the GPU machine holds a few
#                        runs: each copies the 43 GB of experts into pinned RAM first
#   STRATA_OFFLOAD_TYPE  the experts' type (default iq2_xs; q4_k makes an ~85 GB file: more than the one-GPU
#                        machine's 64 GB disk, so point STRATA_BENCH_MODELS at a tmpfs with room, e.g. /dev/shm, and
#                        run "file" there: the page cache is the file's pages, and nothing else is pinned)
#   STRATA_CUDA_BENCH=spec  speculation (issue 28): `--window-costs` (decode windows of 1..8 tokens at 8K depth,
#                        projected at 0.90 per draft) on flash-next with --router-skew 1, all in VRAM and at
#                        --vram-budget 12G, then uniform routing all in VRAM; the bundled model's window costs and
#                        its greedy decoding with and without --spec 4 on a code prompt (STRATA_SPEC_SKEWS: the
#                        flash-next skews, default "1 0"; STRATA_SPEC_BUDGETS: default "all 12G")
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
if [[ $mode == prompts ]]; then
    {
        [[ -s $dir/fn-skew1.gguf ]] || rm -f "$dir"/fn-skew*.gguf
        synth fn-skew1 --preset flash-next --type iq2_xs --ple-vocab-base 200000 --router-skew 1
        for part in ${STRATA_PROMPT_RUNS:-vram 12G}; do
            budget=()
            [[ $part == vram ]] || budget=(--vram-budget "$part")
            n=128
            [[ $part == vram ]] || n=64
            run fn-skew1 "${budget[@]}" -p 512 -n "$n" -r 2
            run fn-skew1 "${budget[@]}" -p 4096 -n 0 -r 1
        done
    } 2>&1 | tee -a "$logs/bench.log"
    exit 0
fi
if [[ $mode == spec ]]; then
    {
        bundled=assets/strata-code-19m.gguf
        head -c 1500 tools/goldens/make_goldens.py >"$dir/code-prompt.txt"
        run_bundled() { echo "== bench $bundled $*"; "$strata" bench --model "$bundled" --backend cuda "$@" 2>&1 |
            grep -v '^  [a-z]*: \|^strata: CUDA NVIDIA'; }
        run_bundled --window-costs -d 512 -r 5
        run_bundled -p 0 -n 400 -r 3 --spec 4 --spec-prompt "$dir/code-prompt.txt"
        for skew in ${STRATA_SPEC_SKEWS:-1 0}; do
            [[ -s $dir/fn-skew$skew.gguf ]] || rm -f "$dir"/fn-skew*.gguf
            synth "fn-skew$skew" --preset flash-next --type iq2_xs --ple-vocab-base 200000 --router-skew "$skew"
            for budget in ${STRATA_SPEC_BUDGETS:-all 12G}; do
                [[ $skew == 1 || $budget == all ]] || continue  # uniform routing: all in VRAM only
                budget_args=(--vram-budget "$budget")
                [[ $budget == all ]] && budget_args=()
                run "fn-skew$skew" "${budget_args[@]}" --window-costs -d 8192 -r 3
            done
        done
    } 2>&1 | tee -a "$logs/bench.log"
    exit 0
fi
if [[ $mode == offload ]]; then
    {
        type=${STRATA_OFFLOAD_TYPE:-iq2_xs}
        for skew in ${STRATA_OFFLOAD_SKEWS:-1 0}; do
            name=fn-skew$skew
            [[ $type == iq2_xs ]] || name=fn-$type-skew$skew
            [[ -s $dir/$name.gguf ]] || rm -f "$dir"/fn-*skew*.gguf
            synth "$name" --preset flash-next --type "$type" --ple-vocab-base 200000 --router-skew "$skew"
            for budget in ${STRATA_OFFLOAD_BUDGETS:-12G 24G}; do
                local_budget=(--vram-budget "$budget")
                [[ $budget == all ]] && local_budget=()  # every expert in VRAM: the reference
                for part in ${STRATA_OFFLOAD_RUNS:-tg tg-pcie pp512 pp4096 d8k d32k}; do
                    case $part in
                        tg) run "$name" "${local_budget[@]}" -p 0 -n 64 -r 2 ;;
                        tg-pcie) run "$name" "${local_budget[@]}" --cpu-experts 0 -p 0 -n 64 -r 1 ;;
                        pp512) run "$name" "${local_budget[@]}" -p 512 -n 0 -r 1 ;;
                        pp4096) run "$name" "${local_budget[@]}" -p 4096 -n 0 -r 1 ;;
                        pp4096-ring8) run "$name" "${local_budget[@]}" --expert-ring 8 -p 4096 -n 0 -r 1 ;;
                        pp4096-ring16) run "$name" "${local_budget[@]}" --expert-ring 16 -p 4096 -n 0 -r 1 ;;
                        # Experts read from the mapped file (a RAM budget that cannot pin them): decode and prompts.
                        file) run "$name" "${local_budget[@]}" --ram-budget 8G -p 4096 -n 64 -r 1 ;;
                        d8k) run "$name" "${local_budget[@]}" -p 0 -n 32 -r 1 -d 8192 ;;
                        pp512-profile) run "$name" "${local_budget[@]}" -p 512 -n 0 -r 1 --profile ;;
                        d32k) run "$name" "${local_budget[@]}" -p 0 -n 32 -r 1 -d 32768 ;;
                        *) echo "gpu_bench.sh: unknown offload run $part" >&2; exit 2 ;;
                    esac
                done
            done
            if [[ -n ${LLAMA_BENCH:-} ]]; then
                for n in 40 48; do
                    echo "== llama-bench -ncmoe $n $name"
                    "$LLAMA_BENCH" -m "$dir/$name.gguf" -ngl 99 -fa 1 -ncmoe "$n" -p 512 -n 64 -r 2
                done
            fi
        done
    } 2>&1 | tee -a "$logs/bench.log"
    exit 0
fi
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
