"""Write configs/<data set>/<method>.yaml, the one-line combinations of configs/datasets x configs/methods.

    python scripts/generate_configs.py            # write every missing or stale combination file
    python scripts/generate_configs.py --check    # write nothing; list what is missing, stale or orphaned
    mtl-cog generate-configs ...                  # the same, once installed

Run it after adding ``configs/datasets/<name>.yaml`` or ``configs/methods/<name>.yaml``. Each file
is one ``_base_`` line (``mtl_cog/config/compose.py`` says why they are kept on disk); a file with
settings tuned below that line and a ``#`` comment saying why is kept as it is. Files that combine
no existing data set and method are listed, never deleted (a user's own file may sit there).
Exit code 1 when anything is left to fix.
"""

from __future__ import annotations

import argparse
import sys

from mtl_cog.cli.paths import CONFIGS
from mtl_cog.config.compose import problems, write_combinations
from mtl_cog.errors import run_cli


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a file is not as generated")
    args = parser.parse_args(argv)
    if not args.check:
        for path in write_combinations(CONFIGS):
            print(f"wrote {path}")
    found = problems(CONFIGS)
    print("\n".join(found) or f"every combination in {CONFIGS} is as generated")
    return found


def cli() -> None:
    run_cli(lambda: sys.exit(1 if main() else 0))


if __name__ == "__main__":
    cli()
