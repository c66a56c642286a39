"""The bincount path of the subgroup metrics equals each group's rows scored on their own, to 1e-12.

``group_metrics`` never sorts nor copies a group's rows (mtl_cog.evaluation.group_bins); here every
cell is recomputed the straightforward way — the group's rows cut out and scored by
``compute_metrics`` (smECE included: each group at its own bandwidth) — on random data with
empty and one-class groups, a three-valued group task with an empty value, labels missing from a
group task, a K-class scored task and a task with a non-finite logit.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import expit

from mtl_cog.constants import MISSING_LABEL
from mtl_cog.evaluation.binning import CLAMP
from mtl_cog.evaluation.group_bins import Combined, GroupBins, batches
from mtl_cog.evaluation.groups import CELL_METRICS, NO_SAMPLES, OK, ONE_CLASS, group_metrics
from mtl_cog.evaluation.metrics import compute_metrics
from mtl_cog.evaluation.smooth_ece import smooth_ece


def _data(n=900, seed=0):
    rng = np.random.default_rng(seed)
    names = ["Male", "Young", "Region", "Smiling", "Hat", "Digit", "Rare"]
    logits = [rng.normal(0, 2, n) for _ in names]
    labels = [(rng.random(n) < expit(z)).astype(np.int64) for z in logits]
    logits[2] = rng.normal(size=(n, 3))  # a 3-valued group task whose value 2 never occurs
    labels[2] = rng.integers(0, 2, n)
    logits[5] = rng.normal(size=(n, 4))  # a K-class scored task
    labels[5] = rng.integers(0, 4, n)
    labels[6] = np.zeros(n, np.int64)
    labels[6][:3] = 1  # rare: one class only in most groups
    labels[1][rng.random(n) < 0.05] = MISSING_LABEL  # Young unknown for some: in no group of Young, and
    labels[5][rng.random(n) < 0.05] = MISSING_LABEL  # left out of Young's and Digit's cells
    return names, logits, labels


def _expected(names, logits, labels, group, value):
    """Every other task's cell, from the group's rows alone."""
    g = names.index(group)
    inside = np.asarray(labels[g]) == value
    out = {}
    for t, name in enumerate(names):
        if t == g:
            continue
        rows = inside & (labels[t] != MISSING_LABEL)  # partly labelled: the task's labelled rows of the group
        out[name] = compute_metrics([name], [logits[t][rows]], [labels[t][rows]], [15], selective=False)["tasks"][name]
    return out


def test_every_cell_equals_the_group_scored_on_its_own():
    names, logits, labels = _data()
    groups = ["Male", "Young", "Region"]
    report = group_metrics(names, logits, labels, groups)
    checked = set()
    for group in groups:
        values = 3 if group == "Region" else 2
        for value in range(values):
            cells = [c for c in report["cells"] if c["group"] == group and c["value"] == value]
            inside = np.asarray(labels[names.index(group)]) == value
            assert [c["task"] for c in cells] == [n for n in names if n != group]
            assert [c["n"] for c in cells] == [(inside & (labels[names.index(c["task"])] != MISSING_LABEL)).sum()
                                               for c in cells]
            if not inside.any():
                assert all(c["status"] == NO_SAMPLES and "accuracy" not in c for c in cells)
                checked.add(NO_SAMPLES)
                continue
            expected = _expected(names, logits, labels, group, value)
            for cell in cells:
                for metric in CELL_METRICS:
                    assert cell[metric] == pytest.approx(expected[cell["task"]][metric], rel=0, abs=1e-12), \
                        (group, value, cell["task"], metric)
                checked.add(cell["status"])
    assert checked == {NO_SAMPLES, ONE_CLASS, OK}


def test_a_non_finite_task_gets_nan_cells_and_leaves_the_others_alone():
    names, logits, labels = _data(seed=1)
    clean = group_metrics(names, logits, labels, ["Male"])
    logits[3] = logits[3].copy()
    logits[3][7] = np.nan
    report = group_metrics(names, logits, labels, ["Male"])
    for before, after in zip(clean["cells"], report["cells"]):
        if after["task"] == "Smiling":
            assert all(np.isnan(after[m]) for m in CELL_METRICS)
        else:  # smECE's batched FFTs may round the last bit differently with another row in the batch
            assert after == {k: pytest.approx(v, rel=0, abs=1e-13) if isinstance(v, float) else v
                             for k, v in before.items()}


def test_group_tasks_counted_together_or_one_by_one_give_the_same_cells():
    names, logits, labels = _data(seed=2)
    together = group_metrics(names, logits, labels, ["Male", "Young", "Region"])["cells"]
    alone = [c for g in ("Male", "Young", "Region") for c in group_metrics(names, logits, labels, [g])["cells"]]
    assert len(together) == len(alone)
    for a, b in zip(together, alone):
        assert a.keys() == b.keys()
        for key, value in a.items():
            assert value == (pytest.approx(b[key], rel=0, abs=1e-13) if isinstance(value, float) else b[key])


def test_combined_membership_and_runs():
    young = np.array([0, 1, MISSING_LABEL, 1])
    combined = Combined([np.array([0, 1, 1, 0]), young], [2, 2])
    assert combined.size == 2 * 3  # Male has no missing label (no spare value), Young has
    np.testing.assert_array_equal(combined.counts(), [2, 2, 1, 2])  # Male=0, Male=1, Young=0, Young=1
    np.testing.assert_array_equal(combined.sums_of(np.arange(4.0)[None]), [[3, 3, 0, 4]])
    assert batches([2, 2], events=80_000, cells=1_000) == [[0, 1]]
    assert batches([2, 2, 9], events=80_000, cells=1_000) == [[0, 1], [2]]  # 9 x 10 x 1,000 > 80,000
    assert batches([2], events=10, cells=1_000) == [[0]]  # a group task alone always


def test_bin_sums_are_those_of_each_groups_rows():
    from mtl_cog.evaluation.binning import bin_sums, uniform_bin_index

    rng = np.random.default_rng(5)
    confidence = np.clip(rng.random((3, 200)), CLAMP, 1 - CLAMP)
    confidence[:, :5] = [0.0 + CLAMP, 1 / 15, 0.2, 1 - CLAMP, 14 / 15]  # bin edges and the clamped ends
    outcome = (rng.random((3, 200)) < confidence).astype(float)
    group = rng.integers(0, 3, 200)
    sums = GroupBins(confidence, outcome, 15).scores(Combined([group], [3]))
    for value in range(3):
        mask = group == value
        expected = bin_sums(confidence[:, mask], outcome[:, mask], uniform_bin_index(confidence[:, mask], 15), 15)
        np.testing.assert_allclose(sums[value], expected, rtol=0, atol=1e-12)


def test_groups_whose_own_width_needs_a_finer_grid_match_their_rows_scored_alone():
    """Well calibrated large groups bisect below σ = 0.01, where relplot's grid grows with 1 / σ: those steps
    count a finer grid for the tasks that ask for it (not all of them), and every group's smECE still equals
    its rows scored on their own (sorted running sums: another summation order, hence 1e-10)."""
    from mtl_cog.evaluation.group_bins import GroupDeposits, group_smooth_ece
    from mtl_cog.evaluation.smooth_ece import smooth_ece_of_deposits

    rng = np.random.default_rng(3)
    n = 30000
    z = rng.normal(0, 2, (4, n))
    truth = z.copy()
    truth[3] /= 3  # overconfident: its groups stay on the coarse grid
    outcome = (rng.random((4, n)) < expit(truth)).astype(np.float64)
    confidence = np.clip(expit(z), CLAMP, 1 - CLAMP)
    group_labels = [rng.integers(0, 2, n), (rng.random(n) < 0.1).astype(np.int64)]  # halves; a 10 % group
    groups = Combined(group_labels, [2, 2])
    data = GroupDeposits(confidence, outcome, groups)
    values = smooth_ece_of_deposits(data)[0].reshape(4, 4)
    finer = {grid: len(tasks) for grid, tasks in data._counted.items() if grid > 1001}
    assert finer and min(finer.values()) < 4, finer  # finer grids, counted for the tasks that needed them
    np.testing.assert_array_equal(group_smooth_ece(confidence, outcome, groups), values)
    for r, (g, v) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        inside = group_labels[g] == v
        expected = smooth_ece(confidence[:, inside], outcome[:, inside])[0]
        np.testing.assert_allclose(values[r], expected, rtol=0, atol=1e-10)


def test_smooth_ece_counts_run_over_group_tasks_of_their_own_within_the_events(monkeypatch):
    """smECE's bincounts have T x COARSE_GRID cells per joint value: its runs of group tasks are sized for that,
    so no count outgrows the events it counts (six binary group tasks would be one run for ECE@15's bins)."""
    import mtl_cog.evaluation.groups as groups_module
    from mtl_cog.evaluation.smooth_ece import COARSE_GRID

    rng = np.random.default_rng(4)
    n, tasks = 3000, 10
    names = [f"t{i}" for i in range(tasks)]
    logits = [rng.normal(0, 2, n) for _ in names]
    labels = [(rng.random(n) < expit(z)).astype(np.int64) for z in logits]
    sizes = []
    original = groups_module.group_smooth_ece
    monkeypatch.setattr(groups_module, "group_smooth_ece",
                        lambda conf, out, combined, known: sizes.append(combined.size) or original(conf, out, combined,
                                                                                                   known))
    group_metrics(names, logits, labels, names[:6])
    assert len(sizes) > 1 and all(size * tasks * COARSE_GRID <= max(tasks * n, 3 * tasks * COARSE_GRID)
                                  for size in sizes)
