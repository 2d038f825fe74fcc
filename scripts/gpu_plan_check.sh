#!/usr/bin/env bash
# Checks the CUDA memory plan (src/runtime/memory_plan.h, made without touching the GPU) against what the CUDA backend
# really takes, on the GPU machine after scripts/gpu.sh has built: `scripts/gpu_plan_check.sh STRATA_BINARY [DIR]`.
# On qwen4exp-mid (every expert fits a 24G budget) it prints:
#   - the plan's lines (stderr "memory plan (--backend cuda)") and the accountant's "VRAM plan after loading" lines
#     (weights, window, scratch): they should agree within the 256-byte rounding of each buffer;
#   - nvidia-smi's memory used by the process while it decodes: minus the accountant's total (weights, window,
#     scratch, kv cache, sequence state), that is the CUDA context and allocator slack the plan holds back as
#     kCudaContextReserve + kAllocatorSlack (640 MiB).
set -euo pipefail
strata=$1
dir=${2:-/tmp/strata-plan-check}
mkdir -p "$dir"
model=$dir/mid.gguf
[[ -s $model ]] || "$strata" synth --preset qwen4exp-mid --type iq2_xs --fast --out "$model"

nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv
"$strata" generate --model "$model" --backend cuda --vram-budget 24G --tokens "1 2 3" -n 30000 --ids \
    > /dev/null 2> "$dir/generate.err" &
pid=$!
sleep 10  # loaded and decoding (30000 tokens take longer than that)
echo "== nvidia-smi while decoding (pid $pid)"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv
wait "$pid" || true
echo "== the plan, then the backend's accounting"
cat "$dir/generate.err"
