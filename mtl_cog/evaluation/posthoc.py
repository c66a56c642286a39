"""Post-hoc calibration of saved predictions: fit on validation logits, apply to test logits.

Every method is a ``PosthocCalibrator`` with ``fit(val_predictions)`` and ``apply(predictions)``
(torch-uncertainty's post-processing scalers have the same shape), registered under its name in
``POSTHOC``, the one list every command reads (``evaluate --posthoc``, ``reproduce``, the tables).
Adding a method is one class and one decorator; see "Adding a post-hoc method" in docs/explanation/baselines.md.
One calibrator per task (tasks never share calibration parameters). Four families:

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
  (kept, with a warning; see ``GuoTemperatureScaling`` and tests/test_posthoc.py). It is a weaker baseline
  than ``ts``; reports name the two apart (``baseline+ts`` vs ``baseline+ts_guo``), see
  docs/explanation/baselines.md.
- ``svs``, ``sms`` (structured vector / matrix scaling, Berta, Holzmüller, Jordan & Bach, AISTATS 2026:
  a temperature first, then a ridge-penalised scaling of the log-probabilities, not of the logits; on a
  binary task that is beta calibration's family, one parameter more than VS/MS's a*z + b), ``isotonic``
  (Zadrozny & Elkan, 2002) and ``histogram`` binning (Zadrozny & Elkan, 2001) come from
  probmetrics (``probmetrics.calibrators``), fitted per task. Multi-class histogram binning is
  one-vs-rest. Binary tasks enter probmetrics (and ``ts_guo``) as two-column logits [0, z].

- ``stability`` (``mtl_cog.evaluation.stability``) re-runs the trained network on perturbed
  images (``needs_network``): it is built with the network and gets each split's images.

Unregularised matrix scaling overfits with many classes (the COG paper sees it on CIFAR-100);
it is reported as is; ``sms`` is the penalised alternative (on log-probabilities, see above).
"""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType
from typing import ClassVar

import numpy as np
import torch
from torch import nn

from mtl_cog.errors import PosthocError
from mtl_cog.evaluation.predictions import Predictions, flat_tensors, labelled_rows, layout_of, require_labelled
from mtl_cog.evaluation.stability import StabilityTemperature, apply_stability, fit_stability
from mtl_cog.models.calibrators import CALIBRATORS, fit_calibrator
from mtl_cog.registry import Registry

__all__ = ["POSTHOC", "POSTHOC_METHODS", "PosthocCalibrator", "build_posthoc", "calibrate", "fit_calibrator",
           "guo_temperature", "layout_of"]

# Guo et al.'s set_temperature (github.com/gpleiss/temperature_scaling, temperature_scaling.py).
GUO_INITIAL_TEMPERATURE = 1.5
GUO_LBFGS = {"lr": 0.01, "max_iter": 50}


class PosthocCalibrator:
    """A post-hoc method: ``fit`` on validation predictions, then ``apply`` to any predictions of the same tasks.

    ``needs_network`` methods are built with the trained network and its evaluation transform
    (``build_posthoc``) and get each split's uint8 images, in the predictions' order.
    """

    needs_network: ClassVar[bool] = False
    # A positive rescaling of each sample's logits keeps every prediction (its argmax), so the calibrated accuracy
    # equals the uncalibrated one; where a report finds it changed, the fit reversed predictions (``ts_guo``'s
    # negative temperature) and the summary says so (``analysis.bundle_answers.summary``).
    keeps_predictions: ClassVar[bool] = False
    title: ClassVar[str] = ""  # what the short name stands for, in help and beside tables ("vs" is not "versus")

    def fit(self, val: Predictions, images: torch.Tensor | None = None) -> PosthocCalibrator:
        raise NotImplementedError

    def apply(self, predictions: Predictions, images: torch.Tensor | None = None) -> Predictions:
        raise NotImplementedError


POSTHOC: Registry[type[PosthocCalibrator]] = Registry("post-hoc method")


def _with_logits(predictions: Predictions, logits: list[np.ndarray]) -> Predictions:
    return Predictions(list(predictions.task_names), logits, list(predictions.labels), predictions.true_probs)


class LearnedScaling(PosthocCalibrator):
    """One of the calibrator classes COG trains (``calibrator`` names it in ``CALIBRATORS``), fitted exactly
    (``fit_calibrator``: L-BFGS, strong Wolfe) on the frozen validation logits, all tasks in one separable fit."""

    calibrator: ClassVar[str]

    def fit(self, val: Predictions, images: torch.Tensor | None = None) -> LearnedScaling:
        self.layout = layout_of(val)
        self.module = CALIBRATORS.get(self.calibrator)(self.layout).double()
        fit_calibrator(self.module, *flat_tensors(val, self.layout), self.layout, task_names=val.task_names,
                       what=f"post-hoc {self.calibrator} scaling")
        return self

    def apply(self, predictions: Predictions, images: torch.Tensor | None = None) -> Predictions:
        with torch.no_grad():
            logits = self.module(flat_tensors(predictions, self.layout)[0]).float().numpy()
        return _with_logits(predictions, self.layout.split(logits))


@POSTHOC.register("ts")
class TemperatureScaling(LearnedScaling):
    keeps_predictions = True  # T = exp(log T) > 0
    title = "temperature scaling"
    calibrator = "temperature"


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


@POSTHOC.register("ts_guo")
class GuoTemperatureScaling(PosthocCalibrator):
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

    keeps_predictions = True  # unless the recipe ends at T < 0, which the summary then reports
    title = "temperature scaling, Guo et al.'s recipe"

    def fit(self, val: Predictions, images: torch.Tensor | None = None) -> GuoTemperatureScaling:
        self.temperatures, reversed_tasks = [], []
        for name, z, y in zip(val.task_names, val.logits, val.labels):
            z, y = labelled_rows(z, y)  # partly labelled: fit on the task's labelled samples only
            logits = torch.as_tensor(z, dtype=torch.float32)  # the recipe runs on the float32 logits of a network
            if logits.ndim == 1:  # binary: softmax of [0, z / T] is sigmoid(z / T)
                logits = torch.stack([torch.zeros_like(logits), logits], 1)
            temperature = guo_temperature(logits, torch.as_tensor(y, dtype=torch.long))
            if not np.isfinite(temperature) or temperature == 0:
                raise PosthocError(
                    f"post-hoc 'ts_guo' on task {name!r} ended at temperature {temperature}: Guo et "
                    f"al.'s fixed-step recipe diverged on these logits. Use 'ts' (the exact optimum) instead."
                )
            if temperature < 0:
                reversed_tasks.append(f"{name} (T = {temperature:.3g})")
            self.temperatures.append(temperature)
        if reversed_tasks:
            warnings.warn(
                f"post-hoc 'ts_guo': Guo et al.'s recipe ended at a negative temperature on "
                f"{len(reversed_tasks)} task(s), which reverses their predictions, as the published code would: "
                f"{', '.join(reversed_tasks)}. 'ts' fits the exact optimum.", stacklevel=3,
            )
        return self

    def apply(self, predictions: Predictions, images: torch.Tensor | None = None) -> Predictions:
        return _with_logits(predictions, [(np.asarray(z, dtype=np.float64) / t).astype(np.float32)
                                          for z, t in zip(predictions.logits, self.temperatures)])


@POSTHOC.register("vs")
class VectorScaling(LearnedScaling):
    title = "vector scaling"
    calibrator = "vector"


@POSTHOC.register("ms")
class MatrixScaling(LearnedScaling):
    title = "matrix scaling"
    calibrator = "matrix"


def probmetrics(module: str) -> ModuleType:
    """``probmetrics.<module>``, imported on first use (it is slow to import) without the ``FutureWarning``
    (``torch.jit.script`` is deprecated) that its dependency torchmin raises when imported: a third-party
    deprecation no user can act on, which would be printed in the middle of ``evaluate``'s output."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.script` is deprecated", category=FutureWarning)
        return importlib.import_module(f"probmetrics.{module}")


class ProbmetricsCalibration(PosthocCalibrator):
    """A probmetrics calibrator (``probmetrics.calibrators``) per task; binary tasks enter as logits [0, z]."""

    name: ClassVar[str]
    options: ClassVar[dict[str, object]] = {}  # keyword arguments of ``get_calibrator``

    def make(self):
        return probmetrics("calibrators").get_calibrator(self.name, **self.options)

    def _guarded(self, task: str, work):
        try:
            return work()
        except Exception as err:  # noqa: BLE001  (sklearn / scipy raise many types on degenerate data)
            raise PosthocError(f"post-hoc {self.name!r} failed on task {task!r}: {type(err).__name__}: {err}") \
                from None

    def fit(self, val: Predictions, images: torch.Tensor | None = None) -> ProbmetricsCalibration:
        CategoricalLogits = probmetrics("distributions").CategoricalLogits  # noqa: N806  (a class)
        self.fitted = []
        for name, z, y in zip(val.task_names, val.logits, val.labels):
            z, y = labelled_rows(z, y)  # partly labelled: fit on the task's labelled samples only
            calibrator = self.make()
            self._guarded(name, lambda c=calibrator, z=z, y=y: c.fit_torch(
                CategoricalLogits(torch.as_tensor(z, dtype=torch.float64)), torch.as_tensor(y, dtype=torch.long)))
            self.fitted.append(calibrator)
        return self

    def apply(self, predictions: Predictions, images: torch.Tensor | None = None) -> Predictions:
        CategoricalLogits = probmetrics("distributions").CategoricalLogits  # noqa: N806  (a class)
        logits = []
        for calibrator, name, z in zip(self.fitted, predictions.task_names, predictions.logits):
            out = self._guarded(name, lambda c=calibrator, z=z: c.predict_proba_torch(
                CategoricalLogits(torch.as_tensor(z, dtype=torch.float64))))
            # log-probabilities, floored (probmetrics clips log(0) at log of float32's tiny) so all are finite
            log_p = torch.log(out.get_probs().double().clamp_min(1e-30))
            logits.append(((log_p[:, 1] - log_p[:, 0]) if np.ndim(z) == 1 else log_p).float().numpy())
        return _with_logits(predictions, logits)


@POSTHOC.register("svs")
class RegularisedVectorScaling(ProbmetricsCalibration):
    title = "structured vector scaling"
    name, options = "svs", {"svs_print_init_info": False}


@POSTHOC.register("sms")
class RegularisedMatrixScaling(ProbmetricsCalibration):
    title = "structured matrix scaling"
    name, options = "sms", {"sms_print_init_info": False}


@POSTHOC.register("isotonic")
class IsotonicRegression(ProbmetricsCalibration):
    title = "isotonic regression"
    name = "isotonic"


@POSTHOC.register("histogram")
class HistogramBinning(ProbmetricsCalibration):
    title = "histogram binning"
    name = "histogram"

    def make(self):  # multi-class: one-vs-rest
        calibrators = probmetrics("calibrators")
        return calibrators.MulticlassOneVsRestCalibrator(calibrators.BinaryHistogramBinningCalibrator())


@POSTHOC.register("stability")
class StabilityScaling(PosthocCalibrator):
    """Stability scaling (``mtl_cog.evaluation.stability``): a temperature per sample from how stable the
    network's prediction is under perturbations; validation perturbed with seed 0, other splits with seed 1."""

    title = "stability scaling"
    keeps_predictions = True  # T = exp(a_t + b_t (1 - s)) > 0
    needs_network = True

    def __init__(self, network: nn.Module, transform, perturbations: int = 8, seed: int = 0) -> None:
        self.network, self.transform, self.perturbations, self.seed = network, transform, perturbations, seed

    def fit(self, val: Predictions, images: torch.Tensor | None = None) -> StabilityScaling:
        self.module: StabilityTemperature = fit_stability(self.network, self.transform, _needs(images), val,
                                                          self.perturbations, self.seed)
        return self

    def apply(self, predictions: Predictions, images: torch.Tensor | None = None) -> Predictions:
        return apply_stability(self.module, self.network, self.transform, _needs(images), predictions,
                               self.perturbations, self.seed + 1)


def _needs(images: torch.Tensor | None) -> torch.Tensor:
    if images is None:
        raise PosthocError("stability scaling re-runs the network: it needs the images of each split.")
    return images


# The methods fitted on saved logits alone (no network), in registration order.
POSTHOC_METHODS = tuple(name for name in POSTHOC.in_order() if not POSTHOC.get(name).needs_network)


def build_posthoc(method: str, network: nn.Module | None = None, transform=None) -> PosthocCalibrator:
    """A fresh, unfitted ``method``; a ``needs_network`` one gets ``network`` and its evaluation ``transform``."""
    cls = POSTHOC.get(method) if method in POSTHOC else None
    if cls is None:
        raise PosthocError(f"unknown post-hoc method {method!r}. Available: {', '.join(POSTHOC.in_order())}.")
    if not cls.needs_network:
        return cls()
    if network is None:
        raise PosthocError(f"post-hoc {method!r} re-runs the trained network: fit it on a run (evaluate --run).")
    return cls(network, transform)


def check_pair(method: str, val: Predictions, test: Predictions) -> None:
    """Validation and test predictions that one calibrator per task can be fitted on and applied to."""
    if val.task_names != test.task_names:
        raise PosthocError(
            f"validation and test predictions name different tasks: {val.task_names} vs {test.task_names}."
        )
    if len(val) == 0:
        raise PosthocError(f"post-hoc {method!r}: the validation predictions hold no samples to fit on.")
    require_labelled(val.task_names, val.labels, f"post-hoc {method!r}: the validation predictions' ", PosthocError)
    if layout_of(test).num_classes != layout_of(val).num_classes:
        raise PosthocError("validation and test predictions have different numbers of classes per task.")


def calibrate(method: str, val: Predictions, test: Predictions, network: nn.Module | None = None, transform=None,
              val_images: torch.Tensor | None = None, test_images: torch.Tensor | None = None) -> Predictions:
    """``test`` with logits replaced by those of ``method`` fitted on ``val`` (one calibrator per task)."""
    calibrator = build_posthoc(method, network, transform)
    check_pair(method, val, test)
    return calibrator.fit(val, val_images).apply(test, test_images)
