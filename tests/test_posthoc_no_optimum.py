"""Calibrator fits with no optimum: a task without validation errors (docs/guides/failure_paths.md, "Values").

The validation NLL of such a task keeps falling as its logits are scaled up (T -> 0), so every
fit that can scale them (TS, VS, MS, stability scaling, LiST's L, the drift script's T) would run
to the edge of its domain. ``fit_calibrator`` names the task and keeps its uncalibrated logits,
and fits the other tasks exactly as if they had been alone.
"""

import warnings

import numpy as np
import pytest
import torch

from mtl_cog.data.task_api import LogitLayout
from mtl_cog.evaluation.posthoc import calibrate
from mtl_cog.evaluation.predictions import Predictions
from mtl_cog.evaluation.stability import StabilityTemperature
from mtl_cog.models.calibrators import fit_calibrator, fit_temperatures, separated_tasks


def _noisy_binary(rng, n):
    z = rng.normal(0, 2, n)
    return z * 3, (rng.random(n) < 1 / (1 + np.exp(-z))).astype(np.int64)  # overconfident: optimal T near 3


def _data(seed: int, n: int = 300) -> tuple[Predictions, Predictions]:
    """Task "sep": every validation sample right (|z| >= 1); task "noisy": a normal task; task "digits": 4
    classes, every validation sample's argmax right (like digits: 359 of 359)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(2):
        y_sep = rng.integers(0, 2, n)
        z_sep = np.where(y_sep == 1, 1, -1) * rng.uniform(1, 4, n)
        z_noisy, y_noisy = _noisy_binary(rng, n)
        y_k = rng.integers(0, 4, n)
        z_k = rng.normal(0, 1, (n, 4))
        z_k[np.arange(n), y_k] += 5
        out.append(Predictions(["sep", "noisy", "digits"], [z_sep, z_noisy, z_k], [y_sep, y_noisy, y_k]))
    test = out[1]
    test.logits[0][:10] *= -1  # the test split has errors; a T -> 0 fit would make them cost a lot
    test.logits[2][:10] = test.logits[2][:10, ::-1].copy()
    return out[0], test


@pytest.mark.parametrize("method", ["ts", "vs", "ms"])
def test_a_task_without_validation_errors_keeps_its_uncalibrated_logits_and_is_named(method):
    val, test = _data(0)
    family = {"ts": "temperature", "vs": "vector", "ms": "matrix"}[method]
    with pytest.warns(UserWarning, match=r"post-hoc " + family + r" scaling.*task\(s\) sep, digits have no errors"):
        calibrated = calibrate(method, val, test)
    assert np.allclose(calibrated.logits[0], test.logits[0]) and np.allclose(calibrated.logits[2], test.logits[2])
    alone = calibrate(method, Predictions(["noisy"], [val.logits[1]], [val.labels[1]]),
                      Predictions(["noisy"], [test.logits[1]], [test.labels[1]]))
    assert np.allclose(calibrated.logits[1], alone.logits[0], atol=1e-5)  # the others: as if fitted alone
    assert not np.allclose(calibrated.logits[1], test.logits[1])


def test_without_errors_the_validation_nll_keeps_falling_as_t_goes_to_0():
    """The failure being guarded against: no minimum in T, so an exact fit heads for T = 0."""
    val, _ = _data(0)
    z, y = torch.as_tensor(val.logits[0]), torch.as_tensor(val.labels[0], dtype=torch.float64)
    nll = [float(torch.nn.functional.binary_cross_entropy_with_logits(z / t, y)) for t in (1, 0.1, 0.01, 0.001)]
    assert nll == sorted(nll, reverse=True) and nll[-1] < 1e-30


def test_vector_scaling_sees_separation_by_a_threshold_that_temperature_scaling_does_not():
    """Errors by sign but none by a shifted threshold (z > 1): TS has an optimum, VS (Platt) has none."""
    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, 200)
    z = np.where(y == 1, rng.uniform(1.5, 4, 200), rng.uniform(-3, 0.5, 200))  # negatives up to 0.5: errors
    val = Predictions(["t"], [z], [y])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        calibrate("ts", val, val)
    with pytest.warns(UserWarning, match="task\\(s\\) t have no errors"):
        assert np.allclose(calibrate("vs", val, val).logits[0], z)


def test_fit_temperatures_reports_nan_where_there_is_no_optimum():
    """LiST's L update and the drift script read this: NaN leaves L unchanged and is not a temperature."""
    val, _ = _data(2)
    layout = LogitLayout((2, 2, 4))
    with pytest.warns(UserWarning, match="sep, digits"):
        temperatures = fit_temperatures(layout, val.logits, val.labels, val.task_names)
    assert np.isnan(temperatures[0]) and np.isnan(temperatures[2]) and 2 < temperatures[1].item() < 5


def test_stability_scaling_uses_the_same_check():
    val, _ = _data(3)
    layout = LogitLayout((2, 2, 4))
    calibrator = StabilityTemperature(layout).double()
    calibrator.instability = torch.rand(len(val), 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    logits = torch.as_tensor(layout.join(val.logits), dtype=torch.float64)
    labels = torch.as_tensor(np.stack(val.labels, 1))
    with pytest.warns(UserWarning, match="sep, digits"):
        assert fit_calibrator(calibrator, logits, labels, layout, task_names=val.task_names) == [0, 2]
    assert float(calibrator.log_base[0]) == 0 and float(calibrator.slope[2]) == 0 and float(calibrator.log_base[1]) != 0


def test_separated_tasks_counts_ties_as_errors():
    layout = LogitLayout((2, 3))
    logits = torch.tensor([[0.0, 2.0, 2.0, 0.0], [1.0, 0.0, 3.0, 0.0]])
    labels = torch.tensor([[0, 0], [1, 1]])
    assert separated_tasks(logits, labels, layout) == []
    assert separated_tasks(logits[1:], labels[1:], layout) == [0, 1]
