"""Every command creates its output folder through one checked helper (``mtl_cog.io.output_folder``)."""

from __future__ import annotations

import pytest
from test_robustness import user_error

from mtl_cog.errors import StorageError
from mtl_cog.io import output_folder


@pytest.mark.parametrize("command", ["list_front", "compare"])
@pytest.mark.parametrize("where", ["a file", "read-only", "under read-only"])
def test_a_report_folder_that_cannot_be_written_is_one_error_line_before_the_work(command, where, tmp_path,
                                                                                   read_only_folder, capsys):
    runs = tmp_path / "runs"
    runs.mkdir()  # no runs: the work would fail on its own, after the --out check
    out = {"a file": tmp_path / "report.txt", "read-only": read_only_folder,
           "under read-only": read_only_folder / "report"}[where]
    if where == "a file":
        out.write_text("keep me\n")
    err = user_error(command, [str(runs), "--out", str(out)], capsys)
    assert err.startswith(f"error: --out {out}") and ("not a folder" in err or "not writable" in err), err
    assert (out.read_text() == "keep me\n") if where == "a file" else not (read_only_folder / "report").exists()


def test_output_folder_creates_nested_folders_and_refuses_in_one_line(tmp_path, read_only_folder):
    assert output_folder(tmp_path / "a" / "b", "--out").is_dir()
    (tmp_path / "f").write_text("")
    with pytest.raises(StorageError, match=r"--out .*f/x: .*f is a file, not a folder"):
        output_folder(tmp_path / "f" / "x", "--out")
    with pytest.raises(StorageError, match="is not writable"):
        output_folder(read_only_folder / "x", "--out")
