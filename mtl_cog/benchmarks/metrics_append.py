"""Cost of one ``metrics.jsonl`` line late in a long run: append (now) vs. rewrite-the-file (before).

    python -m mtl_cog.benchmarks.metrics_append [--epochs 769] [--tasks 40]

Both variants log the same per-epoch records (the ``Tracker`` layout: mean and per-task
validation metrics) and count the file's lines after each one, as ``run_stage`` does before
saving the training state; printed side by side in one run, with their ratio.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from mtl_cog.io import append_jsonl, atomic_write_text
from mtl_cog.runs.training_state import count_lines

METRICS = ["accuracy", "nll", "brier"] + [f"{k}@{b}" for k in ("ece", "rmsce", "mce") for b in (5, 10, 15, 20, 50)]


def rewrite_jsonl(path: Path, record: dict) -> None:
    """The former ``append_jsonl``: read the whole file, write it again with one more line."""
    old = path.read_text() if path.exists() else ""
    atomic_write_text(path, old + json.dumps(record) + "\n")


def measure(log, folder: Path, epochs: int, tasks: int) -> tuple[float, float, int]:
    values = {m: 0.123456789012345 for m in METRICS}
    record = {"train_loss": 0.5, "lr": {"follower": 1e-3, "leader": 1e-4}, "val": values, "best_epoch": 1,
              "nonfinite_skipped": 0, "val_tasks": {f"attr{t:02d}": values for t in range(tasks)}}
    path = folder / f"{log.__name__}.jsonl"
    start, times = time.perf_counter(), []
    for epoch in range(1, epochs + 1):
        began = time.perf_counter()
        log(path, {"epoch": epoch, **record})
        count_lines(path)
        times.append(time.perf_counter() - began)
    last = sum(times[-10:]) / len(times[-10:])  # mean of the last 10 epochs (one fsync is noisy)
    return time.perf_counter() - start, last, path.stat().st_size


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=769)
    parser.add_argument("--tasks", type=int, default=40)
    args = parser.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for log in (rewrite_jsonl, append_jsonl):
            total, last, size = measure(log, Path(folder), args.epochs, args.tasks)
            results[log.__name__] = {"total_s": total, "last_epoch_ms": last * 1e3, "file_mb": size / 1e6}
            print(f"{log.__name__:14s} {args.epochs} epochs x {args.tasks} tasks: file {size / 1e6:.1f} MB, "
                  f"total {total:.2f} s, per epoch at the end {last * 1e3:.1f} ms")
    ratio = results["rewrite_jsonl"]["last_epoch_ms"] / results["append_jsonl"]["last_epoch_ms"]
    print(f"per epoch at the end of the run: rewrite / append = {ratio:.0f}x")
    return results


if __name__ == "__main__":
    main()
