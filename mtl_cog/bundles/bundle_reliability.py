"""Per run and task, the reliability histogram of the test split, kept in a results bundle (``reliability.csv.gz``).

A bundle keeps no predictions, so ``mtl-cog report --bundle`` could not draw a reliability diagram. This
file keeps what a diagram needs: per run, split and task, ``BINS`` = 20 bins and in each the number of
predictions (``count``), their summed confidence (``confidence_sum``), their summed outcome
(``outcome_sum``) and, where the data set knows the true probabilities (``synthetic``), their summed p*
(``truth_sum``; empty otherwise). Sums, not means, because sums add: pooled over seeds and tasks they
are the bins of the pooled predictions, so the bundle's diagrams are those ``compare`` draws from the
prediction files (means and ECE within about 1e-5: the sums keep 6 significant digits, counts and
outcome sums are exact).

The convention is ``ece@B``'s (``mtl_cog.evaluation.binning``, ``binning.calibration_inputs``): a binary task
bins its positive-class probability and counts positive labels; a multi-class task bins its top-label
confidence and counts correct predictions. Uniform bins on [0, 1], right-open except the last, after
clamping by ``binning.CLAMP``; each task's labelled rows only. The split is ``test``, the selected checkpoint's
test predictions (the one split a run folder keeps predictions of). The 20 bins are the diagram's; a metric such
as ECE@15 is read from ``results.csv.gz``, which the run computed on its predictions, not re-binned from these.

One row per (run, split, task); each of the four columns holds the task's 20 bins, bin 0 first, as
space-separated numbers (``0`` for an empty bin). One row per task rather than per bin keeps the file at
about 4 kB a 40-task run (a row per bin repeats the labels 20 times: twice the bytes once gzipped), so a
bundle of 100 such runs stays well under 1 MB. Written like every bundle file (sorted rows, gzip without
a timestamp), so re-collecting the same runs gives the same bytes.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd

from mtl_cog.constants import MISSING_LABEL
from mtl_cog.evaluation.binning import CLAMP, bin_sums, calibration_inputs, uniform_bin_index
from mtl_cog.evaluation.predictions import Predictions

RELIABILITY = "reliability.csv.gz"
RELIABILITY_COLUMNS = ["run", "split", "task", "count", "confidence_sum", "outcome_sum", "truth_sum"]
RELIABILITY_SORT = ["run", "split", "task"]
BIN_VALUES = ("count", "confidence_sum", "outcome_sum", "truth_sum")
BINS = 20
SUM_DIGITS = "%.6g"
DIAGRAM_COLUMNS = ["task", "bin", "n_bins", "count", "mean_confidence", "frequency", "mean_truth"]


def empty_reliability() -> pd.DataFrame:
    return pd.DataFrame(columns=RELIABILITY_COLUMNS)


def _cell(values: np.ndarray, whole: bool) -> str:
    return " ".join(str(int(v)) if whole else ("0" if v == 0 else SUM_DIGITS % v) for v in values)


def reliability_rows(predictions: Predictions, split: str, run: str = "") -> pd.DataFrame:
    """The histogram rows of every task of ``predictions`` (one run's ``split``)."""
    rows = []
    for t, task in enumerate(predictions.task_names):
        known = np.asarray(predictions.labels[t]) != MISSING_LABEL
        logits, labels = np.asarray(predictions.logits[t])[known], np.asarray(predictions.labels[t])[known]
        truth = None if predictions.true_probs is None else np.asarray(predictions.true_probs[t])[known]
        probability, outcome, truth = calibration_inputs(logits, labels, truth)
        confidence = np.clip(probability, CLAMP, 1 - CLAMP)
        index = uniform_bin_index(confidence, BINS)
        count, outcomes, confidences = bin_sums(confidence[None], outcome[None], index[None], BINS)[0].T
        rows.append({"run": run, "split": split, "task": str(task), "count": _cell(count, True),
                     "confidence_sum": _cell(confidences, False), "outcome_sum": _cell(outcomes, True),
                     "truth_sum": "" if truth is None else _cell(np.bincount(index, truth, BINS), False)})
    return pd.DataFrame(rows, columns=RELIABILITY_COLUMNS)


def _numbers(cell) -> np.ndarray:
    """A cell's 20 numbers; NaN for an empty cell (no p*); raises ValueError for anything else."""
    if cell is None or (isinstance(cell, float) and np.isnan(cell)) or str(cell).strip() == "":
        return np.full(BINS, np.nan)
    values = np.array([float(v) for v in str(cell).split()])
    if len(values) != BINS or not np.isfinite(values).all():
        raise ValueError(f"{len(values)} numbers where {BINS} finite ones belong")
    return values


def histograms(rows: pd.DataFrame) -> tuple[np.ndarray, list[str]]:
    """(R, 4, BINS) array of ``BIN_VALUES`` per row, and the problems found (a row that is no histogram: a file
    edited by hand): a cell without 20 numbers, a count that is negative or not whole, a sum outside [0, count]."""
    out = np.full((len(rows), len(BIN_VALUES), BINS), np.nan)
    problems = []
    for i, row in enumerate(rows[list(BIN_VALUES)].itertuples(index=False)):
        try:
            out[i] = [_numbers(cell) for cell in row]
            count = out[i, 0]
            if np.isnan(count).any() or (count < 0).any() or (count % 1 != 0).any():
                raise ValueError("counts must be whole numbers >= 0")
            slack = 1e-5 * count + 1e-5  # the sums' 6 significant digits
            sums = out[i, 1:]
            if ((sums < -slack) | (sums > count + slack)).any():
                raise ValueError("a bin's sum lies outside [0, its count]")
        except ValueError as err:
            problems.append(f"run {rows['run'].iloc[i]}, split {rows['split'].iloc[i]}, task {rows['task'].iloc[i]}: "
                            f"{err}")
    return out, problems


def reliability_problems(rows: pd.DataFrame, file: str = RELIABILITY) -> list[str]:
    """What makes ``rows`` no set of histograms, as lines for the bundle's one error (``bundle.check_bundle``)."""
    if rows.empty:
        return []
    problems = [f"{file}: {p}" for p in histograms(rows)[1][:3]]
    if rows.duplicated(RELIABILITY_SORT).any():
        problems.append(f"{file}: a run's split and task listed twice")
    return problems


def diagram_bins(rows: pd.DataFrame, keys: list[str], all_tasks: str | None) -> pd.DataFrame:
    """Histogram rows with the report's labels (``keys``, e.g. dataset and method) pooled over seeds into
    ``html_report.ReportTables.reliability``'s rows: all 20 bins of each (keys, task), empty ones with NaN
    means. ``all_tasks`` names the extra task pooling every task of a multi-task data set (None: none)."""
    if rows.empty:
        return pd.DataFrame(columns=[*keys, *DIAGRAM_COLUMNS])
    values, _ = histograms(rows)
    groups = {}
    for i, labels in enumerate(zip(*(rows[k] for k in keys), rows["task"])):
        groups.setdefault(labels, []).append(i)
    pooled = {}
    for (*key, task), index in groups.items():
        pooled[(*key, task)] = values[index].sum(0)  # a NaN truth sum in any run leaves that bin's mean p* unknown
    if all_tasks is not None:
        for key in dict.fromkeys(tuple(k[:-1]) for k in pooled):
            tasks = [v for k, v in pooled.items() if tuple(k[:-1]) == key]
            if len(tasks) > 1:
                pooled[(*key, all_tasks)] = np.sum(tasks, axis=0)
    frames = []
    for (*key, task), (count, confidence, outcome, truth) in pooled.items():
        with np.errstate(invalid="ignore", divide="ignore"):  # empty bins: NaN, never drawn
            shown = np.where(count > 0, count, np.nan)
            frames.append(pd.DataFrame({**dict(zip(keys, key)), "task": task, "bin": np.arange(BINS), "n_bins": BINS,
                                        "count": count, "mean_confidence": confidence / shown,
                                        "frequency": outcome / shown, "mean_truth": truth / shown}))
    frame = pd.concat(frames, ignore_index=True)
    first = frame["task"] == all_tasks if all_tasks is not None else pd.Series(False, index=frame.index)
    return pd.concat([frame[first], frame[~first]], ignore_index=True)


ACCURACY_MATCH = 1e-6  # a recorded accuracy (8 significant digits) against one recounted from the bins' exact counts
HALF = BINS // 2  # bins HALF.. hold p >= 0.5: a binary task's predictions of its positive class


def confidence_gaps(rows: pd.DataFrame, accuracy: pd.Series) -> pd.Series:
    """Per (run, task): mean top-label confidence minus accuracy from the task's bins (> 0: overconfident, < 0:
    underconfident), which ECE cannot tell apart.

    A binary task's bins hold its positive-class probability p (a prediction below 0.5 is the negative class, of
    confidence 1 - p), a multi-class task's its top-label confidence; the bundle does not record which. Each row is
    recounted both ways against the run's own ``accuracy`` (indexed by run and task). A task keeps one convention in
    every run, so it is decided per task by the rows where exactly one reading reproduces the accuracy (one row can
    fit the wrong reading by coincidence while a prediction at exactly 0.5, binned above and predicted below, spoils
    the right one; the other runs outvote it: the reading most deciding rows chose, by a strict majority). A row
    gets its task's reading where that reproduces its accuracy;
    where no row decides (no prediction below 0.5 in any run: the two readings are the same sums) the reading both
    agree on; else NaN (the readings conflict, or this row's accuracy does not fit). A task seen in one run only has
    no other run to outvote such a coincidence (it needs a logit of exactly 0 and as many positives as correct
    predictions)."""
    values, _ = histograms(rows)
    keys = list(rows[["run", "task"]].itertuples(index=False, name=None))
    readings = []  # per row: {convention: (gap, fits the recorded accuracy)}
    for (run, task), (count, confidence, outcome) in zip(keys, values[:, :3]):
        n, low = count.sum(), slice(0, HALF)
        top = {"multi-class": (confidence.sum(), outcome.sum()),
               "binary": (confidence[HALF:].sum() + (count[low] - confidence[low]).sum(),
                          outcome[HALF:].sum() + (count[low] - outcome[low]).sum())}
        recorded = accuracy.get((run, task), np.nan)
        readings.append({kind: ((conf - right) / n if n else np.nan, bool(n and abs(right / n - recorded) <=
                                                                           ACCURACY_MATCH))
                         for kind, (conf, right) in top.items()})
    votes: dict[str, Counter] = {}
    for (_, task), reading in zip(keys, readings):
        fitting = [kind for kind, (_, fits) in reading.items() if fits]
        votes.setdefault(task, Counter()).update(fitting if len(fitting) == 1 else [])
    gaps = []
    for (_, task), reading in zip(keys, readings):
        ranked = votes[task].most_common()
        if ranked and (len(ranked) == 1 or ranked[0][1] > ranked[1][1]):  # a strict majority of deciding rows
            gap, fits = reading[ranked[0][0]]
            gaps.append(gap if fits else np.nan)
        elif not ranked and all(fits for _, fits in reading.values()):
            pair = [gap for gap, _ in reading.values()]
            gaps.append(pair[0] if abs(pair[0] - pair[1]) <= ACCURACY_MATCH else np.nan)
        else:
            gaps.append(np.nan)
    return pd.Series(gaps, index=pd.MultiIndex.from_tuples(keys, names=["run", "task"]), dtype=float)
