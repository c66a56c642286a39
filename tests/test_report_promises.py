"""report.html keeps what docs/guides/comparing.md promises (issue 46, item 8).

The sections the guide lists, 13+ methods told apart (colour-blind-safe colour, marker, dash), the task
picker worst first with a filter, headers sortable from the keyboard, every summary column inside 1,400 px,
each command's last line naming its report.html, and the bundle's reliability histograms
(``reliability.csv.gz``): read back exactly, drawn by ``report --bundle``, small enough to commit. The
browser checks run the page's own script in headless Chromium (skipped, with the reason, without it).
"""

from __future__ import annotations

import gzip
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_bundle_answers import make_bundle
from test_html_report import CHROMIUM, read_page, synthetic_tables, write_comparison_runs

from mtl_cog.bundles import bundle as bundles
from mtl_cog.bundles.bundle_reliability import BINS, RELIABILITY, diagram_bins, reliability_rows
from mtl_cog.cli import compare, report
from mtl_cog.constants import MISSING_LABEL
from mtl_cog.errors import UserError
from mtl_cog.evaluation.binning import reliability_bins
from mtl_cog.evaluation.predictions import Predictions
from mtl_cog.reporting.html_report import ALL_TASKS, report_html, write_html_report
from mtl_cog.reporting.plots import calibration_inputs, method_styles, pareto_figure
from mtl_cog.reporting.plots.common import PALETTE

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs" / "guides" / "comparing.md"
THIRTEEN = [f"method_{i:02d}" for i in range(13)]


def thirteen_method_tables():
    """The issue's worst case: 40 tasks, 13 methods with long names, every summary metric filled."""
    tables = synthetic_tables(tasks=40, methods=13)
    rename = {f"m{i}": f"cog_ts+ts_variant_{i:02d}" for i in range(13)}
    for frame in (tables.summary, tables.per_task, tables.reliability, tables.curves, tables.shift):
        frame["method"] = frame["method"].map(rename)
    for metric in ("rmsce@15", "mce@15", "adaece@15", "classwise_ece@15", "aurc", "nf_ece@15", "prob_error"):
        tables.summary[metric], tables.summary[f"{metric}_std"] = 0.1234, 0.0123
    return tables


def promised_sections() -> list[str]:
    """The section headings the guide's list names (``**Heading**`` items after "report.html shows")."""
    text = GUIDE.read_text()
    block = text[text.index("report.html shows, per data set"):].split("\n\n")[0]
    return [" ".join(name.split()) for name in re.findall(r"\*\*([^*]+)\*\*", block)]


def test_the_report_has_every_section_the_guide_lists(tmp_path):
    sections = promised_sections()
    assert {"Summary", "Pareto fronts", "Worst tasks", "Per-task ECE", "Per task"} <= set(sections)
    tables = synthetic_tables(tasks=6, methods=4)  # every section's table filled
    tables.calibrators = pd.DataFrame([{"dataset": "d", "method": "m1", "seed": 0, "parameter": "temperature",
                                        "task": f"attr{t:02d}", "last_epoch_value": 1.2 + 0.01 * t,
                                        "calibrator_at_identity": False} for t in range(6)])
    tables.subgroups = pd.DataFrame([{"dataset": "d", "method": m, "seed": 0, "group": "g", "value": v,
                                      "task": "attr00", "n": 50, "ece@15": 0.05} for m in ("m0", "m1") for v in "ab"])
    page = read_page(write_html_report(tmp_path / "report.html", tables))
    missing = [s for s in sections if not any(h == s or h.startswith(s + " ") for h in page.headings)]
    assert missing == [], f"the guide promises {missing}, the page has {page.headings}"


def test_thirteen_methods_differ_in_colour_marker_and_dash():
    styles = method_styles(THIRTEEN)
    keys = [(s.color, s.marker, s.dash) for s in styles.values()]
    assert len(set(keys)) == 13 and len({(s.color, s.marker) for s in styles.values()}) == 13
    assert {s.color for s in styles.values()} <= set(PALETTE) and "#F0E442" not in PALETTE  # no yellow line
    ordered = [styles[m] for m in sorted(THIRTEEN)]
    assert all(a.color != b.color and a.marker != b.marker for a, b in zip(ordered, ordered[1:]))
    assert len({s.dash for s in styles.values()}) >= 2  # the 8th method on is dashed: colour repeats, line differs
    assert len({(s.color, s.marker) for s in method_styles([f"m{i}" for i in range(42)]).values()}) == 42


def test_the_figures_and_the_page_draw_each_method_in_its_own_style(tmp_path):
    summary = pd.DataFrame({"dataset": "d", "method": THIRTEEN, "accuracy": np.linspace(0.8, 0.9, 13),
                            "nll": np.linspace(0.5, 0.3, 13), "brier": np.linspace(0.3, 0.2, 13)})
    figure = pareto_figure(summary, "d")
    handles, labels = figure.axes[0].get_legend_handles_labels()
    drawn = {label: (h.lines[0].get_color(), h.lines[0].get_marker()) for h, label in zip(handles, labels)
             if label in THIRTEEN}
    assert len(set(drawn.values())) == 13
    html = report_html(thirteen_method_tables())
    legend = re.search(r'<div class="legend">(.*?)</div>', html).group(1)
    keys = re.findall(r"<span><svg[^>]*>(.*?)</svg>", legend)  # each key: line (colour, dash) and marker
    assert len(keys) == 13 and len(set(keys)) == 13


def test_headers_are_focusable_and_the_summary_says_how_it_is_sorted():
    html = report_html(thirteen_method_tables())
    headers = re.findall(r"<th(?: [^>]*)?>", html)  # every header cell (not <thead>)
    assert headers and all('tabindex="0"' in h and 'scope="col"' in h for h in headers)
    summary_head = re.search(r'<table class="sortable summary"><thead>(.*?)</thead>', html).group(1)
    assert re.findall(r'<th[^>]*aria-sort="ascending"[^>]*>([^<]*)', summary_head) == ["avg rank ↓"]
    names = re.findall(r"<th[^>]*>(.*?)</th>", summary_head)
    assert names[:2] == ["method", "avg rank ↓"]  # next to the method, never off to the right
    assert '"keydown"' in html and 'event.key === "Enter"' in html and 'event.key === " "' in html


def test_the_picker_lists_tasks_worst_first_with_their_scores_and_a_filter():
    tables = synthetic_tables(tasks=12, methods=3)
    html = report_html(tables)
    picker = re.search(r'<select class="task"[^>]*>(.*?)</select>', html).group(1)
    options = re.findall(r'<option value="([^"]*)" data-m="([^"]*)"', picker)
    ece = tables.per_task.groupby("task")["ece@15"].mean().sort_values(ascending=False)
    assert [t for t, _ in options] == [ALL_TASKS, *ece.index]  # the pool first, then the worst ECE first
    first = dict(options)[ece.index[0]].split()
    assert float(first[0]) == pytest.approx(ece.iloc[0], rel=1e-5)
    assert 'class="filter"' in html and 'aria-label="order of the tasks"' in html
    assert re.findall(r'<select class="order"[^>]*>(.*?)</select>', html)[0].count("<option") == 6  # 5 metrics, name


def histograms_of(predictions: Predictions, run: str = "r") -> pd.DataFrame:
    return reliability_rows(predictions, "test", run)


def random_predictions(rng, tasks: int = 3, n: int = 700, multiclass: bool = True) -> Predictions:
    labels, logits = [], []
    for t in range(tasks):
        if multiclass and t == tasks - 1:
            labels.append(rng.integers(0, 4, n))
            logits.append(rng.normal(0, 2, (n, 4)))
        else:
            labels.append(rng.integers(0, 2, n))
            logits.append(rng.normal(0, 2.5, n))
    labels[0][:25] = MISSING_LABEL  # partly labelled: unlabelled rows are never binned
    return Predictions([f"t{t}" for t in range(tasks)], logits, labels)


def test_histograms_round_trip_through_the_bundle_and_match_the_diagrams_of_the_predictions(tmp_path):
    rng = np.random.default_rng(3)
    seeds = [random_predictions(rng) for _ in range(2)]
    bundle = bundles.Bundle({"format": bundles.FORMAT, "campaign": "c", "specs": {}})
    for seed, predictions in enumerate(seeds):
        row = {c: "" for c in bundles.RUN_COLUMNS} | {"run": f"r{seed}", "campaign": "c", "status": "done",
                                                      "seed": seed, "data": "d", "method": "m", "role": "final",
                                                      "config_digest": "x"}
        results = pd.DataFrame([{"run": f"r{seed}", "split": "test", "task": "mean", "metric": "nll", "value": 0.3}])
        bundle.add_run(row, results, pd.DataFrame(columns=bundles.CURVE_COLUMNS), histograms_of(predictions))
    bundles.write_bundle(tmp_path / "a", bundle)
    bundles.write_bundle(tmp_path / "b", bundles.read_bundle(tmp_path / "a"))
    assert (tmp_path / "a" / RELIABILITY).read_bytes() == (tmp_path / "b" / RELIABILITY).read_bytes()  # same bytes
    with gzip.open(tmp_path / "a" / RELIABILITY, "rt") as handle:
        assert handle.readline().strip() == "run,split,task,count,confidence_sum,outcome_sum,truth_sum"
    back = bundles.read_bundle(tmp_path / "a").reliability.merge(bundle.runs[["run", "data", "method"]], on="run")
    drawn = diagram_bins(back, ["data", "method"], ALL_TASKS)
    for index, task in enumerate(["t0", "t1", "t2", ALL_TASKS]):
        pooled = [index] if task != ALL_TASKS else [0, 1, 2]
        known = [(p, t, p.labels[t] != MISSING_LABEL) for p in seeds for t in pooled]
        parts = [calibration_inputs(p.logits[t][mask], p.labels[t][mask]) for p, t, mask in known]
        expected = reliability_bins(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                                    BINS)
        mine = drawn[drawn["task"] == task].sort_values("bin")
        assert np.array_equal(mine["count"].to_numpy(), expected["count"])
        assert np.allclose(mine["frequency"], expected["frequency"], equal_nan=True)
        assert np.allclose(mine["mean_confidence"], expected["mean_confidence"], atol=1e-5, equal_nan=True)
    assert int(drawn.loc[drawn["task"] == "t0", "count"].sum()) == 2 * (700 - 25)


def test_a_bin_that_is_no_histogram_is_one_error_line(tmp_path):
    bundle = make_bundle()
    rows = histograms_of(random_predictions(np.random.default_rng(0), tasks=2, multiclass=False),
                         bundle.runs["run"].iloc[0])
    counts = rows.at[0, "count"].split()
    rows.at[0, "confidence_sum"] = " ".join(str(int(c) + 5) for c in counts)  # more confidence than predictions
    bundle.reliability = rows
    bundles.write_bundle(tmp_path, bundle)
    with pytest.raises(UserError, match=r"reliability.csv.gz: run .*: a bin's sum lies outside \[0, its count\]"):
        bundles.read_bundle(tmp_path)


def pessimistic_bundle(runs: int = 100, tasks: int = 40, n: int = 2000) -> bundles.Bundle:
    """``runs`` final runs of ``tasks`` binary tasks with the rows a campaign keeps: results (val and test, five
    metrics per task and the mean), 20 epochs of curves and every task's histogram, probabilities spread over all
    20 bins (the most bytes a histogram takes)."""
    rng = np.random.default_rng(0)
    bundle = bundles.Bundle({"format": bundles.FORMAT, "campaign": "c", "specs": {}})
    names = [f"attr{t:02d}" for t in range(tasks)]
    for i in range(runs):
        run = f"fashion_mosaic-cog_ts-d1-seed{i}"
        row = {c: "" for c in bundles.RUN_COLUMNS} | {"run": run, "campaign": "c", "status": "done", "seed": i,
                                                      "data": "d", "method": "m", "role": "final", "config_digest": "x"}
        results = pd.DataFrame([{"run": run, "split": split, "task": task, "metric": metric, "value": rng.random()}
                                for split in ("val", "test") for task in [*names, "mean"]
                                for metric in ("accuracy", "nll", "brier", "ece@15", "smece")])
        curves = pd.DataFrame([{"run": run, "epoch": e, "split": "val", "metric": m, "value": rng.random()}
                               for e in range(1, 21) for m in ("nll", "accuracy", "ece@15")])
        labels = [rng.integers(0, 2, n) for _ in names]
        logits = [np.where(y == 1, 1, -1) * rng.gamma(2.0, 1.5, n) + rng.normal(0, 1.5, n) for y in labels]
        bundle.add_run(row, results, curves, histograms_of(Predictions(names, logits, labels), run))
    return bundle


def test_a_bundle_of_100_40_task_runs_stays_under_1_mb(tmp_path):
    bundles.write_bundle(tmp_path, pessimistic_bundle())
    sizes = {p.name: p.stat().st_size for p in tmp_path.iterdir()}
    assert sizes[RELIABILITY] < 600_000, sizes  # about 5 kB a run at most
    assert sum(sizes.values()) < 1_000_000, sizes


def test_report_bundle_draws_reliability_diagrams_and_names_its_page_last(tmp_path, capsys):
    bundle = make_bundle()
    rng = np.random.default_rng(1)
    bundle.reliability = pd.concat([histograms_of(Predictions(["a", "b"], [rng.normal(0, 2, 300) for _ in "ab"],
                                                              [rng.integers(0, 2, 300) for _ in "ab"]), run)
                                    for run in bundle.done()["run"]], ignore_index=True)
    bundles.write_bundle(tmp_path / "bundle", bundle)
    report.main(["--bundle", str(tmp_path / "bundle"), "--out", str(tmp_path / "report")])
    page = tmp_path / "report" / "report.html"
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"wrote {page}"
    html = page.read_text()
    assert html.count('<svg class="rel"') >= 3 * 3 * 2  # 3 methods x 3 tasks (a, b, pooled) x 2 draws
    assert "none for baseline+ts" in html  # post-hoc rows: said once, not drawn


def test_an_old_bundle_without_histograms_still_reports_and_says_so_once(tmp_path, capsys):
    bundles.write_bundle(tmp_path / "bundle", make_bundle())
    report.main(["--bundle", str(tmp_path / "bundle"), "--out", str(tmp_path / "report")])
    html = (tmp_path / "report" / "report.html").read_text()
    assert '<svg class="rel"' not in html and html.count("keeps no reliability histograms") == 1
    assert {"Summary", "Per task"} <= set(read_page(tmp_path / "report" / "report.html").headings)


def test_compare_names_its_report_html_on_its_last_line(tmp_path, capsys):
    runs = write_comparison_runs(tmp_path / "runs", ["baseline", "cog_ts"], tasks=3, seeds=(0,), n=120)
    out = compare.main([str(runs), "--out", str(tmp_path / "report")])
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"wrote {out / 'report.html'}"
    headings = read_page(out / "report.html").headings
    assert {"Pareto fronts", "Worst tasks", "Per-task ECE", "Per task"} <= set(headings)


# ------------------------------------------------------------------------------------------- in a real browser


def run_in_chromium(page: Path, probe: str, tmp_path: Path) -> str:
    """The DOM after the page's script and then ``probe`` ran (appended as one more script) at 1,400 px."""
    probed = tmp_path / f"probed_{page.name}"
    probed.write_text(page.read_text().replace("</body>", f"<script>{probe}</script></body>"))
    result = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                             "--no-first-run", "--disable-background-networking", "--disable-component-update",
                             "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,1000",
                             "--hide-scrollbars", "--dump-dom", probed.as_uri()],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def probe_result(dom: str) -> str:
    match = re.search(r'data-probe="([^"]*)"', dom)
    assert match, "the probe did not run"
    return match.group(1).replace("&amp;", "&").replace("&quot;", '"')


needs_chromium = pytest.mark.skipif(CHROMIUM is None or shutil.which(CHROMIUM) is None,
                                    reason="chromium is not installed (Debian: apt-get install -y chromium)")


@pytest.mark.slow
@needs_chromium
def test_in_chromium_every_summary_column_is_inside_1400_px(tmp_path):
    page = write_html_report(tmp_path / "report.html", thirteen_method_tables())
    dom = run_in_chromium(page, """
      var heads = document.querySelectorAll("table.summary thead th");
      var out = [];
      heads.forEach(function (th) { var r = th.getBoundingClientRect();
        if (r.right > window.innerWidth || r.left < 0) out.push(th.textContent); });
      document.body.setAttribute("data-probe", heads.length + ":" + out.join("|"));""", tmp_path)
    count, _, outside = probe_result(dom).partition(":")
    assert int(count) == 15 and outside == ""  # method, avg rank, seeds and 12 metrics, none cut off


@pytest.mark.slow
@needs_chromium
def test_in_chromium_enter_sorts_a_column_and_the_picker_filters_and_reorders(tmp_path):
    page = write_html_report(tmp_path / "report.html", synthetic_tables(tasks=12, methods=3))
    dom = run_in_chromium(page, """
      var th = Array.prototype.filter.call(document.querySelectorAll("table.summary thead th"),
                                           function (h) { return h.textContent.indexOf("nll") === 0; })[0];
      th.focus();
      th.dispatchEvent(new KeyboardEvent("keydown", {key: "Enter", bubbles: true}));
      var sorted = th.getAttribute("aria-sort");
      th.dispatchEvent(new KeyboardEvent("keydown", {key: " ", bubbles: true}));
      var again = th.getAttribute("aria-sort");
      var view = document.querySelector(".task-view");
      var filter = view.querySelector("input.filter");
      filter.value = "attr1"; filter.dispatchEvent(new Event("input"));
      var kept = Array.prototype.map.call(view.querySelector("select.task").options, function (o) { return o.value; });
      var order = view.querySelector("select.order"); order.value = ""; order.dispatchEvent(new Event("change"));
      var byName = Array.prototype.map.call(view.querySelector("select.task").options,
                                            function (o) { return o.value; });
      document.body.setAttribute("data-probe", [document.activeElement === th, sorted, again, kept.join(","),
        byName.join(","), view.querySelector(".count").textContent].join(";"));""", tmp_path)
    focused, sorted_, again, kept, by_name, count = probe_result(dom).split(";")
    assert focused == "true" and sorted_ == "ascending" and again == "descending"
    assert kept.split(",")[0] == ALL_TASKS and sorted(kept.split(",")[1:]) == ["attr10", "attr11"]
    assert by_name == f"{ALL_TASKS},attr10,attr11" and count == "2 of 12 tasks"


def test_the_guide_names_the_histogram_file_and_its_bins():
    text = GUIDE.read_text()
    assert RELIABILITY in text and "20 " in text and "last line" in text
