"""A lane's inputs, bounded: --every a finite positive number of seconds (30 minutes by default), a name the file
system can hold, and a frozen copy that holds no link leading out of it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_lane import git, repo, run_lane  # noqa: F401 (repo: the fixture)

from mtl_cog.cli import lane
from mtl_cog.errors import UserError


@pytest.mark.parametrize("every", ["nan", "inf", "-inf", "-1", "0"])  # "--every=-inf": not an option
def test_every_is_a_finite_positive_number_of_seconds(every):
    with pytest.raises(UserError, match="finite, positive number of seconds"):
        lane.parse(["--name", "x", f"--every={every}", "--", "scripts/reproduce.py"])


def test_the_default_commits_at_most_every_half_hour():
    assert lane.parse(["--name", "x", "--", "scripts/reproduce.py"]).every == 3600


def test_a_name_longer_than_the_file_system_takes_is_one_error_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mtl_cog.cli.lane", "--name", "a" * 300, "--work", str(tmp_path),
                           "--", "scripts/reproduce.py"], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("error:") == 1 and "Traceback" not in done.stderr
    assert "bytes long; the file system takes at most" in done.stderr


def test_a_committed_link_leading_out_of_the_frozen_copy_is_refused_naming_it(repo, tmp_path):  # noqa: F811
    outside = tmp_path / "live.py"
    outside.write_text("print('the live file ran')\n")
    os.symlink(outside, repo / "scripts" / "campaign_link.py")
    os.symlink("fake_campaign.py", repo / "scripts" / "inside_link.py")  # a link within the copy is fine
    git(repo, "add", "scripts")
    git(repo, "commit", "-q", "-m", "links")
    with pytest.raises(UserError, match="scripts/campaign_link.py in commit is a link to .*live.py, outside"):
        lane.freeze_code(repo, "HEAD", tmp_path / "code")
    (repo / "scripts" / "campaign_link.py").unlink()
    git(repo, "add", "-A", "scripts")
    git(repo, "commit", "-q", "-m", "no outside link")
    lane.freeze_code(repo, "HEAD", tmp_path / "code")
    assert (tmp_path / "code" / "scripts" / "inside_link.py").read_text() == \
        (repo / "scripts" / "fake_campaign.py").read_text()


def test_the_lane_refuses_it_in_one_line_before_the_campaign_runs(repo, tmp_path):  # noqa: F811
    os.symlink(tmp_path / "elsewhere.py", repo / "scripts" / "campaign_link.py")
    git(repo, "add", "scripts")
    git(repo, "commit", "-q", "-m", "a link out")
    done = run_lane(repo, tmp_path / "w", "1", "a", "0")
    assert done.returncode == 2 and done.stderr.count("error:") == 1, done.stderr
    assert "campaign_link.py in commit is a link to" in done.stderr and not (tmp_path / "w" / "camp" / "out").exists()


def test_a_malformed_marker_in_a_page_leaves_the_bundle_to_go_alone_not_the_campaign_stopped(repo, capsys):  # noqa: F811
    (repo / "docs").mkdir()
    (repo / "docs" / "r.md").write_text("<!-- bundle-table: results/camp/bundle summary -->\nnever closed\n")
    assert lane.regenerate_pages(repo, "results/camp/bundle", "camp") == []
    assert "docs tables not regenerated" in capsys.readouterr().err


def test_a_lane_commit_says_what_finished(tmp_path):
    """The message counts finished trials and finals from the bundle; one that cannot be read says no more."""
    committed = Path(__file__).parents[1] / "results" / "overconfident_paper_fashion_mnist" / "bundle"
    assert lane.commit_message(committed, "c") == "results: c 48/48 trials, 50/50 finals (lane)"
    assert lane.commit_message(tmp_path / "missing", "c") == "results: c bundle as runs finish (lane)"
