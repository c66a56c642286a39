"""The campaign engine and its results bundle: plan, resume from the bundle alone, refuse mixed or damaged bundles,
and a campaign killed at a random point finishing with the results of an uninterrupted one."""

import dataclasses
import gzip
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from mtl_cog.bundles import bundle as bundles
from mtl_cog.errors import UserError
from mtl_cog.experiments import campaign

REPO = Path(__file__).resolve().parents[1]
TINY = ["tracking=none", "train.epochs=2", "train.batch_size=32", "train.eval_batch_size=64",
        "model.backbone=cog_cnn_tiny", "data.image_size=16", "data.synthetic.num_attributes=5",
        "data.synthetic.train_size=96", "data.synthetic.val_size=50", "data.synthetic.test_size=37"]


def sweep_argv(out: Path, *extra: str) -> list[str]:
    return ["--config", str(REPO / "configs" / "synthetic" / "cog_ts.yaml"), *TINY, *extra, "--out", str(out),
            "--grid", "optim.leader_lr=1e-5,1e-4"]


def run_sweep(argv: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "mtl_cog.cli.sweep", *argv], capture_output=True, text=True, env=env,
                          cwd=REPO)


def write_tiny_bundle(folder: Path) -> None:
    """A bundle of two final runs (seeds 0 and 1) of cog_ts and baseline, two tasks, as a campaign writes it."""
    bundle = bundles.Bundle({"format": bundles.FORMAT, "campaign": "c", "specs": {},
                             "counterparts": {"cog_ts": "baseline"}})
    for method, shift in (("baseline", 0.0), ("cog_ts", -0.01)):
        for seed in (0, 1):
            run = f"synthetic-{method}-seed{seed}"
            row = {c: "" for c in bundles.RUN_COLUMNS} | {
                "run": run, "campaign": "c", "data": "synthetic", "method": method, "role": "final", "draw": "1",
                "seed": seed, "status": "done", "config_digest": "x"}
            results = pd.DataFrame([{"run": run, "split": "test", "task": task, "metric": metric,
                                     "value": base + shift + 0.001 * seed + 0.002 * i}
                                    for i, task in enumerate(["a", "b", "mean"])
                                    for metric, base in (("accuracy", 0.9), ("nll", 0.3), ("brier", 0.1),
                                                         ("ece@15", 0.02))])
            bundle.add_run(row, results, pd.DataFrame(columns=bundles.CURVE_COLUMNS))
    bundles.write_bundle(folder, bundle)


def test_the_report_regenerates_from_the_bundle_alone(tmp_path):
    from mtl_cog.cli import report

    write_tiny_bundle(tmp_path / "bundle")
    report.main(["--bundle", str(tmp_path / "bundle"), "--out", str(tmp_path / "out")])
    summary = pd.read_csv(tmp_path / "out" / "summary_values.csv")
    assert summary.set_index("method").loc["cog_ts", "nll"] == pytest.approx(0.3 - 0.01 + 0.0005 + 0.004)
    paired = pd.read_csv(tmp_path / "out" / "paired.csv")
    nll = paired[paired["metric"] == "nll"].iloc[0]
    assert nll["mean_difference"] == pytest.approx(-0.01) and nll["n_seeds"] == 2
    html = (tmp_path / "out" / "report.html").read_text()
    assert "cog_ts" in html and "http://" not in html and "https://" not in html
    with pytest.raises(UserError, match="no such table"):
        report.main(["--bundle", str(tmp_path / "bundle"), "--markdown", "nope"])
    with pytest.raises(UserError, match="no results bundle"):
        report.main(["--bundle", str(tmp_path / "empty"), "--list"])


def test_a_leader_curve_bundle_gets_a_report_html_with_its_curves(tmp_path):
    """A curve bundle has no final runs; its report.html shows each arm and ratio, the curve figures and the paired
    table, and links only to sections that exist (no per-task panel without per-task rows)."""
    import re

    from mtl_cog.cli import report

    report.main(["--bundle", str(REPO / "results" / "fashion_mnist_full_curve_cog_fc" / "bundle"),
                 "--out", str(tmp_path)])
    html = (tmp_path / "report.html").read_text()
    assert "Leader curves" in html and "<svg" in html and "Each ratio paired by seed" in html
    assert "cog_fc @ ratio 0.001" in html and "cog_fc @ ratio 1<" in html and ">baseline+ts<" in html
    links = set(re.findall(r'href="#([^"]+)"', html))
    assert links and links <= set(re.findall(r'id="([^"]+)"', html))


def test_run_names_follow_one_rule():
    assert campaign.run_name(data="digits", method="cog_fc", seed=3) == "digits-cog_fc-seed3"
    assert campaign.run_name(method="cog_fc", ratio=0.1, seed=0) == "cog_fc-r0.1-seed0"
    assert campaign.run_name(method="cog_fc", ratio=1.0, seed=0) == "cog_fc-r1-seed0"
    assert campaign.run_name(data="d", method="m", draw=2, seed=0) == "d-m-d2-seed0"
    assert campaign.run_name(trial=3) == "trial_03" and campaign.run_name(trial=3, seed=7) == "trial_03-seed7"
    assert campaign.run_name(index=7) == "run_07"


def test_a_bad_spec_refuses_the_whole_campaign_naming_it(tmp_path):
    labels = campaign.Labels("synthetic", "cog_ts", "sweep", 0)
    good = campaign.RunSpec("a", (REPO / "configs/synthetic/cog_ts.yaml",), tuple(TINY), tmp_path / "a", labels)
    bad = campaign.RunSpec("b", good.configs, (*TINY, "optim.leader_lr=1"), tmp_path / "b", labels)
    with pytest.raises(UserError, match="campaign run b: .*leader_lr"):
        campaign.plan(campaign.Campaign("c", tmp_path, [good, bad]))
    with pytest.raises(UserError, match="two runs named a"):
        campaign.plan(campaign.Campaign("c", tmp_path, [good, good]))
    assert not (tmp_path / "bundle").exists()


def test_the_digest_ignores_where_a_run_lies_not_what_it_is():
    from mtl_cog.config import load_config

    path = REPO / "configs" / "synthetic" / "cog_ts.yaml"
    base = campaign.config_digest(load_config(path, TINY))
    assert campaign.config_digest(load_config(path, [*TINY, "output_dir=/elsewhere", "data.root=/x"])) == base
    assert campaign.config_digest(load_config(path, [*TINY, "train.epochs=3"])) != base


def test_a_bundle_is_written_deterministically_and_read_back(tmp_path):
    bundle = bundles.Bundle({"format": bundles.FORMAT, "campaign": "c", "specs": {"r": "1234e567"}})
    row = {c: "" for c in bundles.RUN_COLUMNS} | {"run": "r", "campaign": "c", "status": "done", "seed": 0,
                                                   "data": "d", "method": "m", "role": "final",
                                                   "config_digest": "1234e567"}  # reads as a float unless kept text
    results = pd.DataFrame([{"run": "r", "split": "test", "task": "mean", "metric": "nll", "value": 0.123456789}])
    curves = pd.DataFrame([{"run": "r", "epoch": 1, "split": "val", "metric": "nll", "value": 0.5}])
    bundle.add_run(row, results, curves)
    # a retry's retry_of beside empty cells (read back as floats): a rewrite keeps "5", and a study's trials set
    # again from what was read (a resumed protocol choosing its settings) write the same bytes
    def trials():  # as tuning.trials_table makes them: Python ints beside "" in one column
        return pd.DataFrame([{"trial": 0, "state": "fail", "retry_of": "", "epochs_trained": 3},
                             {"trial": 1, "state": "complete", "retry_of": 0, "epochs_trained": 20}])
    bundle.set_trials("s", trials())
    bundle.set_trials("t", trials())
    bundles.write_bundle(tmp_path / "a", bundle)
    again = bundles.read_bundle(tmp_path / "a")
    again.set_trials("t", trials())  # beside study s's rows, read back with retry_of as floats
    bundles.write_bundle(tmp_path / "b", again)
    assert "\n1,complete,0,20,s\n" in (tmp_path / "b" / bundles.TRIALS).read_text()
    for name in (bundles.RUNS, bundles.RESULTS, bundles.CURVES, bundles.CAMPAIGN, bundles.TRIALS):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert bundles.read_bundle(tmp_path / "a").results["value"].iloc[0] == pytest.approx(0.12345679)


@pytest.mark.parametrize("damage, message", [
    (lambda f: (f / bundles.RESULTS).write_bytes(b"\x1f\x8b garbage"), "not a readable results-bundle table"),
    (lambda f: (f / bundles.RUNS).write_text("run,status\nr,done\n"), "columns"),
    (lambda f: (f / bundles.CAMPAIGN).write_text("{"), "campaign record"),
    (lambda f: (f / bundles.RUNS).write_text((f / bundles.RUNS).read_text().replace(",c,", ",other,")),
     "another campaign"),
])
def test_a_damaged_bundle_is_one_error_line(tmp_path, damage, message):
    bundle = bundles.Bundle({"format": bundles.FORMAT, "campaign": "c", "specs": {}})
    row = {c: "" for c in bundles.RUN_COLUMNS} | {"run": "r", "campaign": "c", "status": "done", "seed": 0,
                                                   "data": "d", "method": "m", "role": "final", "config_digest": "x"}
    bundle.add_run(row, pd.DataFrame(columns=bundles.RESULT_COLUMNS), pd.DataFrame(columns=bundles.CURVE_COLUMNS))
    bundles.write_bundle(tmp_path, bundle)
    damage(tmp_path)
    (tmp_path / "manifest.json").unlink()  # unsealed (an older bundle): the checks after the seal's (test_bundle_seal)
    with pytest.raises(UserError, match=message):
        bundles.read_bundle(tmp_path)


@pytest.mark.parametrize("damage, message", [
    (lambda b: b.results.__setitem__("value", float("nan")), "not finite .first: run r, test nll"),
    (lambda b: b.results.__setitem__("value", float("-inf")), "not finite"),
    (lambda b: b.results.__setitem__("split", "val"), "finished run.s. without test results in results.csv.gz: r"),
    (lambda b: b.campaign["specs"].update({"r": {"digest": "x", "setting": "s1"}, "r2": {"digest": "x",
                                                                                       "setting": "s2"}}),
     "final runs of d/m .draw 1. were trained with 2 different settings"),
])
def test_a_finished_run_whose_numbers_cannot_be_shown_refuses_the_bundle(tmp_path, damage, message):
    """A finished run's results are shown as they are: a non-finite value, a run without test results, or final
    runs of one method and draw under two settings would be a wrong number shown, so the bundle is refused."""
    bundle = bundles.Bundle({"format": bundles.FORMAT, "campaign": "c", "specs": {}})
    for run in ("r", "r2"):
        row = {c: "" for c in bundles.RUN_COLUMNS} | {"run": run, "campaign": "c", "status": "done", "seed": 0,
                                                      "data": "d", "method": "m", "role": "final", "draw": "1",
                                                      "config_digest": "x"}
        results = pd.DataFrame([{"run": run, "split": "test", "task": "mean", "metric": "nll", "value": 0.3}])
        bundle.add_run(row, results, pd.DataFrame(columns=bundles.CURVE_COLUMNS))
    bundles.check_bundle(tmp_path, bundle)  # as written: fine
    damage(bundle)
    with pytest.raises(UserError, match=message):
        bundles.check_bundle(tmp_path, bundle)


@pytest.mark.slow
def test_a_campaign_resumes_from_its_bundle_alone_and_refuses_another_spec(tmp_path):
    """Sweep of 2 tiny runs; then, with the run folders gone (a fresh clone holding only the committed bundle),
    the same command trains nothing and writes the same table; a changed setting is refused naming the run."""
    out = tmp_path / "sweep"
    first = run_sweep(sweep_argv(out))
    assert first.returncode == 0, first.stderr
    table = (out / "sweep.csv").read_text()
    fresh = tmp_path / "fresh"
    shutil.copytree(out / "bundle", fresh / "bundle")
    again = run_sweep(sweep_argv(fresh))
    assert again.returncode == 0, again.stderr
    assert "2 planned (2 in the bundle, 0 finished outside it, 0 to resume, 0 to train)" in again.stdout
    assert not (fresh / "run_00").exists() and (fresh / "sweep.csv").read_text() == table
    changed = run_sweep(sweep_argv(fresh, "train.epochs=3"))
    assert changed.returncode == 2 and changed.stderr.count("\n") == 1
    assert "run run_00 was recorded with config digest" in changed.stderr and "Traceback" not in changed.stderr
    report = subprocess.run([sys.executable, "-m", "mtl_cog.cli.report", "--bundle", str(fresh / "bundle"), "--out",
                             str(tmp_path / "report")], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert report.returncode == 0, report.stderr
    # a sweep's two runs differ in their settings: reported run by run, never pooled into one method's mean
    assert not (tmp_path / "report" / "summary.md").exists()
    runs = pd.read_csv(tmp_path / "report" / "convergence_runs.csv")
    assert sorted(runs["run"]) == ["run_00", "run_01"] and set(runs["role"]) == {"sweep"}


@pytest.mark.slow
def test_a_campaign_killed_at_a_random_point_finishes_with_the_uninterrupted_results(tmp_path):
    whole = tmp_path / "whole"
    assert run_sweep(sweep_argv(whole)).returncode == 0
    killed = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "-m", "mtl_cog.cli.sweep", *sweep_argv(killed)], env=env, cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    time.sleep(random.Random(os.getpid()).uniform(4, 25))  # anywhere from start-up to the second run's end
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    resumed = run_sweep(sweep_argv(killed))
    assert resumed.returncode == 0, resumed.stderr
    for name in (bundles.RESULTS, bundles.CURVES):
        a = gzip.decompress((whole / "bundle" / name).read_bytes())
        b = gzip.decompress((killed / "bundle" / name).read_bytes())
        assert a == b, name
    keep = ["run", "status", "config_digest", "epochs_run", "converged", "val_size", "test_size", "train_size"]
    runs = [pd.read_csv(folder / "bundle" / bundles.RUNS)[keep] for folder in (whole, killed)]
    assert runs[0].equals(runs[1])


@pytest.mark.slow
def test_a_fair_protocol_resumes_its_tuning_from_the_bundle_on_a_fresh_clone(tmp_path, monkeypatch, capsys):
    """The study file is lost with the machine; the bundle's trials are restored into a new study, so no trial
    and no final run trains again, and the same settings are chosen."""
    from mtl_cog.cli import reproduce

    monkeypatch.chdir(tmp_path)
    argv = ["--protocol", "fair", "--budget", "2", "--seeds", "0", "--epochs", "2", "--data", "digits",
            "--method", "cog_fc", "--jobs", "1", "--threads", "1"]
    reproduce.main([*argv, "--out", "first"])
    chosen = pd.read_csv(tmp_path / "first" / "report" / "chosen_settings.csv")
    shutil.copytree(tmp_path / "first" / "bundle", tmp_path / "fresh" / "bundle")
    capsys.readouterr()
    # the dry run sizes what is left before anything is chosen: the final run the bundle records is done, not
    # refused for lacking the tuned settings the dry run cannot know yet
    reproduce.main([*argv, "--out", "fresh", "--dry-run"])
    out = capsys.readouterr().out
    assert "0 still to run" in out and "final runs: 1 planned (1 in the bundle" in out and "0 to train" in out
    reproduce.main([*argv, "--out", "fresh"])
    out = capsys.readouterr().out
    assert "1 already complete, 0 worker(s) to run" in out
    assert "final runs: 1 planned (1 in the bundle, 0 finished outside it, 0 to resume, 0 to train)" in out
    again = pd.read_csv(tmp_path / "fresh" / "report" / "chosen_settings.csv")
    assert again["settings"].tolist() == chosen["settings"].tolist()
    assert not list((tmp_path / "fresh").glob("tuning/*/trial_*"))  # nothing trained


def record_as_done(planned_campaign: campaign.Campaign) -> None:
    """Record the campaign's first run as finished in its bundle (test NLL 0.3), as if it had trained."""
    planned = campaign.plan(planned_campaign)
    row = {c: "" for c in bundles.RUN_COLUMNS} | {**planned[0].spec.labels.row(), "run": planned[0].spec.run,
                                                   "campaign": planned_campaign.name, "status": "done",
                                                   "config_digest": planned[0].digest}
    results = pd.DataFrame([{"run": row["run"], "split": "test", "task": "mean", "metric": "nll", "value": 0.3}])
    campaign.Collector(planned_campaign, planned).update(
        lambda b: b.add_run(row, results, pd.DataFrame(columns=bundles.CURVE_COLUMNS)))


def test_a_rerun_that_would_pool_another_setting_into_an_arm_is_refused(tmp_path):
    """Other seeds under other settings get new run names; the digest check alone would let them in."""
    config = REPO / "configs" / "synthetic" / "cog_ts.yaml"

    def spec(seed, epochs):
        name = campaign.run_name(data="synthetic", method="cog_ts", seed=seed)
        return campaign.RunSpec(name, (config,), (*TINY, f"seed={seed}", f"train.epochs={epochs}"), tmp_path / name,
                                campaign.Labels("synthetic", "cog_ts", "final", seed, "1"))
    record_as_done(campaign.Campaign("c", tmp_path, [spec(0, 2)], command=["x"]))
    assert [p.state for p in campaign.plan(campaign.Campaign("c", tmp_path, [spec(0, 2), spec(1, 2)]))] == [
        campaign.BUNDLED, "new"]  # another seed of the same setting: fine
    with pytest.raises(UserError, match="another setting"):
        campaign.plan(campaign.Campaign("c", tmp_path, [spec(1, 3)]))


def test_a_missing_draw_is_incomplete_not_a_disagreement():
    from mtl_cog.analysis.bundle_answers import verdicts

    paired = pd.DataFrame([{"dataset": "d", "draw": "1", "variant": "a", "counterpart": "b", "metric": "nll",
                            "better": "variant"},
                           {"dataset": "d", "draw": "2", "variant": "a", "counterpart": "b", "metric": "brier",
                            "better": "variant"},
                           {"dataset": "d", "draw": "1", "variant": "a", "counterpart": "b", "metric": "brier",
                            "better": "inconclusive"}])
    table = verdicts(paired).set_index("metric")
    assert table.loc["nll", "status"] == "incomplete" and "draw 2 missing" in table.loc["nll", "answer"]
    assert table.loc["brier", "answer"] == "depends on the tuning draw"


def test_a_bundle_path_that_is_a_file_is_one_error_line(tmp_path):
    (tmp_path / "bundle").write_text("x")
    with pytest.raises(UserError, match="is a file"):
        bundles.read_bundle(tmp_path / "bundle")


def test_the_papers_claims_are_read_from_both_draws_and_an_idle_calibrator_is_not_ranked():
    """claims: per draw, the paired verdict read against the paper's side; both draws alike -> that reading,
    unlike -> 'depends on the tuning draw'; a side without final runs -> incomplete; COG-TS whose temperature
    stayed at the identity -> 'not tested at this budget', whatever its interval says."""
    from mtl_cog.analysis.bundle_answers import DEPENDS, NOT_TESTED, claims

    bundle = bundles.Bundle({"format": bundles.FORMAT, "campaign": "c", "specs": {}})
    # draw 1: COG-FC's NLL lower than the baseline's by 0.01 on every seed (supported); draw 2: higher (contradicted)
    shifts = {("baseline", "1"): 0.0, ("cog_fc", "1"): -0.01, ("baseline", "2"): 0.0, ("cog_fc", "2"): 0.01,
              ("cog_ts", "1"): 0.02, ("cog_ts", "2"): 0.02}
    for (method, draw), shift in shifts.items():
        for seed in (0, 1, 2):
            run = f"d-{method}-d{draw}-seed{seed}"
            row = {c: "" for c in bundles.RUN_COLUMNS} | {
                "run": run, "campaign": "c", "data": "d", "method": method, "role": "final", "draw": draw,
                "seed": seed, "status": "done", "config_digest": "x"}
            results = [{"run": run, "split": "test", "task": task, "metric": metric,
                        "value": base + (shift if metric == "nll" else 0.0) + 0.001 * seed + 0.002 * i}
                       for i, task in enumerate(["a", "mean"]) for metric, base in (("accuracy", 0.9), ("nll", 0.3))]
            if method == "baseline":  # post-hoc TS fitted on it: NLL 0.005 lower
                results += [{**r, "split": "test+ts", "value": r["value"] - (0.005 if r["metric"] == "nll" else 0)}
                            for r in results]
            if method == "cog_ts":  # draw 2's temperature ends at 1.001, within 1 % of the identity; draw 1's moved
                results.append({"run": run, "split": "calibrator", "task": "a", "metric": "temperature",
                                "value": 1.5 if draw == "1" else 1.001})
            bundle.add_run(row, pd.DataFrame(results), pd.DataFrame(columns=bundles.CURVE_COLUMNS))
    table = claims(bundle).set_index(["claim", "metric"])
    fc = table.loc[("COG-FC improves on the baseline", "nll")]
    assert fc["draw 1"].startswith("supported (-0.0100") and fc["draw 2"].startswith("contradicted (+0.0100")
    assert fc["answer"] == DEPENDS
    assert table.loc[("COG-FC improves on the baseline", "accuracy"), "answer"] == "inconclusive at this scale"
    assert table.loc[("COG+LS improves on label smoothing", "nll"), "answer"] == (
        "incomplete (draw 1 missing, draw 2 missing)")  # neither draw has COG+LS or LS
    ts = table.loc[("COG-TS is worse than post-hoc TS", "nll")]
    assert ts["answer"] == NOT_TESTED  # one draw that did not test it is no settled reading
    assert ts["draw 1"].startswith("supported (+0.0250") and ts["draw 2"].startswith(NOT_TESTED)


def test_draw_choices_read_numeric_knobs_only():
    """A leader ratio near 1 brings the flag optim.allow_leader_lr_geq_follower=true into the overrides."""
    from mtl_cog.analysis.tuning_choices import draw_choices

    chosen = pd.DataFrame({"study": ["d-a", "d-a-d2"],
                           "overrides": ["optim.follower_lr=0.03 optim.leader_lr=0.03 "
                                         "optim.allow_leader_lr_geq_follower=true",
                                         "optim.follower_lr=0.01 optim.leader_lr=0.001"]})
    assert draw_choices(chosen).loc[0, "largest_fold"] == pytest.approx(30.0)


def test_draw_choices_set_each_draws_final_choice_side_by_side():
    """The widened re-tuning's choice replaces the one at an edge; a knob more than 2x apart is a change."""
    from mtl_cog.analysis.tuning_choices import draw_choices

    chosen = pd.DataFrame({"study": ["d-a", "d-a-w1", "d-a-d2", "d-b", "d-b-d2", "d-c"],
                           "overrides": ["optim.follower_lr=0.03", "optim.follower_lr=0.05", "optim.follower_lr=0.02",
                                         "optim.follower_lr=0.01 leader_ratio=0.1",
                                         "optim.follower_lr=0.015 leader_ratio=0.12", "optim.follower_lr=0.01"]})
    table = draw_choices(chosen).set_index("study")
    assert table.loc["d-a", "draw 1"] == "optim.follower_lr=0.05"  # the widened study's
    assert table.loc["d-a", "largest_fold"] == pytest.approx(2.5) and table.loc["d-a", "changed"]
    assert table.loc["d-b", "largest_fold"] == pytest.approx(1.5) and not table.loc["d-b", "changed"]
    assert pd.isna(table.loc["d-c", "draw 2"]) and pd.isna(table.loc["d-c", "changed"])


def test_a_pruned_run_records_what_it_trained_so_its_cost_is_counted(tmp_path):
    """A tuning trial stopped after 2 epochs cost 2 epochs: its runs.csv row says so (and scope counts it)."""
    import json

    from mtl_cog.reporting.bundle_report import bundle_tables
    from mtl_cog.runs import rundir

    config = REPO / "configs" / "synthetic" / "cog_ts.yaml"
    run_dir = tmp_path / "trial_00"
    spec = campaign.RunSpec("s-trial_00", (config,), (*TINY, "seed=0"), run_dir,
                            campaign.Labels("synthetic", "cog_ts", "trial", 0, "1", "00"))
    trial = campaign.Campaign("c", tmp_path, [spec], command=["x"])
    planned = campaign.plan(trial)
    run_dir.mkdir()
    (run_dir / rundir.TIMING).write_text("".join(
        json.dumps({"stage": "train", "epoch": e, "seconds": 30.0, "threads": 1, "train_images": 200}) + "\n"
        for e in (1, 2)))
    (run_dir / rundir.METRICS).write_text("".join(json.dumps({"epoch": e, "val": {"nll": 0.5}}) + "\n" for e in (1, 2)))
    collector = campaign.Collector(trial, planned)
    row = collector.unfinished_row(planned[0], "pruned", "pruned after epoch 2")
    assert (row["status"], row["epochs_run"], row["threads"], row["wall_s"]) == ("pruned", 2, "1", 60.0)
    collector.update(lambda b: b.add_run(row, pd.DataFrame(columns=bundles.RESULT_COLUMNS),
                                         pd.DataFrame(columns=bundles.CURVE_COLUMNS)))
    scope = bundle_tables(bundles.read_bundle(tmp_path / "bundle"))["scope"].iloc[0]
    assert scope["pruned"] == 1 and scope["epoch_hours"] == pytest.approx(60 / 3600)
    gone = collector.unfinished_row(dataclasses.replace(planned[0], spec=dataclasses.replace(
        spec, run_dir=tmp_path / "never_started")), "failed", "exit 1")
    assert gone["wall_s"] == "" and gone["epochs_run"] == ""  # nothing trained, nothing counted


def test_a_run_that_ended_as_the_stop_came_is_recorded_before_the_campaign_exits(tmp_path, monkeypatch):
    """SIGINT between a run's end and its recording (its post-hoc fits take seconds): the interrupt records it, so
    the bundle a lane commits at its stop holds every run that finished and a fresh machine trains none again."""
    from mtl_cog.runs import rundir

    config = REPO / "configs" / "synthetic" / "cog_ts.yaml"
    specs = [campaign.RunSpec(f"r{seed}", (config,), (*TINY, f"seed={seed}"), tmp_path / f"r{seed}",
                              campaign.Labels("synthetic", "cog_ts", "final", seed, "1")) for seed in (0, 1)]
    stopped = campaign.Campaign("c", tmp_path, specs, command=["x"])

    def recorded(run_dir, labels, posthoc):  # what run_rows reads of a finished folder, without training one
        results = pd.DataFrame([{"run": labels["run"], "split": "test", "task": "mean", "metric": "nll",
                                 "value": 0.3}])
        return ({c: "" for c in bundles.RUN_COLUMNS} | labels | {"status": "done"}, results,
                pd.DataFrame(columns=bundles.CURVE_COLUMNS), pd.DataFrame(columns=bundles.RELIABILITY_COLUMNS))
    monkeypatch.setattr(campaign, "run_rows", recorded)

    class StoppedAsTheFirstRunEnded:
        def run(self, jobs, on_done):
            specs[0].run_dir.mkdir(parents=True)
            (specs[0].run_dir / rundir.DONE).write_text("")
            raise KeyboardInterrupt  # before on_done(0, 0) recorded it

    with pytest.raises(SystemExit) as stop:
        campaign.run(stopped, campaign.plan(stopped), StoppedAsTheFirstRunEnded(), (), "the same command")
    assert stop.value.code == 130
    assert pd.read_csv(tmp_path / "bundle" / bundles.RUNS)["run"].tolist() == ["r0"]  # r1 never finished
