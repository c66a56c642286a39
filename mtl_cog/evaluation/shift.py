"""Calibration under distribution shift: every metric on corrupted test splits, per corruption x severity.

The network predicts each corrupted copy of the test split (mtl_cog.data.shift: Hendrycks &
Dietterich's 15 corruptions, severities 1–5, built once into the cache). Every metric of
``compute_metrics`` is computed per task and as the mean over tasks, for the model as trained
(method ``none``) and for each post-hoc calibrator fitted once on the *clean* validation
predictions and applied unchanged to every shifted split: a calibrator fitted where the data
came from meets data from elsewhere, which is the situation it is sold for (Ovadia et al.,
NeurIPS 2019, "Can you trust your model's uncertainty?", measure exactly this). Severity 0 rows
(corruption ``none``) are the clean test split, the start of every curve.

``shift_metrics.csv``: columns suite (whose severity parameters: cifar10c or imagenetc,
mtl_cog.data.shift), method, corruption, severity, task (every task, then ``mean``), then the
metrics (docs/guides/shift.md).
"""

from __future__ import annotations

import pandas as pd

from mtl_cog.data.shift import corrupted_split, resolve_suite
from mtl_cog.data.task_api import SplitData, Task, TaskSpec
from mtl_cog.evaluation.inference import predict_split
from mtl_cog.evaluation.metrics import metrics_frame
from mtl_cog.evaluation.posthoc import build_posthoc, check_pair
from mtl_cog.evaluation.predictions import Predictions
from mtl_cog.evaluation.scoring import score
from mtl_cog.progress import track

CLEAN = "none"  # corruption name of the clean test split (severity 0)
KEYS = ("suite", "method", "corruption", "severity", "task")


def shifted_predictions(accelerator, network, task: Task, spec: TaskSpec, data_cfg, clean: SplitData,
                        names: list[str], severities: list[int], seed: int, workers: int,
                        batch_size: int, suite: str) -> dict[tuple[str, int], Predictions]:
    """{(corruption, severity): predictions of the corrupted test split}; the main process builds each split first."""
    out = {}
    jobs = [(name, severity) for name in names for severity in severities]
    for name, severity in track(jobs, "test split under corruptions", every=1):
        with accelerator.main_process_first():
            split = corrupted_split(task, spec, data_cfg, clean, name, severity, seed, workers,
                                    show_progress=accelerator.is_main_process, suite=suite)
        out[(name, severity)] = predict_split(accelerator, network, spec, split, batch_size)
    return out


def calibrated_under_shift(method: str, val: Predictions, splits: list[Predictions]) -> list[Predictions]:
    """``method`` fitted once on ``val`` (the clean validation predictions), applied unchanged to every split."""
    check_pair(method, val, splits[0])
    calibrator = build_posthoc(method).fit(val)
    return [calibrator.apply(split) for split in splits]


def shift_frame(clean: Predictions, shifted: dict[tuple[str, int], Predictions], bins: list[int],
                val: Predictions | None = None, posthoc: list[str] = (), suite: str = "cifar10c") -> pd.DataFrame:
    """The rows of ``shift_metrics.csv``: every task and the mean, per method x corruption x severity."""
    keys = [(CLEAN, 0), *shifted]
    splits = [clean, *shifted.values()]
    methods = {"none": splits}
    for method in posthoc:
        methods[method] = calibrated_under_shift(method, val, splits)
    frames = []
    for method, predictions in methods.items():
        for (name, severity), preds in zip(keys, predictions):
            frame = metrics_frame(score(preds, bins, pairs=0))  # pairs: the joint metrics cost time, not asked here
            frames.append(frame.assign(suite=suite, method=method, corruption=name, severity=severity))
    frame = pd.concat(frames, ignore_index=True)
    return frame[[*KEYS, *[c for c in frame.columns if c not in KEYS]]]


def evaluate_shift(accelerator, network, task: Task, spec: TaskSpec, data_cfg, eval_cfg, test: SplitData,
                   clean: Predictions, val: Predictions | None, names: list[str], severities: list[int],
                   posthoc: list[str], batch_size: int) -> pd.DataFrame:
    """The whole suite (``eval_cfg.shift_suite``, ``auto`` resolved by the test pictures' side): corrupted
    splits (built or read from the cache), predictions, ``shift_frame``."""
    suite = resolve_suite(eval_cfg.shift_suite, test.images.shape[-1])
    shifted = shifted_predictions(accelerator, network, task, spec, data_cfg, test, names, severities,
                                  eval_cfg.shift_seed, eval_cfg.shift_workers, batch_size, suite)
    return shift_frame(clean, shifted, eval_cfg.bins, val, posthoc, suite)


def summary(frame: pd.DataFrame, columns: tuple[str, ...] = ("accuracy", "nll", "ece@15")) -> pd.DataFrame:
    """Mean rows averaged over corruptions: one row per method x severity (what the figure and console show)."""
    mean = frame[frame.task == "mean"]
    columns = [c for c in columns if c in mean.columns]
    return mean.groupby(["method", "severity"], sort=True)[columns].mean().reset_index()


def shift_summary_scalars(frame: pd.DataFrame) -> dict[str, float]:
    """W&B run-summary keys ``shift/<method>/severity<s>/<metric>``: task means averaged over corruptions."""
    out = {}
    for row in summary(frame, ("accuracy", "nll", "brier", "ece@15", "smece", "aurc")).to_dict("records"):
        for metric, value in row.items():
            if metric not in ("method", "severity"):
                out[f"shift/{row['method']}/severity{row['severity']}/{metric}"] = float(value)
    return out
