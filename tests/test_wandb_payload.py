"""What W&B receives: the real wandb client in offline mode, its ``Run.log`` wrapped to record payloads."""

import numpy as np
import pytest
import wandb
from PIL import Image
from scipy.special import logit
from wandb.sdk.wandb_run import Run

from mtl_cog.evaluation.metrics import compute_metrics, metric_names, metrics_frame
from mtl_cog.evaluation.predictions import Predictions, save_predictions
from mtl_cog.reporting.run_report import publish_final_report, write_run_report
from mtl_cog.runs.metrics_log import flatten_metrics
from mtl_cog.runs.rundir import COUNT_CALIBRATION_PNG, RELIABILITY_PNG, SMOOTH_RELIABILITY_PNG, TRUTH_METRICS
from mtl_cog.runs.tracking import Tracker, log_with
from mtl_cog.training.accelerator import create_accelerator

BINS = [5, 15]
TASKS = [f"attr{t:02d}" for t in range(40)]


@pytest.fixture
def logged(monkeypatch):
    payloads = []
    original = Run.log

    def record(self, data, *args, **kwargs):
        payloads.append(dict(data))
        return original(self, data, *args, **kwargs)

    monkeypatch.setattr(Run, "log", record)
    monkeypatch.setenv("WANDB_MODE", "offline")
    return payloads


def _predictions(n: int = 300) -> Predictions:
    rng = np.random.default_rng(0)
    p_true = [rng.uniform(0.05, 0.95, n) for _ in TASKS]
    labels = [(rng.random(n) < p).astype(np.int64) for p in p_true]
    return Predictions(TASKS, [logit(p) * 1.5 for p in p_true], labels, p_true)


def test_one_epoch_gives_each_attribute_its_own_section_and_the_end_a_table_and_image(tmp_path, logged):
    accelerator = create_accelerator(log_with("wandb"))
    tracker = Tracker(accelerator, tmp_path, "mtl_cog-test", "payload", {"seed": 0})
    assert tracker.enabled and wandb.run is not None and wandb.run.settings.mode == "offline"
    predictions = _predictions()
    val = compute_metrics(TASKS, predictions.logits, predictions.labels, BINS)
    tracker.log_epoch(1, {"val": val["mean"]}, {"train/loss": 0.5, **flatten_metrics("val", val)})
    tracker.log_final({"epoch": 2, "final": True}, flatten_metrics("test", val))

    # W&B groups panels into sections by the key's prefix before the first "/"
    sections: dict[str, set[str]] = {}
    for key in logged[0]:
        section, _, rest = key.partition("/")
        sections.setdefault(section, set()).add(rest)
    assert set(TASKS) | {"mean", "train", "multitask", "pairs"} <= set(sections)
    expected = {f"val/{m}" for m in metric_names(BINS)}
    assert {"val/accuracy", "val/ece@15", "val/smece", "val/adaece@5", "val/brier_resolution"} <= expected
    for section in [*TASKS, "mean"]:
        assert sections[section] == expected, section
    assert sections["multitask"] == {f"val/{m}" for m in val["multitask"]}
    assert {"val/pooled_ece@15", "val/worst_task_ece@5", "val/count_ece", "val/pair_joint_ece"} <= sections["multitask"]
    assert len(sections["pairs"]) == len(val["pairs"]) == 10
    assert logged[0]["attr07/val/nll"] == pytest.approx(val["tasks"]["attr07"]["nll"])
    # the final test metrics: the run summary, not a history row (one-point charts at an invented step)
    assert len(logged) == 1
    assert {k.partition("/")[2] for k in wandb.run.summary.keys() if k.startswith("attr39/test/")} == {
        e.replace("val/", "test/") for e in expected}
    assert wandb.run.summary["attr07/test/nll"] == pytest.approx(val["tasks"]["attr07"]["nll"])

    # the end-of-training report: table + image on W&B, and the same in the run folder
    save_predictions(tmp_path / "predictions_test.npz", predictions)
    metrics_frame(val).to_csv(tmp_path / "test_metrics.csv", index=False)
    publish_final_report(accelerator, write_run_report(tmp_path), tracker.enabled)
    final = logged[-1]
    table, image = final["test/per_task_metrics"], final["test/reliability"]
    assert isinstance(table, wandb.Table) and isinstance(image, wandb.Image)
    assert isinstance(final["test/smooth_reliability"], wandb.Image)
    assert isinstance(final["test/count_calibration"], wandb.Image)
    assert {"smece", "adaece@15", "pooled_ece@15", "count_ece", "nf_count_ece", "nf_smece"} <= set(table.columns)
    assert table.columns[0] == "task" and [row[0] for row in table.data] == [*TASKS, "mean"]
    assert {"ece@15", "nf_ece@15", "prob_error", "bayes_nll"} <= set(table.columns)
    tracker.finish()
    assert (tmp_path / TRUTH_METRICS).is_file()
    for name in (RELIABILITY_PNG, SMOOTH_RELIABILITY_PNG, COUNT_CALIBRATION_PNG):
        with Image.open(tmp_path / name) as png:
            assert min(png.size) > 500, name
    assert list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))  # the offline run W&B can sync later


def test_final_report_without_wandb_still_writes_the_run_folder(tmp_path):
    accelerator = create_accelerator(None)
    predictions = _predictions(50)
    save_predictions(tmp_path / "predictions_test.npz", predictions)
    metrics_frame(compute_metrics(TASKS, predictions.logits, predictions.labels, BINS)).to_csv(
        tmp_path / "test_metrics.csv", index=False)
    publish_final_report(accelerator, write_run_report(tmp_path), tracking_enabled=False)
    assert (tmp_path / RELIABILITY_PNG).stat().st_size > 20_000
