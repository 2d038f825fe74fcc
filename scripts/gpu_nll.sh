#!/usr/bin/env bash
# Issue 8 (seed 003) quality check on the GPU machine: teacher-forced NLL of the bundled model over long held-out files
# with the QSA union attention off, on, and a control that changes only rounding (fp16 KV cells instead of int8, union
# off), then tools/nll_compare.py for the change against "off" with a bootstrap interval over the files.
# The held-out files are the training split's (tools/train/results/heldout_files.txt): Python sources of the GPU
# machine's own installation, so this runs there. Needs the full CUDA build (scripts/gpu.sh) first.
#   STRATA_NLL_FILES  how many files (default 24: the longest held-out files that exist here)
#   STRATA_NLL_CTX    tokens read per file (default 4096)
#   STRATA_CUDA_BUILD build folder (default build-cuda)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${STRATA_CUDA_BUILD:-build-cuda}
n_files=${STRATA_NLL_FILES:-24}
ctx=${STRATA_NLL_CTX:-4096}
out=${OUT:-$build/logs}/nll
mkdir -p "$out"
strata=$build/strata
[[ -x $strata ]] || { echo "gpu_nll.sh: $strata missing: run scripts/gpu.sh first" >&2; exit 2; }

# The longest held-out files present on this machine (the list holds hash and path; sizes decide).
mapfile -t files < <(cut -f2 tools/train/results/heldout_files.txt | while read -r f; do
    [[ -f $f ]] && printf '%s\t%s\n' "$(stat -c %s "$f")" "$f"; done | sort -rn | head -n "$n_files" | cut -f2)
(( ${#files[@]} > 1 )) || { echo "gpu_nll.sh: fewer than 2 held-out files on this machine" >&2; exit 2; }
printf '%s\n' "${files[@]}" > "$out/files.txt"
echo "gpu_nll.sh: ${#files[@]} held-out files, first $ctx tokens of each"

run_arm() {  # name, flags...
    local name=$1; shift
    echo "== arm $name: $*"
    /usr/bin/time -f "$name: %e s" "$strata" perplexity --backend cuda --ctx "$ctx" --jsonl "$out/$name.jsonl" "$@" \
        "${files[@]}" > "$out/$name.txt"
    tail -n 1 "$out/$name.txt"
}
run_arm off --kv-cache int8
run_arm union --kv-cache int8 --qsa-union
run_arm control-f16 --kv-cache f16
python3 tools/nll_compare.py "$out/off.jsonl" union="$out/union.jsonl" control-f16="$out/control-f16.jsonl" |
    tee "$out/compare.md"
