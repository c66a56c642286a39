"""``mtl-cog <command> ...``: one entry point for every command (installed by ``pip install``).

    mtl-cog train --config configs/synthetic/cog_ts.yaml train.epochs=5
    accelerate launch -m mtl_cog.cli.main train ...      # several processes
    mtl-cog evaluate --run RUN_DIR --posthoc ts vs
    mtl-cog --help                                       # the list of commands

Each command is also ``python scripts/<command>.py`` and ``mtl-cog-<command>`` is not needed.
"""

from __future__ import annotations

import sys

from mtl_cog.cli import (
    benchmark,
    calibration_drift,
    compare,
    evaluate,
    generate_configs,
    generate_reference,
    lane,
    launch,
    leader_curve,
    list_front,
    parameter_counts,
    prepare_data,
    regenerate_docs_tables,
    report,
    reproduce,
    sweep,
    train,
)
from mtl_cog.errors import UserError, run_cli

COMMANDS = {
    "train": train,
    "evaluate": evaluate,
    "compare": compare,
    "sweep": sweep,
    "leader-curve": leader_curve,
    "reproduce": reproduce,
    "report": report,
    "regenerate-docs-tables": regenerate_docs_tables,
    "prepare-data": prepare_data,
    "benchmark": benchmark,
    "parameter-counts": parameter_counts,
    "calibration-drift": calibration_drift,
    "list-front": list_front,
    "generate-configs": generate_configs,
    "generate-reference": generate_reference,
    "launch": launch,
    "lane": lane,
}


def usage() -> str:
    lines = ["usage: mtl-cog <command> [options]   (mtl-cog <command> --help for its options)", "", "commands:"]
    lines += [f"  {name:<18} {(module.__doc__ or '').strip().splitlines()[0]}" for name, module in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> object:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
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
