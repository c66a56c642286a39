"""Write docs/reference/commands.md and config.md from the code: every command's flags and every config key.

    python scripts/generate_reference.py            # (re)write both pages
    python scripts/generate_reference.py --check    # write nothing; exit 1 when a page is not as generated

The flags come from each command's own argparse parser (the one ``mtl-cog <command>`` parses with,
caught as it is about to parse, so nothing runs), the keys from the config schema
(``mtl_cog.config.reference``). Run it after changing a flag or a config key; the pages are
deterministic (no paths of this machine, no dates), so ``--check`` and the test compare them byte for byte.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

from mtl_cog.cli import main as dispatcher
from mtl_cog.config.reference import config_markdown
from mtl_cog.errors import UserError, run_cli
from mtl_cog.io import atomic_write_text

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "docs" / "reference"
# Commands whose options belong to another tool: documented by pointing at it, not copied (they change with it).
PASSTHROUGH = {"launch": "`accelerate launch`"}


class _Caught(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        super().__init__(parser.prog)
        self.parser = parser


@contextmanager
def _catching_parsers():
    def catch(self, *args, **kwargs):
        raise _Caught(self)

    with mock.patch.object(argparse.ArgumentParser, "parse_known_args", catch):
        yield


def command_parser(name: str) -> argparse.ArgumentParser:
    """The parser ``mtl-cog <name>`` parses its arguments with, stopped before it parses anything."""
    module = dispatcher.COMMANDS[name]
    entry = getattr(module, "parse_args", None) or module.main
    with _catching_parsers():
        try:
            entry([])
        except _Caught as caught:
            caught.parser.prog = f"mtl-cog {name}"
            return caught.parser
    raise UserError(f"mtl-cog {name}: no argparse parser was reached by {entry.__module__}.{entry.__name__}([]); "
                    "document it in PASSTHROUGH of mtl_cog/cli/generate_reference.py.")


def _relative(value: object) -> str:
    """A default as text, with this checkout's absolute paths made relative (the page must not depend on where
    the repository lies)."""
    text = " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return text.replace(f"{REPO}/", "").replace(str(REPO), ".")


def _value(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    name = action.metavar or (action.dest.upper() if action.option_strings else action.dest)
    if isinstance(name, tuple):
        name = " ".join(name)
    if action.choices is not None:
        name = "{" + ",".join(map(str, action.choices)) + "}"
    return {None: name, "?": f"[{name}]", "*": f"[{name} ...]", "+": f"{name} [...]"}.get(action.nargs,
                                                                                       f"{name} x{action.nargs}")


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def flag_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:  # argparse keeps its actions here; there is no public list
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        flag = ", ".join(action.option_strings) or action.dest
        help_text = (action.help or "") % {**vars(action), "prog": parser.prog} if action.help else ""
        default = action.default
        empty = default is None or default is False or default == [] or default is argparse.SUPPRESS
        shown = "" if empty or action.nargs == 0 else f"`{_relative(default)}`"
        required = " (required)" if action.required and action.option_strings else ""
        value = _value(action)
        rows.append(f"| `{flag}`{required} | {f'`{_cell(value)}`' if value else ''} | {_cell(shown)} | "
                    f"{_cell(help_text)} |")
    return rows


def _summary(module) -> list[str]:
    """The docstring's first paragraph and its first block of indented example lines."""
    paragraphs = (module.__doc__ or "").strip().split("\n\n")
    lines = [" ".join(paragraphs[0].split()), ""]
    examples = next((p for p in paragraphs[1:3] if p.startswith("    ")), None)
    if examples:
        lines += ["```bash", *(line.strip() for line in examples.splitlines()), "```", ""]
    return lines


def commands_markdown() -> str:
    lines = ["# Commands", "",
             "Generated from the commands' argument parsers by `mtl-cog generate-reference` (do not edit; "
             "`tests/test_reference_docs.py` fails when this page and the code disagree). Every command is "
             "`mtl-cog <command>` once installed and `python scripts/<command>.py` from a clone "
             "(`train` is `scripts/train_mtl.py`); `mtl-cog <command> --help` prints the full description.", ""]
    lines += [f"- [`{name}`](#{name}): {' '.join((module.__doc__ or '').split(chr(10))[0].split())}"
              for name, module in dispatcher.COMMANDS.items()]
    for name, module in dispatcher.COMMANDS.items():
        lines += ["", f"## {name}", "", *_summary(module)]
        if name in PASSTHROUGH:
            lines.append(f"Takes exactly the options of {PASSTHROUGH[name]} (see its `--help`).")
            continue
        lines += ["| flag | value | default | what |", "|---|---|---|---|", *flag_rows(command_parser(name))]
    return "\n".join(lines) + "\n"


def pages() -> dict[Path, str]:
    return {REFERENCE / "commands.md": commands_markdown(), REFERENCE / "config.md": config_markdown()}


def stale_pages() -> list[Path]:
    """The reference pages that differ from what the code generates now."""
    return [path for path, text in pages().items() if not path.is_file() or path.read_text() != text]


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a page is not as generated")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_pages()
        print("\n".join(f"{p.relative_to(REPO)} is not as generated: run scripts/generate_reference.py"
                        for p in stale) or "the reference pages are as generated")
        return stale
    for path, text in pages().items():
        REFERENCE.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, text)
        print(f"wrote {path.relative_to(REPO)}")
    return []


def cli() -> None:
    run_cli(lambda: sys.exit(1 if main() else 0))


if __name__ == "__main__":
    cli()
