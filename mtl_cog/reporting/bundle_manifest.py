"""A results bundle's seal: ``manifest.json``, every file's SHA-256, size and row count, written last.

A bundle is the evidence every published number rests on, and a resume, ``report --bundle``, the
docs tables and their test read it without its run folders. A file edited after the campaign wrote
it (a validation NLL lowered so that a sweep chooses another run, a test accuracy raised) or inflated
to gigabytes of well-formed rows would otherwise be read as the campaign's own. So ``write_bundle``
removes the manifest, writes the tables, and writes the manifest last (all under the campaign's
collection lock), and ``verify`` checks a bundle before any of its files is parsed: every file the
manifest lists present as a regular file with its size and SHA-256, no other bundle file beside them
(each refusal names the file), and the row counts that bound every later read.

A bundle without a manifest is *unsealed*: one written before bundles were sealed, or one whose
writer was killed between its tables and its manifest. It is read with a warning (its files still
get every schema check, and reads are bounded by ``UNSEALED_MAX_ROWS``) and sealed by its next write,
or by ``mtl-cog report --bundle DIR --seal``. Like the run digests this detects accidents and edits
by hand, not an attacker, who could rewrite the manifest as well.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

from mtl_cog.errors import UserError
from mtl_cog.io import atomic_write_text

MANIFEST = "manifest.json"
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


def write_manifest(folder: Path, rows: dict[str, int | None]) -> None:
    """Seal ``folder``: the manifest of its files (``rows``: {file: data rows}, None for campaign.json)."""
    files = {name: {"bytes": (folder / name).stat().st_size, "sha256": sha256(folder / name),
                    "rows": rows.get(name)} for name in bundle_files(folder)}
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


def verify(folder: Path) -> dict[str, int] | None:
    """Check ``folder`` against its manifest -> {file: row bound} for the readers; None (with a warning) when the
    bundle is unsealed. A mismatch is one error line naming the file."""
    present = bundle_files(folder)
    if not (folder / MANIFEST).exists() and not (folder / MANIFEST).is_symlink():
        warnings.warn(f"{folder} is an unsealed results bundle (no {MANIFEST}: written before bundles were "
                      "sealed, or its writer stopped midway): its files are checked against the schema but not "
                      "against a seal; its next write seals it, or: mtl-cog report --bundle "
                      f"{folder} --seal", stacklevel=3)
        return None
    files = _read_manifest(folder)
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
