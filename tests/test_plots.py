"""Figures of the report (mtl_cog/reporting/plots/): right content, readable at 40 attributes, real PNGs."""

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from scipy.special import logit

from mtl_cog.evaluation.predictions import Predictions
from mtl_cog.reporting import plots

TASKS = [f"Attribute_name_{t:02d}" for t in range(40)]  # CelebA-length names


def test_pareto_front_known_answer():
    accuracy = np.array([0.90, 0.92, 0.92, 0.85, 0.91])
    nll = np.array([0.30, 0.35, 0.33, 0.20, 0.40])
    # 0.92/0.33 dominates 0.92/0.35; 0.90/0.30 and 0.85/0.20 trade off; 0.91/0.40 is dominated
    assert plots.pareto_front(accuracy, nll).tolist() == [True, False, True, True, False]
    assert plots.pareto_front(np.array([0.5, 0.5]), np.array([0.1, 0.1])).all()  # equal points both stay


def _no_overlap(labels) -> bool:
    boxes = [label.get_window_extent() for label in labels]
    return all(not a.overlaps(b) for a, b in zip(boxes, boxes[1:]))


def test_per_task_ece_readable_at_40_attributes(tmp_path):
    rng = np.random.default_rng(0)
    rows = [{"dataset": "celeba", "method": m, "task": t, "ece@15": rng.uniform(0, 0.1), "ece@15_std": 0.01}
            for m in ("baseline", "cog_fc", "cog_ts", "baseline+ts", "ls", "focal") for t in TASKS]
    figure = plots.per_task_ece_figure(pd.DataFrame(rows), "celeba")
    figure.canvas.draw()
    bottom = figure.axes[-1]
    labels = bottom.get_xticklabels()
    assert [label.get_text() for label in labels] == TASKS
    assert _no_overlap(labels), "task names overlap"
    assert len(figure.axes) == 6
    path = plots.save_figure(figure, tmp_path / "ece.png")
    with Image.open(path) as image:
        assert image.size[0] > 1000


def test_multitask_reliability_grid_has_a_panel_per_task_and_the_pool(tmp_path):
    rng = np.random.default_rng(1)
    p_true = [rng.uniform(0.05, 0.95, 200) for _ in TASKS]
    predictions = Predictions(TASKS, [logit(p) for p in p_true], [(rng.random(200) < p).astype(int) for p in p_true],
                              p_true)
    figure = plots.reliability_figure([predictions, predictions], "celeba / cog_fc")
    titled = [ax for ax in figure.axes if ax.get_title()]
    assert len(titled) == 41 and titled[0].get_title().startswith("ALL TASKS POOLED")
    assert "2 seeds pooled" in figure._suptitle.get_text()
    assert figure._supxlabel.get_text() == "predicted P(y=1)"
    path = plots.save_figure(figure, tmp_path / "rel.png")
    with Image.open(path) as image:
        pixels = np.asarray(image.convert("L"))
    assert pixels.std() > 10 and image.size[0] > 1000


def test_reliability_panel_ece_matches_the_metric():
    from mtl_cog.evaluation.metrics import task_metrics

    rng = np.random.default_rng(2)
    z = rng.normal(0, 2, 1000)
    y = (rng.random(1000) < 1 / (1 + np.exp(-z / 2))).astype(int)
    import matplotlib.pyplot as plt

    figure, ax = plt.subplots()
    ece = plots.reliability_panel(ax, 1 / (1 + np.exp(-z)), y.astype(float), 15)
    plt.close(figure)
    assert ece == pytest.approx(task_metrics(z, y, [15])["ece@15"], abs=1e-9)


def _binary_predictions(tasks: list[str], n: int = 2000, true_probs: bool = True) -> Predictions:
    rng = np.random.default_rng(3)
    p = [rng.uniform(0.05, 0.95, n) for _ in tasks]
    labels = [(rng.random(n) < q).astype(np.int64) for q in p]
    return Predictions(list(tasks), [logit(np.clip(q * 1.1, 0.01, 0.99)) for q in p], labels,
                       p if true_probs else None)


def test_smoothed_reliability_and_count_calibration_figures(tmp_path):
    predictions = _binary_predictions(TASKS)
    figure = plots.smooth_reliability_figure([predictions, predictions], "run")
    assert len([ax for ax in figure.axes if ax.axison]) == 41  # every task + pooled
    assert figure.axes[0].get_title().startswith("ALL TASKS POOLED\nsmECE ")
    with Image.open(plots.save_figure(figure, tmp_path / "smooth.png")) as image:
        assert min(image.size) > 600
    counts = plots.count_calibration_figure([predictions], "run")
    labels = [line.get_label() for line in counts.axes[0].get_lines()]
    assert any(label.startswith("mean actual count (count ECE") for label in labels)
    assert any("noise-free" in label for label in labels)  # p* known: the true expected count is drawn
    plots.save_figure(counts, tmp_path / "counts.png")
    single = plots.smooth_reliability_figure([_binary_predictions(["only"], true_probs=False)], "run")
    assert len(single.axes) == 1
    assert plots.count_calibration_figure([_binary_predictions(["only"])], "run") is None  # nothing to count
