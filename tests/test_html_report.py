"""report.html (mtl_cog/reporting/html_report.py): written by compare, self-contained, light, and working in a browser.

The fast tests read the HTML; the slow one opens a 40-task, 10-method comparison in headless Chromium
(Debian's ``chromium`` package; skipped with the reason when it is not installed), checks that the page
renders, logs nothing to the console (an uncaught error would), and that another task in the picker
(``#task=NAME``) shows another diagram. Its screenshot is kept as ``report_screenshot.png`` beside the
report (and copied to ``$MTL_COG_SCREENSHOT`` when set).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_report import write_run

from mtl_cog.cli import compare
from mtl_cog.reporting.html_report import ALL_TASKS, ReportTables, report_html, write_html_report

METHODS = ["baseline", "cog_fc", "cog_ts", "cog_vs", "cog_ms", "ls", "cog_ls", "focal", "mbls", "cog_mbls"]
SIZE_LIMIT = 10 * 2**20  # the bound for a 40-task, 10-method comparison


def write_extras(run: Path, tasks: list[str], method: str, seed: int, epochs: int = 8) -> None:
    """What a trained run adds beyond predictions, in the real formats: metrics.jsonl (validation NLL per epoch,
    COG-TS's temperatures), group_metrics.csv (eval.groups) and shift_metrics.csv (eval.shift)."""
    rng = np.random.default_rng(seed)
    lines = []
    for epoch in range(1, epochs + 1):
        line = {"epoch": epoch, "stage": "stage_one", "train_loss": 1 / epoch,
                "val": {"nll": 0.5 + 0.3 / epoch + 0.01 * seed, "accuracy": 0.7}}
        if method == "cog_ts":
            line["calibrator"] = {"summary": {}, "tasks": {"temperature": {
                t: 1 + 0.05 * epoch * (1 + i % 3) / epochs for i, t in enumerate(tasks)}}}
        lines.append(line)
    lines.append({"epoch": epochs, "final": True, **({"calibrator_at_identity": False} if method == "cog_ts" else {})})
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    cells = [{"group": tasks[0], "value": v, "task": t, "n": 200, "status": "ok", "accuracy": rng.uniform(0.6, 0.8),
              "nll": rng.uniform(0.4, 0.7), "brier": rng.uniform(0.3, 0.5), "ece@15": rng.uniform(0.01, 0.1),
              "smece": rng.uniform(0.01, 0.1)} for v in (0, 1) for t in tasks[1:]]
    pd.DataFrame(cells).to_csv(run / "group_metrics.csv", index=False)
    rows = [{"method": "none", "corruption": "none" if s == 0 else c, "severity": s, "task": task,
             "accuracy": 0.75 - 0.04 * s, "nll": 0.5 + 0.1 * s + 0.01 * seed, "ece@15": 0.03 + 0.02 * s}
            for s in range(6) for c in (["fog", "gaussian_noise"] if s else ["none"]) for task in ["mean", *tasks]]
    pd.DataFrame(rows).to_csv(run / "shift_metrics.csv", index=False)


def write_comparison_runs(root: Path, methods: list[str], tasks: int, seeds=(0, 1), n: int = 400) -> Path:
    for i, method in enumerate(methods):
        for seed in seeds:
            run = write_run(root, f"{method}-{seed}", method, seed, tasks=tasks, n=n, temperature=0.6 + 0.1 * i)
            write_extras(run, [f"attr{t:02d}" for t in range(tasks)], method, seed)
    return root


class Page(HTMLParser):
    """What the checks read from report.html: external references, the task picker's options, the task panels."""

    def __init__(self):
        super().__init__()
        self.external, self.options, self.panels, self.svgs, self.headings = [], [], [], 0, []
        self._heading, self._select = None, None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("src", "href", "xlink:href", "action"):
            if re.match(r"\s*(https?:)?//", attrs.get(key) or ""):
                self.external.append(f"{tag} {key}={attrs[key]}")
        if tag == "select":
            self._select = attrs.get("class")
        if tag == "option" and self._select == "task":  # the task picker's (not its order menu's)
            self.options.append(attrs["value"])
        if tag == "div" and "task-panel" in (attrs.get("class") or ""):
            self.panels.append((attrs["data-task"], "hidden" in attrs))
        self.svgs += tag == "svg"
        self._heading = tag if tag in ("h2", "h3") else None

    def handle_data(self, data):
        if self._heading and data.strip():
            self.headings.append(data.strip())


def read_page(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text())
    return page


def test_compare_writes_a_self_contained_report(tmp_path):
    runs = write_comparison_runs(tmp_path / "runs", ["baseline", "cog_fc", "cog_ts"], tasks=4)
    out = compare.main([str(runs), "--out", str(tmp_path / "report")])
    html = (out / "report.html").read_text()
    page = read_page(out / "report.html")
    assert page.external == [] and "@import" not in html and "url(http" not in html  # opens offline
    assert page.options[0] == ALL_TASKS and sorted(page.options[1:]) == ["attr00", "attr01", "attr02", "attr03"]
    assert [task for task, hidden in page.panels if not hidden] == [ALL_TASKS]  # one panel shown at a time
    assert page.headings[:1] == ["synthetic"] and {"Summary", "COG variants against their counterparts (paired)",
                                                   "Convergence", "Learned calibrators", "Per task", "Subgroups",
                                                   } <= set(page.headings)
    assert any(h.startswith("Under corruption shift") for h in page.headings)
    assert page.svgs >= 3 * 5  # a reliability diagram per method and task (and the pool)
    assert 'class="sortable summary"' in html and "data-report-ready" in html


def synthetic_tables(tasks: int = 40, methods: int = 10, seeds: int = 3, bins: int = 15) -> ReportTables:
    """Every section filled, at the issue's size: 40 tasks x 10 methods."""
    rng = np.random.default_rng(0)
    names = [f"m{i}" for i in range(methods)]
    task_names = [ALL_TASKS, *(f"attr{t:02d}" for t in range(tasks))]
    metrics = {"accuracy": 0.8, "nll": 0.4, "brier": 0.3, f"ece@{bins}": 0.05, "smece": 0.04}
    summary = pd.DataFrame([{"dataset": "d", "method": m, "n_seeds": seeds, "avg_rank": i + 1.0, "top_ranked": i == 0,
                             **{k: v + 0.01 * i for k, v in metrics.items()}, **{f"{k}_std": 0.01 for k in metrics}}
                            for i, m in enumerate(names)])
    per_task = pd.DataFrame([{"dataset": "d", "method": m, "task": t, **{k: v * rng.uniform(0.9, 1.1)
                                                                         for k, v in metrics.items()}}
                             for m in names for t in task_names[1:]])
    reliability = pd.DataFrame([{"dataset": "d", "method": m, "task": t, "bin": b, "n_bins": bins,
                                 "count": int(rng.integers(0, 500)), "mean_confidence": (b + 0.5) / bins,
                                 "frequency": min(1.0, max(0.0, (b + 0.5) / bins + rng.normal(0, 0.05)))}
                                for m in names for t in task_names for b in range(bins)])
    paired = pd.DataFrame([{"dataset": "d", "variant": "m1", "counterpart": "m0", "metric": "nll",
                            "mean_difference": -0.01, "ci_low": -0.02, "ci_high": -0.001, "n_seeds": seeds,
                            "n_tasks": tasks, "better": "variant"}])
    leader = pd.DataFrame([{"dataset": "d", "arm": "m1", "ratio": r, "metric": "nll", "mean": 0.4 + 0.01 * k,
                            "ci_low": 0.39 + 0.01 * k, "ci_high": 0.41 + 0.01 * k, "n_seeds": seeds}
                           for k, r in enumerate([1e-3, 1e-2, 1e-1, 1])] +
                          [{"dataset": "d", "arm": "m0", "ratio": np.nan, "metric": "nll", "mean": 0.42,
                            "ci_low": 0.41, "ci_high": 0.43, "n_seeds": seeds}])
    curves = pd.DataFrame([{"dataset": "d", "method": m, "seed": s, "epoch": e, "split": "val", "metric": "nll",
                            "value": 0.4 + 1 / e} for m in names for s in range(seeds) for e in range(1, 31)])
    shift = pd.DataFrame([{"dataset": "d", "method": m, "seed": s, "severity": v, "accuracy": 0.8 - 0.05 * v,
                           "nll": 0.4 + 0.1 * v, f"ece@{bins}": 0.05 + 0.02 * v}
                          for m in names for s in range(seeds) for v in range(6)])
    return ReportTables(summary=summary, paired=paired, per_task=per_task, reliability=reliability, curves=curves,
                        leader_curve=leader, shift=shift, bins=bins)


def test_a_40_task_10_method_report_stays_light(tmp_path):
    path = write_html_report(tmp_path / "report.html", synthetic_tables())
    size = path.stat().st_size
    page = read_page(path)
    assert size < SIZE_LIMIT, f"report.html is {size / 2**20:.1f} MiB"
    assert len(page.options) == 41 and len(page.panels) == 41 and page.svgs >= 41 * 10
    assert {"Leader curves", "Convergence"} <= set(page.headings)
    assert any(h.startswith("Under corruption shift") for h in page.headings)


def test_a_report_without_a_summary_is_refused():
    with pytest.raises(ValueError, match="summary"):
        report_html(ReportTables(summary=pd.DataFrame()))


def test_a_post_hoc_name_is_explained_where_it_is_shown():
    """"vs" reads as "versus": the legend and the method cell say it is vector scaling; a trained method and an
    unknown suffix are shown as they are."""
    from mtl_cog.reporting.method_titles import method_title

    assert method_title("baseline+vs") == "baseline + post-hoc vector scaling"
    assert method_title("cog_ts") == "cog_ts" and method_title("baseline+nope") == "baseline+nope"
    summary = pd.DataFrame({"dataset": ["d", "d"], "method": ["baseline", "baseline+vs"], "n_seeds": [1, 1],
                            "accuracy": [0.8, 0.8], "nll": [0.3, 0.28], "brier": [0.2, 0.19]})
    page = report_html(ReportTables(summary=summary))
    assert '<td title="baseline + post-hoc vector scaling">baseline+vs' in page
    assert "baseline+vs <i>post-hoc vector scaling</i></span>" in page  # the charts' legend


# ------------------------------------------------------------------------------------------- in a real browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    """Headless Chromium with the page's console on stderr (``--enable-logging=stderr``: one ``CONSOLE`` line per
    message, uncaught errors included)."""
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--enable-logging=stderr", "--v=0", "--allow-file-access-from-files", *args],
                          capture_output=True, text=True, timeout=timeout)


def console_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if ":CONSOLE" in line]


def screenshot_stats(path: Path) -> tuple[float, int]:
    """(share of pixels that are not white, number of distinct colours)."""
    from PIL import Image

    pixels = np.asarray(Image.open(path).convert("RGB")).reshape(-1, 3)
    return float((pixels < 245).any(axis=1).mean()), len(np.unique(pixels[::7], axis=0))


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install -y chromium)")
def test_the_report_renders_in_chromium_and_its_picker_works(tmp_path):
    bad = tmp_path / "bad.html"  # the console capture sees an uncaught error (so the check below can fail)
    bad.write_text("<html><body><script>notDefined();</script></body></html>")
    assert any("Uncaught ReferenceError" in line for line in console_lines(chromium("--dump-dom", bad.as_uri())))

    runs = write_comparison_runs(tmp_path / "runs", METHODS, tasks=40)
    out = compare.main([str(runs), "--out", str(tmp_path / "report")])
    report = out / "report.html"
    assert report.stat().st_size < SIZE_LIMIT
    shown = {}
    for task in ("attr17", "attr03"):
        result = chromium("--dump-dom", f"{report.as_uri()}#task={task}")
        assert result.returncode == 0 and console_lines(result) == [], console_lines(result)
        assert 'data-report-ready="1"' in result.stdout  # the script ran to its end
        views = re.findall(r'<div class="task-view" data-dataset="[^"]*" data-shown="([^"]*)"', result.stdout)
        visible = re.findall(r'<div class="task-panel" data-task="([^"]*)">', result.stdout)  # no hidden attribute
        assert views == [task] and visible == [task]
        shown[task] = out / f"screenshot_{task}.png"
        result = chromium("--window-size=1400,4500", f"--screenshot={shown[task]}", f"{report.as_uri()}#task={task}")
        assert result.returncode == 0 and console_lines(result) == [], console_lines(result)
    inked, colours = screenshot_stats(shown["attr17"])
    assert inked > 0.05 and colours > 20, (inked, colours)  # tables, bars and text drawn, not a blank page
    assert shown["attr17"].read_bytes() != shown["attr03"].read_bytes()  # another task, other diagrams
    shutil.copy(shown["attr17"], out / "report_screenshot.png")
    if os.environ.get("MTL_COG_SCREENSHOT"):
        shutil.copy(shown["attr17"], os.environ["MTL_COG_SCREENSHOT"])
