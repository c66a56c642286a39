"""The documentation site (mkdocs.yml) builds with ``mkdocs build --strict``, offline, with API reference and search.

The build takes about 15 s on 2 busy cores, so it is not marked slow: CI builds the site on every run. Strict mode
turns every warning into a failure: a broken link or anchor, a page missing from the nav, a docstring the API
reference cannot render.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
SECTIONS = ("tutorials", "guides", "reference", "explanation", "results")  # the Diátaxis folders, plus results
# what the API reference must render from the docstrings (issue 46's list): the public API a user calls
API_OBJECTS = ("mtl_cog.runs.trained.load_run", "mtl_cog.runs.trained.TrainedRun.predict_proba",
               "mtl_cog.evaluation.posthoc.POSTHOC", "mtl_cog.evaluation.posthoc.PosthocCalibrator",
               "mtl_cog.data.shift.corrupt", "mtl_cog.data.task_api.TaskSpec", "mtl_cog.data.task_api.Task",
               "mtl_cog.bundles.bundle.read_bundle", "mtl_cog.cog.Calibrated", "mtl_cog.cog.parameter_groups")


def mkdocs_build(config: Path, out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's notice about its successor, not a warning of ours
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config),
                           "-d", str(out)], capture_output=True, text=True, env=env, timeout=600, cwd=config.parent)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = mkdocs_build(REPO / "mkdocs.yml", out)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    return out


def nav_pages(nav) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    return [page for item in nav for page in nav_pages(item)]


def test_every_page_sits_in_a_section_and_in_the_nav():
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    outside = [p for p in pages if p != "README.md" and p.split("/")[0] not in SECTIONS]
    assert outside == [], f"pages outside {SECTIONS}: move them into one"
    nav = nav_pages(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"])
    assert sorted(nav) == pages, "mkdocs.yml's nav and docs/ disagree"


def test_the_site_builds_strictly_with_the_api_reference(site):
    api = (site / "reference" / "api.html").read_text()
    missing = [name for name in API_OBJECTS if f'id="{name}"' not in api]
    assert missing == []
    from mtl_cog.runs.trained import load_run  # its docstring, rendered: the page is generated, not written

    assert load_run.__doc__.split("(")[0].strip() in api
    for page in ("index.html", "tutorials/first_comparison.html", "guides/python_api.html", "results/real_images.html"):
        assert (site / page).is_file(), page


def test_search_works_offline(site):
    """The offline plugin inlines the search index as a script (a browser fetches no JSON from a file:// page),
    and no page asks a server for fonts or scripts."""
    index = (site / "search" / "search_index.js").read_text()
    assert "predict_proba" in index and "corrupt" in index
    remote = re.compile(r'<(?:script|link)[^>]+(?:src|href)="(https?:)?//', re.I)
    fetching = [str(p.relative_to(site)) for p in site.rglob("*.html") if remote.search(p.read_text())]
    assert fetching == []


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install -y chromium)")
def test_search_finds_pages_in_a_browser_opened_from_disk(site, tmp_path):
    """Material reads ``?q=`` as a search: from file://, with no network, the results list must fill."""
    page = (site / "guides" / "training.html").as_uri() + "?q=predict_proba"
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=8000", "--dump-dom",
                           page], capture_output=True, text=True, timeout=120)
    found = re.search(r'md-search-result__meta">(\d+) matching document', done.stdout)
    assert found and int(found.group(1)) >= 1, done.stdout[-2000:]


def test_a_broken_link_fails_the_strict_build(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\nSee [the guide](guides/missing.md).\n")
    (tmp_path / "mkdocs.yml").write_text("site_name: t\ntheme:\n  name: material\n  font: false\n")
    done = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0 and "guides/missing.md" in done.stdout + done.stderr
