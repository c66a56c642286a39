"""The baseline-vs-COG-FC table of docs/data.md: the ``mean`` row of each finished run's test_metrics.csv.

    python scripts/measure_fashion_table.py [measure/runs]

Runs as ``scripts/measure_fashion.sh`` names them. Mean ± standard deviation (ddof 1) over the
finished seeds of each data set and method: a table without ``scripts/compare.py``'s figures,
which took over ten minutes for 40 tasks on the loaded 2-core machine.
"""

import re
import sys
from pathlib import Path

import pandas as pd

METRICS = ("accuracy", "nll", "brier", "ece@15")
NAME = re.compile(r"(fashion_mnist|fashion_mosaic)_(.+)_s(\d+)")  # the run names scripts/measure_fashion.sh gives
root = Path(sys.argv[1] if len(sys.argv) > 1 else "measure/runs")
rows = []
for run in sorted(root.iterdir()):
    if not (run / "DONE").exists():
        continue
    dataset, method, seed = NAME.fullmatch(run.name).groups()
    mean = pd.read_csv(run / "test_metrics.csv").set_index("task").loc["mean"]
    rows.append({"dataset": dataset, "method": method, "seed": int(seed), **{m: mean[m] for m in METRICS}})
frame = pd.DataFrame(rows)
print("| data set | method | seeds | " + " | ".join(METRICS) + " |")
print("| --- | --- | ---: | " + " | ".join("---:" for _ in METRICS) + " |")
for (dataset, method), group in frame.groupby(["dataset", "method"]):
    cells = [f"{group[m].mean():.4f} ± {group[m].std(ddof=1):.4f}" if len(group) > 1 else f"{group[m].mean():.4f}"
             for m in METRICS]
    print(f"| `{dataset}` | {method} | {', '.join(map(str, sorted(group['seed'])))} | " + " | ".join(cells) + " |")
