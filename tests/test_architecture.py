"""The layers of docs/explanation/architecture.md, enforced: imports point downwards only, and none hides in a function.

The layers are read from the table in docs/explanation/architecture.md, the one place they are written down: a row's
first cell names its modules (``errors.py``) or folders (``config/``, the top-level ``tasks/``).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ARCHITECTURE = REPO / "docs" / "explanation" / "architecture.md"
SOURCES = sorted([*REPO.glob("mtl_cog/**/*.py"), *REPO.glob("tasks/*.py")])


def read_layers(text: str) -> dict[str, int]:
    """``{module prefix: rank}`` from the first column of the layer table (lowest first)."""
    start = text.index("| layer (lowest first)")
    layers: dict[str, int] = {}
    rows = text[start:].splitlines()[2:]
    for rank, row in enumerate(rows[: next(i for i, r in enumerate(rows) if not r.startswith("|"))]):
        for name in re.findall(r"`([^`]+)`", row.split("|")[1]):
            stem = name.removesuffix("/").removesuffix(".py")
            layers[stem if stem == "tasks" else f"mtl_cog.{stem}"] = rank
    return layers


LAYERS = read_layers(ARCHITECTURE.read_text())


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int | None:
    matches = [(len(prefix), rank) for prefix, rank in LAYERS.items()
               if module == prefix or module.startswith(prefix + ".")]
    return max(matches)[1] if matches else None


def absolute(node: ast.ImportFrom, me: str, is_package: bool) -> str:
    """The module a (possibly relative) ``from`` import names, as Python resolves it."""
    if node.level == 0:
        return node.module or ""
    package = me.split(".") if is_package else me.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def is_type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def project_imports(tree: ast.Module, me: str, is_package: bool) -> list[tuple[ast.stmt, str, bool]]:
    """Every import of ``mtl_cog`` or ``tasks``: (node, imported name, runs at import time at module level)."""
    top_level = {id(node) for node in tree.body}
    type_only = {id(n) for block in tree.body if is_type_checking(block) for n in ast.walk(block)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found += [(node, f"{absolute(node, me, is_package)}.{alias.name}") for alias in node.names]
    return [(node, name, id(node) in top_level) for node, name in found
            if name.split(".")[0] in ("mtl_cog", "tasks") and id(node) not in type_only]


def target_layer(name: str) -> int | None:
    return layer(name) if layer(name) is not None else layer(name.rsplit(".", 1)[0])


def test_the_table_names_every_layer():
    assert LAYERS["mtl_cog.errors"] == 0 and LAYERS["mtl_cog.cli"] == max(LAYERS.values())
    assert sorted(set(LAYERS.values())) == list(range(len(set(LAYERS.values()))))  # one rank per table row
    for prefix in LAYERS:  # every row names something that exists
        path = REPO / Path(*prefix.split("."))
        assert path.is_dir() or path.with_suffix(".py").is_file(), f"{prefix} in {ARCHITECTURE.name} does not exist"


def test_every_module_has_a_layer():
    assert [module_name(p) for p in SOURCES if module_name(p) != "mtl_cog" and layer(module_name(p)) is None] == []


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_imports_point_down_and_sit_at_module_level(path: Path):
    me = module_name(path)
    for node, name, top in project_imports(ast.parse(path.read_text()), me, path.name == "__init__.py"):
        assert top, f"{me}: project import of {name} inside a function or block (line {node.lineno})"
        target = target_layer(name)
        if me == "mtl_cog":  # the package root: nothing above the lowest layer is imported eagerly
            assert target == 0, f"mtl_cog/__init__.py imports {name} eagerly: export it through LAZY_EXPORTS"
            continue
        assert target is not None and target <= layer(me), (
            f"{me} (layer {layer(me)}) imports {name} (layer {target}): a lower layer must not import a higher one"
        )


def test_relative_imports_are_resolved():
    tree = ast.parse("from . import b\nfrom ..data.task_api import TASKS\nfrom .x import y\n")
    found = [name for _, name, _ in project_imports(tree, "mtl_cog.models.network", False)]
    assert found == ["mtl_cog.models.b", "mtl_cog.data.task_api.TASKS", "mtl_cog.models.x.y"]
    tree = ast.parse("from .cache import load_cached\n")
    assert [n for _, n, _ in project_imports(tree, "mtl_cog.data", True)] == ["mtl_cog.data.cache.load_cached"]
    assert target_layer("mtl_cog.data.task_api.TASKS") == LAYERS["mtl_cog.data"]


def test_the_lazy_root_exports_exist():
    import mtl_cog

    for name, module in mtl_cog.LAZY_EXPORTS.items():
        assert module.startswith("mtl_cog.") and target_layer(module) is not None
        assert getattr(mtl_cog, name) is getattr(__import__(module, fromlist=[name]), name)
    with pytest.raises(AttributeError):
        mtl_cog.no_such_name  # noqa: B018


def test_the_root_and_errors_load_neither_timm_nor_the_tasks():
    code = ("import sys, mtl_cog, mtl_cog.errors, mtl_cog.config; "
            "print(sorted(m for m in ('timm', 'tasks', 'torch', 'mtl_cog.runs') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


def module_list() -> list[str]:
    """The block under "Every module, one line each": path, then the first line of its docstring."""
    lines = []
    for path in sorted((REPO / "mtl_cog").rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        lines.append(f"{str(path.relative_to(REPO)):<43} {doc.splitlines()[0] if doc else ''}".rstrip())
    return lines


def test_the_module_list_is_complete_and_current():
    block = ARCHITECTURE.read_text().split("## Every module, one line each")[1].split("```")[1]
    expected = module_list()
    assert block.strip("\n").splitlines() == expected, (
        f"{ARCHITECTURE.relative_to(REPO)}'s module list is out of date; replace its block with:\n"
        + "\n".join(expected))


MAX_PACKAGE_SHARE = 0.15  # no room of the package holds more than this share of its lines (issue 59)


def package_lines() -> dict[str, int]:
    """Lines per top-level folder of ``mtl_cog/`` (its modules at the root counted as ``mtl_cog``)."""
    lines: dict[str, int] = {}
    for path in (REPO / "mtl_cog").rglob("*.py"):
        parts = path.relative_to(REPO / "mtl_cog").parts
        room = parts[0] if len(parts) > 1 else "mtl_cog"
        lines[room] = lines.get(room, 0) + len(path.read_text().splitlines())
    return lines


def test_no_room_holds_more_than_its_share_of_the_package():
    lines = package_lines()
    total = sum(lines.values())
    over = {room: f"{n / total:.1%}" for room, n in lines.items() if n > MAX_PACKAGE_SHARE * total}
    assert over == {}, f"rooms above {MAX_PACKAGE_SHARE:.0%} of mtl_cog's {total} lines: split them by job"


def test_storage_answers_and_showing_are_floors_in_that_order():
    """Results as stored (bundles/) sit below the questions asked of them (analysis/), which sit below what shows
    them (reporting/): a table or a figure may read an answer, an answer never a figure."""
    assert LAYERS["mtl_cog.runs"] < LAYERS["mtl_cog.bundles"] < LAYERS["mtl_cog.analysis"] < LAYERS["mtl_cog.reporting"]
