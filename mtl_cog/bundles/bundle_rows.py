"""A finished run folder as results-bundle rows (``mtl_cog.bundles.bundle``): what a campaign keeps of it.

``run_rows`` reads only what the run's digests vouch for (``finished_predictions``: ``DONE``, the
config, task spec and prediction files checked against ``digests.json``, the predictions' tasks the
run's: a file swapped in from another run is refused with one error line naming it), scores the
selected checkpoint's validation and test predictions, fits the requested post-hoc calibrators on
validation (split ``test+<name>``), and reads the per-epoch curves (``trajectories.curve_rows``),
the epochs' timing and thread count (``timing.jsonl``) and whether the run converged
(``trajectories.convergence_of_curves``: the same rule every report applies).
"""

from __future__ import annotations

import platform
from pathlib import Path

import pandas as pd

from mtl_cog.bundles.bundle_reliability import reliability_rows
from mtl_cog.bundles.trajectories import calibrator_trajectory, convergence_of_curves, curve_rows, read_metrics_lines
from mtl_cog.evaluation.posthoc import calibrate
from mtl_cog.evaluation.predictions import Predictions
from mtl_cog.evaluation.scoring import score
from mtl_cog.io import read_jsonl
from mtl_cog.runs import rundir
from mtl_cog.runs.finished import finished_predictions

RESULT_METRICS = ("accuracy", "nll", "brier", "ece@15", "smece")  # what tables and verdicts read; bins 15
CALIBRATOR_SPLIT = "calibrator"  # results rows of the learned calibrator's final values (task, parameter, value)
BINS = [15]


def _score_rows(predictions: Predictions, split: str) -> list[tuple[str, str, str, float]]:
    scores = score(predictions, BINS)
    rows = [(split, task, m, float(values[m])) for task, values in scores["tasks"].items() for m in RESULT_METRICS
            if m in values]
    return rows + [(split, "mean", m, float(scores["mean"][m])) for m in RESULT_METRICS if m in scores["mean"]]


def posthoc_split(name: str) -> str:
    """The results split of the test scores after post-hoc calibrator ``name``: ``test+ts``."""
    return f"test+{name}"


def result_splits(posthoc: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The splits of the scores ``results_rows`` records for a run fitted with the ``posthoc`` calibrators."""
    return ("val", "test", *map(posthoc_split, posthoc))


LAST = "@last"  # results splits of the last epoch's network (eval.score_last_epoch): val@last, test@last, test@last+ts


def _checkpoint_rows(val: Predictions, test: Predictions, posthoc: tuple[str, ...], tag: str = "") -> list:
    """One checkpoint's rows: validation, test, and test after each post-hoc calibrator fitted on its validation."""
    rows = _score_rows(val, f"val{tag}") + _score_rows(test, f"test{tag}")
    for name in posthoc:
        rows += _score_rows(calibrate(name, val, test), f"test{tag}+{name}")
    return rows


def results_rows(run_dir: Path, posthoc: tuple[str, ...] = ()) -> pd.DataFrame:
    """``split, task, metric, value`` of the selected checkpoint (the run's one check first), one split of
    ``result_splits(posthoc)`` each; a run that also scored its last epoch (``eval.score_last_epoch``) adds the
    same splits for that network, tagged ``@last`` (``val@last``, ``test@last``, ``test@last+ts``)."""
    val, test = finished_predictions(run_dir, ("val", "test")).values()
    rows = _checkpoint_rows(val, test, posthoc)
    last = tuple(rundir.last_epoch_split(s) for s in ("val", "test"))
    if rundir.load_run_config(run_dir).eval.score_last_epoch:  # a file it should have and lacks is refused there
        rows += _checkpoint_rows(*finished_predictions(run_dir, last).values(), posthoc, LAST)
    frame = pd.DataFrame(rows, columns=["split", "task", "metric", "value"])
    frame.attrs["sizes"] = {"val": len(val.labels[0]), "test": len(test.labels[0])}
    frame.attrs["reliability"] = reliability_rows(test, "test")  # the test split's histogram, read once here
    return frame


def calibrator_rows(run_dir: Path) -> pd.DataFrame:
    """The learned calibrator at the last epoch (split ``calibrator``, task, metric = its parameter, e.g.
    ``temperature``): what "did COG-TS move its temperatures?" is answered from."""
    trajectory = calibrator_trajectory(run_dir)
    last = trajectory[trajectory["epoch"] == trajectory["epoch"].max()] if not trajectory.empty else trajectory
    return pd.DataFrame({"split": CALIBRATOR_SPLIT, "task": last["task"].astype(str), "metric": last["parameter"],
                         "value": last["value"].astype(float)}, columns=["split", "task", "metric", "value"])


def run_facts(run_dir: Path) -> dict:
    """Training images, torch threads, wall seconds and epochs of a run, from ``timing.jsonl`` and its metrics.

    A resumed run may time an epoch twice (the killed attempt's line, then the retry's): the last line per
    (stage, epoch) counts. Runs from before ``timing.jsonl`` have empty facts.
    """
    last = {(line.get("stage"), line.get("epoch")): line for line in read_jsonl(run_dir / rundir.TIMING)
            if isinstance(line, dict)}
    epochs, _ = read_metrics_lines(run_dir)
    facts = {"epochs_run": len(epochs), "train_size": "", "threads": "", "wall_s": ""}
    if last:
        lines = list(last.values())
        threads = sorted({int(line["threads"]) for line in lines if isinstance(line.get("threads"), int)})
        facts["threads"] = " ".join(map(str, threads))  # two values: a resume under another thread count
        facts["train_size"] = max(int(line.get("train_images", 0)) for line in lines) or ""
        facts["wall_s"] = round(sum(float(line.get("seconds", 0.0)) for line in lines), 1)
    return facts


def run_rows(run_dir: Path, labels: dict,
             posthoc: tuple[str, ...] = ()) -> tuple[dict, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(runs.csv row, results rows, curves rows, the test split's reliability histogram: ``bundle_reliability``) of
    the finished run in ``run_dir``; ``labels`` fill the row's ``run, campaign, data, method, role, draw, trial,
    ratio, seed, config_digest`` (and may set ``versions``, ``commit``)."""
    run_dir = Path(run_dir)
    name = labels["run"]
    results = results_rows(run_dir, posthoc)
    sizes, reliability = results.attrs["sizes"], results.attrs["reliability"]
    results = pd.concat([results, calibrator_rows(run_dir)], ignore_index=True)
    curves = curve_rows(run_dir)
    result = convergence_of_curves(curves)
    row = {"status": "done", "reason": "", "val_size": sizes["val"], "test_size": sizes["test"],
           "converged": "" if result is None else bool(result.converged), "versions": "", "commit": "",
           **run_facts(run_dir), **labels}
    return row, results.assign(run=name), curves.assign(run=name), reliability.assign(run=name)


def failed_row(labels: dict, status: str, reason: str) -> dict:
    """The runs.csv row of a run that did not finish (``failed``) or was stopped by the tuner (``pruned``)."""
    return {"status": status, "reason": reason, "train_size": "", "val_size": "", "test_size": "", "epochs_run": "",
            "converged": "", "wall_s": "", "threads": "", "versions": "", "commit": "", **labels}


def environment() -> dict:
    """Versions of what computed the numbers (python, torch and the libraries that score)."""
    import numpy
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": numpy.__version__,
            "pandas": pd.__version__, "platform": platform.platform(terse=True)}


def versions_text(env: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in env.items() if k != "platform")
