"""Every results table in docs/ is generated from a committed results bundle and agrees with it."""

import re
from pathlib import Path

import pytest

from mtl_cog.reporting.docs_tables import regenerate_docs

ROOT = Path(__file__).resolve().parents[1]


def test_every_docs_results_table_agrees_with_its_committed_bundle():
    assert regenerate_docs(ROOT, check=True) == []


def test_every_named_bundle_is_committed_with_the_project_or_not_written_yet():
    """A block names a committed bundle, or one whose campaign folder does not exist at all (a lane not started:
    the block reads "Not written yet", which the test above holds it to)."""
    import subprocess

    from mtl_cog.reporting.docs_tables import _blocks, bundles_of

    tracked = set(subprocess.run(["git", "-C", str(ROOT), "ls-files", "results"], capture_output=True, text=True,
                                 check=True).stdout.split())
    for page in [*(ROOT / "docs").rglob("*.md"), ROOT / "README.md"]:
        text = page.read_text()
        prose = "\n".join(line for line in text.splitlines() if not line.startswith("<!-- "))
        for match in _blocks(text, page):
            for bundle in bundles_of(match):
                if (ROOT / bundle).parent.exists():
                    assert f"{bundle}/campaign.json" in tracked, f"{page}: {bundle} is not committed"
                else:  # a campaign to come: its page names its lane in prose too, so a misspelt marker stands out
                    campaign = Path(bundle).parent.name
                    assert f"`{campaign}`" in prose, f"{page}: {bundle} is not written and `{campaign}` is not named"


def test_a_table_that_drifts_from_its_bundle_is_found(tmp_path):
    import shutil

    from test_campaign import write_tiny_bundle

    write_tiny_bundle(tmp_path / "results" / "c" / "bundle")
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "r.md"
    page.write_text("x\n<!-- bundle-table: results/c/bundle summary -->\nold\n<!-- /bundle-table -->\n")
    assert regenerate_docs(tmp_path, check=True) == ["docs/r.md: summary of results/c/bundle"]
    assert regenerate_docs(tmp_path) and regenerate_docs(tmp_path, check=True) == []
    assert re.search(r"\| cog_ts \|", page.read_text())
    shutil.rmtree(tmp_path / "results")


def test_a_table_whose_runs_have_not_finished_reads_pending_and_an_unknown_one_is_refused(tmp_path):
    import pytest
    from test_campaign import write_tiny_bundle

    from mtl_cog.errors import UserError
    from mtl_cog.reporting.docs_tables import PENDING

    write_tiny_bundle(tmp_path / "results" / "c" / "bundle")  # final runs only: no curve, no tuning
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "r.md"
    page.write_text("<!-- bundle-table: results/c/bundle curve -->\nold\n<!-- /bundle-table -->\n")
    assert regenerate_docs(tmp_path, check=True) == ["docs/r.md: curve of results/c/bundle"]
    regenerate_docs(tmp_path)
    assert page.read_text() == f"<!-- bundle-table: results/c/bundle curve -->\n{PENDING}\n<!-- /bundle-table -->\n"
    assert regenerate_docs(tmp_path, check=True) == []
    page.write_text("<!-- bundle-table: results/c/bundle sumary -->\nold\n<!-- /bundle-table -->\n")
    with pytest.raises(UserError, match="names no table 'sumary'"):
        regenerate_docs(tmp_path)


def write_curve_bundle(folder: Path, ratios=(0.01, 1.0)) -> None:
    """A curve bundle: cog_fc at ``ratios`` and the baseline reference (no ratio), seeds 0-2, two tasks."""
    import pandas as pd

    from mtl_cog.bundles import bundle as bundles

    bundle = bundles.Bundle({"format": bundles.FORMAT, "campaign": "k", "specs": {},
                             "counterparts": {"cog_fc": "baseline"}})
    for method, ratio in [("baseline", None), *(("cog_fc", r) for r in ratios)]:
        for seed in (0, 1, 2):
            run = f"synthetic-{method}" + ("" if ratio is None else f"-r{ratio:g}") + f"-seed{seed}"
            row = {c: "" for c in bundles.RUN_COLUMNS} | {
                "run": run, "campaign": "k", "data": "synthetic", "method": method, "role": "curve", "draw": "1",
                "ratio": "" if ratio is None else ratio, "seed": seed, "status": "done", "config_digest": "x"}
            shift = 0.0 if ratio is None else -0.02 * (1 - ratio)
            results = pd.DataFrame([{"run": run, "split": split, "task": task, "metric": metric,
                                     "value": base + shift + 0.003 * seed + 0.002 * i}
                                    for split in ("val", "test") for i, task in enumerate(["a", "b", "mean"])
                                    for metric, base in (("accuracy", 0.9), ("nll", 0.3), ("brier", 0.1),
                                                         ("ece@15", 0.02), ("smece", 0.02))])
            bundle.add_run(row, results, pd.DataFrame(columns=bundles.CURVE_COLUMNS))
    bundles.write_bundle(folder, bundle)


FIGURE_BLOCK = ("<!-- bundle-figure: results/k/bundle curve figures/k_nll.svg where metric == 'nll' -->\n{body}"
                "<!-- /bundle-figure -->\n")


def test_a_figure_is_drawn_from_its_bundle_and_a_drifted_one_is_found(tmp_path):
    import xml.etree.ElementTree as ElementTree

    write_curve_bundle(tmp_path / "results" / "k" / "bundle")
    (tmp_path / "docs").mkdir()
    page, svg = tmp_path / "docs" / "r.md", tmp_path / "docs" / "figures" / "k_nll.svg"
    page.write_text("x\n" + FIGURE_BLOCK.format(body="old\n"))
    assert regenerate_docs(tmp_path, check=True) == ["docs/r.md: figure figures/k_nll.svg of results/k/bundle"]
    assert not svg.exists()  # check mode writes nothing
    regenerate_docs(tmp_path)
    assert "](figures/k_nll.svg)\n<!-- /bundle-figure -->" in page.read_text()
    root = ElementTree.fromstring(svg.read_text())  # one well-formed SVG with its own style: shown as an image
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    # the title is longer than the 560 px figure holds on one line (~7 px a character): it wraps, all of it shown,
    # and the axes start below its last line
    title = [t for t in root.iter("{http://www.w3.org/2000/svg}text") if t.get("class") == "t"]
    full = "synthetic: test NLL, mean over 3 seeds, 95 % interval (dashed: references)"
    assert " ".join(t.text for t in title) == full
    assert len(title) == 2 and all(58 + 7 * len(t.text) <= 560 for t in title)
    frame_top = float(root.find("{http://www.w3.org/2000/svg}rect[@class='frame']").get("y"))
    assert frame_top > float(title[-1].get("y")) + 5
    assert "cog_fc" in texts and "baseline" in texts  # the legend
    assert root.find("{http://www.w3.org/2000/svg}style") is not None
    circles = root.findall(".//{http://www.w3.org/2000/svg}circle")
    tips = sorted(c.find("{http://www.w3.org/2000/svg}title").text for c in circles)
    # the plotted means are the curve table's: cog_fc at 0.01 = 0.3 - 0.0198 + seed mean 0.003 + task mean 0.001
    assert tips == ["cog_fc: 0.2842 at 0.01", "cog_fc: 0.304 at 1"]
    assert regenerate_docs(tmp_path, check=True) == []
    first = svg.read_text()
    regenerate_docs(tmp_path)
    assert svg.read_text() == first  # the same bundle makes the same bytes
    svg.write_text(first.replace("cog_fc", "cog_xx"))
    assert regenerate_docs(tmp_path, check=True) == ["docs/r.md: figure figures/k_nll.svg of results/k/bundle"]
    regenerate_docs(tmp_path)
    assert svg.read_text() == first


def test_a_figure_whose_runs_are_gone_reads_pending_and_its_file_is_removed(tmp_path):
    from mtl_cog.bundles.bundle import read_bundle
    from mtl_cog.reporting.bundle_report import bundle_tables
    from mtl_cog.reporting.docs_tables import PENDING_FIGURE, figures_on, pages_naming

    write_curve_bundle(tmp_path / "results" / "k" / "bundle", ratios=())  # the references alone: no curve yet
    (tmp_path / "docs" / "figures").mkdir(parents=True)
    page, svg = tmp_path / "docs" / "r.md", tmp_path / "docs" / "figures" / "k_nll.svg"
    page.write_text(FIGURE_BLOCK.format(body="![old](figures/k_nll.svg)\n"))
    svg.write_text("<svg/>")
    assert pages_naming(tmp_path, "results/k/bundle") == [page]
    assert figures_on(tmp_path, [page]) == [svg.resolve()]
    regenerate_docs(tmp_path)
    assert page.read_text() == FIGURE_BLOCK.format(body=PENDING_FIGURE + "\n") and not svg.exists()
    assert regenerate_docs(tmp_path, check=True) == []
    # the report of such a bundle (a curve lane records its reused references first) has the curve, no pairs yet
    tables = bundle_tables(read_bundle(tmp_path / "results" / "k" / "bundle"))
    assert set(tables["curve"]["arm"]) == {"baseline"} and "curve_paired" not in tables


@pytest.mark.parametrize("head, message", [
    ("results/k/bundle curve ../../outside.svg where metric == 'nll'", "must be an .svg under docs/"),
    ("results/k/bundle curve /tmp/abs.svg where metric == 'nll'", "must be an .svg under docs/"),
    ("results/k/bundle curve figures/k.png where metric == 'nll'", "must be an .svg under docs/"),
    ("results/k/bundle curve figures/k.svg", "selects 5 values of metric"),
    ("results/k/bundle summary figures/k.svg", "bundle-figure names no table 'summary'"),
    # a campaign folder that exists without a readable bundle (one whose folder is missing reads "Not written yet")
    ("results/k/nobundle curve figures/k.svg", "bundle-figure names results/k/nobundle, which holds no"),
])
def test_a_figure_block_that_cannot_be_drawn_is_one_error_and_nothing_is_written(tmp_path, head, message):
    from mtl_cog.errors import UserError

    write_curve_bundle(tmp_path / "results" / "k" / "bundle")
    (tmp_path / "docs").mkdir()
    page, earlier = tmp_path / "docs" / "r.md", tmp_path / "docs" / "a.md"
    earlier.write_text(FIGURE_BLOCK.format(body="old\n"))  # a good block on a page read first: not drawn either
    text = f"<!-- bundle-figure: {head} -->\nold\n<!-- /bundle-figure -->\n"
    page.write_text(text)
    with pytest.raises(UserError, match=re.escape(message)):
        regenerate_docs(tmp_path)
    assert page.read_text() == text and earlier.read_text() == FIGURE_BLOCK.format(body="old\n")
    assert sorted(p.name for p in tmp_path.rglob("*.svg")) == []


def test_a_figure_file_drawn_by_two_blocks_or_leading_elsewhere_is_refused(tmp_path):
    from mtl_cog.errors import UserError

    write_curve_bundle(tmp_path / "results" / "k" / "bundle")
    (tmp_path / "docs" / "figures").mkdir(parents=True)
    page = tmp_path / "docs" / "r.md"
    page.write_text(FIGURE_BLOCK.format(body="x\n") + FIGURE_BLOCK.replace("'nll'", "'brier'").format(body="x\n"))
    with pytest.raises(UserError, match="is drawn by two blocks"):
        regenerate_docs(tmp_path)
    victim = tmp_path / "docs" / "victim.md"
    victim.write_text("a page\n")
    (tmp_path / "docs" / "figures" / "k_nll.svg").symlink_to(victim)
    page.write_text(FIGURE_BLOCK.format(body="x\n"))
    with pytest.raises(UserError, match="must be an .svg under docs/"):
        regenerate_docs(tmp_path)
    assert victim.read_text() == "a page\n"


def test_a_figure_of_one_seed_says_it_has_no_interval(tmp_path):
    import pandas as pd

    from mtl_cog.reporting.docs_tables import figure_svg

    frame = pd.DataFrame([{"arm": "cog_fc", "ratio": r, "metric": "nll", "mean": 0.3, "ci_low": float("nan"),
                           "ci_high": float("nan"), "n_seeds": 1, "n_tasks": 2, "data": "d"} for r in (0.1, 1.0)])
    assert "d: test NLL, one seed, no interval (dashed: references)" in figure_svg(frame, Path("p.md"), "curve")
    assert figure_svg(frame.assign(mean=float("nan")), Path("p.md"), "curve") is None  # nothing finite to draw
