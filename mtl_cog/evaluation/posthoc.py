"""Post-hoc calibration of saved predictions: fit on validation logits, apply to test logits.

One calibrator per task (tasks never share calibration parameters). Three families:

- ``ts``, ``vs``, ``ms`` (temperature, vector, matrix scaling; Guo et al., 2017) use *our*
  calibrator classes (``mtl_cog/models/calibrators.py``), the very classes COG trains jointly;
  only the fitting differs: L-BFGS with a strong-Wolfe line search on the validation NLL, run to
  convergence with the network frozen, i.e. the exact optimum (for ``ts``: the temperature
  minimising the validation NLL, which has a single minimum in T). All tasks are fitted in one
  optimisation of the summed per-task NLL, whose optimum is that of fitting each task alone
  because no parameter is shared between tasks (the sum is separable) and the fit converges.
- ``ts_guo``: temperature scaling with Guo et al.'s published recipe (their ``temperature_scaling.py``),
  the one the COG paper used (App. B): T starts at 1.5 and L-BFGS with a fixed step (lr 0.01, no
  line search) runs 50 iterations on the mean validation NLL. It stops far from the optimum when
  the optimum is far from 1.5: a binary task with logits +-3.65 right 80% of the time (optimal
  T = 2.63) ends at T = 1.71, with optimal T = 0.6 it ends at T = 1.47, worse than no
  calibration, and where the NLL is nearly linear in T it can jump to a negative temperature
  (kept, with a warning; see ``_fit_guo`` and tests/test_posthoc.py). It is a weaker baseline
  than ``ts``; reports name the two apart (``baseline+ts`` vs ``baseline+ts_guo``), see
  docs/baselines.md.
- ``svs``, ``sms`` (regularised vector / matrix scaling; Berta et al., 2025), ``isotonic``
  (Zadrozny & Elkan, 2002) and ``histogram`` binning (Zadrozny & Elkan, 2001) come from
  probmetrics (``probmetrics.calibrators``), fitted per task. Multi-class histogram binning is
  one-vs-rest. Binary tasks enter probmetrics (and ``ts_guo``) as two-column logits [0, z].

Unregularised matrix scaling overfits with many classes (the COG paper sees it on CIFAR-100);
it is reported as is, ``sms`` is its regularised counterpart.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torch import nn

from mtl_cog.data.task_api import LogitLayout
from mtl_cog.errors import PosthocError
from mtl_cog.evaluation.predictions import Predictions, labelled_rows
from mtl_cog.models.calibrators import CALIBRATORS, fit_calibrator

OUR_CALIBRATORS = {"ts": "temperature", "vs": "vector", "ms": "matrix"}
GUO_TEMPERATURE_SCALING = "ts_guo"
PROBMETRICS_CALIBRATORS = ("svs", "sms", "isotonic", "histogram")
POSTHOC_METHODS = ("ts", GUO_TEMPERATURE_SCALING, "vs", "ms", *PROBMETRICS_CALIBRATORS)
# Guo et al.'s set_temperature (github.com/gpleiss/temperature_scaling, temperature_scaling.py).
GUO_INITIAL_TEMPERATURE = 1.5
GUO_LBFGS = {"lr": 0.01, "max_iter": 50}


def layout_of(predictions: Predictions) -> LogitLayout:
    return LogitLayout(tuple(2 if np.ndim(z) == 1 else z.shape[1] for z in predictions.logits))


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


def guo_temperature(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """The temperature Guo et al.'s recipe fits to (N, K) ``logits`` and (N,) class ``labels``.

    Their ``ModelWithTemperature.set_temperature`` as published: the temperature itself is the
    parameter (not its logarithm, which changes the optimiser's path), starts at 1.5, and
    ``torch.optim.LBFGS(lr=0.01, max_iter=50)`` with PyTorch's other defaults (no line search)
    minimises the mean cross-entropy of logits / T in one ``step``. Written out here rather than
    reusing ``fit_calibrator`` because the point is to reproduce where this recipe *stops*.
    """
    temperature = nn.Parameter(torch.ones(1, dtype=logits.dtype) * GUO_INITIAL_TEMPERATURE)
    nll = nn.CrossEntropyLoss()
    optimizer = torch.optim.LBFGS([temperature], **GUO_LBFGS)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = nll(logits / temperature, labels)
        loss.backward()
        return loss

    optimizer.step(closure)
    return float(temperature.item())


def _fit_guo(val: Predictions, test: Predictions) -> list[np.ndarray]:
    """``ts_guo``: one temperature per task by ``guo_temperature``, each task fitted alone.

    Alone, not jointly: L-BFGS's curvature estimate mixes every parameter it optimises, so a
    joint fit of several tasks' temperatures would not follow the single-model recipe.

    Without a line search, L-BFGS can jump to a *negative* temperature where the NLL is nearly
    linear in T (a curvature estimate near 0 gives a huge step): e.g. a binary task right 90% of
    the time with optimal T = 0.9 ends at T = -15, which reverses the task's predictions. The
    published code does exactly this, so the result is kept (this is the recipe's baseline, not
    a repaired one) and a warning names the tasks; a temperature of 0 or a non-finite one gives
    no usable logits and is refused.
    """
    out, reversed_tasks = [], []
    for name, z, y, z_test in zip(val.task_names, val.logits, val.labels, test.logits):
        z, y = labelled_rows(z, y)  # partly labelled: fit on the task's labelled samples only
        logits = torch.as_tensor(z, dtype=torch.float32)  # the recipe runs on the float32 logits of a network
        if logits.ndim == 1:  # binary: softmax of [0, z / T] is sigmoid(z / T)
            logits = torch.stack([torch.zeros_like(logits), logits], 1)
        temperature = guo_temperature(logits, torch.as_tensor(y, dtype=torch.long))
        if not np.isfinite(temperature) or temperature == 0:
            raise PosthocError(
                f"post-hoc {GUO_TEMPERATURE_SCALING!r} on task {name!r} ended at temperature {temperature}: Guo et "
                f"al.'s fixed-step recipe diverged on these logits. Use 'ts' (the exact optimum) instead."
            )
        if temperature < 0:
            reversed_tasks.append(f"{name} (T = {temperature:.3g})")
        out.append((np.asarray(z_test, dtype=np.float64) / temperature).astype(np.float32))
    if reversed_tasks:
        warnings.warn(
            f"post-hoc {GUO_TEMPERATURE_SCALING!r}: Guo et al.'s recipe ended at a negative temperature on "
            f"{len(reversed_tasks)} task(s), which reverses their predictions, as the published code would: "
            f"{', '.join(reversed_tasks)}. 'ts' fits the exact optimum.", stacklevel=3,
        )
    return out


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
    if len(val) == 0:
        raise PosthocError(f"post-hoc {method!r}: the validation predictions hold no samples to fit on.")
    layout = layout_of(val)
    if layout_of(test).num_classes != layout.num_classes:
        raise PosthocError("validation and test predictions have different numbers of classes per task.")
    if method in OUR_CALIBRATORS:
        logits = _fit_ours(method, val, test, layout)
    elif method == GUO_TEMPERATURE_SCALING:
        logits = _fit_guo(val, test)
    else:
        logits = [_fit_probmetrics(method, name, *labelled_rows(val.logits[t], val.labels[t]), test.logits[t])
                  for t, name in enumerate(val.task_names)]
    return Predictions(list(test.task_names), logits, list(test.labels), test.true_probs)
