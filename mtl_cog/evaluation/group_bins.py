"""Every group's calibration sums at once: uniform-bin sums and smooth-ECE deposits, no sort and no copies.

The subgroup metrics (mtl_cog.evaluation.groups) need, inside every group (one value of a group
task) and for every scored task, the sums of ``ece@B``'s bins and the deposits of smooth ECE at
the task's bandwidth. Neither needs the samples in order: a bin's (count, Σ outcome, Σ
confidence) and a grid point's deposit are sums over the samples whose confidence falls in a
cell. So each task's cell of every sample is found once (``GroupBins``), and one ``np.bincount``
per statistic over (joint value of the group tasks, task, cell) gives the sums of every group
and task together (``Combined``: a group is the sum over the joint values inside it) — a pass
over the (T, N) events per statistic, instead of a sort and a gather of each group's rows.

The cells and weights are those of the overall metrics: ``uniform_bin_index``
(mtl_cog.evaluation.binning) for the bins, and relplot's ``smooth_round_to_grid`` for the
deposits, j = ⌊f (G − 1)⌋ clipped to G − 2, weight (1 − frac) w on grid point j and frac·w on
j + 1 (mtl_cog.evaluation.smooth_ece, whose FFT step turns the deposits into smECE); only the
order of summation differs (``tests/test_group_bins.py`` checks every group's values against
its rows scored on their own, to 1e-12).
"""

from __future__ import annotations

import numpy as np

from mtl_cog.evaluation.binning import uniform_bin_index
from mtl_cog.evaluation.smooth_ece import DepositSpectra, grid_sizes, smooth_ece_of_deposits


class GroupBins:
    """Per-sample calibration events of T tasks, (T, N) confidence (clamped, finite) and 0/1 outcome,
    with each task's smECE bandwidth: the cells of every sample, ready for any group task.

    ``known`` (T, N), when given, marks the events that count: a sample unlabelled in a task
    (partly labelled data) is in none of that task's sums.
    """

    def __init__(self, confidence: np.ndarray, outcome: np.ndarray, sigmas: np.ndarray, n_bins: int,
                 known: np.ndarray | None = None) -> None:
        tasks = len(confidence)
        self.unknown = None if known is None or known.all() else np.flatnonzero(~np.asarray(known).ravel())
        self.n_bins, self.sigmas = n_bins, np.asarray(sigmas, dtype=np.float64)
        self.outcome, self.confidence = outcome, confidence
        # uniform bins: task t's bin b is cell t * B + b
        self.bin_cell = uniform_bin_index(confidence, n_bins)
        self.bin_cell += (np.arange(tasks) * n_bins)[:, None]
        # smECE grids: task t's grid point j is cell offset[t] + j (grids differ with σ). In place where
        # possible: at 40 x 20,000 events every fresh array costs as much as the arithmetic.
        self.grids = grid_sizes(self.sigmas)
        self.offsets = np.concatenate([[0], np.cumsum(self.grids)[:-1]])
        frac = confidence * (self.grids - 1)[:, None]  # relplot's product f * (G − 1)
        cell = frac.astype(np.int64)
        np.clip(cell, 0, (self.grids - 2)[:, None], out=cell)
        frac -= cell
        residual = confidence - outcome
        cell += self.offsets[:, None]
        self.grid_cell = cell
        # per cell, Σ r, Σ frac·r and Σ frac (with the count) give the weights on j, Σ (1 − frac) w, and on j + 1
        self.deposit_weights = (residual, residual * frac, frac)

    def _index(self, cells: np.ndarray, size: int) -> np.ndarray:
        """(T, N) cells -> flat bincount indices; events that do not count go to the spare last one, ``size``."""
        index = cells.ravel()
        if self.unknown is not None:
            index[self.unknown] = size
        return index

    def cells_per_group(self) -> int:
        """How many sums one group's bins and grid points take (the size of a bincount per group)."""
        return len(self.bin_cell) * self.n_bins + int(self.grids.sum())

    def scores(self, groups: Combined) -> tuple[np.ndarray, np.ndarray]:
        """Every group's uniform-bin sums (R, T, B, 3) (count, Σ outcome, Σ confidence, as ``binning.bin_sums``
        of the group's rows) and smECE_σ at each task's σ (R, T); R = the rows of ``groups.membership``."""
        tasks = len(self.bin_cell)
        cells = tasks * self.n_bins
        size = groups.size * cells
        index = self._index(self.bin_cell + groups.index * cells, size)
        sums = [np.bincount(index, minlength=size + 1)[:size].astype(np.float64),
                *(np.bincount(index, w.ravel(), size + 1)[:size] for w in (self.outcome, self.confidence))]
        bins = groups.membership @ np.stack(sums, axis=1).reshape(groups.size, -1)
        total = int(self.grids.sum())
        size = groups.size * total
        index = self._index(self.grid_cell + groups.index * total, size)
        count = np.bincount(index, minlength=size + 1)[:size]
        residual, frac_residual, frac = (np.bincount(index, w.ravel(), size + 1)[:size] for w in self.deposit_weights)
        deposits = np.empty((groups.size, 2, total))
        for k, (lo, hi) in enumerate(((residual - frac_residual, frac_residual), (count - frac, frac))):
            # cell j's weight on grid point j, and on j + 1; task t's last cell is always empty (j <= G − 2),
            # so shifting every task's hi sums along the whole row by one lands each on its own j + 1
            deposits[:, k] = lo.reshape(groups.size, total)
            deposits[:, k, 1:] += hi.reshape(groups.size, total)[:, :-1]
        rows = len(groups.membership)
        grouped = (groups.membership @ deposits.reshape(groups.size, -1)).reshape(rows * 2, total)
        data = _GroupDeposits(grouped, self.offsets, rows * tasks)
        smece = smooth_ece_of_deposits(data, np.tile(self.sigmas, rows)).reshape(rows, tasks)
        return bins.reshape(rows, tasks, self.n_bins, 3), smece


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


class _GroupDeposits(DepositSpectra):
    """Deposits of the rows (group, task), row r = group * T + task, from the per-cell sums of ``GroupBins``."""

    def __init__(self, deposits: np.ndarray, offsets: np.ndarray, count: int) -> None:
        super().__init__(count)
        self.all, self.offsets = deposits, offsets  # (2 R, Σ G): group r's residual and ones at 2 r, 2 r + 1

    def deposits(self, rows: np.ndarray, grid: int) -> np.ndarray:
        group, task = np.divmod(rows, len(self.offsets))
        at = self.offsets[task][:, None] + np.arange(grid)  # the row's grid points (all rows here share G)
        return self.all[(2 * group[:, None] + np.arange(2))[:, :, None], at[:, None, :]]
