"""A study storage that cannot hold the study is refused first, in one line naming the URL (password hidden)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mtl_cog.errors import UserError, run_cli
from mtl_cog.experiments import protocol, tuning

KNOBS = [protocol.Knob("optim.follower_lr", 1e-4, 1e-2, log=True)]
REPO = Path(__file__).resolve().parents[1]


def open_study(url: str):
    return tuning.open_study(url, "ds-m", epochs=3, prune=False, budget=2, knobs=KNOBS, trial_seeds=[1000])


@pytest.mark.parametrize("url, message", [
    ("nosuchdb://x/y", "no database kind 'nosuchdb'"),
    ("postgresql+psycopg2://user:secret@db.example.org/optuna", "database driver is not installed"),
    ("not a url", "is not a database URL"),
    ("sqlite://", "in-memory SQLite database"),
    ("sqlite:///:memory:", "in-memory SQLite database"),
])
def test_unusable_urls_are_refused_in_one_line(url, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may appear here
    with pytest.raises(UserError, match=message) as err:
        open_study(url)
    assert "secret" not in str(err.value) and list(tmp_path.iterdir()) == []


def test_an_sqlite_file_in_a_read_only_folder_is_refused(read_only_folder):
    with pytest.raises(UserError, match="is not writable"):
        open_study(f"sqlite:///{read_only_folder / 'o.db'}")


@pytest.mark.parametrize("damage", ["not a database", "half"])
def test_a_study_file_that_is_no_database_or_was_cut_short_is_refused(tmp_path, damage):
    url = tuning.storage_url(tmp_path)
    study = open_study(url)
    for value in (0.5, 0.4):
        trial = study.ask()
        tuning.suggest(trial, KNOBS)
        study.tell(trial, value)
    path = tmp_path / tuning.STUDY_FILE
    data = path.read_bytes()
    path.write_bytes(b"this is not a database\n" * 50 if damage == "not a database" else data[: len(data) // 2])
    with pytest.raises(UserError, match="is not an intact SQLite database"):
        open_study(url)


def test_a_good_file_and_a_new_one_open(tmp_path):
    url = tuning.storage_url(tmp_path / "new")
    (tmp_path / "new").mkdir()
    open_study(url).tell(open_study(url).ask(), 0.3)
    assert len(open_study(url).trials) == 1


def test_a_tuning_worker_refuses_a_bad_url_with_one_error_line(capsys):
    from mtl_cog.cli import tune

    with pytest.raises(SystemExit) as info:
        run_cli(lambda: tune.main(["--storage", "nosuchdb://x/y", "--study", "synthetic-baseline", "--config",
                                   str(REPO / "configs" / "synthetic" / "baseline.yaml"), "--base-follower-lr",
                                   "0.01", "--budget", "2"]))
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.startswith("error: study storage nosuchdb://x/y") and "Traceback" not in err
