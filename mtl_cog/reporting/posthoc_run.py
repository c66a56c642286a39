"""Post-hoc calibrators fitted on a finished run: ``posthoc_metrics.csv`` and the calibrated test predictions.

Shared by ``evaluate --run RUN --posthoc ...`` and ``reproduce`` (which fits every registered method
on its baseline runs), so no command calls another. Each method of ``mtl_cog.evaluation.posthoc.POSTHOC``
is fitted on the run's ``predictions_val.npz`` and applied to its ``predictions_test.npz``; a method
that re-runs the network (``needs_network``) gets the run's network and the data set's images.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

from mtl_cog.constants import SUMMARY_BINS
from mtl_cog.data.loading import load_task
from mtl_cog.evaluation.metrics import metrics_frame
from mtl_cog.evaluation.posthoc import POSTHOC, build_posthoc, check_pair
from mtl_cog.evaluation.predictions import Predictions, save_predictions
from mtl_cog.evaluation.scoring import score
from mtl_cog.io import atomic_write, atomic_write_json
from mtl_cog.progress import track
from mtl_cog.runs import rundir
from mtl_cog.runs.digests import add_digests
from mtl_cog.runs.finished import finished_predictions
from mtl_cog.runs.trained import TrainedRun, load_run


def posthoc_method_names() -> list[str]:
    """Every registered post-hoc method, in the order its rows appear (``evaluate --posthoc`` choices)."""
    return POSTHOC.in_order()


def fit_posthoc_run(run_dir: Path, methods: list[str], bins: list[int] | None, out: Path | None,
                    pairs: int | None = None) -> dict:
    """Fit each post-hoc method on the run's validation predictions; score it on its test predictions.

    Nothing is written until every method has been fitted and scored, so a method that is refused
    (a degenerate fit, a data set that cannot be read) leaves the run folder as it was."""
    val, test = finished_predictions(run_dir, ("val", "test")).values()  # DONE, the files it wrote, its tasks
    eval_cfg = rundir.load_run_config(run_dir).eval
    bins = bins or eval_cfg.bins
    pairs = eval_cfg.joint_pairs if pairs is None else pairs
    results = {"none": score(test, bins, pairs)}
    calibrated: dict[str, Predictions] = {}
    trained: TrainedRun | None = None
    images: dict[str, torch.Tensor] = {}
    for method in track(methods, f"post-hoc calibrators of {run_dir.name}", every=1):
        if POSTHOC.get(method).needs_network and trained is None:  # the network and the images, not only logits
            trained = load_run(run_dir, "cuda" if torch.cuda.is_available() else "cpu")
            splits = load_task(trained.config.data).splits
            images = {"val": splits["val"].images, "test": splits["test"].images}
        calibrator = build_posthoc(method, *((trained.network, trained.transform) if trained is not None else ()))
        check_pair(method, val, test)
        calibrated[method] = calibrator.fit(val, images.get("val")).apply(test, images.get("test"))
        results[method] = score(calibrated[method], bins, pairs)
    # written only once every method has been fitted: a refused method leaves the run folder as it was
    for method, predictions in calibrated.items():
        save_predictions(run_dir / rundir.posthoc_predictions_file("test", method), predictions)
    frame = pd.concat([metrics_frame(m).assign(method=name) for name, m in results.items()], ignore_index=True)
    frame = frame[["method", *[c for c in frame.columns if c != "method"]]]
    atomic_write(run_dir / rundir.POSTHOC_METRICS, lambda tmp: frame.to_csv(tmp, index=False))
    add_digests(run_dir, [rundir.POSTHOC_METRICS, *(rundir.posthoc_predictions_file("test", m) for m in calibrated)])
    summary = pd.DataFrame([{"method": name, **m["mean"], **m.get("multitask", {})} for name, m in results.items()])
    columns = ["method", "accuracy", "nll", "brier", *[c for c in summary.columns if c.startswith("ece@")], "smece",
               *[c for c in (f"pooled_ece@{SUMMARY_BINS}", "count_ece", "pair_joint_ece") if c in summary.columns]]
    print("test metrics (mean over tasks), post-hoc calibrators fitted on validation predictions:")
    print(summary[columns].to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    if "pair_joint_ece" in columns:  # docs/explanation/metrics.md: not a measure of the heads' own calibration
        print("pair_joint_ece: the joint calibration implied by independent heads (p_a·p_b); perfectly calibrated "
              "heads score ~0.16 on a conditionally dependent pair. Not used to rank methods.")
    if out is not None:
        atomic_write_json(out, results)
    print(run_dir / rundir.POSTHOC_METRICS)
    return results
