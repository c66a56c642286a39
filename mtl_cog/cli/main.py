"""``mtl-cog <command> ...``: one entry point for every command (installed by ``pip install``).

    mtl-cog train --config configs/synthetic/cog_ts.yaml train.epochs=5
    accelerate launch -m mtl_cog.cli.main train ...      # several processes
    mtl-cog evaluate --run RUN_DIR --posthoc ts vs
    mtl-cog --help                                       # the list of commands
    mtl-cog --version

Each command is also ``python scripts/<command>.py`` and ``mtl-cog-<command>`` is not needed.

Only the chosen command's module is imported: importing all of them pulls in torch, timm, W&B and
the plotting stack (about 10 s), which ``--help`` and ``--version`` do not need. The list of
commands reads each module's first docstring line from its source file instead.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from mtl_cog.errors import UserError, run_cli


class Command:
    """One command's module under ``mtl_cog.cli``, imported on first use of anything but its docstring."""

    def __init__(self, module: str) -> None:
        self.module_name = f"mtl_cog.cli.{module}"

    @property
    def __doc__(self) -> str | None:  # the module's docstring, read from its source file (nothing imported)
        origin = importlib.util.find_spec(self.module_name).origin
        return ast.get_docstring(ast.parse(Path(origin).read_text()), clean=False)

    def __getattr__(self, name: str) -> object:  # main, parse_args, ...: the module's own
        return getattr(importlib.import_module(self.module_name), name)


# command -> its module (mtl_cog/cli/<module>.py, whose main(argv) runs it)
COMMANDS = {name: Command(name.replace("-", "_")) for name in (
    "train", "evaluate", "compare", "sweep", "leader-curve", "reproduce", "report", "regenerate-docs-tables",
    "prepare-data", "benchmark", "parameter-counts", "calibration-drift", "list-front", "generate-configs",
    "generate-reference", "launch", "lane")}


def summary(command: str) -> str:
    """The first line of the command's docstring."""
    return (COMMANDS[command].__doc__ or "").strip().splitlines()[0]


def usage() -> str:
    lines = ["usage: mtl-cog <command> [options]   (mtl-cog <command> --help for its options)",
             "       mtl-cog --version", "", "commands:"]
    width = max(map(len, COMMANDS)) + 1
    lines += [f"  {name:<{width}} {summary(name)}" for name in COMMANDS]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> object:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return None
    if argv[0] in ("-V", "--version"):
        try:
            print(f"mtl-cog {version('mtl_cog')}")  # the installed package's (pyproject.toml's) version
        except PackageNotFoundError:
            raise UserError("mtl_cog is not installed, so it has no version: run bash scripts/setup.sh.") from None
        return None
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        raise UserError(f"unknown command {name!r}; the commands are {', '.join(COMMANDS)} (mtl-cog --help).")
    sys.argv = [f"mtl-cog {name}", *rest]  # so argparse names the command in its messages
    return COMMANDS[name].main(rest)


def cli() -> None:
    run_cli(main)


if __name__ == "__main__":
    cli()
