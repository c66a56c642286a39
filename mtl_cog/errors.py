"""User-facing errors: the entry points print their message and exit non-zero, no traceback.

Every class here is a mistake in what the user gave (config, data, files), so its message must
name the key, file or value at fault and, where it can, say how to fix it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable


class UserError(Exception):
    """Base of every error caused by user input rather than a bug."""


class ReportError(UserError, ValueError):
    """No runs found, or a run folder a report cannot read; the message names the folder/file."""


class PredictionFileError(UserError, ValueError):
    """A prediction file that cannot be trusted; the message names file, key and problem."""


class TruthError(UserError, ValueError):
    """True probabilities that do not fit the predictions they come with."""


class CacheError(UserError, OSError):
    """The cache folder cannot be created or written; the message names it."""


class PosthocError(UserError, ValueError):
    """An unknown post-hoc method or predictions that do not fit together."""


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that is missing, not safetensors, or does not fit the model."""


class RunFolderError(UserError, ValueError):
    """A folder that is not (or not yet) a run folder."""


class UnknownNameError(UserError, ValueError):
    """A config named a registered variant that does not exist; the message lists the options."""


class NonFiniteLossError(UserError, RuntimeError):
    """The loss became NaN or infinite; the message names epoch and step."""


class ConfigError(UserError, ValueError):
    """A user error in a config file or override; the message names key and value."""


class DataError(UserError, RuntimeError):
    """Missing or malformed data files; the message names the file and how to get the data."""


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
