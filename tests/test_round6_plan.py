"""Issue 58, family 2: a recorded plan binds every later command of its campaign, with or without ``--plan``; a plan
is a regular file tracked by git in the checkout that runs the campaign, checked before anything is read from it."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from mtl_cog.bundles import bundle as bundles
from mtl_cog.errors import UserError
from mtl_cog.experiments import campaign, preregistration, reuse

PLAN = "docs/results/c-plan.md"


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A checkout holding a committed plan, and the working directory of the campaign."""
    root = tmp_path / "repo"
    (root / "docs" / "results").mkdir(parents=True)
    (root / ".gitignore").write_text("runs/\nresults/*/\n")
    (root / PLAN).write_text("H1: COG-FC beats the baseline\n")
    git(root, "init", "-q")
    git(root, "config", "user.email", "t@example.com")
    git(root, "config", "user.name", "t")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "plan")
    monkeypatch.chdir(root)
    monkeypatch.delenv("MTL_COG_CODE_COMMIT", raising=False)
    monkeypatch.delenv("MTL_COG_REPO", raising=False)
    return root


def recorded_campaign(root: Path) -> campaign.Campaign:
    """A campaign whose bundle recorded the plan (as ``reproduce --plan`` records it), no run yet."""
    record = preregistration.plan_record(Path(PLAN), "abc")
    bundle = bundles.Bundle({"format": bundles.FORMAT, "campaign": "c", "specs": {}, "counterparts": {}})
    preregistration.keep_first(bundle, record)
    bundles.write_bundle(root / "runs" / "c" / "bundle", bundle)
    return campaign.Campaign("c", root / "runs" / "c", [], command=[])


@pytest.mark.parametrize("change", ["edited and committed", "deleted and committed", "deleted"])
def test_a_recorded_plan_binds_a_command_without_plan(repo, change):
    planned = recorded_campaign(repo)
    recorded = bundles.read_bundle(bundles.bundle_dir(planned.out))
    preregistration.campaign_plan(None, recorded, "abc")  # unchanged: nothing to say
    reuse.with_threads(planned, ())
    if change.startswith("edited"):
        (repo / PLAN).write_text("H1: COG-FC beats the baseline, or else\n")
    else:
        (repo / PLAN).unlink()
    if change.endswith("committed"):
        git(repo, "commit", "-q", "-am", "plan changed")
    with pytest.raises(UserError, match="plan"):
        preregistration.campaign_plan(None, recorded, "abc")
    with pytest.raises(UserError, match="plan"):  # the engine's check before every campaign's runs
        reuse.with_threads(planned, ())


@pytest.mark.parametrize("where", ["runs/plan.md", "results/c/plan.md"])
def test_a_plan_in_an_ignored_folder_is_not_committed(repo, where):
    (repo / where).parent.mkdir(parents=True)
    (repo / where).write_text("H1\n")
    with pytest.raises(UserError, match="--plan"):
        preregistration.plan_record(Path(where), "abc")


def test_a_plan_behind_a_linked_folder_is_refused(repo, tmp_path):
    (repo / "linked").symlink_to(repo / "docs")
    with pytest.raises(UserError, match="link"):
        preregistration.plan_record(Path("linked/results/c-plan.md"), "abc")


def test_a_plan_outside_any_git_checkout_is_refused(tmp_path, monkeypatch):
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "plan.md").write_text("H1\n")
    monkeypatch.chdir(tmp_path / "plain")
    monkeypatch.delenv("MTL_COG_CODE_COMMIT", raising=False)
    with pytest.raises(UserError, match="git"):
        preregistration.plan_record(Path("plan.md"), "abc")


def test_a_fifo_is_refused_without_being_read(repo):
    os.mkfifo(repo / "docs" / "fifo.md")
    outcome = []

    def record() -> None:
        try:
            preregistration.plan_record(Path("docs/fifo.md"), "abc")
        except UserError as err:
            outcome.append(str(err))

    worker = threading.Thread(target=record, daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():  # unblock the read so the test process can end
        with open(repo / "docs" / "fifo.md", "w"):
            pass
        pytest.fail("reading the plan blocked on a FIFO")
    assert outcome and "regular file" in outcome[0]


def test_a_committed_plan_is_accepted_and_an_uncommitted_edit_is_not(repo):
    assert preregistration.plan_record(Path(PLAN), "abc")["path"] == PLAN
    (repo / PLAN).write_text("H1: changed\n")
    with pytest.raises(UserError, match="not committed"):
        preregistration.plan_record(Path(PLAN), "abc")
