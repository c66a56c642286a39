"""No docstring, comment, help text or document names a module path that does not exist.

Paths (``mtl_cog/evaluation/truth.py``, ``evaluation/truth.py``, ``configs/celeba/cog_fc.yaml``) must
exist; dotted names (``mtl_cog.evaluation.truth.truth_metric_names``) must name a module, and a name
after it must be defined at that module's top level. Format tags such as ``mtl_cog.run_folder.v1``
are not module paths.
"""

from __future__ import annotations

import ast
import json
import re
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PATH = re.compile(r"(?<![\w/.-])((?:mtl_cog|tasks|scripts|configs|docs|tests)/[\w./-]*\w)")
LAYER_PATH = re.compile(r"(?<![\w/.-])(\w+)/(\w+\.py)\b")  # evaluation/truth.py: relative to mtl_cog/
DOTTED = re.compile(r"(?<![\w.])(mtl_cog(?:\.\w+)+)")
FORMAT_TAG = re.compile(r"\.v\d+$")
LAYERS = {p.name for p in (REPO / "mtl_cog").iterdir() if (p / "__init__.py").is_file()}


def texts() -> list[tuple[Path, str]]:
    """Library, data sets, scripts and documents whole; tests by their module docstring only
    (a test may name a missing file on purpose)."""
    found = [*REPO.glob("mtl_cog/**/*.py"), *REPO.glob("tasks/*.py"), *REPO.glob("scripts/*"),
             *REPO.glob("docs/**/*.md"), REPO / "README.md", *REPO.glob("configs/**/*.yaml")]
    # docs/reference/commands.md is the parsers' help text, where NAME stands for a value (configs/methods/NAME.yaml):
    # its sources, the commands, are read here themselves
    generated = REPO / "docs" / "reference" / "commands.md"
    # a plan a results bundle recorded is a frozen record (its digest binds the campaign): it names the paths of the
    # code it was written against, and editing it would break the binding
    frozen = recorded_plans()
    out = [(path, path.read_text()) for path in found if path.is_file() and path != generated and path not in frozen]
    return out + [(path, ast.get_docstring(ast.parse(path.read_text())) or "") for path in REPO.glob("tests/*.py")]


def recorded_plans() -> set[Path]:
    """The plan files the committed results bundles recorded (``campaign.json``'s ``plan.path``)."""
    plans = set()
    for campaign in REPO.glob("results/*/bundle/campaign.json"):
        plan = json.loads(campaign.read_text()).get("plan")
        if isinstance(plan, dict) and isinstance(plan.get("path"), str):
            plans.add(REPO / plan["path"])
    return plans


@cache
def top_level_names(path: Path) -> frozenset[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.If):  # e.g. the root's ``if TYPE_CHECKING:`` imports of its lazy exports
            names |= {(a.asname or a.name).split(".")[0] for n in ast.walk(node)
                      if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return frozenset(names)


def dotted_exists(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        module = REPO.joinpath(*parts[:i])
        source = module.with_suffix(".py") if module.with_suffix(".py").is_file() else module / "__init__.py"
        if source.is_file():
            rest = parts[i:]
            return not rest or rest[0] in top_level_names(source) or (module / f"{rest[0]}.py").is_file()
    return False


def stale(text: str) -> list[str]:
    found = [p for p in PATH.findall(text) if not (REPO / p.rstrip(".")).exists()]
    found += [f"{a}/{b}" for a, b in LAYER_PATH.findall(text)
              if a in LAYERS and not (REPO / "mtl_cog" / a / b).is_file()]
    return found + [d for d in DOTTED.findall(text) if not FORMAT_TAG.search(d) and not dotted_exists(d)]


def test_the_checker_finds_a_stale_path():  # known answers, so the test below cannot pass vacuously
    assert stale("see mtl_cog/heads.py and evaluation/truth.py") == ["mtl_cog/heads.py"]
    assert stale("``mtl_cog.evaluation.truth`` and mtl_cog.truth") == ["mtl_cog.truth"]
    assert stale("mtl_cog.evaluation.metrics.compute_metrics, mtl_cog.evaluation.metrics.nope") == [
        "mtl_cog.evaluation.metrics.nope"]
    assert stale("tag mtl_cog.run_folder.v1; configs/celeba/cog_fc.yaml; training/nope.py") == ["training/nope.py"]


def test_no_stale_module_path():
    problems = [f"{path.relative_to(REPO)}: {name}" for path, text in texts() for name in stale(text)]
    assert problems == []


ISSUE_NUMBER = re.compile(r"\bissues?[ -]?#?\d+", re.IGNORECASE)
# Being rewritten elsewhere at the time of writing; delete each entry once its file has no issue number left.
ISSUE_NUMBER_PENDING: set[str] = set()


def test_no_internal_issue_number_in_docs_or_code():
    assert ISSUE_NUMBER.findall("see issue 19, Issue #3 and the issue-20 metrics; issues are tracked") == [
        "issue 19", "Issue #3", "issue-20"]
    paths = [REPO / "README.md", *REPO.glob("docs/**/*.md"), *REPO.glob("mtl_cog/**/*.py")]
    found = [f"{path.relative_to(REPO)}: {match}" for path in paths if str(path.relative_to(REPO))
             not in ISSUE_NUMBER_PENDING for match in ISSUE_NUMBER.findall(path.read_text())]
    assert found == []
