"""Subgroup metrics and multicalibration: known answers, self-exclusion, empty and one-class groups, bad names."""

from __future__ import annotations

import numpy as np
import pytest

from mtl_cog.errors import ConfigError
from mtl_cog.evaluation.groups import CELL_METRICS, ECE, NO_SAMPLES, ONE_CLASS, cells_frame, group_metrics
from mtl_cog.evaluation.metrics import compute_metrics


def _data(n=400, seed=0):
    rng = np.random.default_rng(seed)
    names = ["Male", "Young", "Smiling", "Hat"]
    logits = [rng.normal(0, 2, n) for _ in names]
    labels = [(rng.random(n) < 1 / (1 + np.exp(-z))).astype(np.int64) for z in logits]
    return names, logits, labels


def test_one_group_covering_everyone_gives_the_overall_metrics():
    names, logits, labels = _data()
    labels[0] = np.zeros_like(labels[0])  # "Male" = 0 for everyone: its group 0 is the whole split
    report = group_metrics(names, logits, labels, ["Male"])
    overall = compute_metrics(names, logits, labels, [15])["tasks"]
    everyone = [c for c in report["cells"] if c["value"] == 0]
    assert [c["task"] for c in everyone] == ["Young", "Smiling", "Hat"]  # Male is not scored against itself
    for cell in everyone:
        for metric in CELL_METRICS:
            assert cell[metric] == pytest.approx(overall[cell["task"]][metric], abs=1e-12), metric
    empty = [c for c in report["cells"] if c["value"] == 1]
    assert all(c["status"] == NO_SAMPLES and c["n"] == 0 and "accuracy" not in c for c in empty)
    # one non-empty group: worst = that group, no gap (an empty cell, not 0)
    assert report["tasks"]["Hat"][f"worst_group_{ECE}"] == pytest.approx(overall["Hat"][ECE], abs=1e-12)
    assert f"group_gap_{ECE}" not in report["tasks"]["Hat"]
    assert "Male" not in report["tasks"]  # only a group, never scored
    frame = cells_frame(report)
    assert frame.loc[frame.status == NO_SAMPLES, "accuracy"].isna().all()


def test_cells_equal_metrics_of_the_subset_and_summaries_are_worst_and_gap():
    names, logits, labels = _data(seed=1)
    report = group_metrics(names, logits, labels, ["Male", "Young"])
    cells = report["cells"]
    assert len(cells) == 2 * 2 * 3
    for group in ("Male", "Young"):
        g = names.index(group)
        for value in (0, 1):
            mask = labels[g] == value
            others = [t for t in range(4) if t != g]
            sub = compute_metrics([names[t] for t in others], [logits[t][mask] for t in others],
                                  [labels[t][mask] for t in others], [15])["tasks"]
            for c in cells:
                if c["group"] == group and c["value"] == value:
                    assert c["n"] == mask.sum()
                    for metric in CELL_METRICS:  # smECE too: the group's own, at its own bandwidth
                        assert c[metric] == pytest.approx(sub[c["task"]][metric], abs=1e-12)
    hat = [c for c in cells if c["task"] == "Hat"]
    summary = report["tasks"]["Hat"]
    assert summary[f"worst_group_{ECE}"] == max(c[ECE] for c in hat)
    assert summary["worst_group_accuracy"] == min(c["accuracy"] for c in hat)
    assert summary["multicalibration_smece"] == max(c["smece"] for c in hat)
    gap = max(abs(hat[0][ECE] - hat[1][ECE]), abs(hat[2][ECE] - hat[3][ECE]))
    assert summary[f"group_gap_{ECE}"] == pytest.approx(gap, abs=1e-15)
    # the Male and Young tasks are scored inside each other's groups only
    assert {c["group"] for c in cells if c["task"] == "Male"} == {"Young"}
    assert report["mean"]["multicalibration_smece"] == pytest.approx(
        np.mean([report["tasks"][t]["multicalibration_smece"] for t in names]))


def test_one_class_inside_a_group_is_marked():
    names, logits, labels = _data(seed=2)
    labels[3] = labels[0].copy()  # "Hat" = "Male": inside each Male group, Hat has one class
    report = group_metrics(names, logits, labels, ["Male"])
    hat = [c for c in report["cells"] if c["task"] == "Hat"]
    assert [c["status"] for c in hat] == [ONE_CLASS, ONE_CLASS]
    assert all(np.isfinite(c[ECE]) for c in hat)


def test_multiclass_task_inside_groups():
    names, logits, labels = _data(seed=3)
    rng = np.random.default_rng(0)
    logits[2] = rng.normal(size=(400, 3))
    labels[2] = rng.integers(0, 3, 400)
    report = group_metrics(names, logits, labels, ["Male"])
    mask = labels[0] == 1
    sub = compute_metrics(["Smiling"], [logits[2][mask]], [labels[2][mask]], [15])["tasks"]["Smiling"]
    cell = next(c for c in report["cells"] if c["task"] == "Smiling" and c["value"] == 1)
    for metric in ("accuracy", "nll", "brier", ECE):
        assert cell[metric] == pytest.approx(sub[metric], abs=1e-12)


def test_unknown_or_repeated_group_is_refused_with_a_suggestion():
    names, logits, labels = _data()
    with pytest.raises(ConfigError, match="Did you mean Male"):
        group_metrics(names, logits, labels, ["Mal"])
    with pytest.raises(ConfigError, match="twice"):
        group_metrics(names, logits, labels, ["Male", "Male"])


def test_multicalibration_smece_is_relplots_smece_of_each_group():
    """Each group's smECE at its own kernel width (relplot.smECE of the group's rows), not the split's:
    on data where a small group is calibrated differently, the two widths differ and so do the values."""
    import relplot  # a dependency of the project (pyproject.toml): its absence is a failure, not a skip
    rng = np.random.default_rng(7)
    n = 3000
    small = rng.random(n) < 0.08  # an 8 % group, overconfident
    z = rng.normal(0, 2, n)
    truth = np.where(small, z / 3, z)
    names = ["Small", "Task"]
    logits = [rng.normal(size=n), z]
    labels = [small.astype(np.int64), (rng.random(n) < 1 / (1 + np.exp(-truth))).astype(np.int64)]
    report = group_metrics(names, logits, labels, ["Small"])
    p = np.clip(1 / (1 + np.exp(-z)), 1e-7, 1 - 1e-7)
    confidence, outcome = p, labels[1].astype(float)  # a binary task is calibrated on (p, y)
    expected = {}
    for value in (0, 1):
        mask = small == value
        expected[value] = relplot.smECE(confidence[mask], outcome[mask])
        cell = next(c for c in report["cells"] if c["task"] == "Task" and c["value"] == value)
        assert cell["smece"] == pytest.approx(expected[value], rel=0, abs=1e-9)
    assert report["tasks"]["Task"]["multicalibration_smece"] == pytest.approx(max(expected.values()), abs=1e-9)
    # the whole split's width inside the small group gives another number: the old definition differs here
    width = relplot.smECE(confidence, outcome, return_width=True)[1]
    own = relplot.smECE(confidence[small], outcome[small], return_width=True)[1]
    assert abs(width - own) > 1e-3


def test_subgroups_plug_in_as_an_evaluation_add_on():
    """eval.groups reaches a split's metrics through assess.ADD_ONS, like any add-on, not inside score."""
    from mtl_cog.evaluation.assess import ADD_ONS, AssessSettings, assess, subgroup_metrics
    from mtl_cog.evaluation.predictions import Predictions

    names, logits, labels = _data(seed=5)
    predictions = Predictions(task_names=names, logits=logits, labels=labels)
    assert subgroup_metrics in ADD_ONS
    metrics = assess(predictions, AssessSettings(bins=[15], pairs=0, groups=("Male",))).metrics
    assert metrics["groups"] == group_metrics(names, logits, labels, ["Male"])
    hat = metrics["groups"]["tasks"]["Hat"]
    assert metrics["tasks"]["Hat"]["multicalibration_smece"] == hat["multicalibration_smece"]
    assert "groups" not in assess(predictions, AssessSettings(bins=[15], pairs=0)).metrics
