"""Command-line values, checked when they are parsed: one place for every command's numbers.

argparse's ``type=int`` accepts ``0``, ``-5`` and ``10**12`` alike and ``type=float`` accepts
``nan`` and ``inf``, so each command used to check (or forget to check) its own ranges after
parsing, and a value nobody checked ended in a traceback, a silent fallback (``--parallel 0``
ran one at a time) or a wrong column name (``--eps nan``). Every numeric option is declared
with one of these types instead, so its range is part of its declaration, and ``Parser`` turns
any argparse complaint into one ``error:`` line (a ``UserError``, exit 2) like every other
mistake, instead of argparse's usage block.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence

from mtl_cog.errors import UserError


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are ``UserError``s: one line, exit 2, under ``run_cli``."""

    def error(self, message: str):  # argparse's own: usage on stderr + SystemExit(2)
        raise UserError(f"{self.prog}: {message} (see {self.prog} --help).")


def whole_number(low: int | None = 1, high: int | None = None, what: str = "a whole number") -> Callable[[str], int]:
    """An argparse type: an integer in [low, high] (None: unbounded), written without a fraction."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if (low is not None and value < low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected {what} in [{low if low is not None else '-inf'}, "
                                             f"{high if high is not None else 'inf'}], got {value}")
        return value

    parse.__name__ = what  # argparse names the type in some messages
    return parse


def real_number(low: float | None = None, high: float | None = None, low_open: bool = False,
                what: str = "a number") -> Callable[[str], float]:
    """An argparse type: a finite float in [low, high] (``low_open``: (low, high]); never nan or inf."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        below = low is not None and (value <= low if low_open else value < low)
        if not math.isfinite(value) or below or (high is not None and value > high):
            bounds = f"{'(' if low_open else '['}{low if low is not None else '-inf'}, " \
                     f"{high if high is not None else 'inf'}]"
            raise argparse.ArgumentTypeError(f"expected {what}, finite and in {bounds}, got {text!r}")
        return value

    parse.__name__ = what
    return parse


def distinct(values: Sequence | None, flag: str) -> None:
    """Refuse a list option that names one value twice (``--seeds 0 0`` would run two jobs in one folder)."""
    if values is None:
        return
    twice = sorted({v for v in values if list(values).count(v) > 1}, key=str)
    if twice:
        raise UserError(f"{flag} lists {', '.join(map(str, twice))} more than once; give each value once.")


def add_deprecated_alias(parser: argparse.ArgumentParser, old: str, new: str, nargs: str | None = None,
                         type: Callable[[str], object] | None = None) -> None:  # noqa: A002  (argparse's name)
    """``old`` still works for ``new`` (its values land in ``new``'s destination) with one line on stderr.

    Every command names data sets and methods with ``--data`` and ``--method``; the older spellings
    (``--datasets``, ``--methods``, ``--dataset``, ``--task``) keep scripts working while they are updated.
    """

    class Alias(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            import sys

            print(f"{parser.prog}: {old} is deprecated; use {new} (it takes the same values).", file=sys.stderr)
            setattr(namespace, new.lstrip("-").replace("-", "_"), values)

    parser.add_argument(old, nargs=nargs, type=type, action=Alias, help=argparse.SUPPRESS)
