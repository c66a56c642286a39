"""Certified robust accuracy of Lipschitz networks (LiST): correct *and* provably so within radius eps.

For a logit map z(x) that is L-Lipschitz in l2 and a sample with true class y and logit lead
m = z_y - max_{j != y} z_j > 0, no input perturbation of l2 norm below

    K-class task:  m / (sqrt(2) L)       (Tsuzuku et al., 2018, Prop. 1)
    binary task:   |z| / L               (the one logit z on [0, z])

can change the prediction. K-class: |(z_y - z_j)(x) - (z_y - z_j)(x')| <= |e_y - e_j| ||z(x) - z(x')||
<= sqrt(2) L ||x - x'||, so the lead m needs at least m / (sqrt(2) L) to vanish. A binary task's two
logits [0, z] differ by z itself, whose Lipschitz constant is L, so the factor sqrt(2) (which the
general bound would add) does not apply.

Radii are in the pixel scale [0, 1] of the images, the usual convention (e.g. eps = 36/255 on
CIFAR-10): the network sees (x - mean) / std, so its Lipschitz constant w.r.t. pixels is at most
L / min(std). Metric names: ``cert_acc@<eps>``, only for networks that report a bound
(``mtl_cog.models.lipschitz.network_lipschitz``); other runs get no such column.
"""

from __future__ import annotations

import math

import numpy as np

from mtl_cog.evaluation.margins import label_margin
from mtl_cog.evaluation.predictions import Predictions, labelled_rows


def metric_name(eps: float) -> str:
    return f"cert_acc@{eps:.4g}"


def certified_radii(predictions: Predictions, lipschitz: np.ndarray) -> list[np.ndarray]:
    """Per task, the certified l2 radius of each of its labelled samples (all N when every label is known);
    0 where the prediction is wrong (or a tie). A sample whose label is unknown (``MISSING_LABEL``) has no
    "correct" class, so no radius: it is left out, as from every metric.

    ``lipschitz`` (T,) bounds each task's logit map w.r.t. the same input scale as the radii.
    """
    radii = []
    for t, (z, y) in enumerate(zip(predictions.logits, predictions.labels)):
        z, y = labelled_rows(z, y)
        # binary: one logit z, |z| / L; K classes: the margin spans two logits, so / (sqrt(2) L)
        scale = lipschitz[t] if np.ndim(z) == 1 else math.sqrt(2) * lipschitz[t]
        radii.append(np.maximum(label_margin(z, y) / scale, 0.0))
    return radii


def certified_accuracy(predictions: Predictions, lipschitz: np.ndarray, eps_values: list[float]) -> dict[str, dict]:
    """{task: {cert_acc@eps: fraction of its labelled samples correct with certified radius >= eps (and > 0)}}."""
    out: dict[str, dict[str, float]] = {}
    for name, radius in zip(predictions.task_names, certified_radii(predictions, lipschitz)):
        out[name] = {metric_name(eps): float(np.mean((radius > 0) & (radius >= eps))) if len(radius) else float("nan")
                     for eps in eps_values}
    return out


def add_certified_accuracy(metrics: dict[str, dict], predictions: Predictions, lipschitz: np.ndarray,
                           eps_values: list[float], pixel_std: tuple[float, ...]) -> dict[str, dict]:
    """Add ``cert_acc@eps`` to ``metrics`` (the ``score`` layout: tasks and their unweighted mean), in place.

    ``lipschitz`` is the network's bound w.r.t. its normalised input; ``pixel_std`` the per-channel
    std of that normalisation, which turns it into a bound w.r.t. pixels in [0, 1].
    """
    pixel_lipschitz = np.asarray(lipschitz, dtype=np.float64).reshape(-1) / min(pixel_std)
    if pixel_lipschitz.size == 1:
        pixel_lipschitz = np.repeat(pixel_lipschitz, len(predictions.task_names))
    per_task = certified_accuracy(predictions, pixel_lipschitz, eps_values)
    for task, values in per_task.items():
        metrics["tasks"][task].update(values)
    for eps in eps_values:
        key = metric_name(eps)
        metrics["mean"][key] = float(np.mean([per_task[t][key] for t in per_task]))
    return metrics
