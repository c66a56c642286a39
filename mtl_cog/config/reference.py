"""Every config key with its type, default and help, read from the schema itself (``docs/reference/config.md``).

The keys, types and defaults come from the dataclasses of ``mtl_cog.config.schema`` (walked from the
root ``Config`` as the loader walks them); the help is the schema's own comments: the comment lines right
above a field and the comment at the end of its line, so the reference says what the code says and
cannot drift from it (``mtl-cog generate-reference --check``).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import tokenize
from functools import cache

from mtl_cog.config import schema


@cache
def _comments(cls: type) -> dict[str, str]:
    """{field name: its comments} of one dataclass, from its source."""
    source = inspect.getsource(cls)
    lines = source.splitlines()
    trailing = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            row = token.start[0]
            if lines[row - 1].strip() != token.string.strip():  # a comment after code on the same line
                trailing[row] = token.string.lstrip("#").strip()
    out = {}
    for node in ast.parse(source).body[0].body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above, row = [], node.lineno - 1
        while row >= 1 and lines[row - 1].strip().startswith("#"):
            above.insert(0, lines[row - 1].strip().lstrip("#").strip())
            row -= 1
        out[node.target.id] = " ".join([*above, *([trailing[node.lineno]] if node.lineno in trailing else [])])
    return out


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()  # type: ignore[misc]


def _text(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(_text, value)) + "]"
    return "{}" if value == {} else str(value)


def config_keys(cls: type = schema.Config, prefix: str = "") -> list[tuple[str, type, list[tuple[str, str, str, str]]]]:
    """Sections in the schema's order: (dotted section, its dataclass, rows of (key, type, default, help))."""
    rows, nested = [], []
    comments = _comments(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        default = _default(f)
        if dataclasses.is_dataclass(default):
            nested.append((key, type(default)))
            continue
        rows.append((key, str(f.type), _text(default), comments.get(f.name, "")))
    sections = [(prefix.rstrip("."), cls, rows)]
    for key, sub in nested:
        sections += config_keys(sub, f"{key}.")
    return sections


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def config_markdown() -> str:
    lines = ["# Config keys", "",
             "Generated from `mtl_cog/config/schema.py` by `mtl-cog generate-reference` (do not edit; "
             "`tests/test_reference_docs.py` fails when this page and the schema disagree). A run's YAML "
             "(`configs/`) and its `key=value` overrides use these keys; an unknown key, a wrong type or an "
             "impossible value is refused with a message naming it.", ""]
    for section, cls, rows in config_keys():
        lines += [f"## `{section}`" if section else "## top level", ""]
        doc = inspect.getdoc(cls) or ""
        if doc and not doc.startswith(f"{cls.__name__}("):  # dataclasses invent a signature when there is none
            lines += [doc.split("\n\n")[0].replace("\n", " "), ""]
        lines += ["| key | type | default | what |", "|---|---|---|---|"]
        lines += [f"| `{key}` | `{_cell(kind)}` | `{_cell(default)}` | {_cell(help_text)} |"
                  for key, kind, default, help_text in rows]
        lines.append("")
    return "\n".join(lines)
