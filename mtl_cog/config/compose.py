"""Configs composed from parts: a data set (``configs/datasets/<d>.yaml``) x a method (``configs/methods/<m>.yaml``).

``mtl-cog train --data celeba --method cog_fc`` reads ``configs/celeba/cog_fc.yaml``, the combination
file, which is one generated ``_base_`` line naming the two parts (mmdetection keeps its ``_base_``
files the same way). The combination files stay on disk, generated rather than hand-written, so that
``--config configs/celeba/cog_fc.yaml`` in users' scripts and our docs keeps working and
``cat configs/celeba/cog_fc.yaml`` shows what a run composes. ``scripts/generate_configs.py`` writes
them from ``datasets/*.yaml`` x ``methods/*.yaml``; ``tests/test_compose.py`` fails when one is
missing, stale or an orphan. A combination may carry settings tuned for it below its ``_base_``
line (``configs/synthetic/cog_fc.yaml``: learning rates from a sweep); such a file must say why in a
``#`` comment right after that line, and the generator leaves it alone. A data set's folder may
also hold documented variants of a combination (``_base_: baseline.yaml`` then a ``#`` comment and
the changed settings, e.g. ``configs/fashion_mosaic/baseline_mgda.yaml``); they are written by hand.

Without a combination file (a data set or method a user just added), the two parts are composed
directly, with the same result.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

from mtl_cog.errors import ConfigError
from mtl_cog.io import atomic_write_text, output_folder

DATASETS = "datasets"
METHODS = "methods"


def available(root: Path, kind: str) -> list[str]:
    """The names of ``root/<kind>/*.yaml`` (kind: ``datasets`` or ``methods``)."""
    return sorted(path.stem for path in (root / kind).glob("*.yaml"))


def _check_name(root: Path, kind: str, name: str, option: str) -> None:
    names = available(root, kind)
    if name not in names:
        close = difflib.get_close_matches(name, names, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(f"{option} {name!r}: no {root / kind / (name + '.yaml')}.{hint} "
                          f"Available: {', '.join(names)}.")


def base_line(dataset: str, method: str) -> str:
    """The whole generated content of ``configs/<dataset>/<method>.yaml``."""
    return f"_base_: [../{DATASETS}/{dataset}.yaml, ../{METHODS}/{method}.yaml]\n"


def combination_path(root: Path, dataset: str, method: str) -> Path:
    return root / dataset / f"{method}.yaml"


def config_files(root: Path, dataset: str, method: str) -> list[Path]:
    """The files ``--data`` and ``--method`` name, in merge order (later ones win)."""
    _check_name(root, DATASETS, dataset, "--data")
    _check_name(root, METHODS, method, "--method")
    path = combination_path(root, dataset, method)
    if path.is_file():  # the generated line, plus any settings tuned for this combination
        return [path]
    return [root / DATASETS / f"{dataset}.yaml", root / METHODS / f"{method}.yaml"]


def combination_problem(path: Path, dataset: str, method: str) -> str | None:
    """Why ``path`` is not a valid combination file (None when it is)."""
    if not path.is_file():
        return f"{path} is missing (run scripts/generate_configs.py)"
    text = path.read_text()
    expected = base_line(dataset, method)
    if text == expected:
        return None
    if not text.startswith(expected):
        return f"{path} does not start with the generated line {expected.strip()!r} (run scripts/generate_configs.py)"
    if not text[len(expected):].startswith("#"):
        return f"{path} adds settings to the generated line without a '#' comment right after it saying why"
    return None


def is_variant(path: Path) -> bool:
    """A documented variant of a combination beside it: ``_base_: <method>.yaml``, then a ``#`` comment.

    E.g. ``configs/fashion_mosaic/baseline_mgda.yaml``: the baseline with another multi-task
    aggregator, compared as a method of its own.
    """
    lines = path.read_text().splitlines()
    match = re.fullmatch(r"_base_: *(\w+)\.yaml", lines[0].strip()) if lines else None
    return (match is not None and (path.parent / f"{match.group(1)}.yaml").is_file() and len(lines) > 1
            and lines[1].startswith("#"))


def orphans(root: Path) -> list[Path]:
    """Files in a data set's folder that are neither a combination of an existing data set and method
    nor a documented variant of one (``is_variant``)."""
    datasets, methods = available(root, DATASETS), available(root, METHODS)
    found = [path for name in datasets if (root / name).is_dir() for path in sorted((root / name).glob("*.yaml"))
             if path.stem not in methods and not is_variant(path)]
    parts = {DATASETS, METHODS}
    return found + [path for folder in sorted(root.iterdir()) if folder.is_dir() and folder.name not in parts
                    and folder.name not in datasets and any(_is_combination(p) for p in folder.glob("*.yaml"))
                    for path in sorted(folder.glob("*.yaml"))]


def _is_combination(path: Path) -> bool:
    return path.read_text().startswith(f"_base_: [../{DATASETS}/")


def problems(root: Path) -> list[str]:
    """Every combination that is missing, stale or undocumented, and every orphan."""
    found = [combination_problem(combination_path(root, d, m), d, m)
             for d in available(root, DATASETS) for m in available(root, METHODS)]
    return [p for p in found if p is not None] + [f"{path} combines no existing data set and method"
                                                  for path in orphans(root)]


def write_combinations(root: Path) -> list[Path]:
    """Write every missing or stale one-line combination file; returns those written.

    A file with tuned settings after a correct ``_base_`` line is kept. One whose first line is
    wrong and that holds more than that line is refused (it would lose hand-written settings).
    """
    stale = [(d, m) for d in available(root, DATASETS) for m in available(root, METHODS)
             if combination_problem(combination_path(root, d, m), d, m) is not None]
    for dataset, method in stale:  # refuse before writing anything
        path = combination_path(root, dataset, method)
        if path.is_file() and len(path.read_text().strip().splitlines()) > 1:
            raise ConfigError(f"{path} holds more than a _base_ line, and its first line is not "
                              f"{base_line(dataset, method).strip()!r}: fix it by hand.")
    for dataset, method in stale:
        output_folder(combination_path(root, dataset, method).parent, "the configs folder")
        atomic_write_text(combination_path(root, dataset, method), base_line(dataset, method))
    return [combination_path(root, d, m) for d, m in stale]


# Scales (``--scale NAME`` of the campaign commands): ``configs/scales/<NAME>/<data set>.yaml``, merged on
# top of a run's data set x method config, then ``configs/scales/<NAME>/methods/<method>.yaml`` where a
# method needs its own (LiST's Lipschitz backbone at CPU scale). A user adds a scale by adding files.
SCALES = "scales"


def scale_names(root: Path) -> list[str]:
    return sorted(p.name for p in (root / SCALES).iterdir() if p.is_dir()) if (root / SCALES).is_dir() else []


def scale_datasets(root: Path, scale: str) -> list[str]:
    """The data sets ``scale`` has a file for (the default data of a campaign at that scale)."""
    _check_scale(root, scale)
    return sorted(p.stem for p in (root / SCALES / scale).glob("*.yaml"))


def _check_scale(root: Path, scale: str) -> None:
    if scale not in scale_names(root):
        raise ConfigError(f"--scale {scale!r}: no folder {root / SCALES / scale}. Available: "
                          f"{', '.join(scale_names(root)) or 'none'} (a scale is a folder of <data set>.yaml files).")


def scale_files(root: Path, scale: str, dataset: str, method: str) -> list[Path]:
    """The files of ``scale`` for (``dataset``, ``method``), in merge order."""
    _check_scale(root, scale)
    path = root / SCALES / scale / f"{dataset}.yaml"
    if not path.is_file():
        raise ConfigError(f"--scale {scale} has no {path}: it sets sizes for {', '.join(scale_datasets(root, scale))}. "
                          f"Add that file, or use another --scale for {dataset}.")
    method_file = root / SCALES / scale / METHODS / f"{method}.yaml"
    return [path, *([method_file] if method_file.is_file() else [])]
