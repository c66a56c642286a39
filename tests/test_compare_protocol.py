"""compare.py ranks only comparable runs, counts distinct seeds, writes summary.tex and the calibrator report."""

import re
from pathlib import Path

import pandas as pd
import pytest
import yaml
from test_protocol import write_metrics
from test_report import write_run

from mtl_cog.bundles.run_records import load_runs
from mtl_cog.cli import compare
from mtl_cog.reporting.tables import summary_markdown, summary_table, worst_tasks_line

REPO = Path(__file__).resolve().parents[1]


def _set(run: Path, key: str, value) -> None:
    config = yaml.safe_load((run / "config.yaml").read_text())
    node = config
    *parents, last = key.split(".")
    for part in parents:
        node = node[part]
    node[last] = value
    (run / "config.yaml").write_text(yaml.safe_dump(config))


def test_runs_of_other_epochs_are_set_apart_and_the_report_says_so(tmp_path, capsys):
    runs = tmp_path / "runs"
    for seed in (0, 1):
        write_run(runs, f"base{seed}", "baseline", seed)
        write_run(runs, f"fc{seed}", "cog_fc", seed)
    short = write_run(runs, "fc_short", "cog_fc", 2)
    _set(short, "train.epochs", 5)
    notes: list[str] = []
    records = load_runs([runs], notes)
    assert {r.dataset for r in records} == {"synthetic[epochs=40]", "synthetic[epochs=5]"}
    assert len(notes) == 1 and "fc_short" in notes[0] and "train.epochs" in notes[0]
    out = compare.main([str(runs), "--out", str(tmp_path / "report")])
    summary = pd.read_csv(out / "summary.csv")
    main = summary[summary["dataset"] == "synthetic[epochs=40]"]
    assert set(main["method"]) == {"baseline", "cog_fc"} and (main["n_seeds"] == 2).all()
    text = (out / "summary.md").read_text()
    assert "## Runs set apart" in text and "fc_short" in text
    assert "set apart:" in capsys.readouterr().out


def test_backbone_and_image_size_are_part_of_the_protocol_but_learning_rates_are_not(tmp_path):
    a, b, c = (write_run(tmp_path, name, "baseline", seed) for name, seed in (("a", 0), ("b", 1), ("c", 2)))
    _set(b, "optim.follower_lr", 0.5)  # tuned per method: still comparable
    _set(c, "model.backbone", "resnet18")
    with pytest.warns(UserWarning, match="also differ in optim.follower_lr"):  # said, but not set apart
        records = load_runs([tmp_path])
    labels = {r.run_dir.name: r.dataset for r in records}
    assert labels["a"] == labels["b"] != labels["c"] and "backbone=resnet18" in labels["c"]


def test_plus_minus_only_with_two_distinct_seeds_and_seeds_counted_once(tmp_path):
    for i in range(3):  # three runs, all seed 0
        write_run(tmp_path / "runs", f"same{i}", "baseline", 0)
    for seed in (0, 1):
        write_run(tmp_path / "runs", f"fc{seed}", "cog_fc", seed)
    from mtl_cog.reporting.tables import score_runs

    with pytest.warns(UserWarning, match="share a seed"):
        records = load_runs([tmp_path / "runs"])
    summary = summary_table(score_runs(records, [15])).set_index("method")
    assert summary.loc["baseline", "n_seeds"] == 1 and summary.loc["baseline", "n_runs"] == 3
    assert pd.isna(summary.loc["baseline", "nll_std"]) and summary.loc["cog_fc", "nll_std"] > 0
    text = summary_markdown(summary.reset_index(), 15)
    baseline_row = next(line for line in text.splitlines() if line.startswith("| baseline") or "baseline" in line
                        and line.startswith("| **baseline"))
    assert "±" not in baseline_row and "1 (3 runs)" in baseline_row
    fc_row = next(line for line in text.splitlines() if "cog_fc" in line)
    assert "±" in fc_row and "± 0.0000" not in fc_row.split("|")[3]


def test_summary_tex_is_a_well_formed_booktabs_table(tmp_path):
    runs = tmp_path / "runs"
    for seed in (0, 1):
        write_run(runs, f"base{seed}", "baseline", seed, posthoc=True)
        write_run(runs, f"fc{seed}", "cog_fc", seed)
    out = compare.main([str(runs), "--out", str(tmp_path / "report")])
    tex = (out / "summary.tex").read_text()
    for environment in ("table", "tabular"):
        assert tex.count(f"\\begin{{{environment}}}") == tex.count(f"\\end{{{environment}}}") == 1
    assert tex.index("\\toprule") < tex.index("\\midrule") < tex.index("\\bottomrule")
    body = tex[tex.index("\\midrule") + len("\\midrule"):tex.index("\\bottomrule")].strip().splitlines()
    columns = len(re.search(r"\\begin\{tabular\}\{(\w+)\}", tex).group(1))
    assert len(body) == 4 and all(line.endswith("\\\\") and line.count("&") == columns - 1 for line in body)
    assert "cog\\_fc" in tex and "baseline+ts" in tex and "\\textbf{" in tex
    assert tex.count("{") == tex.count("}")  # braces balance
    assert "_" not in tex.replace("\\_", "")  # no unescaped underscore outside math


def test_compare_reports_the_learned_calibrator_and_flags_one_at_identity(tmp_path):
    runs = tmp_path / "runs"
    for seed in (0, 1):
        write_run(runs, f"base{seed}", "baseline", seed, temperature=0.5, posthoc=True)
        stuck = write_run(runs, f"ts{seed}", "cog_ts", seed)
        write_metrics(stuck, [0.5] * 6, [1.0, 1.0, 1.001, 1.0, 1.002, 1.001], at_identity_flag=True)
        moved = write_run(runs, f"vs{seed}", "cog_vs", seed)
        write_metrics(moved, [0.5, 0.4, 0.35, 0.34, 0.34, 0.34], [1.0, 1.3, 1.5, 1.6, 1.6, 1.6], False)
    out = compare.main([str(runs), "--out", str(tmp_path / "report")])
    table = pd.read_csv(out / "calibrator.csv")
    assert set(table["method"]) == {"cog_ts", "cog_vs"}
    assert table.groupby("method")["calibrator_at_identity"].all().to_dict() == {"cog_ts": True, "cog_vs": False}
    text = (out / "summary.md").read_text()
    ts_line = next(line for line in text.splitlines() if line.startswith("| synthetic | cog_ts | temperature"))
    assert "never left the identity" in ts_line
    assert (out / "calibrator_synthetic.png").is_file()
    paired = pd.read_csv(out / "paired_differences.csv")
    assert set(paired["counterpart"]) == {"baseline+ts"}  # cog_vs's counterpart baseline+vs was not fitted


def test_worst_tasks_line_lists_the_largest_ece_first():
    tasks = {"a": {"ece@15": 0.01}, "b": {"ece@15": 0.2}, "c": {"ece@15": 0.05}, "d": {"ece@15": float("nan")}}
    assert worst_tasks_line(tasks, [5, 15], k=2) == "worst-calibrated tasks (test ECE@15): b 0.2000, c 0.0500"
    assert worst_tasks_line({"digit": {"ece@15": 0.1}}, [15]) == ""  # single task: nothing to rank
    assert worst_tasks_line({"a": {"ece@10": 0.1}, "b": {"ece@10": 0.3}}, [10]).startswith(
        "worst-calibrated tasks (test ECE@10): b")
