"""Smooth ECE (Błasiok & Nakkiran, 2023), ``relplot.smECE``'s algorithm run on many rows (tasks) at once.

smECE_σ(f, y) = ∫ |r̂_σ(t)| δ̂_σ(t) dt / ∫ δ̂_σ(t) dt, where r̂_σ is the Nadaraya–Watson kernel
regression of the residual f − y on the prediction f and δ̂_σ the kernel density of f, both with a
Gaussian kernel of width σ reflected at 0 and 1; smECE is smECE_σ* at the bandwidth σ* where
σ* = smECE_σ* (found by bisection). It is a consistent calibration measure that needs no bins.

``relplot`` (Apple's reference implementation, the package made for it) computes one task in
about 10 ms, which for 40 tasks exceeds the whole budget of the other metrics (ECE at five bin
counts, NLL, Brier). This module runs *the same* algorithm — the same grid sizes, the same
linear deposit of every sample onto the grid, the same reflected kernel, the same
interpolation onto the same evaluation mesh and the same 11-step bandwidth bisection with
``eps=0.001`` — on every row together: the deposits are computed once per grid size and
reused by every bisection step, the convolutions of all rows are one batched FFT instead
of one direct ``np.convolve`` per row and step, and the smoothed density, which enters only
through its sum over the mesh, is summed as one inner product in the frequency domain. The only
difference is floating-point rounding (~1e-15); ``tests/test_smooth_ece.py`` checks equality with ``relplot.smECE``
to 1e-6 on calibrated, over- and underconfident, saturated, constant and tiny inputs.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod

import numpy as np
from scipy import fft

from mtl_cog.evaluation.binning import SortedRows, running_sum

# relplot's defaults (relplot.metrics.smECE, relplot.config.smECE_mesh_pts, BaseKernelMixin.smooth)
EPS = 0.001  # smallest bandwidth the bisection reports
REFINE = 10  # bisection steps after the first check at σ = 1
MESH_POINTS = 200  # minimum number of evaluation points of the integral
DENSITY_EPS = 1e-4  # added to the kernel density before dividing by it


def grid_sizes(sigmas: np.ndarray) -> np.ndarray:
    """relplot's ``GaussianKernel.apply``: grid points of the deposit and the convolution, per σ.

    ``np.rint`` rounds halves to even, as Python's ``round`` in relplot does.
    """
    return np.maximum(2000, np.rint(20 / sigmas)).astype(np.int64) // 2 + 1


COARSE_GRID = 2000 // 2 + 1  # grid_sizes of every σ >= 0.01: the grid most bisection steps use


def _mesh_sizes(sigmas: np.ndarray) -> np.ndarray:
    """relplot's ``smooth_ece``: points of the evaluation mesh t on [0, 1], per σ."""
    return np.maximum(np.rint(10 / sigmas), MESH_POINTS).astype(np.int64)


@functools.lru_cache(maxsize=64)
def _interpolation(mesh: int, grid: int) -> tuple[np.ndarray, np.ndarray]:
    """``relplot.kernels.interpolate``'s indices and weights for t = linspace(0, 1, mesh) on a grid of G points."""
    t = np.linspace(0, 1, mesh)
    bucket_size = 1 / (grid - 1)
    inds = (t * (grid - 1)).astype(int).clip(0, grid - 2)
    return inds, (t - inds * bucket_size) / bucket_size


def _kernels(sigmas: np.ndarray, grid: int) -> np.ndarray:
    """``GaussianKernel.kernel_ev`` for each bandwidth: (R,) -> (R, grid)."""
    t = np.linspace(0, 1, grid)
    var = (sigmas**2)[:, None]
    return np.exp(-(t - 0.5) * (t - 0.5) / (2 * var)) / (np.sqrt(2 * np.pi) * sigmas[:, None])


def _reflect(values: np.ndarray) -> np.ndarray:
    """``ReflectedGaussianKernel.convolve``'s extension [flip(v)[:-1], v, flip(v)[1:]] of each row."""
    flipped = values[..., ::-1]
    return np.concatenate([flipped[..., :-1], values, flipped[..., 1:]], axis=-1)


def _interpolate(mesh: int, y: np.ndarray) -> np.ndarray:
    """``relplot.kernels.interpolate`` of each row of y (R, G) at t = linspace(0, 1, mesh), as relplot computes it."""
    inds, residual = _interpolation(mesh, y.shape[1])
    return y[:, inds] * (1 - residual) + y[:, inds + 1] * residual


class DepositSpectra(ABC):
    """The rFFT of each row's reflected deposits per grid size, computed once per row and grid.

    relplot's deposit (``smooth_round_to_grid``) puts weight (1 − frac) w on grid point j and
    frac·w on j + 1, where j = ⌊f (G − 1)⌋ (clipped to G − 2) and frac = f (G − 1) − j, for the
    weights w = f − y (the residual) and w = 1. A subclass says how the deposits are found
    (``deposits``): from the running sums of sorted rows (``_Rows``).
    """

    def __init__(self, count: int) -> None:
        self.count = count
        # grid -> (the spectra (k, 2, n_fft // 2 + 1) of the k rows asked for so far, each row's place there or -1):
        # only rows a bisection step takes to that grid are held (a fine grid is large and few rows reach it)
        self._spectra: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    @abstractmethod
    def deposits(self, rows: np.ndarray, grid: int) -> np.ndarray:
        """-> (len(rows), 2, grid): the deposits of the residual and of ones."""

    def spectra(self, rows: np.ndarray, grid: int) -> np.ndarray:
        """rFFT of each row's reflected deposits, wrapped onto ``_fft_length(grid)`` points -> (len(rows), 2, ·)."""
        held, place = self._spectra.get(grid, (None, np.full(self.count, -1)))
        missing = rows[place[rows] < 0]
        if len(missing):
            new = fft.rfft(_wrap(_reflect(self.deposits(missing, grid)), _fft_length(grid)), axis=-1)
            start = 0 if held is None else len(held)
            held = new if held is None else np.concatenate([held, new])
            place[missing] = np.arange(start, start + len(missing))
            self._spectra[grid] = (held, place)
        at = place[rows]
        if len(at) == len(held) and (at == np.arange(len(held))).all():  # every row held, in order: no copy
            return held
        return held[at]


class _Rows(DepositSpectra):
    """The deposits of rows sorted by f, from their running sums.

    Summed over the samples of cell j, the deposits are (1 + j) Σw − (G − 1) Σfw on j and
    (G − 1) Σfw − j Σw on j + 1: with the rows sorted by f, every cell's Σw and Σfw are
    differences of running sums, so the deposits of any grid size cost O(G) per row instead of a
    pass over the samples. (A sample exactly on a cell boundary gives the same deposit from
    either side: all its weight lands on that grid point.)
    """

    def __init__(self, rows: SortedRows) -> None:
        super().__init__(len(rows.confidence))
        self.f = rows.confidence
        self._cum = {"r": rows.cum_conf - rows.cum_hit, "f": rows.cum_conf,
                     "fr": running_sum(self.f * (self.f - rows.hit))}

    def deposits(self, rows: np.ndarray, grid: int) -> np.ndarray:
        cuts = np.arange(1, grid - 1) / (grid - 1)  # where cells 1 .. G − 2 start
        n = self.f.shape[1]
        starts = np.empty((len(rows), grid), dtype=np.int64)
        starts[:, 0], starts[:, -1] = 0, n
        for i, row in enumerate(rows):
            starts[i, 1:-1] = np.searchsorted(self.f[row], cuts, side="left")
        cell = np.arange(grid - 1)
        out = np.zeros((len(rows), 2, grid))
        sums = {name: np.diff(cum[rows[:, None], starts], axis=1) for name, cum in self._cum.items()}
        count = np.diff(starts, axis=1).astype(np.float64)
        for k, (plain, weighted) in enumerate(((sums["r"], sums["fr"]), (count, sums["f"]))):
            out[:, k, :-1] += (1 + cell) * plain - (grid - 1) * weighted
            out[:, k, 1:] += (grid - 1) * weighted - cell * plain
        return out


def _valid_start(grid: int) -> int:
    """Where relplot's output starts in the full linear convolution: the 'valid' part starts at
    G − 1, and relplot then keeps [G // 2, G // 2 + G) of it."""
    return grid - 1 + grid // 2


def _fft_length(grid: int) -> int:
    """The shortest fast circular convolution whose outputs [s, s + G) equal the linear ones.

    The linear convolution of the reflected deposit (3G − 2 points) with the kernel (G points)
    has 4G − 3 points; a circular one of length L adds y[m + L] and y[m − L] to y[m], which are
    zero for every kept m when L >= 4G − 3 − s and L >= s + G.
    """
    s = _valid_start(grid)
    return fft.next_fast_len(max(4 * grid - 3 - s, s + grid), real=True)


def _wrap(values: np.ndarray, length: int) -> np.ndarray:
    """Fold the last axis onto ``length`` points (x[i] added at i mod length): a circular convolution's input."""
    out = np.zeros((*values.shape[:-1], length))
    for begin in range(0, values.shape[-1], length):
        chunk = values[..., begin:begin + length]
        out[..., :chunk.shape[-1]] += chunk
    return out


def _smooth_ece_at(data: DepositSpectra, rows: np.ndarray, sigmas: np.ndarray) -> np.ndarray:
    """``relplot.metrics.smooth_ece`` (smECE at a fixed bandwidth) of ``rows``, each at its σ."""
    out = np.empty(len(rows))
    grids, meshes = grid_sizes(sigmas), _mesh_sizes(sigmas)
    for grid, mesh in sorted({(int(g), int(m)) for g, m in zip(grids, meshes)}):
        group = np.flatnonzero((grids == grid) & (meshes == mesh))
        spectra = data.spectra(rows[group], grid)
        unique, which = np.unique(sigmas[group], return_inverse=True)  # rows often share σ: one kernel each
        which = which.reshape(-1)
        kernels = fft.rfft(_wrap(_kernels(unique, grid), _fft_length(grid)), axis=-1)
        start = _valid_start(grid)
        # relplot: rs = ys / dens, smECE_σ = Σ_t |rs| dens / Σ_t dens = Σ_t |ys| / Σ_t dens over the mesh t.
        # The residual's smoothing ys is needed point by point (|·|); the density only through its sum, a
        # linear functional of the smoothed density, so it is one inner product with the spectrum of that
        # functional instead of an inverse FFT (half the FFTs; equal up to rounding, ~1e-15).
        ys = _interpolate(mesh, fft.irfft(spectra[:, 0] * kernels[which], _fft_length(grid), axis=-1)
                          [:, start:start + grid])
        summed = spectra[:, 1] @ (kernels * _mesh_sum_functional(mesh, grid)).T  # (rows, unique σ)
        density_sum = summed[np.arange(len(group)), which].real + mesh * DENSITY_EPS
        out[group] = np.abs(ys).sum(1) / density_sum
    return out


@functools.lru_cache(maxsize=64)
def _mesh_sum_functional(mesh: int, grid: int) -> np.ndarray:
    """The vector φ with Σ_t interpolate(y)(t) = Re(X · φ), where y = irfft(X)[s : s + G] is a smoothed row.

    Σ_t interpolate(y)(t) = Σ_j c_j y_j, c_j the interpolation weight grid point j gets over the mesh;
    with c placed at the kept outputs [s, s + G) of the circular convolution (length L), Σ_n c_n x_n
    = (1 / L) Σ_k X_k conj(C_k) over the full spectrum, i.e. over the rFFT's half with the bins other
    than 0 and L / 2 counted twice (c is real, so C_0 and C_(L/2) are real, as irfft reads X there).
    """
    inds, residual = _interpolation(mesh, grid)
    weights = np.zeros(grid)
    np.add.at(weights, inds, 1 - residual)
    np.add.at(weights, inds + 1, residual)
    length, start = _fft_length(grid), _valid_start(grid)
    placed = np.zeros(length)
    placed[start:start + grid] = weights
    twice = np.full(length // 2 + 1, 2.0)
    twice[0] = 1.0
    if length % 2 == 0:
        twice[-1] = 1.0
    return np.conj(fft.rfft(placed)) * twice / length


def smooth_ece(confidence: np.ndarray, outcome: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """smECE and its bandwidth σ* of each row: confidence and outcome (C, N) -> (C,), (C,).

    ``outcome`` is the 0/1 event (or, for a noise-free version, its true probability). A row
    with a non-finite value gets NaN. Equals ``relplot.smECE(f, y, return_width=True)`` per row.
    """
    f = np.asarray(confidence, dtype=np.float64)
    y = np.asarray(outcome, dtype=np.float64)
    values = np.full(len(f), np.nan)
    widths = np.full(len(f), np.nan)
    finite = np.flatnonzero(np.isfinite(f).all(1) & np.isfinite(y).all(1)) if f.shape[1] else np.array([], int)
    if len(finite):
        values[finite], widths[finite] = smooth_ece_sorted(SortedRows.sort(f[finite], y[finite]))
    return values, widths


def smooth_ece_sorted(rows: SortedRows) -> tuple[np.ndarray, np.ndarray]:
    """``smooth_ece`` of rows already sorted by confidence (finite), sharing their running sums."""
    return smooth_ece_of_deposits(_Rows(rows))


def smooth_ece_of_deposits(data: DepositSpectra) -> tuple[np.ndarray, np.ndarray]:
    """smECE and σ* of each of ``data``'s rows, whatever finds their deposits (sorted rows, or the
    subgroups' bincounts of mtl_cog.evaluation.group_bins): relplot's bisection, all rows in lock step."""
    count = data.count
    # relplot.metrics.search_param(check, start=1, refine=10) with check(α) = α < eps or α < smECE_α,
    # run in lock step over the rows. check(1) is always false, since smECE_α < 1 (|residual| <= 1 and
    # the density gets + 1e-4), so the first evaluation, at α = 1, is only needed for rows whose
    # answer stays 1; smECE_α is cached where α becomes the answer, so it is never recomputed.
    start = np.ones(count)
    start_value = np.full(count, np.nan)
    end = np.zeros(count)
    every = np.arange(count)
    for _ in range(REFINE):
        mid = (start + end) / 2
        check = mid < EPS
        evaluate = every[~check]
        value = np.zeros(count)
        value[evaluate] = _smooth_ece_at(data, evaluate, mid[evaluate])
        check |= mid < value
        end[check] = mid[check]
        start[~check] = mid[~check]
        start_value[~check] = value[~check]
    at_one = np.flatnonzero(start == 1)
    if len(at_one):
        start_value[at_one] = _smooth_ece_at(data, at_one, start[at_one])
    return start_value, start
