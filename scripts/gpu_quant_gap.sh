#!/usr/bin/env bash
# Whose rounding moves the logits of a file quantized whole (issue 30, bench/notes/fidelity.md): on the GPU machine
# after scripts/gpu.sh has built, `scripts/gpu_quant_gap.sh STRATA_BINARY LOG_DIR`. For the random-weight preset
# qwen35moe-small-k (synth seed 7) and for the trained bundled model, each quantized whole at q8_0 and q4_k: the CPU's
# and CUDA's logits of the quantized file against the CPU's logits of the unquantized one, 40 tokens, prefill and
# one token a call (tools/logits_gap.py).
set -euo pipefail
strata=$1
logs=$2
dir=${STRATA_GAP_DIR:-/tmp/strata-gap}
mkdir -p "$dir"
tokens="7 300 41 5 99 250 12 480 3 77 150 401 26 9 333 64 210 18 444 2 91 120 55 368 14 290 43 500 8 175 61 230 19 412 33 140 88 270 4 199"
{
    "$strata" synth --preset qwen35moe-small-k --seed 7 --out "$dir/small.gguf" >/dev/null
    cp assets/strata-code-19m.gguf "$dir/bundled.gguf"
    for model in small bundled; do
        echo "== $model"
        "$strata" info "$dir/$model.gguf" 2>&1 | grep -i "^model\|type\|vocab" | head -n 4 || true
        "$strata" logits --model "$dir/$model.gguf" --tokens "$tokens" --out "$dir/$model-ref.f32" --backend cpu \
            2>/dev/null
        n_vocab=$(( $(stat -c %s "$dir/$model-ref.f32") / 4 / 40 ))
        for type in q8_0 q4_k; do
            if ! "$strata" quantize "$dir/$model.gguf" "$dir/$model-$type.gguf" --type "$type" >"$dir/q.log" 2>&1; then
                echo "-- $model $type: quantize failed: $(tail -n 1 "$dir/q.log")"
                continue
            fi
            files=()
            for backend in cpu cuda; do
                for mode in prefill incremental; do
                    out=$dir/$model-$type-$backend-$mode.f32
                    "$strata" logits --model "$dir/$model-$type.gguf" --tokens "$tokens" --out "$out" \
                        --backend "$backend" --mode "$mode" 2>/dev/null
                    files+=("$backend-$mode=$out")
                done
            done
            echo "-- $model $type (reference: the unquantized file on the CPU)"
            python3 tools/logits_gap.py "$n_vocab" "$dir/$model-ref.f32" "${files[@]}"
        done
    done
} 2>&1 | tee "$logs/quant_gap.log"
