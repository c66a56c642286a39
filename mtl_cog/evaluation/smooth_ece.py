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
reused by every bisection step, and the convolutions of all rows are one batched FFT instead
of one direct ``np.convolve`` per row and step. The only difference is floating-point
summation order (~1e-15); ``tests/test_smooth_ece.py`` checks equality with ``relplot.smECE``
to 1e-6 on calibrated, over- and underconfident, saturated, constant and tiny inputs.
"""

from __future__ import annotations

import numpy as np
from scipy import fft

# relplot's defaults (relplot.metrics.smECE, relplot.config.smECE_mesh_pts, BaseKernelMixin.smooth)
EPS = 0.001  # smallest bandwidth the bisection reports
REFINE = 10  # bisection steps after the first check at σ = 1
MESH_POINTS = 200  # minimum number of evaluation points of the integral
DENSITY_EPS = 1e-4  # added to the kernel density before dividing by it


def _grid_size(sigma: float) -> int:
    """relplot's ``GaussianKernel.apply``: grid points of the deposit and the convolution."""
    return max(2000, round(20 / float(sigma))) // 2 + 1


def _mesh_size(sigma: float) -> int:
    """relplot's ``smooth_ece``: points of the evaluation mesh t on [0, 1]."""
    return max(round(10 / float(sigma)), MESH_POINTS)


def _deposit(f: np.ndarray, residual: np.ndarray, grid: int) -> np.ndarray:
    """``relplot.kernels.smooth_round_to_grid`` of each row, for the residual and for ones.

    (R, N) -> (R, 2, grid): every sample split linearly onto its two neighbouring grid points.
    """
    rows = len(f)
    scaled = f * (grid - 1)
    bins = scaled.astype(int).clip(0, grid - 2)
    frac = scaled - bins
    below = (bins + (np.arange(rows) * grid)[:, None]).ravel()
    above = below + 1
    low, high = (1 - frac).ravel(), frac.ravel()
    size = rows * grid
    res = residual.ravel()
    out = np.empty((rows, 2, grid))
    out[:, 0] = (np.bincount(below, low * res, size) + np.bincount(above, high * res, size)).reshape(rows, grid)
    out[:, 1] = (np.bincount(below, low, size) + np.bincount(above, high, size)).reshape(rows, grid)
    return out


def _kernels(sigmas: np.ndarray, grid: int) -> np.ndarray:
    """``GaussianKernel.kernel_ev`` for each bandwidth: (R,) -> (R, grid)."""
    t = np.linspace(0, 1, grid)
    var = (sigmas**2)[:, None]
    return np.exp(-(t - 0.5) * (t - 0.5) / (2 * var)) / (np.sqrt(2 * np.pi) * sigmas[:, None])


def _reflect(values: np.ndarray) -> np.ndarray:
    """``ReflectedGaussianKernel.convolve``'s extension [flip(v)[:-1], v, flip(v)[1:]] of each row."""
    flipped = values[..., ::-1]
    return np.concatenate([flipped[..., :-1], values, flipped[..., 1:]], axis=-1)


def _interpolate(t: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``relplot.kernels.interpolate`` of each row of y (R, G) at the points t, with relplot's arithmetic."""
    buckets_cnt = y.shape[1]
    bucket_size = 1 / (buckets_cnt - 1)
    inds = (t * (buckets_cnt - 1)).astype(int).clip(0, buckets_cnt - 2)
    residual = (t - inds * bucket_size) / bucket_size
    return y[:, inds] * (1 - residual) + y[:, inds + 1] * residual


class _Rows:
    """The data of every row, and its deposits on each grid size (reused across bisection steps)."""

    def __init__(self, f: np.ndarray, y: np.ndarray) -> None:
        self.f, self.residual = f, f - y
        self._spectra: dict[int, np.ndarray] = {}  # grid -> (C, 2, n_fft // 2 + 1) rFFT of the reflected deposits
        self._computed: dict[int, np.ndarray] = {}  # grid -> which rows are in _spectra[grid]

    def spectra(self, rows: np.ndarray, grid: int, n_fft: int) -> np.ndarray:
        if grid not in self._spectra:
            self._spectra[grid] = np.zeros((len(self.f), 2, n_fft // 2 + 1), dtype=complex)
            self._computed[grid] = np.zeros(len(self.f), dtype=bool)
        missing = rows[~self._computed[grid][rows]]
        if len(missing):
            deposits = _deposit(self.f[missing], self.residual[missing], grid)
            self._spectra[grid][missing] = fft.rfft(_reflect(deposits), n_fft, axis=-1)
            self._computed[grid][missing] = True
        return self._spectra[grid][rows]


def _smooth_ece_at(data: _Rows, rows: np.ndarray, sigmas: np.ndarray) -> np.ndarray:
    """``relplot.metrics.smooth_ece`` (smECE at a fixed bandwidth) of ``rows``, each at its σ."""
    out = np.empty(len(rows))
    grids = np.array([_grid_size(s) for s in sigmas])
    meshes = np.array([_mesh_size(s) for s in sigmas])
    for grid, mesh in sorted({(int(g), int(m)) for g, m in zip(grids, meshes)}):
        group = np.flatnonzero((grids == grid) & (meshes == mesh))
        # 'valid' part of the convolution of the reflected deposit (3G - 2) with the kernel (G),
        # then relplot's slice [G // 2, G // 2 + G)
        n_fft = fft.next_fast_len(4 * grid - 3, real=True)
        spectra = data.spectra(rows[group], grid, n_fft)
        kernel = fft.rfft(_kernels(sigmas[group], grid), n_fft, axis=-1)
        full = fft.irfft(spectra * kernel[:, None, :], n_fft, axis=-1)
        start = grid - 1 + grid // 2
        smoothed = full[..., start:start + grid]  # (g, 2, grid): residual, density
        t = np.linspace(0, 1, mesh)
        ys = _interpolate(t, smoothed[:, 0])
        dens = _interpolate(t, smoothed[:, 1]) + DENSITY_EPS
        rs = ys / dens
        out[group] = np.sum(np.abs(rs) * dens, axis=1) / np.sum(dens, axis=1)
    return out


def smooth_ece(confidence: np.ndarray, outcome: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """smECE and its bandwidth σ* of each row: confidence and outcome (C, N) -> (C,), (C,).

    ``outcome`` is the 0/1 event (or, for a noise-free version, its true probability). A row
    with a non-finite value gets NaN. Equals ``relplot.smECE(f, y, return_width=True)`` per row.
    """
    f_all = np.ascontiguousarray(confidence, dtype=np.float64)
    y_all = np.ascontiguousarray(outcome, dtype=np.float64)
    values = np.full(len(f_all), np.nan)
    widths = np.full(len(f_all), np.nan)
    finite = np.flatnonzero(np.isfinite(f_all).all(1) & np.isfinite(y_all).all(1)) if f_all.shape[1] else []
    if len(finite) == 0:
        return values, widths
    data = _Rows(f_all[finite], y_all[finite])
    every = np.arange(len(finite))
    # relplot.metrics.search_param(check, start=1, refine=10) with check(α) = α < eps or α < smECE_α,
    # run in lock step; smECE_α is cached where α becomes the answer, so it is never recomputed.
    start = np.ones(len(finite))
    start_value = _smooth_ece_at(data, every, start)
    done = start < start_value  # check(1): the answer is σ = 1
    end = np.zeros(len(finite))
    for _ in range(REFINE):
        active = np.flatnonzero(~done)
        if len(active) == 0:
            break
        mid = (start[active] + end[active]) / 2
        check = mid < EPS
        evaluate = active[~check]
        value = np.zeros(len(active))
        value[~check] = _smooth_ece_at(data, evaluate, mid[~check])
        check |= mid < value
        end[active[check]] = mid[check]
        start[active[~check]] = mid[~check]
        start_value[active[~check]] = value[~check]
    values[finite], widths[finite] = start_value, start
    return values, widths
