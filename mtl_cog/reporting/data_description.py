"""What a data set's labels look like: every task's prevalence and the most correlated task pairs, as Markdown.

``python scripts/prepare_data.py --config ... --describe 15`` prints it from the built cache, so
the tables in docs/guides/data.md are computed from the data, not typed. Prevalence of a binary task is
its share of positives; a K-class task shows its most frequent class and that class's share.
Correlations are Pearson's between the 0/1 labels of two binary tasks (the phi coefficient), the
same pairs ``pair_joint_ece`` scores (``evaluation.multitask_metrics.select_pairs``).

Partly labelled data (``MISSING_LABEL``): a task's shares count its labelled samples; the
correlations and positives per sample use the samples labelled in every binary task, as the
joint metrics do; the input-blind predictor is fitted on and scored on labelled entries.
"""

from __future__ import annotations

import numpy as np

from mtl_cog.constants import MISSING_LABEL
from mtl_cog.data.task_api import TaskData
from mtl_cog.evaluation.multitask_metrics import select_pairs
from mtl_cog.evaluation.predictions import Predictions
from mtl_cog.evaluation.scoring import score

PRIOR_METRICS = ("accuracy", "nll", "brier", "ece@15")


def prevalence_rows(data: TaskData) -> list[tuple[str, str, dict[str, float]]]:
    """(task, kind, split -> share): share of positives (binary) or of the training split's most frequent class."""
    rows = []
    first = "train" if "train" in data.splits else next(iter(data.splits))
    for t, (name, k) in enumerate(zip(data.spec.task_names, data.spec.num_classes)):
        counts = {s: _class_counts(split.labels[:, t].numpy(), k) for s, split in data.splits.items()}
        shown = 1 if k == 2 else int(np.argmax(counts[first]))
        kind = "binary" if k == 2 else f"{k} classes, most frequent {shown}"
        shares = {s: float(c[shown] / c.sum()) if c.sum() else float("nan") for s, c in counts.items()}
        rows.append((name, kind, shares))
    return rows


def _class_counts(column: np.ndarray, k: int) -> np.ndarray:
    """(k,) samples per class among the labelled entries of one task's label column."""
    return np.bincount(column[column != MISSING_LABEL], minlength=k)


def _binary_labels(data: TaskData, split: str) -> tuple[list[int], np.ndarray]:
    """The binary tasks and their labels (N', Tb) on the samples of ``split`` labelled in every one of them."""
    binary = [t for t, c in enumerate(data.spec.num_classes) if c == 2]
    labels = data.splits[split].labels[:, binary].numpy()
    return binary, labels[(labels != MISSING_LABEL).all(axis=1)]


def correlated_pairs(data: TaskData, k: int, split: str = "train") -> list[tuple[str, str, float]]:
    """The k binary-task pairs with the largest |correlation| of their labels on ``split``."""
    binary, labels = _binary_labels(data, split)
    if len(binary) < 2 or len(labels) < 2:
        return []
    labels = labels.T.astype(np.float64)
    names = [data.spec.task_names[t] for t in binary]
    return [(names[i], names[j], corr) for i, j, corr in select_pairs(labels, k)]


def positives_per_sample(data: TaskData, split: str = "train") -> np.ndarray | None:
    """How many binary tasks are positive in each sample of ``split`` (None without two binary tasks)."""
    binary, labels = _binary_labels(data, split)
    return labels.sum(axis=1) if len(binary) >= 2 else None


def prior_predictor_scores(data: TaskData, fit: str = "train", scored: str = "test") -> dict[str, float]:
    """Task-mean scores on ``scored`` of the input-blind predictor: every task's class shares on ``fit``.

    The floor a trained model must beat (accuracy of always answering the majority class, NLL and
    Brier of the prevalence), scored by the same ``compute_metrics`` as a run's test metrics.
    """
    logits, labels = [], []
    for t, k in enumerate(data.spec.num_classes):
        counts = _class_counts(data.splits[fit].labels[:, t].numpy(), k) + 0.5  # no share of exactly 0
        shares = counts / counts.sum()
        column = data.splits[scored].labels[:, t].numpy()
        n = len(column)
        logits.append(np.full(n, np.log(shares[1] / shares[0])) if k == 2 else np.tile(np.log(shares), (n, 1)))
        labels.append(column)
    mean = score(Predictions(list(data.spec.task_names), logits, labels), [15], pairs=0)["mean"]
    return {name: float(mean[name]) for name in PRIOR_METRICS}


def describe_markdown(data: TaskData, k: int) -> str:
    """The prevalence table (every split), positives per sample and the ``k`` most correlated pairs (training split)."""
    splits = list(data.splits)
    lines = ["| task | kind | " + " | ".join(f"{s} (n={len(data.splits[s]):,})" for s in splits) + " |",
             "| --- | --- | " + " | ".join("---:" for _ in splits) + " |"]
    for name, kind, shares in prevalence_rows(data):
        lines.append(f"| `{name}` | {kind} | " + " | ".join(f"{shares[s]:.1%}" for s in splits) + " |")
    counts = positives_per_sample(data)
    if counts is not None and len(counts):
        low, high = np.percentile(counts, [5, 95])
        lines += ["", f"Positive binary labels per sample (training split): mean {counts.mean():.2f}, 5th-95th "
                  f"percentile {low:.0f}-{high:.0f}, range {counts.min()}-{counts.max()}."]
    if "train" in data.splits and "test" in data.splits:
        prior = prior_predictor_scores(data)
        lines += ["", "Input-blind predictor (each task's training class shares), task mean on the test split: "
                  + ", ".join(f"{name} {value:.4f}" for name, value in prior.items()) + "."]
    pairs = correlated_pairs(data, k)
    if pairs:
        lines += ["", f"The {len(pairs)} most correlated task pairs (Pearson correlation of the labels, "
                  "training split):", "", "| task a | task b | correlation |", "| --- | --- | ---: |"]
        lines += [f"| `{a}` | `{b}` | {corr:+.3f} |" for a, b, corr in pairs]
    return "\n".join(lines)
