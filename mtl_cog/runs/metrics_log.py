"""``metrics.jsonl`` and ``two_stage_metrics.jsonl``: the one schema of an epoch line, its writer, its W&B row.

Both stages write the same line (``epoch_line``), told apart by ``stage`` ("stage_one" /
"stage_two"): ``epoch``, ``stage``, ``train_loss``, ``lr`` ({group: rate}), ``val`` (the mean over
tasks of every validation metric), ``val_nll``, ``best`` (this epoch is the best so far),
``best_epoch``, ``nonfinite_skipped``, ``calibrator`` (stage one, a learned calibrator only:
``summary`` and per-task ``tasks`` values), ``val_tasks``, ``val_multitask``, ``val_pairs``. The
last line of ``metrics.jsonl`` is the run's final line (``final_record``: ``"final": true``, the
selected network's test means). Every line goes through ``append_line`` (crash-safe append);
readers (``mtl_cog.bundles.trajectories``, ``mtl_cog.io.read_jsonl``) also read the files of
older runs, whose stage-two lines had only epoch, train_loss, val_nll, best, lr and val.

``wandb_row`` turns a stage-one line into its W&B history row, the same live and when a resumed run
replays the lines W&B lacks (``mtl_cog.runs.tracking.Tracker.replay``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mtl_cog.io import append_jsonl


def epoch_line(stage: str, epoch: int, train_loss: float, lrs: dict[str, float], val_metrics: dict, best_epoch: int,
               nonfinite_skipped: int, calibrator: dict[str, Any] | None = None,
               task_weights: list[float] | None = None, conflict_rate: float | None = None) -> dict[str, Any]:
    """One epoch's line; ``val_metrics`` is ``score(...)`` of the validation split, ``calibrator``
    {"summary": ..., "tasks": ...} of a learned calibrator (None: no such key), ``task_weights`` the
    backbone's mean task weights over the epoch under ``mtl.aggregator`` (None: equal weights, no key),
    ``conflict_rate`` the share of its checked steps in which some task's loss rose to first order
    (mtl_cog.training.aggregated_step; None: nothing checked, no key)."""
    mean = val_metrics["mean"]
    line: dict[str, Any] = {"epoch": epoch, "stage": stage, "train_loss": train_loss, "lr": lrs, "val": mean,
                            "val_nll": mean["nll"], "best": best_epoch == epoch, "best_epoch": best_epoch,
                            "nonfinite_skipped": nonfinite_skipped}
    if calibrator is not None:
        line["calibrator"] = calibrator
    if task_weights is not None:
        line["task_weights"] = dict(zip(val_metrics["tasks"], task_weights, strict=True))
    if conflict_rate is not None:
        line["conflict_rate"] = conflict_rate
    line["val_tasks"] = val_metrics["tasks"]
    line["val_multitask"] = val_metrics.get("multitask", {})
    line["val_pairs"] = val_metrics.get("pairs", [])
    return line


def append_line(path: Path, line: dict[str, Any]) -> None:
    """The one writer of a metrics line (call on the main process only)."""
    append_jsonl(path, line)


def flatten_metrics(split: str, metrics: dict) -> dict[str, float]:
    """{"tasks": {t: {m: v}}, "mean": {m: v}, "multitask": {m: v}, "pairs": [...]} -> W&B keys.

    ``t/split/m`` and ``mean/split/m`` per task and task mean, ``multitask/split/m`` for the
    data-set-level metrics and ``pairs/split/<a>&<b>`` for each attribute pair's joint error
    (mtl_cog.evaluation.multitask_metrics); each prefix is its own W&B section.
    """
    flat = {f"{task}/{split}/{m}": v for task, values in metrics["tasks"].items() for m, v in values.items()}
    flat.update({f"mean/{split}/{m}": v for m, v in metrics["mean"].items()})
    flat.update({f"multitask/{split}/{m}": v for m, v in metrics.get("multitask", {}).items()})
    flat.update({f"pairs/{split}/{p['a']}&{p['b']}": p["joint_ece"] for p in metrics.get("pairs", [])})
    return flat


def calibrator_values(by_task: dict[str, dict[str, object]], summary: dict[str, dict[str, float]]) -> dict[str, float]:
    """A learned calibrator on W&B: scalar summaries, and per-task values where a parameter is one number per task."""
    values = {f"calibrator/{name}_{stat}": v for name, s in summary.items() for stat, v in s.items()}
    for name, per_task in by_task.items():
        values.update({f"{task}/calibrator/{name}": v for task, v in per_task.items() if isinstance(v, float)})
    return values


def wandb_row(line: dict[str, Any]) -> dict[str, float]:
    """The W&B history row of one stage-one line: the same row live and on ``--resume``."""
    val = {"tasks": line.get("val_tasks", {}), "mean": line["val"], "multitask": line.get("val_multitask", {}),
           "pairs": line.get("val_pairs", [])}
    row = {"train/loss": line["train_loss"], **{f"lr/{k}": v for k, v in line["lr"].items()},
           **flatten_metrics("val", val)}
    if "calibrator" in line:
        row.update(calibrator_values(line["calibrator"]["tasks"], line["calibrator"]["summary"]))
    for task, weight in line.get("task_weights", {}).items():
        row[f"{task}/task_weight"] = weight
    if "conflict_rate" in line:
        row["mtl/conflict_rate"] = line["conflict_rate"]
    return row


def final_record(final_epoch: int, best_epoch: int, results: dict[str, dict],
                 calibrator_at_identity: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """(``metrics.jsonl``'s final line, the W&B run summary) of the selected network's ``results`` by split."""
    line = {"epoch": final_epoch, "final": True, "best_epoch": best_epoch, "test": results["test"]["mean"],
            "test_multitask": results["test"].get("multitask", {}), "calibrator_at_identity": calibrator_at_identity}
    summary = {**flatten_metrics("val", results["val"]), **flatten_metrics("test", results["test"]),
               "best_epoch": best_epoch, "calibrator_at_identity": calibrator_at_identity}
    return line, summary
