"""A results bundle's seal: ``manifest.json``, every file's SHA-256, size and row count, written last.

A bundle is the evidence every published number rests on, and a resume, ``report --bundle``, the
docs tables and their test read it without its run folders. A file edited after the campaign wrote
it (a validation NLL lowered so that a sweep chooses another run, a test accuracy raised) or inflated
to gigabytes of well-formed rows would otherwise be read as the campaign's own. So ``write_bundle``
removes the manifest, writes the tables, and writes the manifest last (all under the campaign's
collection lock), and ``verify`` checks a bundle before any of its files is parsed: every file the
manifest lists present as a regular file with its size and SHA-256, no other bundle file beside them
(each refusal names the file), and the row counts that bound every later read.

A seal cannot be removed unnoticed: ``campaign.json`` records it (``seal``: the SHA-256 of the manifest's
entries of every other file, which it cannot hold of itself), written after the tables and before the manifest. A
bundle without a manifest whose ``campaign.json`` records a seal is read only when its files are exactly the sealed
ones (the manifest alone was lost: ``--seal`` writes it again, byte for byte); otherwise it is refused, so deleting
the manifest and editing a table is never "unsealed", and ``--seal`` cannot vouch for the edit. Git is the final
word where the record itself was edited away: a bundle in a git checkout whose history holds a ``manifest.json`` was
sealed, and is refused without one.

A bundle without a manifest and without a record is *unsealed*: one written before bundles were sealed, or one whose
writer was killed between its tables and its seal. It is read with a one-line notice (its files still get every
schema check, and reads are bounded by ``UNSEALED_MAX_ROWS``) and sealed by its next write, or by ``mtl-cog report
--bundle DIR --seal`` where git shows it was never sealed and every file is as committed (``check_never_sealed``:
a file that differs from its committed version is refused naming the first row that differs). Like the run digests
this detects accidents and edits by hand, not an attacker, who could rewrite the manifest as well.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import sys
from pathlib import Path

from mtl_cog.errors import UserError
from mtl_cog.io import atomic_write_text

MANIFEST = "manifest.json"
CAMPAIGN = "campaign.json"
SEAL_KEY = "seal"  # campaign.json's record of the seal: {"tables_sha256": the digest of the manifest's other entries}
FORMAT = "mtl_cog.bundle_manifest.v1"
UNSEALED_MAX_ROWS = 5_000_000  # an unsealed bundle's bound per file (the largest committed one has ~300 000 rows)
FILE_SUFFIXES = (".csv", ".csv.gz", ".json")  # the bundle's own files (the manifest covers every one of them)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def bundle_files(folder: Path) -> list[str]:
    """The names of the bundle's own files in ``folder`` (the manifest aside); a link or a folder under such a
    name is refused: a bundle file is a regular file in the bundle, not a way out of it."""
    names = []
    for entry in sorted(folder.iterdir()):
        if not entry.name.endswith(FILE_SUFFIXES) or entry.name == MANIFEST:
            continue
        if entry.is_symlink() or not entry.is_file():
            raise UserError(f"{entry}: a results bundle's files are regular files, and this is "
                            f"{'a link' if entry.is_symlink() else 'no regular file'}. Move it away, and restore "
                            "the file from git.")
        names.append(entry.name)
    return names


def entries(folder: Path, rows: dict[str, int | None], names: list[str] | None = None) -> dict[str, dict]:
    """The manifest's entry of each bundle file (``rows``: {file: data rows}, None for campaign.json)."""
    return {name: {"bytes": (folder / name).stat().st_size, "sha256": sha256(folder / name), "rows": rows.get(name)}
            for name in (bundle_files(folder) if names is None else names)}


def seal_record(files: dict[str, dict]) -> dict:
    """campaign.json's ``seal``: the digest of the manifest's entries of every file but campaign.json itself."""
    tables = {name: record for name, record in files.items() if name != CAMPAIGN}
    return {"tables_sha256": hashlib.sha256(json.dumps(tables, sort_keys=True).encode()).hexdigest()}


def table_names(folder: Path) -> list[str]:
    return [name for name in bundle_files(folder) if name != CAMPAIGN]


def write_manifest(folder: Path, rows: dict[str, int | None]) -> None:
    """Seal ``folder``: the manifest of its files (``rows``: {file: data rows}, None for campaign.json)."""
    files = entries(folder, rows)
    atomic_write_text(folder / MANIFEST, json.dumps({"format": FORMAT, "files": files}, indent=1, sort_keys=True)
                      + "\n")


def unseal(folder: Path) -> None:
    """Remove the manifest before the tables are rewritten: a writer killed midway leaves an unsealed bundle,
    never a seal that contradicts its files."""
    (folder / MANIFEST).unlink(missing_ok=True)


def _read_manifest(folder: Path) -> dict[str, dict]:
    path = folder / MANIFEST
    if path.is_symlink() or not path.is_file():
        raise UserError(f"{path}: not a regular file. Restore the bundle from git.")
    try:
        raw = json.loads(path.read_text())
        files = raw["files"] if isinstance(raw, dict) and raw.get("format") == FORMAT else None
        if not isinstance(files, dict) or not all(
                isinstance(v, dict) and isinstance(v.get("bytes"), int) and isinstance(v.get("sha256"), str)
                and (v.get("rows") is None or (isinstance(v["rows"], int) and v["rows"] >= 0))
                for v in files.values()):
            raise ValueError(f"not a {FORMAT} record")
    except (OSError, ValueError, UnicodeDecodeError, KeyError) as err:
        raise UserError(f"{path} is damaged ({err}); the bundle cannot be checked against its seal. Restore the "
                        "bundle from git.") from None
    return files


def verify(folder: Path, campaign: dict | None = None) -> dict[str, int] | None:
    """Check ``folder`` against its manifest -> {file: row bound} for the readers; None when the bundle has no
    manifest (``check_unsealed`` then judges it, once its tables are read). A mismatch is one error line naming the
    file."""
    present = bundle_files(folder)
    if not (folder / MANIFEST).exists() and not (folder / MANIFEST).is_symlink():
        return None
    files = _read_manifest(folder)
    if campaign is not None:
        check_seal_record(folder, campaign, files)
    extra = sorted(set(present) - set(files))
    if extra:
        raise UserError(f"{folder / extra[0]} is not in the bundle's {MANIFEST}: it was added after the bundle "
                        "was sealed. Remove it, or restore the bundle from git.")
    for name, record in sorted(files.items()):
        path = folder / name
        if name not in present:
            raise UserError(f"{path} is missing, but the bundle's {MANIFEST} lists it. Restore the bundle from git.")
        if path.stat().st_size != record["bytes"] or sha256(path) != record["sha256"]:
            raise UserError(f"{path} is not the file the campaign sealed: its content differs from the SHA-256 in "
                            f"the bundle's {MANIFEST} (edited or replaced after it was written). Restore it from "
                            "git, or delete the bundle folder to collect it anew from the run folders.")
    return {name: record["rows"] for name, record in files.items() if record["rows"] is not None}


def check_seal_record(folder: Path, campaign: dict, files: dict[str, dict]) -> None:
    """A sealed bundle's manifest must be the seal campaign.json records, where it records one."""
    record = campaign.get(SEAL_KEY)
    if record is not None and record != seal_record(files):
        raise UserError(f"{folder / MANIFEST} is not the seal {CAMPAIGN} records (rewritten after the campaign "
                        "sealed the bundle). Restore the bundle from git, or delete the bundle folder to collect it "
                        "anew from the run folders.")


_NOTICED: set[Path] = set()


def notice(folder: Path, text: str) -> None:
    """One ``warning:`` line on stderr, once per bundle and process (a campaign reads its bundle many times)."""
    if folder.resolve() not in _NOTICED:
        _NOTICED.add(folder.resolve())
        print(f"warning: {folder}: {text}", file=sys.stderr, flush=True)


def check_unsealed(folder: Path, campaign: dict, rows: dict[str, int]) -> None:
    """Judge a bundle without a manifest (its tables read and checked, ``rows``: their data rows): the files of a
    recorded seal, read with a notice; a recorded seal they differ from, or one git history shows, refused; else an
    unsealed bundle, read with a notice."""
    record = campaign.get(SEAL_KEY)
    if record is not None:
        if record != seal_record(entries(folder, rows, table_names(folder))):
            raise UserError(f"{folder}: {CAMPAIGN} records that this bundle was sealed, and its {MANIFEST} is gone "
                            "while its files differ from that seal (edited after the campaign sealed them). Restore "
                            f"the bundle from git (git checkout -- {folder}), or delete the bundle folder to collect "
                            "it anew from the run folders.")
        notice(folder, f"its {MANIFEST} is missing, and its files are those the seal in {CAMPAIGN} records; write it "
                       f"again: mtl-cog report --bundle {folder} --seal")
        return
    sealed_in = _git_sealed(folder)
    if sealed_in:
        raise UserError(f"{folder}: git shows this bundle sealed (commit {sealed_in} holds its {MANIFEST}), and it has "
                        f"none now: a bundle once sealed stays sealed. Restore it from git (git checkout {sealed_in} "
                        f"-- {folder}), or delete the bundle folder to collect it anew from the run folders.")
    notice(folder, f"an unsealed results bundle (no {MANIFEST}: written before bundles were sealed, or its writer "
                   "stopped midway): its files are checked against the schema but not against a seal; its next "
                   f"write seals it, or: mtl-cog report --bundle {folder} --seal")


def _git(folder: Path, *args: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None


def _git_sealed(folder: Path) -> str:
    """The last commit that holds ``folder``'s manifest.json, "" where git shows none (or there is no git)."""
    done = _git(folder, "log", "-1", "--format=%h", "--diff-filter=AM", "--", MANIFEST) if folder.is_dir() else None
    return done.stdout.decode().strip() if done is not None and done.returncode == 0 else ""


def check_never_sealed(folder: Path) -> None:
    """Before an older bundle is sealed: git must show it never sealed (``check_unsealed`` has read its history) and
    hold every file as it is now; a file that differs from its committed version is refused naming the first row."""
    inside = _git(folder, "rev-parse", "--is-inside-work-tree")
    if inside is None or inside.returncode != 0:
        raise UserError(f"{folder}: not in a git checkout, so git cannot show that this bundle was never sealed. "
                        "Commit it as it is in the repository's results/ first, or delete the bundle folder to "
                        "collect it anew from the run folders (its next write seals it).")
    for name in bundle_files(folder):
        committed = _git(folder, "show", f"HEAD:./{name}")
        if committed is None or committed.returncode != 0:
            raise UserError(f"{folder / name} is not committed, so git cannot vouch for it: commit the bundle as it "
                            "is first, then seal it.")
        now = (folder / name).read_bytes()
        if committed.stdout != now:
            where = _first_difference(name, committed.stdout, now)
            raise UserError(f"{folder / name} differs from its committed version (HEAD){where}: a seal would vouch "
                            f"for rows git does not hold. Restore it (git checkout -- {folder / name}), or commit the "
                            "change first, where its diff shows.")


def _first_difference(name: str, old: bytes, new: bytes) -> str:
    """`` at row N: 'committed' committed, 'now' now`` of two versions of a bundle file."""
    try:
        old, new = (gzip.decompress(b) if name.endswith(".gz") else b for b in (old, new))
        lines = [b.decode().splitlines() for b in (old, new)]
    except (OSError, EOFError, UnicodeDecodeError):
        return ""
    for row, (a, b) in enumerate(zip(*lines)):
        if a != b:
            return f" at row {row}: {a[:80]!r} committed, {b[:80]!r} now"
    return f" ({len(lines[0])} rows committed, {len(lines[1])} now)"
