"""Per-task and task-averaged metrics: accuracy, NLL, Brier, binned, adaptive and smooth calibration errors.

Conventions (docs/explanation/metrics.md, which also gives every formula), identical to probmetrics (Berta
et al., 2025) and torchmetrics' binary/multiclass ``CalibrationError``: a binary task (one logit
z) is scored with the positive-class probability p = sigmoid(z) against y; a K-class task with
the top-label confidence against correctness. Brier sums over classes (2 * (p - y)^2 for a
binary task), NLL is in nats. Before binning, probabilities are clamped to [1e-7, 1 - 1e-7], so
a confidence of exactly 1.0 never falls into an extra bin. ``ece@B`` / ``rmsce@B`` / ``mce@B``
use B uniform bins on [0, 1] and are the L1, L2 and max norms of the per-bin gap
|mean(y) - mean(p)|, weighted by the bins' share of samples. Multi-task figures are unweighted
means over the tasks that have the metric.

Beyond binned ECE (each defined in docs/explanation/metrics.md):

- ``smece``: smooth ECE (Błasiok & Nakkiran, 2023), no bins (mtl_cog.evaluation.smooth_ece);
- ``adaece@B``: ECE with B equal-mass bins (edges at the order statistics of the confidences);
- ``classwise_ece@B`` (K-class tasks only): the mean over classes of the uniform-bin ECE of each
  class probability p_k against 1[y = k] (Kull et al., 2019);
- ``brier_reliability`` / ``brier_resolution`` / ``brier_uncertainty``: the exact CORP split of
  the Brier score, Brier = reliability − resolution + uncertainty
  (mtl_cog.evaluation.brier_decomposition);
- ``aurc`` / ``eaurc``: area under the risk–coverage curve of selective prediction and its excess
  over the ideal ordering (Geifman et al., 2019; mtl_cog.evaluation.selective).

``compute_metrics`` also returns the multi-task metrics (mtl_cog.evaluation.multitask_metrics)
under ``"multitask"`` when there are at least two tasks.

Why not call probmetrics per task: it drops classes absent from a split before calling
torchmetrics, which then fails on a binary task with one class present (frequent for rare CelebA
attributes on small splits), and a per-task loop over 40 attributes x 5 bin counts is slow. This
module computes every binary task at once with array ops; ``tests/test_metrics.py`` checks it
against probmetrics on ordinary data.
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit, log_softmax

from mtl_cog.constants import MISSING_LABEL
from mtl_cog.errors import PredictionFileError
from mtl_cog.evaluation import multitask_metrics as multitask
from mtl_cog.evaluation.binning import (  # noqa: F401  (binned_calibration_errors: part of this module's API)
    CLAMP,
    SortedRows,
    bin_sums,
    binned_calibration_errors,
    errors_from_sums,
    sort_with_binary_outcomes,
    uniform_bin_index,
)
from mtl_cog.evaluation.brier_decomposition import decompose_sorted
from mtl_cog.evaluation.predictions import labelled_rows, require_labelled
from mtl_cog.evaluation.selective import SELECTIVE_METRICS, aurc_from_sorted_logits, aurc_rows
from mtl_cog.evaluation.smooth_ece import smooth_ece_sorted

BASE_METRICS = ("accuracy", "nll", "brier")
NORMS = ("ece", "rmsce", "mce")
BRIER_PARTS = ("brier_reliability", "brier_resolution", "brier_uncertainty")
# every error named "<family>@<bins>", per task or multi-task (mtl_cog.evaluation.multitask_metrics)
BINNED_FAMILIES = (*NORMS, "adaece", "classwise_ece", *multitask.BINNED_FAMILIES)
HIGHER_IS_BETTER = {"accuracy", "brier_resolution", "worst_group_accuracy"}  # (mtl_cog.evaluation.groups)
ONLY_SOME_TASKS = ("classwise_ece",)  # K-class tasks only: empty on the rows of binary tasks


def only_some_tasks(name: str) -> bool:
    """Whether a per-task metric exists only for some tasks (``classwise_ece@B``); the task mean is over those."""
    return name.split("@")[0] in ONLY_SOME_TASKS


def metric_names(bins: list[int] | tuple[int, ...], multiclass: bool = False, selective: bool = True) -> list[str]:
    """Per-task metric names: accuracy, nll, brier, ece@B, rmsce@B, mce@B, smece, adaece@B, brier parts.

    ``multiclass=True`` adds ``classwise_ece@B``, which only K-class tasks have.
    """
    names = list(BASE_METRICS) + [f"{norm}@{b}" for norm in NORMS for b in bins]
    names += ["smece", *(f"adaece@{b}" for b in bins), *BRIER_PARTS, *(SELECTIVE_METRICS if selective else ())]
    if multiclass:
        names += [f"classwise_ece@{b}" for b in bins]
    return names


def lower_is_better(metric: str) -> bool:
    return metric.split("@")[0] not in HIGHER_IS_BETTER


# ---------------------------------------------------------------------------------------------
# One group of events scored together: every binary task at once, or one K-class task


def calibration_scores(rows: SortedRows, bins: list[int] | tuple[int, ...]) -> tuple[dict[str, np.ndarray], dict]:
    """ece/rmsce/mce@B, smece, adaece@B of each sorted row -> (metrics, uniform bin sums per B for pooling).

    """
    out: dict[str, np.ndarray] = {}
    sums = {}
    for b in bins:
        sums[b] = rows.uniform_sums(b)
        for norm, values in errors_from_sums(sums[b]).items():
            out[f"{norm}@{b}"] = values
    out["smece"] = smooth_ece_sorted(rows)[0]
    for b in bins:
        out[f"adaece@{b}"] = errors_from_sums(rows.equal_mass_sums(b))["ece"]
    return out, sums


def _refuse_non_finite(values: dict[str, np.ndarray], sums: dict, finite: np.ndarray) -> None:
    """A task with a NaN or infinite logit gets NaN for every metric (and contributes NaN to pooling)."""
    if finite.all():
        return
    for array in (*values.values(), *sums.values()):
        array[~finite] = np.nan


def _clamp_sorted(p_sorted: np.ndarray) -> np.ndarray:
    """``np.clip(p, CLAMP, 1 − CLAMP)`` of rows sorted ascending: a copy only when an end needs clamping."""
    if p_sorted[:, 0].min() >= CLAMP and p_sorted[:, -1].max() <= 1 - CLAMP:
        return p_sorted
    return np.clip(p_sorted, CLAMP, 1 - CLAMP)


def _score_binary(z: np.ndarray, y: np.ndarray, bins, selective: bool = True
                  ) -> tuple[dict[str, np.ndarray], dict, np.ndarray]:
    """Every binary task at once: logits and 0/1 labels (T, N) -> metrics (T,) each, bin sums, p (T, N).

    One sort per task serves every binned error, the equal-mass bins and the Brier decomposition.
    ``z`` keeps its dtype for the sort (float32 logits sort faster; their float64 values sort the same).
    """
    finite = np.isfinite(z).all(1)
    if not finite.all():
        z = np.where(finite[:, None], z, 0)  # placeholder; those tasks' metrics become NaN
    z_sorted, y_sorted = sort_with_binary_outcomes(z, y)
    z_sorted = z_sorted.astype(np.float64)
    p_sorted = expit(z_sorted)
    rows = SortedRows(_clamp_sorted(p_sorted), y_sorted)
    values, sums = calibration_scores(rows, bins)
    # accuracy: the first k samples (z <= 0) predict 0, the rest 1; counted from the running sum of labels
    k = np.array([np.searchsorted(row, 0.0, side="right") for row in z_sorted])
    positives_below = rows.cum_hit[np.arange(len(k)), k]
    values["accuracy"] = (k - positives_below + rows.cum_hit[:, -1] - positives_below) / z.shape[1]
    if selective:  # from the same sort: the order of |z| merges the two halves z <= 0 and z > 0
        values.update(aurc_from_sorted_logits(z_sorted, y_sorted, k))
    # BCE with logits, stably: softplus(z) − y z, with softplus(z) = max(z, 0) + log(1 + e^−|z|)
    # = max(z, 0) − log σ(|z|), and σ(|z|) = max(p, 1 − p) >= 1/2 (so its log is accurate)
    softplus = np.maximum(z_sorted, 0).sum(1) - np.log(np.maximum(p_sorted, 1 - p_sorted)).sum(1)
    values["nll"] = (softplus - np.einsum("ij,ij->i", y_sorted, z_sorted)) / z.shape[1]
    squared_error, parts = decompose_sorted(p_sorted, y_sorted)
    values["brier"] = 2 * squared_error  # summed over both classes
    values.update(dict(zip(BRIER_PARTS, 2 * parts)))  # the two classes' decompositions are identical
    _refuse_non_finite(values, sums, finite)
    return values, sums, np.where(finite[:, None], expit(z.astype(np.float64)), np.nan)


def _score_multiclass(z: np.ndarray, y: np.ndarray, bins, selective: bool = True) -> tuple[dict[str, np.ndarray], dict]:
    """One K-class task: logits (N, K), labels (N,) -> metrics (1,) each, top-label bin sums (1, B, 3)."""
    finite = np.array([np.isfinite(z).all()])
    log_p = log_softmax(np.where(finite[0], z, 0.0), axis=1)
    probs = np.exp(log_p).T  # (K, N): one row per class
    onehot = np.zeros_like(probs)
    onehot[y, np.arange(len(y))] = 1.0
    predicted = probs.argmax(0)
    confidence = probs[predicted, np.arange(len(y))]
    hit = (predicted == y).astype(np.float64)
    values, sums = calibration_scores(SortedRows.sort(np.clip(confidence, CLAMP, 1 - CLAMP)[None], hit[None]), bins)
    values["accuracy"] = hit.mean(keepdims=True)
    values["nll"] = -log_p[np.arange(len(y)), y].mean(keepdims=True)
    values["brier"] = ((probs - onehot) ** 2).sum(0).mean(keepdims=True)
    order = np.argsort(probs, axis=1)
    _, parts = decompose_sorted(np.take_along_axis(probs, order, 1), np.take_along_axis(onehot, order, 1))
    values.update(dict(zip(BRIER_PARTS, parts.sum(1, keepdims=True))))  # summed over classes, like the Brier score
    if selective:
        values.update(aurc_rows(confidence[None], 1.0 - hit[None]))
    clamped = np.clip(probs, CLAMP, 1 - CLAMP)
    for b in bins:  # Kull et al. (2019): mean over classes of each class probability's ECE
        per_class = errors_from_sums(bin_sums(clamped, onehot, uniform_bin_index(clamped, b), b))["ece"]
        values[f"classwise_ece@{b}"] = per_class.mean(keepdims=True)
    _refuse_non_finite(values, sums, finite)
    return values, sums


def compute_metrics(
    task_names: list[str], logits: list[np.ndarray], labels: list[np.ndarray], bins: list[int] | tuple[int, ...],
    pairs: int = multitask.DEFAULT_PAIRS, selective: bool = True,
) -> dict:
    """{"tasks": {task: {metric: value}}, "mean": {metric: value}} (unweighted mean over tasks), plus
    ``"multitask": {metric: value}`` with at least two tasks and ``"pairs": [...]`` (the per-pair
    joint calibration, mtl_cog.evaluation.multitask_metrics) with at least two binary tasks.

    ``logits[t]`` is (N,) for a binary task and (N, K) for a K-class task; ``labels[t]`` is (N,).
    Binary tasks are scored together in one pass; multi-class tasks one by one. ``pairs`` is the
    number k of most correlated attribute pairs whose joint calibration is measured (0 = none).

    Partly labelled data (labels equal to ``MISSING_LABEL``): every per-task metric is that of the
    task's labelled rows alone, the pooled errors pool every labelled (task, sample) event, and
    the joint metrics (count and pair calibration, which need every task's label of a sample) use
    the samples labelled in every binary task (left out when fewer than two are). A task with no
    labelled sample is refused.

    ``selective=False`` leaves out ``aurc``/``eaurc`` (the metrics benchmark times them side by side).
    """
    if not task_names or len(labels[0]) == 0:
        raise PredictionFileError(f"nothing to score: {len(task_names)} task(s) with "
                                  f"{len(labels[0]) if task_names else 0} samples each.")
    known = [np.asarray(y) != MISSING_LABEL for y in labels]
    if all(k.all() for k in known):
        per_task, task_sums, binary, binary_probs, y = _score_tasks(task_names, logits, labels, bins, selective)
    else:
        require_labelled(task_names, labels)
        per_task, task_sums = {}, {}
        for t, name in enumerate(task_names):
            z_t, y_t = labelled_rows(logits[t], labels[t])
            scored, sums = _score_tasks([name], [z_t], [y_t], bins, selective)[:2]
            per_task[name], task_sums[t] = scored[name], sums[0]
        binary = [t for t, z in enumerate(logits) if np.ndim(z) == 1]
        everywhere = np.logical_and.reduce([known[t] for t in binary]) if binary else None
        binary_probs = y = None
        if everywhere is not None and everywhere.sum() >= 2:  # joint metrics: samples labelled in every binary task
            y = np.stack([labels[t][everywhere] for t in binary]).astype(np.float64)
            binary_probs = expit(np.stack([logits[t][everywhere] for t in binary]).astype(np.float64))
    names = metric_names(bins, multiclass=any(np.ndim(z) == 2 for z in logits), selective=selective)
    mean = {m: float(np.mean([v[m] for v in per_task.values() if m in v])) for m in names}
    out: dict = {"tasks": per_task, "mean": mean}
    if len(task_names) >= 2:
        pooled = {b: np.sum([task_sums[t][b] for t in range(len(task_names))], axis=0) for b in bins}
        out["multitask"] = multitask.task_spread(per_task, pooled, bins)
        if len(binary) >= 2 and binary_probs is not None:
            joint = multitask.joint_metrics([task_names[t] for t in binary], binary_probs, y, pairs)
            out["multitask"].update(joint.scalars)
            if joint.pairs:
                out["pairs"] = joint.pairs
    return out


def _score_tasks(task_names: list[str], logits: list[np.ndarray], labels: list[np.ndarray],
                 bins: list[int] | tuple[int, ...], selective: bool = True
                 ) -> tuple[dict, dict, list[int], np.ndarray | None, np.ndarray | None]:

    """Per-task metrics of fully labelled tasks with the same samples: (per_task, per-task uniform bin sums,
    the binary tasks' indices, their probabilities (Tb, N) and 0/1 labels (Tb, N))."""
    per_task: dict[str, dict[str, float]] = {}
    binary = [t for t, z in enumerate(logits) if np.ndim(z) == 1]
    task_sums: dict[int, dict] = {}
    binary_probs = y = None
    if binary:
        z = np.stack([logits[t] for t in binary])
        z = z if z.dtype in (np.float32, np.float64) else z.astype(np.float64)
        y = np.stack([labels[t] for t in binary]).astype(np.float64)
        values, sums, binary_probs = _score_binary(z, y, bins, selective)
        for row, t in enumerate(binary):
            per_task[task_names[t]] = {m: float(values[m][row]) for m in metric_names(bins, selective=selective)}
            task_sums[t] = {b: sums[b][row] for b in bins}
    for t, z in enumerate(logits):
        if np.ndim(z) == 2:
            values, sums = _score_multiclass(np.asarray(z, dtype=np.float64), np.asarray(labels[t], dtype=np.int64),
                                             bins, selective)
            per_task[task_names[t]] = {m: float(values[m][0])
                                       for m in metric_names(bins, multiclass=True, selective=selective)}
            task_sums[t] = {b: sums[b][0] for b in bins}
    per_task = {name: per_task[name] for name in task_names}  # data-set order
    return per_task, task_sums, binary, binary_probs, y


def task_metrics(logits: np.ndarray, labels: np.ndarray, bins: list[int] | tuple[int, ...]) -> dict[str, float]:
    """All metrics of one task: logits (N,) binary or (N, K) multi-class, labels (N,) ints."""
    return compute_metrics(["task"], [logits], [labels], bins)["tasks"]["task"]


def metrics_frame(metrics: dict):
    """One row per task plus a final ``mean`` row (the layout of ``test_metrics.csv``).

    The data-set-level multi-task metrics (``metrics["multitask"]``) are columns of the ``mean``
    row (empty on the task rows), so that tables over runs carry them like the task means.
    """
    import pandas as pd

    rows = [{"task": task, **values} for task, values in metrics["tasks"].items()]
    rows.append({"task": "mean", **metrics["mean"], **metrics.get("multitask", {})})
    return pd.DataFrame(rows)


SUMMARY_COLUMNS = ("accuracy", "nll", "brier", "ece@15", "smece")


def format_table(metrics: dict, columns: tuple[str, ...] = SUMMARY_COLUMNS) -> str:
    """The console table: one row per task + mean, then one line of multi-task metrics (if any)."""
    frame = metrics_frame(metrics)
    columns = tuple(c for c in columns if c in frame.columns)
    table = frame[["task", *columns]].to_string(index=False, float_format=lambda v: f"{v:.4f}")
    summary = multitask.summary_line(metrics.get("multitask", {}))
    return f"{table}\n{summary}" if summary else table
