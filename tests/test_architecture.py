"""The layers of docs/architecture.md, enforced: imports point downwards only, and none hides in a function."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Lower number = lower layer. A module may import its own layer and any lower one.
LAYERS = {
    "mtl_cog.errors": 0, "mtl_cog.registry": 0, "mtl_cog.io": 0, "mtl_cog.constants": 0, "mtl_cog.progress": 0,
    "mtl_cog.config": 1,
    "mtl_cog.data": 2,
    "tasks": 3,
    "mtl_cog.models": 4,
    "mtl_cog.objectives": 5,
    "mtl_cog.evaluation": 6,
    "mtl_cog.runs": 7,
    "mtl_cog.reporting": 8,
    "mtl_cog.training": 9,
    "mtl_cog.experiments": 10,
    "mtl_cog.benchmarks": 11,
    "mtl_cog.cli": 12,
}
SOURCES = sorted([*REPO.glob("mtl_cog/**/*.py"), *REPO.glob("tasks/*.py")])


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int | None:
    matches = [(len(prefix), rank) for prefix, rank in LAYERS.items()
               if module == prefix or module.startswith(prefix + ".")]
    return max(matches)[1] if matches else None


def project_imports(tree: ast.AST) -> list[tuple[ast.stmt, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node, f"{node.module}.{alias.name}") for alias in node.names]
    return [(node, name) for node, name in found if name.split(".")[0] in ("mtl_cog", "tasks")]


def test_every_module_has_a_layer():
    assert [module_name(p) for p in SOURCES if module_name(p) != "mtl_cog" and layer(module_name(p)) is None] == []


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_imports_point_down_and_sit_at_module_level(path: Path):
    tree = ast.parse(path.read_text())
    me = module_name(path)
    top_level = {id(node) for node in tree.body}
    for node, name in project_imports(tree):
        assert id(node) in top_level, f"{me}: project import of {name} inside a function or block (line {node.lineno})"
        if me == "mtl_cog":  # the package root re-exports the public API (load_run)
            continue
        target = layer(name) if layer(name) is not None else layer(name.rsplit(".", 1)[0])
        assert target is not None and target <= layer(me), (
            f"{me} (layer {layer(me)}) imports {name} (layer {target}): a lower layer must not import a higher one"
        )
