"""The ``where`` clause of a docs marker: a filter read as data, never run as code.

A ``bundle-table``/``bundle-figure`` marker may narrow its table (``docs_tables``)::

    where metric == 'nll'
    where metric in ['nll', 'ece@15', 'accuracy'] and role != 'trial'

The grammar is deliberately tiny: conditions ``column == literal``, ``column != literal`` and
``column in [literal, ...]``, joined by ``and``; a literal is a quoted string (``'...'`` or
``"..."``, no escapes) or a number. It is tokenised by one regular expression and compared cell by
cell, so no text of a page is ever evaluated (``DataFrame.query`` evaluated attribute access and
calls: a page could run code on every check). Anything else is refused with one line.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import pandas as pd

from mtl_cog.errors import UserError

TOKEN = re.compile(r"\s*(?:(?P<string>'[^'\n]*'|\"[^\"\n]*\")|(?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
                   r"(?![\w.]))|(?P<op>==|!=|\[|\]|,)|(?P<word>[A-Za-z_][A-Za-z0-9_@.+-]*))")


@dataclass(frozen=True)
class Condition:
    column: str
    operator: str  # "==", "!=" or "in"
    values: tuple  # literals: str or float


def _tokens(text: str) -> list[tuple[str, str]]:
    tokens, at = [], 0
    while at < len(text):
        if not text[at:].strip():
            break
        match = TOKEN.match(text, at)
        if match is None or match.end() == at:
            raise ValueError(f"cannot read {text[at:].strip()[:20]!r}")
        kind = match.lastgroup
        tokens.append((kind, match[kind]))
        at = match.end()
    return tokens


def _literal(token: tuple[str, str]) -> str | float:
    kind, text = token
    if kind == "string":
        return text[1:-1]
    if kind == "number":
        value = float(text)
        if not math.isfinite(value):
            raise ValueError(f"{text} is not a finite number")
        return value
    raise ValueError(f"expected a quoted string or a number, found {text!r}")


def parse_where(text: str) -> list[Condition]:
    """The conditions of a ``where`` clause; ValueError (saying what is wrong) for anything outside the grammar."""
    tokens, conditions = _tokens(text), []
    i = 0
    while True:
        if i >= len(tokens) or tokens[i][0] != "word" or tokens[i][1] in ("and", "in"):
            raise ValueError("expected a column name")
        column = tokens[i][1]
        operator = tokens[i + 1][1] if i + 1 < len(tokens) else ""
        if operator in ("==", "!=") and tokens[i + 1][0] == "op":
            if i + 2 >= len(tokens):
                raise ValueError(f"{column} {operator} needs a value")
            conditions.append(Condition(column, operator, (_literal(tokens[i + 2]),)))
            i += 3
        elif operator == "in" and tokens[i + 1][0] == "word":
            if i + 2 >= len(tokens) or tokens[i + 2] != ("op", "["):
                raise ValueError(f"{column} in needs a list: [value, ...]")
            values, i = [], i + 3
            while True:
                if i >= len(tokens):
                    raise ValueError("unclosed [")
                values.append(_literal(tokens[i]))
                if i + 1 >= len(tokens) or tokens[i + 1] not in (("op", ","), ("op", "]")):
                    raise ValueError("values in [...] are separated by commas and closed by ]")
                i += 2
                if tokens[i - 1] == ("op", "]"):
                    break
            conditions.append(Condition(column, "in", tuple(values)))
        else:
            raise ValueError(f"after {column!r}: expected ==, != or in")
        if i == len(tokens):
            return conditions
        if tokens[i] != ("word", "and"):
            raise ValueError(f"conditions are joined by 'and', found {tokens[i][1]!r}")
        i += 1


def _matches(cells: pd.Series, values: tuple) -> pd.Series:
    """Whether each cell equals one of ``values``: strings compare with the cell's text, numbers with its value."""
    hit = pd.Series(False, index=cells.index)
    numbers = pd.to_numeric(cells, errors="coerce")
    for value in values:
        hit |= (numbers == value) if isinstance(value, float) else (cells.astype(str) == value)
    return hit


def apply_where(frame: pd.DataFrame, text: str, where: str) -> pd.DataFrame:
    """The rows of ``frame`` that meet the ``where`` clause ``text``; ``where`` names the marker in an error."""
    try:
        conditions = parse_where(text)
    except ValueError as err:
        raise UserError(f"{where}: 'where {text}' is not a filter ({err}); write column == 'value', "
                        "column != 'value' or column in ['a', 'b'], joined by and.") from None
    if frame.empty and not len(frame.columns):
        return frame  # a table not in the bundle yet (pending): the clause is read, there is nothing to filter
    keep = pd.Series(True, index=frame.index)
    for condition in conditions:
        if condition.column not in frame.columns:
            raise UserError(f"{where}: 'where {text}' names no column {condition.column!r} of this table (its "
                            f"columns: {', '.join(map(str, frame.columns))}).")
        hit = _matches(frame[condition.column], condition.values)
        keep &= ~hit if condition.operator == "!=" else hit
    return frame[keep].reset_index(drop=True)
