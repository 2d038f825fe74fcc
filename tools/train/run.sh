#!/usr/bin/env bash
# The bundled model's whole training job, for the GPU machine (one H200; `run` from the repository root):
#
#   bash tools/train/run.sh full    # data + tokenizer, runs A and B from scratch (same seed, concurrently),
#                                   # evaluation and export of run A; results in $OUT
#   bash tools/train/run.sh smoke   # the same pipeline on little data and few steps (minutes)
#
# $OUT receives (at most 8 files, 16 MiB each, for the device tool): model-0000i-of-0000n.safetensors (bf16 shards),
# goldens.bin, and results.tar.gz (config.json, tokenizer files, loss curves, metrics of both runs, data stats, logs).
set -euo pipefail
MODE="${1:-full}"
OUT="${OUT:-/tmp/strata-train-out}"
WORK="${STRATA_TRAIN_WORK:-/tmp/strata-train}"
HERE="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8

read -r STDLIB PURELIB < <(python3 -c "import sysconfig as s; p = s.get_paths(); print(p['stdlib'], p['purelib'])")
python3 -c "import torch, transformers, tokenizers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'tokenizers', tokenizers.__version__, 'gpu', torch.cuda.get_device_name(0))"

case "$MODE" in
  smoke) DATA="$WORK/data-smoke"; DATA_ARGS=(--max-train-bytes 30000000 --tokenizer-sample-bytes 8000000)
         STEPS=40; TRAIN_ARGS=(--eval-windows 16 --log-every 5 --warmup 10) ;;
  full)  DATA="$WORK/data-full"; DATA_ARGS=(--max-train-bytes 100000000 --tokenizer-sample-bytes 25000000)
         STEPS="${STEPS:-640}"; TRAIN_ARGS=() ;;
  *) echo "usage: run.sh smoke|full" >&2; exit 2 ;;
esac

if [ ! -f "$DATA/heldout.bin" ]; then
  python3 "$HERE/data.py" --out "$DATA" --roots "$STDLIB" "$PURELIB" "${DATA_ARGS[@]}" 2>&1 | tee "$WORK/data.log"
fi

# Logs of an earlier call on this machine are kept: they are runs from scratch too.
for r in a b; do if [ -f "$WORK/run-$r.log" ]; then cp "$WORK/run-$r.log" "$WORK/earlier-run-$r.log"; fi; done

# Runs A and B: the same seed from scratch; B only trains and evaluates (the reproducibility check).
python3 "$HERE/train.py" --data "$DATA" --out "$WORK/run-a" --steps "$STEPS" --export --copy-to "$OUT" \
  "${TRAIN_ARGS[@]}" \
  > "$WORK/run-a.log" 2>&1 &
A=$!
B=""
if [ "${RUN_B:-1}" = 1 ]; then
  python3 "$HERE/train.py" --data "$DATA" --out "$WORK/run-b" --steps "$STEPS" "${TRAIN_ARGS[@]}" \
    > "$WORK/run-b.log" 2>&1 &
  B=$!
fi
status=0
wait "$A" || status=$?
tail -n 5 "$WORK/run-a.log"
if [ -n "$B" ]; then wait "$B" || status=$?; tail -n 3 "$WORK/run-b.log"; fi

mkdir -p "$WORK/results"
cp "$WORK"/run-a/hf/{config.json,model.safetensors.index.json,tokenizer.json,tokenizer_config.json} "$WORK/results/" \
  2>/dev/null || true
for r in a b; do
  [ -d "$WORK/run-$r" ] || continue
  cp "$WORK/run-$r/loss.json" "$WORK/results/loss-$r.json" 2>/dev/null || true
  cp "$WORK/run-$r/metrics.json" "$WORK/results/metrics-$r.json" 2>/dev/null || true
  cp "$WORK/run-$r.log" "$WORK/results/" 2>/dev/null || true
  cp "$WORK/earlier-run-$r.log" "$WORK/results/" 2>/dev/null || true
done
cp "$DATA/data_stats.json" "$DATA/heldout_files.txt" "$WORK/results/" 2>/dev/null || true
tar -czf "$OUT/results.tar.gz" -C "$WORK" results
ls -la "$OUT"
exit "$status"
