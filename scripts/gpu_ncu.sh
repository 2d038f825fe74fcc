#!/usr/bin/env bash
# One decode window of `strata bench --backend cuda` under Nsight Compute (issue 7's "where the rest goes"): every
# kernel of the N-th graph replay (`bench --ncu-replay N`, N = NCU_REPLAY or 12) is profiled as its own node,
# with its GPU time and DRAM bytes; tools/ncu_summary.py sums them by kernel and splits the matrix-vector launches
# by shape.
#   scripts/gpu_ncu.sh STRATA_BINARY MODEL.gguf LOG_DIR [extra bench arguments]
# Clocks are left alone (--clock-control none), as the device notes ask. NCU_CACHE=none keeps the caches warm
# between kernels, as in the graph (ncu flushes them by default, which inflates small kernels).
set -euo pipefail
strata=$1
model=$2
logs=$3
shift 3
ncu_bin=${NCU:-$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n1)}
mkdir -p "$logs"
"$ncu_bin" --clock-control none --cache-control "${NCU_CACHE:-all}" --profile-from-start off \
    --graph-profiling node --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    --csv --print-units base --print-kernel-base function \
    "$strata" bench --model "$model" --backend cuda -p 0 -n 24 -r 1 --ncu-replay "${NCU_REPLAY:-12}" "$@" \
    > "$logs/ncu.csv" 2> "$logs/ncu.err" || {
    echo "gpu_ncu.sh: ncu failed; its last lines:" >&2
    tail -n 20 "$logs/ncu.err" >&2
    exit 1
}
python3 "$(dirname "$0")/../tools/ncu_summary.py" "$logs/ncu.csv"
