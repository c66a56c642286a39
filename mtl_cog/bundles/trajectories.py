"""What happened *during* training, read back from a run's ``metrics.jsonl``: the learned calibrator and convergence.

Every epoch line of stage one carries ``"calibrator": {"summary": ..., "tasks": {name: {task: value}}}``
(written by ``mtl_cog.training.calibrator_view``) and the final line ``"calibrator_at_identity"``; under a
multi-task aggregator also ``"task_weights": {task: mean weight of the backbone's gradient over the epoch}``.
A report shows from them

- ``calibrator_table``: per run and task, the learned value of each calibrator parameter
  (temperature; scale/bias per class; a matrix's diagonal) at the first and last epoch, and whether the run's
  calibrator never left the identity (``calibrator_at_identity``; for runs written before that
  flag existed, recomputed with the same tolerance from the last epoch's values);
- ``task_weight_table``: per run and task, the aggregator's task weight at the first and last epoch;
- ``convergence``: whether stage one settled, so that "trained long enough" is checked, not
  assumed: the best validation NLL improved by at most ``NLL_PLATEAU`` (1 %) during the final
  ``LAST_FRACTION`` (20 %) of epochs, and a calibrator made at most ``CALIBRATOR_SETTLED`` (10 %)
  of its total move (max abs change over all its parameters, first to last epoch) in that part;
  a calibrator whose total move is below ``CALIBRATOR_FLOOR`` (1 %) of its size counts as settled.
  A decayed learning rate must not pass this by itself (epochs at 1/100 of the rate are flat whatever the
  network had reached), so the NLL rule is applied a second time to the *live* epochs alone, the first
  epochs whose follower rate is at least ``LIVE_RATE_SHARE`` (1/10) of the highest rate before them: a run
  must have settled while it could still learn, and a run with fewer than two live epochs has not shown that
  it did. (The paper's step schedule scaled to 30 epochs, ÷10 every epoch, leaves two live epochs: such a run
  settles only when its validation NLL did not fall by more than 1 % from the first to the second.) Curves
  without the rate on every epoch (bundles collected before it was recorded) count every epoch as live: the
  rule is then the old one, and ``live_epochs`` is None.
  A two-stage run (TST, V-TST) is judged on its second stage too (``two_stage_metrics.jsonl``,
  the same NLL rule): a post-hoc head still learning at its last epoch is not a finished baseline.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from mtl_cog.constants import IDENTITY_TOLERANCE, IDENTITY_VALUES
from mtl_cog.io import read_jsonl
from mtl_cog.runs import rundir

LAST_FRACTION = 0.2
NLL_PLATEAU = 0.01
CALIBRATOR_SETTLED = 0.1
CALIBRATOR_FLOOR = 0.01  # a calibrator whose whole move is below 1 % of its size has settled where it started
LIVE_RATE_SHARE = 0.1  # an epoch whose follower rate is at least this share of the first epoch's can still learn


def live_epoch_count(rate: np.ndarray) -> int:
    """The epochs before the follower rate (one value per epoch) first fell below ``LIVE_RATE_SHARE`` of the highest
    rate before it: a rate that rose (a warm-up, a resume at a higher rate) sets the scale, and a rate exactly at
    the share (0.1 after one step of 1/10) is live."""
    rate = np.asarray(rate, dtype=float)
    live = rate >= LIVE_RATE_SHARE * np.maximum.accumulate(rate) * (1 - 1e-9)
    return int(np.argmin(live)) if not live.all() else len(live)


def read_metrics_lines(run_dir: Path) -> tuple[list[dict], dict]:
    """(stage one's epoch lines, the final line) of a run's metrics.jsonl; empty when there is none."""
    lines = read_jsonl(Path(run_dir) / rundir.METRICS)
    epochs = [line for line in lines if not line.get("final") and isinstance(line.get("val"), dict)]
    final = next((line for line in reversed(lines) if line.get("final")), {})
    return epochs, final


def calibrator_trajectory(run_dir: Path) -> pd.DataFrame:
    """Long table: epoch, parameter, task, value, for every per-task *scalar* of the calibrator."""
    epochs, _ = read_metrics_lines(run_dir)
    rows = []
    for line in epochs:
        for name, per_task in ((line.get("calibrator") or {}).get("tasks") or {}).items():
            for task, value in per_task.items():
                for label, parameter, number in _scalars(name, task, value):
                    rows.append({"epoch": line["epoch"], "parameter": parameter, "task": label, "value": number})
    return pd.DataFrame(rows, columns=["epoch", "parameter", "task", "value"])


def _scalars(name: str, task: str, value) -> list[tuple[str, str, float]]:
    """(task label, parameter, value) of one task's calibrator value: a number, a per-class list
    (``task[k]``), or a K x K matrix, of which the diagonal is shown (``matrix (diagonal)``)."""
    array = np.asarray(value, dtype=float)
    if array.ndim == 0:
        return [(task, name, float(array))]
    if array.ndim == 1:
        return [(f"{task}[{k}]", name, float(v)) for k, v in enumerate(array)] if len(array) > 1 else \
            [(task, name, float(array[0]))]
    diagonal = np.diagonal(array)
    if len(diagonal) == 1:
        return [(task, name, float(diagonal[0]))]
    return [(f"{task}[{k}]", f"{name} (diagonal)", float(v)) for k, v in enumerate(diagonal)]


def at_identity(run_dir: Path, trajectory: pd.DataFrame | None = None) -> bool | None:
    """The run's ``calibrator_at_identity`` flag (None: no calibrator with parameters, or unknown).

    ``trajectory``: the run's ``calibrator_trajectory`` when the caller already has it.
    """
    epochs, final = read_metrics_lines(run_dir)
    if "calibrator_at_identity" in final:
        return bool(final["calibrator_at_identity"]) if _has_calibrator(epochs) else None
    trajectory = calibrator_trajectory(run_dir) if trajectory is None else trajectory
    if trajectory.empty:
        return None
    last = trajectory[trajectory["epoch"] == trajectory["epoch"].max()]
    identity = last["parameter"].map(IDENTITY_VALUES)
    if identity.isna().any():
        return None
    return bool((last["value"] - identity).abs().max() < IDENTITY_TOLERANCE)


def _has_calibrator(epochs: list[dict]) -> bool:
    return any((line.get("calibrator") or {}).get("tasks") for line in epochs)


def calibrator_table(runs: list[tuple[str, str, int, Path]],
                     trajectories: dict[Path, pd.DataFrame] | None = None) -> pd.DataFrame:
    """Per (data set, method, seed, run) and task: the calibrator's first/last value and the identity flag.

    ``runs`` holds (data set label, method, seed, run folder); runs without a calibrator are left out.
    ``trajectories``: each run's ``calibrator_trajectory`` when the caller already read them.
    """
    rows = []
    for dataset, method, seed, run_dir in runs:
        trajectory = trajectories[run_dir] if trajectories is not None else calibrator_trajectory(run_dir)
        if trajectory.empty:
            continue
        flag = at_identity(run_dir, trajectory)
        first, last = trajectory["epoch"].min(), trajectory["epoch"].max()
        for (parameter, task), group in trajectory.groupby(["parameter", "task"], sort=False):
            values = group.set_index("epoch")["value"]
            rows.append({"dataset": dataset, "method": method, "seed": seed, "run": str(run_dir),
                         "parameter": parameter, "task": task, "first_epoch_value": values.get(first),
                         "last_epoch_value": values.get(last), "epochs": int(last),
                         "calibrator_at_identity": flag})
    return pd.DataFrame(rows)


def task_weight_table(runs: list[tuple[str, str, int, Path]]) -> pd.DataFrame:
    """Per (data set, method, seed, run) and task: the backbone's mean task weight (``mtl.aggregator``) at the
    first and the last epoch, from the ``task_weights`` of each epoch line; runs with equal weights are left out."""
    rows = []
    for dataset, method, seed, run_dir in runs:
        epochs = [line for line in read_metrics_lines(run_dir)[0] if line.get("task_weights")]
        if not epochs:
            continue
        first, last = epochs[0], epochs[-1]
        for task, weight in last["task_weights"].items():
            rows.append({"dataset": dataset, "method": method, "seed": seed, "run": str(run_dir), "task": task,
                         "first_epoch_weight": first["task_weights"].get(task), "last_epoch_weight": weight,
                         "epochs": int(last["epoch"])})
    return pd.DataFrame(rows)


@dataclass
class Convergence:
    epochs: int
    nll_gain_last: float  # relative improvement of the best validation NLL in the final part of training
    calibrator_move_last: float | None  # calibrator change in the final part / its change over the run
    stage_two_nll_gain_last: float | None = None  # the same NLL gain for a second stage; None: one stage
    calibrator_move: float | None = None  # its move over the recorded epochs (largest parameter change, first to last)
    live_epochs: int | None = None  # epochs at >= LIVE_RATE_SHARE of the first epoch's rate; None: rate not recorded
    nll_gain_live: float = 0.0  # nll_gain_last over the live epochs alone

    @property
    def converged(self) -> bool:
        settled = self.calibrator_move_last is None or self.calibrator_move_last <= CALIBRATOR_SETTLED
        stage_two_settled = self.stage_two_nll_gain_last is None or self.stage_two_nll_gain_last <= NLL_PLATEAU
        live = self.live_epochs is None or (self.live_epochs >= 2 and self.nll_gain_live <= NLL_PLATEAU)
        return self.nll_gain_last <= NLL_PLATEAU and settled and stage_two_settled and live

    def why_not(self) -> str:
        reasons = []
        part = f"the last {100 * LAST_FRACTION:.0f}% of epochs"
        if self.nll_gain_last > NLL_PLATEAU:
            reasons.append(f"validation NLL still fell {100 * self.nll_gain_last:.1f}% in {part}")
        if self.live_epochs is not None and self.live_epochs < 2:
            reasons.append(f"only {self.live_epochs} epoch ran at >= {LIVE_RATE_SHARE:g} of the first epoch's rate")
        elif self.live_epochs is not None and self.live_epochs < self.epochs and self.nll_gain_live > NLL_PLATEAU:
            # at a constant rate every epoch is live: that window is the whole run, already said above
            reasons.append(f"validation NLL still fell {100 * self.nll_gain_live:.1f}% in the last "
                           f"{100 * LAST_FRACTION:.0f}% of the {self.live_epochs} epochs at >= {LIVE_RATE_SHARE:g} "
                           "of the first epoch's rate")
        if self.calibrator_move_last is not None and self.calibrator_move_last > CALIBRATOR_SETTLED:
            reasons.append(f"the calibrator made {100 * self.calibrator_move_last:.0f}% of its move in {part}")
        if self.stage_two_nll_gain_last is not None and self.stage_two_nll_gain_last > NLL_PLATEAU:
            reasons.append(f"stage two's validation NLL still fell {100 * self.stage_two_nll_gain_last:.1f}% in "
                           f"its last {100 * LAST_FRACTION:.0f}% of epochs")
        return "; ".join(reasons)


def _calibrator_vector(line: dict) -> np.ndarray | None:
    tasks = (line.get("calibrator") or {}).get("tasks")
    if not tasks:
        return None
    values = [np.asarray(v, dtype=float).ravel() for name in sorted(tasks) for _, v in sorted(tasks[name].items())]
    return np.concatenate(values) if values else None


def _nll_gain_last(nll: np.ndarray) -> float:
    """Relative improvement of the best validation NLL during the final ``LAST_FRACTION`` of epochs."""
    cut = len(nll) - max(1, round(LAST_FRACTION * len(nll)))
    before, overall = np.nanmin(nll[:cut]), np.nanmin(nll)
    return max(float((before - overall) / before) if before > 0 else 0.0, 0.0)


# What a run's curves hold for the convergence rule (the results bundle's curves.csv.gz has the same rows).
CURVE_VAL_METRICS = ("nll", "brier", "accuracy", "ece@15")
CALIBRATOR_SPLIT, FROM_LAST, SCALE = "calibrator", "from_last", "scale"
STAGE_TWO_SPLIT = "stage_two"


def curve_rows(run_dir: Path) -> pd.DataFrame:
    """``epoch, split, metric, value`` per epoch of a run: the validation task means and training loss, the
    calibrator's largest distance to its final values (``calibrator``/``from_last``) and its largest magnitude
    at the first epoch (``calibrator``/``scale``), stage two's validation NLL (``stage_two``/``nll``)."""
    epochs, _ = read_metrics_lines(run_dir)
    rows = []
    for line in epochs:
        rows += [(line["epoch"], "val", m, line["val"][m]) for m in CURVE_VAL_METRICS if m in line["val"]]
        if isinstance(line.get("train_loss"), (int, float)):
            rows.append((line["epoch"], "train", "loss", line["train_loss"]))
        rate = (line.get("lr") or {}).get("follower")
        if isinstance(rate, (int, float)) and not isinstance(rate, bool):  # the live epochs of the convergence rule
            rows.append((line["epoch"], "train", "lr", rate))
    vectors = [_calibrator_vector(line) for line in epochs]
    if epochs and all(v is not None for v in vectors) and len({len(v) for v in vectors}) == 1:
        rows += [(line["epoch"], CALIBRATOR_SPLIT, FROM_LAST, float(np.abs(v - vectors[-1]).max()))
                 for line, v in zip(epochs, vectors)]
        rows.append((epochs[0]["epoch"], CALIBRATOR_SPLIT, SCALE, float(np.abs(vectors[0]).max())))
    stage_two = [line for line in read_jsonl(Path(run_dir) / rundir.STAGE_TWO_METRICS)
                 if isinstance(line, dict) and isinstance(line.get("val_nll"), (int, float))]
    rows += [(i, STAGE_TWO_SPLIT, "nll", line["val_nll"]) for i, line in enumerate(stage_two, start=1)]
    return pd.DataFrame(rows, columns=["epoch", "split", "metric", "value"])


def convergence(run_dir: Path) -> Convergence | None:
    """Did stage one (and a second stage) settle? None when stage one has fewer than 5 epoch lines."""
    return convergence_of_curves(curve_rows(run_dir))


def _series(curves: pd.DataFrame, split: str, metric: str) -> np.ndarray:
    rows = curves[(curves["split"] == split) & (curves["metric"] == metric)].sort_values("epoch")
    return rows["value"].to_numpy(dtype=float)


def convergence_of_curves(curves: pd.DataFrame) -> Convergence | None:
    """The convergence rule (module docstring) on one run's ``curve_rows``: from a run folder or a results bundle.

    A calibrator whose whole move stays below ``CALIBRATOR_FLOOR`` of its size (at least 1: a
    temperature of 1 moving by less than 0.01) counts as settled: the ratio of two tiny moves is noise,
    and such a calibrator is reported as having barely moved (``calibrator_move``), not as still moving.
    """
    nll = _series(curves, "val", "nll")
    if len(nll) < 5:
        return None
    cut = len(nll) - max(1, round(LAST_FRACTION * len(nll)))
    from_last = _series(curves, CALIBRATOR_SPLIT, FROM_LAST)
    move = total = None
    if len(from_last) == len(nll):
        total = float(from_last[0])
        scale = _series(curves, CALIBRATOR_SPLIT, SCALE)
        floor = CALIBRATOR_FLOOR * max(1.0, float(scale[0]) if len(scale) else 1.0)
        move = float(from_last[cut - 1]) / total if total > floor else 0.0
    stage_two = _series(curves, STAGE_TWO_SPLIT, "nll")
    rate = _series(curves, "train", "lr")
    live_epochs, gain_live = None, 0.0
    if len(rate) == len(nll) and rate.max() > 0:
        live_epochs = live_epoch_count(rate)
        gain_live = _nll_gain_last(nll[:live_epochs]) if live_epochs >= 2 else 0.0
    return Convergence(len(nll), _nll_gain_last(nll), move,
                       _nll_gain_last(stage_two) if len(stage_two) >= 5 else None, total, live_epochs, gain_live)


def convergence_table(runs: list[tuple[str, str, int, Path]]) -> pd.DataFrame:
    rows = []
    for dataset, method, seed, run_dir in runs:
        result = convergence(run_dir)
        if result is None:
            continue
        rows.append({"dataset": dataset, "method": method, "seed": seed, "run": str(run_dir), "epochs": result.epochs,
                     "nll_gain_last_20pct": result.nll_gain_last, "calibrator_move_last_20pct":
                     result.calibrator_move_last, "calibrator_move": result.calibrator_move,
                     "stage_two_nll_gain_last_20pct": result.stage_two_nll_gain_last,
                     "converged": result.converged, "why_not": result.why_not()})
    return pd.DataFrame(rows)


def epoch_curve_table(runs: list[tuple[str, str, int, Path]], metrics: tuple[str, ...] = ("nll",)) -> pd.DataFrame:
    """Per run and stage-one epoch: the validation task mean of each of ``metrics`` (long: dataset, method, seed,
    run, epoch, split, metric, value), the curves a report draws beside the convergence verdict."""
    rows = []
    for dataset, method, seed, run_dir in runs:
        for line in read_metrics_lines(run_dir)[0]:
            rows += [{"dataset": dataset, "method": method, "seed": seed, "run": str(run_dir), "epoch": line["epoch"],
                      "split": "val", "metric": metric, "value": float(line["val"][metric])}
                     for metric in metrics if isinstance(line["val"].get(metric), (int, float))]
    return pd.DataFrame(rows, columns=["dataset", "method", "seed", "run", "epoch", "split", "metric", "value"])
