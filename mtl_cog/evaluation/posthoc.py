"""Post-hoc calibration of saved predictions: fit on validation logits, apply to test logits.

One calibrator per task (tasks never share calibration parameters). Two families:

- ``ts``, ``vs``, ``ms`` (temperature, vector, matrix scaling; Guo et al., 2017) use *our*
  calibrator classes (``mtl_cog/calibrators.py``), the very classes COG trains jointly; only the
  fitting differs: L-BFGS on the validation NLL with the network frozen. All tasks are fitted in
  one optimisation of the summed per-task NLL, which is the same as fitting each task alone
  because no parameter is shared between tasks.
- ``svs``, ``sms`` (regularised vector / matrix scaling; Berta et al., 2025), ``isotonic``
  (Zadrozny & Elkan, 2002) and ``histogram`` binning (Zadrozny & Elkan, 2001) come from
  probmetrics (``probmetrics.calibrators``), fitted per task. Multi-class histogram binning is
  one-vs-rest. Binary tasks enter probmetrics as two-column logits [0, z].

Unregularised matrix scaling overfits with many classes (the COG paper sees it on CIFAR-100);
it is reported as is, ``sms`` is its regularised counterpart.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from mtl_cog.config import MethodConfig
from mtl_cog.data.task_api import LogitLayout
from mtl_cog.errors import PosthocError
from mtl_cog.evaluation.predictions import Predictions
from mtl_cog.models.calibrators import CALIBRATORS
from mtl_cog.objectives import CrossEntropy

OUR_CALIBRATORS = {"ts": "temperature", "vs": "vector", "ms": "matrix"}
PROBMETRICS_CALIBRATORS = ("svs", "sms", "isotonic", "histogram")
POSTHOC_METHODS = (*OUR_CALIBRATORS, *PROBMETRICS_CALIBRATORS)


def layout_of(predictions: Predictions) -> LogitLayout:
    return LogitLayout(tuple(2 if np.ndim(z) == 1 else z.shape[1] for z in predictions.logits))


def fit_calibrator(calibrator: nn.Module, logits: torch.Tensor, labels: torch.Tensor, layout: LogitLayout,
                   max_iter: int = 200) -> nn.Module:
    """Fit ``calibrator`` (flat logits (N, L) -> (N, L)) to minimise the validation NLL by L-BFGS.

    ``labels`` is (N, T). The objective is the sum of the per-task NLLs: each task's parameters
    only see their own task's loss, so this is one independent fit per task, done at once.
    """
    objective = CrossEntropy(layout, MethodConfig())
    optimizer = torch.optim.LBFGS(calibrator.parameters(), lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe",
                                  tolerance_grad=1e-9, tolerance_change=1e-12)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = objective(calibrator(logits), labels).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return calibrator


def _flat(predictions: Predictions, layout: LogitLayout) -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.as_tensor(layout.join(predictions.logits), dtype=torch.float64)
    labels = torch.as_tensor(np.stack(predictions.labels, axis=1), dtype=torch.long)
    return logits, labels


def _fit_ours(method: str, val: Predictions, test: Predictions, layout: LogitLayout) -> list[np.ndarray]:
    calibrator = CALIBRATORS.get(OUR_CALIBRATORS[method])(layout).double()
    val_logits, val_labels = _flat(val, layout)
    fit_calibrator(calibrator, val_logits, val_labels, layout)
    with torch.no_grad():
        test_logits = calibrator(_flat(test, layout)[0]).float().numpy()
    return layout.split(test_logits)


def _probmetrics_calibrator(method: str):
    from probmetrics.calibrators import BinaryHistogramBinningCalibrator, MulticlassOneVsRestCalibrator, get_calibrator

    if method == "histogram":
        return MulticlassOneVsRestCalibrator(BinaryHistogramBinningCalibrator())
    quiet = {"svs": {"svs_print_init_info": False}, "sms": {"sms_print_init_info": False}}.get(method, {})
    return get_calibrator(method, **quiet)


def _fit_probmetrics(method: str, task: str, val_z: np.ndarray, val_y: np.ndarray, test_z: np.ndarray) -> np.ndarray:
    """One probmetrics calibrator for one task; returns test logits in our layout ((N,) or (N, K))."""
    from probmetrics.distributions import CategoricalLogits

    calibrator = _probmetrics_calibrator(method)
    try:
        calibrator.fit_torch(CategoricalLogits(torch.as_tensor(val_z, dtype=torch.float64)),
                             torch.as_tensor(val_y, dtype=torch.long))
        out = calibrator.predict_proba_torch(CategoricalLogits(torch.as_tensor(test_z, dtype=torch.float64)))
    except Exception as err:  # noqa: BLE001  (sklearn / scipy raise many types on degenerate data)
        raise PosthocError(f"post-hoc {method!r} failed on task {task!r}: {type(err).__name__}: {err}") from None
    # log-probabilities, floored (probmetrics clips log(0) at log of float32's tiny) so all are finite
    log_p = torch.log(out.get_probs().double().clamp_min(1e-30))
    logits = (log_p[:, 1] - log_p[:, 0]) if np.ndim(val_z) == 1 else log_p
    return logits.float().numpy()


def calibrate(method: str, val: Predictions, test: Predictions) -> Predictions:
    """``test`` with logits replaced by those of ``method`` fitted on ``val`` (one calibrator per task)."""
    if method not in POSTHOC_METHODS:
        raise PosthocError(f"unknown post-hoc method {method!r}. Available: {', '.join(POSTHOC_METHODS)}.")
    if val.task_names != test.task_names:
        raise PosthocError(
            f"validation and test predictions name different tasks: {val.task_names} vs {test.task_names}."
        )
    layout = layout_of(val)
    if layout_of(test).num_classes != layout.num_classes:
        raise PosthocError("validation and test predictions have different numbers of classes per task.")
    if method in OUR_CALIBRATORS:
        logits = _fit_ours(method, val, test, layout)
    else:
        logits = [_fit_probmetrics(method, name, val.logits[t], val.labels[t], test.logits[t])
                  for t, name in enumerate(val.task_names)]
    return Predictions(list(test.task_names), logits, list(test.labels), test.true_probs)
