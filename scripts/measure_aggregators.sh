#!/usr/bin/env bash
# How multi-task aggregators affect calibration (docs/guides/mtl.md, "Results"): equal weights vs MGDA vs UPGrad, each
# with and without COG-FC, seeds 0-2, the same budget for all, on fashion_mosaic (40 binary tasks of real
# Fashion-MNIST items): its shipped configs (cog_cnn_tiny, 5 epochs of all 20,000 pictures, their learning rates);
# EPOCHS and MAX (the first MAX samples of each split) shrink it. Resumable: a finished run (DONE) is skipped, a
# started one resumed. The equal-weights runs are the same runs as scripts/measure_fashion.sh's mosaic ones: link
# them into OUT (as fm-<method>-equal-s<seed>) to skip training them twice.
#   OUT=measure/runs nohup nice -n 10 bash scripts/measure_aggregators.sh > measure/aggregators.log 2>&1 &
# Last, a table of test accuracy, NLL, mean ECE@15 and worst-task ECE@15 (mean ± std over the seeds done).
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
PY=${PYTHON:-python}
OUT=${OUT:-measure/runs}
SIZE=()
[ -n "${EPOCHS:-}" ] && SIZE+=("train.epochs=${EPOCHS}")
[ -n "${MAX:-}" ] && SIZE+=("data.max_samples=${MAX}")
for seed in 0 1 2; do
  for agg in equal mgda upgrad; do
    for method in baseline cog_fc; do
      name="fm-${method}-${agg}-s${seed}"
      dir="$OUT/$name"
      [ -f "$dir/DONE" ] && { echo "done: $name"; continue; }
      args=(--config "configs/fashion_mosaic/${method}.yaml" "mtl.aggregator=${agg}" "seed=${seed}"
            "${SIZE[@]}" tracking=none "output_dir=${OUT}" "run_name=${name}")
      [ -f "$dir/config.yaml" ] && args+=(--resume "$dir")
      echo "run: $name $(date +%T)"
      $PY scripts/train_mtl.py "${args[@]}" 2>&1 | grep "epoch\|weights\|error" | tail -8
    done
  done
done
$PY - "$OUT" <<'PYTHON'
import sys
from pathlib import Path

import pandas as pd
import yaml

rows = []
for done in sorted(Path(sys.argv[1]).glob("*/DONE")):
    cfg = yaml.safe_load((done.parent / "config.yaml").read_text())
    mean = pd.read_csv(done.parent / "test_metrics.csv").set_index("task").loc["mean"]
    rows.append({"method": cfg["method"]["name"], "aggregator": cfg["mtl"]["aggregator"], "seed": cfg["seed"],
                 **{m: mean[m] for m in ("accuracy", "nll", "ece@15", "worst_task_ece@15")}})
frame = pd.DataFrame(rows)
stats = frame.groupby(["method", "aggregator"]).agg(["mean", "std"]).drop(columns="seed")
table = pd.DataFrame({m: [f"{a:.4f} ± {s:.4f}" for a, s in zip(stats[m]["mean"], stats[m]["std"].fillna(0))]
                      for m in ("accuracy", "nll", "ece@15", "worst_task_ece@15")}, index=stats.index)
print(table.join(frame.groupby(["method", "aggregator"])["seed"].count().rename("seeds")).to_string())
PYTHON
