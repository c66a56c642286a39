"""Issue 58, family 1: a seal that cannot be re-applied silently. A bundle once sealed stays sealed (campaign.json
records its seal); ``--seal`` on a committed bundle compares it with its committed version; an older bundle is
sealed only where git shows it was never sealed. The unsealed notice is one line in the project's style."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_bundle_seal import MANIFEST, edit_csv, write_labelled_bundle

from mtl_cog.bundles import bundle as bundles
from mtl_cog.errors import UserError

REPO = Path(__file__).resolve().parents[1]
EDITS = [(bundles.RESULTS, "val,mean,nll,0.5", "val,mean,nll,0.4"),  # chooses another run
         (bundles.RESULTS, "test,mean,accuracy,0.5", "test,mean,accuracy,0.99"),
         (bundles.RUNS, ",2,True,3.5,", ",2,True,9.5,"),
         (bundles.CURVES, "run_00,1,val,nll,0.6", "run_00,1,val,nll,0.1")]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def checkout(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    return repo


def commit(repo: Path, message: str) -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)


def strip_seal_record(folder: Path) -> None:
    """campaign.json as a bundle written before seals has it (no record of a seal), as an editor would make it."""
    campaign = json.loads((folder / bundles.CAMPAIGN).read_text())
    campaign = {k: v for k, v in campaign.items() if k not in ("seal", "sealed")}
    (folder / bundles.CAMPAIGN).write_text(json.dumps(campaign, indent=1, sort_keys=True) + "\n")


@pytest.mark.parametrize("file, old, new", EDITS)
def test_edit_then_seal_is_refused_where_the_seal_was_removed(tmp_path, file, old, new):
    write_labelled_bundle(tmp_path / "b")
    (tmp_path / "b" / MANIFEST).unlink()
    edit_csv(tmp_path / "b" / file, old, new)
    with pytest.raises(UserError, match="sealed"):
        bundles.seal_bundle(tmp_path / "b")
    assert not (tmp_path / "b" / MANIFEST).exists()
    with pytest.raises(UserError, match="sealed"):  # nor does any reader take the edited rows
        bundles.read_bundle(tmp_path / "b")


def test_a_lost_manifest_of_unchanged_files_is_restored_by_seal(tmp_path):
    write_labelled_bundle(tmp_path / "b")
    sealed = (tmp_path / "b" / MANIFEST).read_bytes()
    (tmp_path / "b" / MANIFEST).unlink()
    assert bundles.seal_bundle(tmp_path / "b")
    assert (tmp_path / "b" / MANIFEST).read_bytes() == sealed


@pytest.mark.parametrize("file, old, new", EDITS)
def test_git_history_is_the_final_word_when_the_seal_record_is_edited_away(tmp_path, file, old, new):
    repo = checkout(tmp_path)
    write_labelled_bundle(repo / "results" / "c" / "bundle")
    commit(repo, "sealed bundle")
    folder = repo / "results" / "c" / "bundle"
    (folder / MANIFEST).unlink()
    strip_seal_record(folder)
    edit_csv(folder / file, old, new)
    with pytest.raises(UserError, match="git"):
        bundles.seal_bundle(folder)
    assert not (folder / MANIFEST).exists()


def test_an_older_committed_bundle_is_sealed_only_as_committed(tmp_path):
    repo = checkout(tmp_path)
    folder = repo / "results" / "c" / "bundle"
    write_labelled_bundle(folder)
    (folder / MANIFEST).unlink()
    strip_seal_record(folder)  # the bundle as code before seals wrote it
    commit(repo, "an old, never sealed bundle")
    edit_csv(folder / bundles.RESULTS, "test,mean,accuracy,0.5", "test,mean,accuracy,0.99")
    with pytest.raises(UserError, match=r"results.csv.gz.*differs from its committed version.*run_00"):
        bundles.seal_bundle(folder)
    git(repo, "checkout", "--", ".")
    assert bundles.seal_bundle(folder) and bundles.read_bundle(folder) is not None


def test_an_older_bundle_outside_git_cannot_show_it_was_never_sealed(tmp_path):
    write_labelled_bundle(tmp_path / "b")
    (tmp_path / "b" / MANIFEST).unlink()
    strip_seal_record(tmp_path / "b")
    with pytest.raises(UserError, match="git"):
        bundles.seal_bundle(tmp_path / "b")


def test_the_seal_command_refuses_in_one_line(tmp_path):
    write_labelled_bundle(tmp_path / "out" / "bundle")
    (tmp_path / "out" / "bundle" / MANIFEST).unlink()
    edit_csv(tmp_path / "out" / "bundle" / bundles.RESULTS, "test,mean,accuracy,0.5", "test,mean,accuracy,0.99")
    done = subprocess.run([sys.executable, "-m", "mtl_cog.cli.main", "report", "--bundle",
                           str(tmp_path / "out" / "bundle"), "--seal"], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and done.stderr.startswith("error: "), done.stderr
    assert not (tmp_path / "out" / "bundle" / MANIFEST).exists()


def test_the_unsealed_notice_is_one_line_in_the_projects_style(tmp_path):
    repo = checkout(tmp_path)
    folder = repo / "results" / "c" / "bundle"
    write_labelled_bundle(folder)
    (folder / MANIFEST).unlink()
    strip_seal_record(folder)
    commit(repo, "an old, never sealed bundle")
    done = subprocess.run([sys.executable, "-m", "mtl_cog.cli.main", "report", "--bundle", str(folder), "--list"],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("warning: ") and "unsealed" in done.stderr, \
        done.stderr
