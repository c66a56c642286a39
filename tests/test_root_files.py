"""What a research tool ships at its root agrees with pyproject.toml: the licence, the citation, the changelog,
and the README's supported Python versions."""

from __future__ import annotations

import re
from importlib.metadata import metadata
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
META = metadata("mtl_cog")  # pyproject.toml as installed


def test_the_licence_file_is_the_one_pyproject_declares():
    assert META["License"] == "MIT"
    text = (REPO / "LICENSE").read_text()
    assert text.startswith("MIT License") and "Permission is hereby granted, free of charge" in text


def test_the_citation_names_the_paper_and_this_version():
    cff = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["type"] == "software" and cff["authors"]
    assert cff["version"] == META["Version"] and cff["license"] == META["License"]
    paper = cff["preferred-citation"]
    assert paper["title"].startswith("Calibration in One Go") and paper["authors"]
    assert paper["url"] == "https://arxiv.org/abs/2610.13693"


def test_the_changelog_has_this_version():
    text = (REPO / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in text and f"## [{META['Version']}]" in text


def test_the_readme_states_the_python_pyproject_requires():
    oldest = re.fullmatch(r">=(\d+\.\d+)", META["Requires-Python"]).group(1)
    assert f"Python {oldest} or newer" in (REPO / "README.md").read_text()
