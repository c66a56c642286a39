"""From flat logits to per-task ``Predictions`` and their scores (training, evaluation, reports)."""

from __future__ import annotations

import numpy as np

from mtl_cog.data.task_api import SplitData, TaskSpec
from mtl_cog.evaluation.groups import score_with_groups
from mtl_cog.evaluation.multitask_metrics import DEFAULT_PAIRS
from mtl_cog.evaluation.predictions import Predictions


def to_predictions(spec: TaskSpec, flat_logits: np.ndarray, split: SplitData) -> Predictions:
    """Flat (N, L) logits + the split's labels -> per-task ``Predictions``."""
    labels = split.labels.numpy()
    probs = None if split.true_probs is None else [split.true_probs[:, t] for t in range(spec.num_tasks)]
    return Predictions(
        task_names=list(spec.task_names),
        logits=spec.layout.split(flat_logits),
        labels=[labels[:, t] for t in range(spec.num_tasks)],
        true_probs=probs,
    )


def score(predictions: Predictions, bins: list[int], pairs: int = DEFAULT_PAIRS,
          groups: list[str] | tuple[str, ...] = ()) -> dict:
    """{"tasks": {task: {metric: value}}, "mean": {metric: value}}, plus "multitask" (two or more tasks)
    and "pairs" (two or more binary tasks); see ``mtl_cog.evaluation.metrics.compute_metrics``. With
    ``groups`` (task names), also the subgroup metrics (``"groups"``, mtl_cog.evaluation.groups)."""
    return score_with_groups(predictions.task_names, predictions.logits, predictions.labels, bins, pairs, groups)
