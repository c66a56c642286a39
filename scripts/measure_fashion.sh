#!/usr/bin/env bash
# The measurements of docs/guides/data.md ("Fashion-MNIST and the fashion mosaic"), resumable: each step
# skips what an earlier call finished, so it can be stopped and started again, and several copies
# may run at once on different seed orders (a run folder another process holds is skipped).
#   nice -n 10 bash scripts/measure_fashion.sh [OUT] [SEEDS...]     # default: measure 0 1 2
#   python scripts/compare.py OUT/runs --out OUT/report            # the baseline-vs-COG-FC table (summary.md)
# The shipped configs as they are (every image of both data sets, cog_cnn_tiny, 5 epochs), seeds 0, 1,
# 2, baseline and COG-FC: a few minutes a run on one idle core. EXTRA="key=value ..." adds overrides
# (and then belongs in another OUT).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python )}
OUT=${1:-measure}
shift || true
SEEDS=("${@:-0 1 2}")
CACHE=$OUT/cache
mkdir -p "$OUT"

for ds in fashion_mnist fashion_mosaic; do  # 1. cache build: wall time (with the interpreter's start) and size
  if ! grep -q "^$ds " "$OUT/cache_build.txt" 2>/dev/null; then
    rm -rf "$CACHE/$ds"-*
    start=$(date +%s.%N)
    folder=$($PY scripts/prepare_data.py --config "configs/$ds/baseline.yaml" "data.cache_dir=$CACHE" | tail -1) || exit 2
    end=$(date +%s.%N)
    echo "$ds build_seconds $(echo "$end - $start" | bc) bytes $(du -sb "$folder" | cut -f1) folder $folder" \
      >> "$OUT/cache_build.txt"
  fi
done

for ds in fashion_mnist fashion_mosaic; do  # 2. training images/s of the shipped CPU backbones
  if ! grep -q "\"dataset\": \"$ds\"" "$OUT/throughput.jsonl" 2>/dev/null; then
    $PY -m mtl_cog.benchmarks.dataset_throughput --config "configs/$ds/baseline.yaml" \
      --backbones cog_cnn_tiny cog_cnn_small --steps 8 --out "$OUT/throughput.jsonl" "data.cache_dir=$CACHE"
  fi
done

for seed in ${SEEDS[*]}; do  # 3. baseline vs COG-FC, seed by seed so that partial results cover both data sets
  for ds in fashion_mnist fashion_mosaic; do
    for method in baseline cog_fc; do
      name=${ds}_${method}_s$seed
      run=$OUT/runs/$name
      [ -f "$run/DONE" ] && continue
      resume=(); [ -d "$run" ] && resume=(--resume "$run")
      echo "=== $name $(date -u +%H:%M:%S)"
      $PY scripts/train_mtl.py --config "configs/$ds/$method.yaml" "${resume[@]}" tracking=none "output_dir=$OUT/runs" \
        "run_name=$name" "seed=$seed" "data.cache_dir=$CACHE" ${EXTRA:-} 2>&1 | tail -3 \
        || echo "--- $name not run here (held by another process?)"
    done
  done
done
$PY scripts/compare.py "$OUT/runs" --out "$OUT/report" && cat "$OUT/report/summary.md"
