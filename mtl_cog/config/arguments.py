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
import re
import sys
from collections.abc import Callable, Sequence

from mtl_cog.errors import UserError

OVERRIDE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*=")  # the start of a ``key=value`` config override
OVERRIDES = "overrides"  # the positional that takes a command's ``key=value`` overrides


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are ``UserError``s: one line, exit 2, under ``run_cli``.

    Every ``key=value`` word that is not an option's own value is a config override, wherever it stands:
    argparse alone hands ``--seeds 0 train.epochs=2`` to ``--seeds`` (a list option, ``nargs="+"``, takes
    every word up to the next option) and refuses an override between two options. A list option whose
    metavar shows ``=`` takes ``key=value`` items itself (``sweep --grid KEY=V1,V2``) and keeps them.
    """

    def error(self, message: str):  # argparse's own: usage on stderr + SystemExit(2)
        raise UserError(f"{self.prog}: {message} (see {self.prog} --help).")

    def _get_values(self, action, arg_strings):  # every option's values pass here (argparse's own hook)
        if action.option_strings and any(not text.strip() for text in arg_strings):
            # "--method ''" fell back to the default method: an empty value is a mistake, never a choice
            self.error(f"{'/'.join(action.option_strings)}: an empty value; give a value or leave the option out")
        return super()._get_values(action, arg_strings)

    def parse_known_args(self, args=None, namespace=None):
        argv = list(sys.argv[1:] if args is None else args)
        if any(action.nargs == argparse.REMAINDER for action in self._actions):  # the rest is another command's
            return super().parse_known_args(argv, namespace)
        takes_overrides = any(action.dest == OVERRIDES and not action.option_strings for action in self._actions)
        kept, moved = self._split_overrides(argv, anywhere=takes_overrides)
        if not takes_overrides:
            if moved:
                self.error(f"{moved[0]!r}: this command takes no key=value overrides (its options set what it runs)")
            return super().parse_known_args(argv, namespace)
        namespace, extras = super().parse_known_args(kept, namespace)
        setattr(namespace, OVERRIDES, [*moved, *(getattr(namespace, OVERRIDES) or [])])
        return namespace, extras

    def _takes(self, word: str) -> int | str:
        """How many words after option ``word`` are its values: a count, "list", or "items" (key=value items)."""
        if "=" in word:  # --flag=value carries its value
            return 0
        matches = [flag for flag in self._option_string_actions if flag == word] or [
            flag for flag in self._option_string_actions if self.allow_abbrev and flag.startswith(word)]
        if len(matches) != 1:
            return 0  # unknown or ambiguous: argparse reports it
        action = self._option_string_actions[matches[0]]
        if action.nargs in ("+", "*"):
            return "items" if "=" in str(action.metavar or "") else "list"
        return action.nargs if isinstance(action.nargs, int) else (0 if action.nargs == 0 else 1)

    def _split_overrides(self, argv: list[str], anywhere: bool) -> tuple[list[str], list[str]]:
        """(argv without its ``key=value`` overrides, the overrides in command-line order); after ``--``, all kept.

        ``anywhere``: every such word that is no option's value; else only those a list option would swallow."""
        kept, moved, takes = [], [], 0
        for position, word in enumerate(argv):
            if word == "--":
                return kept + argv[position:], moved
            if word.startswith("-") and not _is_number(word):
                takes = self._takes(word)
            elif isinstance(takes, int) and takes > 0:  # the value of a one-value option, whatever it looks like
                takes -= 1
            elif (takes == "list" or (anywhere and takes != "items")) and OVERRIDE.match(word):
                moved.append(word)
                continue
            kept.append(word)
        return kept, moved


def _is_number(word: str) -> bool:
    """A negative number (``-5``, ``-1e-3``) is a value, not an option."""
    try:
        float(word)
        return True
    except ValueError:
        return False


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

    dest, said = new.lstrip("-").replace("-", "_"), f"_given_as_{new.lstrip('-').replace('-', '_')}"

    def contradicts(parser, namespace, values, option_string) -> None:
        """Refuse the two spellings with different values (``--data synthetic --datasets digits`` kept the
        later, silently); in either order: each records what it set."""
        earlier = getattr(namespace, said, None)
        if earlier is not None and earlier[1] != values and old in (earlier[0], option_string):
            parser.error(f"{earlier[0]} {' '.join(map(str, _listed(earlier[1])))} and {option_string} "
                         f"{' '.join(map(str, _listed(values)))} name the same option with different values; "
                         f"give {new} once")
        setattr(namespace, said, (option_string, values))

    class Alias(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            import sys

            contradicts(parser, namespace, values, option_string)
            print(f"{parser.prog}: {old} is deprecated; use {new} (it takes the same values).", file=sys.stderr)
            setattr(namespace, dest, values)

    target = parser._option_string_actions.get(new)
    if target is not None and target.__class__ is argparse._StoreAction:  # the new spelling checks the old one too
        class Checked(argparse._StoreAction):
            def __call__(self, parser, namespace, values, option_string=None):
                contradicts(parser, namespace, values, option_string)
                super().__call__(parser, namespace, values, option_string)

        target.__class__ = Checked
    parser.add_argument(old, nargs=nargs, type=type, action=Alias, help=argparse.SUPPRESS)


def _listed(values) -> list:
    return list(values) if isinstance(values, list | tuple) else [values]
