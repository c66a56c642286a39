"""User-facing errors: the entry points print their message and exit non-zero, no traceback.

Every class here is a mistake in what the user gave (config, data, files), so its message must
name the key, file or value at fault and, where it can, say how to fix it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable


class UserError(Exception):
    """Base of every error caused by user input rather than a bug."""


def run_cli(main: Callable[[], object]) -> None:
    """Run ``main``; a ``UserError`` becomes ``error: <message>`` on stderr and exit code 2."""
    try:
        main()
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:  # Ctrl-C is a choice, not a crash: no traceback
        print("interrupted (a training run continues from its last saved state with --resume RUN_DIR)",
              file=sys.stderr)
        sys.exit(130)
