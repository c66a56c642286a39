"""Every group's uniform-bin sums at once: no sort and no copies.

The subgroup metrics (mtl_cog.evaluation.groups) need, inside every group (one value of a group
task) and for every scored task, the sums of ``ece@B``'s bins. They do not need the samples in
order: a bin's (count, Σ outcome, Σ confidence) is a sum over the samples whose confidence falls
in it. So each task's bin of every sample is found once (``GroupBins``), and one ``np.bincount``
per statistic over (joint value of the group tasks, task, bin) gives the sums of every group and
task together (``Combined``: a group is the sum over the joint values inside it) — a pass over
the (T, N) events per statistic, instead of a sort and a gather of each group's rows.

The bins are those of the overall metrics (``uniform_bin_index``, mtl_cog.evaluation.binning);
only the order of summation differs (``tests/test_group_bins.py`` checks every group's values
against its rows scored on their own, to 1e-12).

smECE inside a group has the group's own kernel width σ* (``relplot.smECE`` of the group's
rows), found by relplot's bisection. Each step of it needs the group's grid deposits at the
step's σ, and they are sums over grid cells too (relplot's ``smooth_round_to_grid``: weight
(1 − frac) w on grid point j = ⌊f (G − 1)⌋, clipped to G − 2, and frac·w on j + 1, for w the
residual f − y and w = 1). So ``GroupDeposits`` counts them like the bins: per grid size, one
bincount per statistic over (joint value, task, cell) gives every group's deposits, and every
(group, task) row bisects its own σ* in one lock step (``group_smooth_ece``). Grids depend on σ
(relplot's max(2000, 20 / σ) // 2 + 1 points: 1,001 for every σ >= 0.01, about 10 / σ below), so most
steps reuse one count; a finer grid is counted for the tasks whose rows need it, and only those are
kept. The smECE bincounts have T x 1,001 cells per joint value (ECE@15's have T x 15), so
mtl_cog.evaluation.groups counts them over runs of group tasks of their own (``batches`` with that
size): a bincount's output stays within the events it counts.
"""

from __future__ import annotations

import numpy as np

from mtl_cog.evaluation.binning import uniform_bin_index
from mtl_cog.evaluation.smooth_ece import DepositSpectra, smooth_ece_of_deposits


class GroupBins:
    """Per-sample calibration events of T tasks, (T, N) confidence (clamped, finite) and 0/1 outcome:
    the bin of every sample, ready for any group task.

    ``known`` (T, N), when given, marks the events that count: a sample unlabelled in a task
    (partly labelled data) is in none of that task's sums.
    """

    def __init__(self, confidence: np.ndarray, outcome: np.ndarray, n_bins: int,
                 known: np.ndarray | None = None) -> None:
        tasks = len(confidence)
        self.unknown = None if known is None or known.all() else np.flatnonzero(~np.asarray(known).ravel())
        self.n_bins = n_bins
        self.outcome, self.confidence = outcome, confidence
        # uniform bins: task t's bin b is cell t * B + b
        self.bin_cell = uniform_bin_index(confidence, n_bins)
        self.bin_cell += (np.arange(tasks) * n_bins)[:, None]

    def _index(self, cells: np.ndarray, size: int) -> np.ndarray:
        """(T, N) cells -> flat bincount indices; events that do not count go to the spare last one, ``size``."""
        index = cells.ravel()
        if self.unknown is not None:
            index[self.unknown] = size
        return index

    def cells_per_group(self) -> int:
        """How many sums one group's bins take (the size of a bincount per group)."""
        return len(self.bin_cell) * self.n_bins

    def scores(self, groups: Combined) -> np.ndarray:
        """Every group's uniform-bin sums (R, T, B, 3) (count, Σ outcome, Σ confidence, as ``binning.bin_sums``
        of the group's rows); R = the rows of ``groups.membership``."""
        tasks = len(self.bin_cell)
        cells = tasks * self.n_bins
        size = groups.size * cells
        index = self._index(self.bin_cell + groups.index * cells, size)
        sums = [np.bincount(index, minlength=size + 1)[:size].astype(np.float64),
                *(np.bincount(index, w.ravel(), size + 1)[:size] for w in (self.outcome, self.confidence))]
        bins = groups.membership @ np.stack(sums, axis=1).reshape(groups.size, -1)
        return bins.reshape(len(groups.membership), tasks, self.n_bins, 3)


class GroupDeposits(DepositSpectra):
    """smooth ECE's grid deposits of every (group, task) row, row r * T + t, counted without a sort.

    ``confidence``, ``outcome`` (T, N) are the calibration events (as ``GroupBins``'), ``known``
    (T, N) or None the events that count. A grid's deposits are counted for every group of the
    tasks asked for, and kept (another group's row of the same task asks for the same grid).
    """

    def __init__(self, confidence: np.ndarray, outcome: np.ndarray, groups: Combined,
                 known: np.ndarray | None = None) -> None:
        self.tasks = len(confidence)
        super().__init__(len(groups.membership) * self.tasks)
        self.confidence, self.residual, self.groups = confidence, confidence - outcome, groups
        self.unknown = None if known is None or known.all() else ~np.asarray(known)
        self._counted: dict[int, dict[int, np.ndarray]] = {}  # grid -> task -> (R, 2, G) deposits of its groups

    def deposits(self, rows: np.ndarray, grid: int) -> np.ndarray:
        group, task = np.divmod(rows, self.tasks)
        counted = self._counted.setdefault(grid, {})
        todo = np.array(sorted(set(task.tolist()) - set(counted)), dtype=np.int64)
        if len(todo):
            for t, deposits in zip(todo.tolist(), np.moveaxis(self._count(todo, grid), 1, 0)):
                counted[t] = deposits
        return np.stack([counted[t][g] for g, t in zip(group.tolist(), task.tolist())])

    def _count(self, tasks: np.ndarray, grid: int) -> np.ndarray:
        """Deposits (R, len(tasks), 2, G) of the residual and of ones, for every group of ``tasks``."""
        every = len(tasks) == self.tasks  # tasks are ascending and distinct: every task, no copies
        frac = (self.confidence if every else self.confidence[tasks]) * (grid - 1)  # relplot's f * (G − 1)
        cell = frac.astype(np.int64)
        np.clip(cell, 0, grid - 2, out=cell)
        frac -= cell
        residual = self.residual if every else self.residual[tasks]
        cells = len(tasks) * grid
        size = self.groups.size * cells
        index = cell  # in place: at 40 x 20,000 events every fresh array costs as much as the arithmetic
        index += (np.arange(len(tasks)) * grid)[:, None]
        index += self.groups.index * cells
        if self.unknown is not None:
            index[self.unknown[tasks]] = size  # an event that does not count goes to the spare last sum
        index = index.ravel()
        count = np.bincount(index, minlength=size + 1)[:size]
        sum_r, sum_fr, sum_f = (np.bincount(index, w.ravel(), size + 1)[:size]
                                for w in (residual, residual * frac, frac))
        shape = (self.groups.size, len(tasks), grid)
        out = np.empty((self.groups.size, len(tasks), 2, grid))
        for k, (lo, hi) in enumerate(((sum_r - sum_fr, sum_fr), (count - sum_f, sum_f))):
            # cell j's weight on grid point j, and on j + 1 (the last cell, G − 1, is always empty: j <= G − 2)
            out[:, :, k] = lo.reshape(shape)
            out[:, :, k, 1:] += hi.reshape(shape)[..., :-1]
        grouped = self.groups.membership @ out.reshape(self.groups.size, -1)
        return grouped.reshape(len(self.groups.membership), len(tasks), 2, grid)


def group_smooth_ece(confidence: np.ndarray, outcome: np.ndarray, groups: Combined,
                     known: np.ndarray | None = None) -> np.ndarray:
    """smECE of every task inside every group of ``groups`` (R, T), each at its own σ* (``relplot.smECE``
    of the group's rows labelled in the task); NaN where a task has no labelled member of the group."""
    data = GroupDeposits(confidence, outcome, groups, known)
    values = smooth_ece_of_deposits(data)[0].reshape(len(groups.membership), data.tasks)
    members = groups.counts()[:, None] if data.unknown is None else groups.sums_of(np.asarray(known, np.float64)).T
    values[np.broadcast_to(members, values.shape) == 0] = np.nan
    return values


class Combined:
    """The joint value of several group tasks, so that one pass counts the groups of all of them.

    Sample i's combination is Σ_g v_g(i) Π_{h<g} S_h, with S_g = V_g values, plus one spare
    value v_g = V_g for the labels outside 0 .. V_g − 1 (missing: in no group of g) where there are
    any. ``membership`` (R, C) is 1 where the combination c lies in group (g, v), one row per group
    in order (g, then v); sums over groups are then ``membership @`` sums over combinations.
    """

    def __init__(self, labels: list[np.ndarray], values: list[int]) -> None:
        self.index = np.zeros(len(labels[0]), dtype=np.int64)
        radices, digits = [], []
        radix = 1
        for y, v in zip(labels, values):
            y = np.asarray(y)
            inside = (y >= 0) & (y < v)
            size = v + int(not inside.all())
            self.index += (y if size == v else np.where(inside, y, v)).astype(np.int64) * radix
            radices.append((radix, size))
            radix *= size
        self.size = radix
        combination = np.arange(radix)
        for (radix, size), v in zip(radices, values):
            digits.append(combination // radix % size == np.arange(v)[:, None])
        self.membership = np.concatenate(digits).astype(np.float64)

    def counts(self) -> np.ndarray:
        """Samples in each group (R,)."""
        return self.membership @ np.bincount(self.index, minlength=self.size)

    def sums_of(self, per_sample: np.ndarray) -> np.ndarray:
        """Sums of each row of per_sample (K, N) inside each group -> (K, R): one matrix product."""
        one_hot = (self.index[:, None] == np.arange(self.size)).astype(np.float64)
        return (per_sample @ one_hot) @ self.membership.T


def batches(values: list[int], events: int, cells: int) -> list[list[int]]:
    """Group tasks (by their numbers of values) in runs counted together by ``Combined``.

    A run grows while its combinations' sums (Π (V + 1) x ``cells``) stay within the ``events``
    counted, so that a bincount's output never outgrows its input: two binary group tasks over 40
    tasks x 20,000 samples are one run (half the passes of one each); ten-valued ones go alone.
    """
    runs: list[list[int]] = []
    product = 0
    for i, v in enumerate(values):
        if runs and product * (v + 1) * cells <= events:
            runs[-1].append(i)
            product *= v + 1
        else:
            runs.append([i])
            product = v + 1
    return runs
