"""Tables of the report (mtl_cog/reporting/tables.py) and the compare.py entry point on hand-built run folders."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image
from scipy.special import logit

from mtl_cog.analysis.paired import average_ranks
from mtl_cog.bundles.run_records import find_run_dirs, load_runs
from mtl_cog.errors import ReportError
from mtl_cog.evaluation.predictions import Predictions, save_predictions
from mtl_cog.reporting.tables import score_runs, summary_table

REPO = Path(__file__).resolve().parents[1]


def test_average_rank_on_a_hand_made_table_with_ties():
    means = pd.DataFrame(
        {"accuracy": [0.90, 0.92, 0.92, 0.85], "nll": [0.30, 0.25, 0.40, 0.25], "brier": [0.15, 0.14, 0.16, 0.13]},
        index=["a", "b", "c", "d"],
    )
    ranks = average_ranks(means)
    # accuracy: b and c tie for 1st -> 1.5 each; a 3; d 4.  nll: b, d tie -> 1.5; a 3; c 4.  brier: d, b, a, c
    assert list(ranks["rank_accuracy"]) == [3, 1.5, 1.5, 4]
    assert list(ranks["rank_nll"]) == [3, 1.5, 4, 1.5]
    assert list(ranks["rank_brier"]) == [3, 2, 4, 1]
    assert ranks["avg_rank"].tolist() == pytest.approx([3, 5 / 3, 19 / 6, 6.5 / 3])
    assert ranks["top_ranked"].tolist() == [False, True, False, False]


def test_tied_average_ranks_mark_every_top_method():
    means = pd.DataFrame({"accuracy": [0.9, 0.8], "nll": [0.3, 0.2], "brier": [0.1, 0.1]}, index=["x", "y"])
    ranks = average_ranks(means)
    assert ranks["avg_rank"].tolist() == [1.5, 1.5] and ranks["top_ranked"].all()


def write_run(root: Path, name: str, method: str, seed: int, *, tasks: int = 3, classes: int = 2, n: int = 400,
              temperature: float = 1.0, posthoc: bool = False, task: str = "synthetic") -> Path:
    """A run folder in the real formats: config.yaml, test_metrics.csv, predictions_{val,test}.npz."""
    from mtl_cog.config import load_config, save_config
    from mtl_cog.evaluation.metrics import metrics_frame
    from mtl_cog.evaluation.scoring import score

    run = root / name
    run.mkdir(parents=True)
    cfg = load_config(REPO / "configs" / "synthetic" / f"{method}.yaml", [f"seed={seed}", f"data.task={task}"])
    save_config(cfg, run / "config.yaml")
    rng = np.random.default_rng(seed)
    for split in ("val", "test"):
        if classes == 2:  # binary attributes that know their true probabilities, as `synthetic`
            p_true = [rng.uniform(0.05, 0.95, n) for _ in range(tasks)]
            labels = [(rng.random(n) < p).astype(np.int64) for p in p_true]
            logits = [logit(p) / temperature + rng.normal(0, 0.3, n) for p in p_true]
        else:  # one K-class task without true probabilities, as `digits`
            p_true = [rng.dirichlet(np.full(classes, 0.3), n) for _ in range(tasks)]
            labels = [np.array([rng.choice(classes, p=row) for row in p]) for p in p_true]
            logits = [np.log(p + 1e-3) / temperature + rng.normal(0, 0.3, p.shape) for p in p_true]
        names = [f"attr{t:02d}" for t in range(tasks)] if tasks > 1 else ["digit"]
        predictions = Predictions(names, logits, labels, p_true if classes == 2 else None)
        save_predictions(run / f"predictions_{split}.npz", predictions)
    frame = metrics_frame(score(predictions, cfg.eval.bins))
    frame.to_csv(run / "test_metrics.csv", index=False)
    (run / "DONE").write_text("best_epoch=1\n")
    if posthoc:
        save_predictions(run / "predictions_test_ts.npz",
                         Predictions(predictions.task_names, [z * temperature for z in logits], labels, p_true))
        # the layout of `scripts/evaluate.py --posthoc`: a "method" column, "none" = uncalibrated
        rows = pd.concat([frame.assign(method="none"), frame.assign(method="hist")], ignore_index=True)
        rows[["method", *frame.columns]].to_csv(run / "posthoc_metrics.csv", index=False)
    return run


def test_runs_are_found_grouped_and_scored(tmp_path):
    for seed in (0, 1):
        write_run(tmp_path / "runs", f"base{seed}", "baseline", seed, temperature=0.5, posthoc=True)
        write_run(tmp_path / "runs", f"fc{seed}", "cog_fc", seed)
    (tmp_path / "runs" / "unfinished").mkdir()
    (tmp_path / "runs" / "unfinished" / "config.yaml").write_text("seed: 0\n")
    with pytest.warns(UserWarning, match="unfinished"):
        assert len(find_run_dirs([tmp_path / "runs"])) == 4
    with pytest.warns(UserWarning):
        records = load_runs([tmp_path / "runs"])
    scores = score_runs(records, [5, 15])
    assert set(scores["method"]) == {"baseline", "baseline+ts", "baseline+hist", "cog_fc"}
    summary = summary_table(scores).set_index("method")
    assert summary.loc["baseline", "n_seeds"] == 2 and summary.loc["baseline", "seeds"] == "0 1"
    # a post-hoc temperature that undoes the planted one is better calibrated against the truth
    assert summary.loc["baseline+ts", "nf_ece@15"] < summary.loc["baseline", "nf_ece@15"]
    # rows from posthoc_metrics.csv carry only the bins they were written with
    assert np.isnan(summary.loc["baseline+hist", "nf_ece@15"]) and summary.loc["baseline+hist", "ece@15"] > 0
    seeds = scores[(scores["method"] == "cog_fc") & (scores["task"] == "mean")]["accuracy"]
    assert summary.loc["cog_fc", "accuracy"] == pytest.approx(seeds.mean())
    assert summary.loc["cog_fc", "accuracy_std"] == pytest.approx(seeds.std(ddof=1))
    assert summary["top_ranked"].sum() >= 1


def test_different_data_settings_are_not_averaged(tmp_path):
    write_run(tmp_path, "a", "baseline", 0)
    run_b = write_run(tmp_path, "b", "baseline", 1)
    config = yaml.safe_load((run_b / "config.yaml").read_text())
    config["data"]["max_samples"] = 10
    (run_b / "config.yaml").write_text(yaml.safe_dump(config))
    records = load_runs([tmp_path])
    assert sorted({r.dataset for r in records}) == ["synthetic[max_samples=10]", "synthetic[max_samples=None]"]


def test_no_runs_is_a_clear_error(tmp_path):
    with pytest.raises(ReportError, match="no run folders"):
        find_run_dirs([tmp_path])


def _assert_real_image(path: Path, min_side: int = 300) -> None:
    with Image.open(path) as image:
        assert image.format == "PNG" and min(image.size) >= min_side, (path, image.size)
        pixels = np.asarray(image.convert("L"), dtype=float)
    assert pixels.std() > 10, f"{path} looks blank"
    assert (pixels < 128).mean() > 0.01, f"{path} has almost no ink"


def test_compare_writes_every_file(tmp_path):
    runs = tmp_path / "runs"
    for seed in (0, 1):
        write_run(runs, f"base{seed}", "baseline", seed, temperature=0.5, posthoc=True)
    write_run(runs, "fc0", "cog_fc", 0)
    write_run(runs, "digits_base", "baseline", 0, tasks=1, classes=10, task="digits")
    out = tmp_path / "report"
    result = subprocess.run([sys.executable, "scripts/compare.py", str(runs), str(runs / "fc0"), "--out", str(out)],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    for name in ("summary.csv", "summary.md", "calibration_errors.csv", "per_task.csv", "truth.csv"):
        assert (out / name).is_file(), name
    summary = pd.read_csv(out / "summary.csv")
    assert set(summary["dataset"]) == {"synthetic", "digits"}
    assert len(summary[summary["dataset"] == "synthetic"]) == 4  # the run given twice counts once
    text = (out / "summary.md").read_text()
    assert "★" in text and "## synthetic" in text and "noise-free" in text
    errors = pd.read_csv(out / "calibration_errors.csv")
    assert {5, 10, 15, 20, 50} <= set(errors["bins"]) and {"ece", "rmsce", "mce", "nf_ece"} <= set(errors["norm"])
    assert errors["mean"].notna().all() and "nf_ece" not in set(errors[errors["dataset"] == "digits"]["norm"])
    truth = pd.read_csv(out / "truth.csv")
    assert set(truth["dataset"]) == {"synthetic"} and truth["nf_ece@15"].notna().all()
    per_task = pd.read_csv(out / "per_task.csv")
    assert set(per_task["dataset"]) == {"synthetic"} and set(per_task["task"]) == {"attr00", "attr01", "attr02"}
    pngs = sorted(out.glob("*.png"))
    names = {p.name for p in pngs}
    for expected in ("reliability_synthetic_baseline.png", "reliability_synthetic_cog_fc.png",
                     "reliability_synthetic.png", "pareto_synthetic.png", "ece_per_task_synthetic.png",
                     "calibration_vs_bins_synthetic.png", "reliability_digits_baseline.png", "pareto_digits.png"):
        assert expected in names, (expected, names)
    for png in pngs:
        _assert_real_image(png)


def test_compare_without_runs_fails_cleanly(tmp_path):
    result = subprocess.run([sys.executable, "scripts/compare.py", str(tmp_path), "--out", str(tmp_path / "r")],
                            cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 2 and "no run folders" in result.stderr and "Traceback" not in result.stderr


def test_reproduce_plans_every_method_config_and_seed(tmp_path):
    from mtl_cog.cli import reproduce
    from mtl_cog.experiments import campaign

    args = reproduce.parse_args(["--data", "digits", "synthetic", "--seeds", "0", "1", "2", "--out", str(tmp_path)])
    specs = reproduce.final_specs(args, None)
    for dataset in ("digits", "synthetic"):
        methods = {p.stem for p in (REPO / "configs" / dataset).glob("*.yaml")}
        planned = {(s.labels.method, s.labels.seed) for s in specs if s.labels.data == dataset}
        assert planned == {(m, s) for m in methods for s in (0, 1, 2)}
    first = campaign.plan(campaign.Campaign("c", tmp_path, specs[:1]))[0]
    assert first.config.tracking == "none" and first.config.model.backbone == "cog_cnn_tiny"  # the cpu scale's file
    assert first.spec.configs[1] == REPO / "configs" / "scales" / "cpu" / f"{first.spec.labels.data}.yaml"
    longer = reproduce.final_specs(reproduce.parse_args(["--epochs", "3", "--out", str(tmp_path)]), None)[0]
    assert "train.epochs=3" in longer.overrides
    with pytest.raises(Exception, match="no config configs/digits/<method>.yaml for --method nope"):
        reproduce.final_specs(reproduce.parse_args(["--data", "digits", "--method", "nope"]), None)
