"""User-facing errors: the entry points print their message and exit non-zero, no traceback.

Every class here is a mistake in what the user gave (config, data, files), so its message must
name the key, file or value at fault and, where it can, say how to fix it.
"""

from __future__ import annotations

import os
import sys
import time
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


class NonFiniteOutputError(UserError, RuntimeError):
    """A network produced NaN or infinite logits, or a calibrator NaN or infinite outputs; the message says where."""


class CogError(UserError, ValueError):
    """A wrong use of ``mtl_cog.cog`` (a leader the model lacks, logits of the wrong shape); the message names it."""


class ConfigError(UserError, ValueError):
    """A user error in a config file or override; the message names key and value."""


class DataError(UserError, RuntimeError):
    """Missing or malformed data files; the message names the file and how to get the data."""


class StorageError(UserError, OSError):
    """A file or folder that cannot be written (read-only, not a folder, disk full, file-size limit)."""


class PeerLostError(UserError, RuntimeError):
    """Another process of a multi-process launch stopped (killed, or failed first) in the middle of the run."""


# Messages of torch.distributed when the other end of a connection went away (gloo on CPUs, NCCL on
# GPUs). Only these become a PeerLostError: any other distributed failure is a bug and keeps its traceback.
PEER_LOST_MARKERS = ("Connection reset by peer", "Connection closed by peer", "Broken pipe",
                     "NCCL communicator was aborted", "Connection refused")
# ... and when it did not answer within the process group's timeout (train.dist_timeout_s): a process or
# machine that hangs, is stopped or lost its network without closing its connections (gloo's message).
PEER_SILENT_MARKERS = ("Timed out waiting",)
# A process other than the main one waits this long before printing a user error (see _print_error).
NON_MAIN_GRACE_S = 10.0


def peer_lost(err: BaseException) -> PeerLostError | None:
    """``err`` as a ``PeerLostError`` if it is a multi-process run losing one of its processes, else None."""
    if int(os.environ.get("WORLD_SIZE", "1")) < 2 or isinstance(err, UserError):
        return None
    kinds = {kind.__name__ for kind in type(err).__mro__}
    text = str(err)
    silent = isinstance(err, RuntimeError) and any(marker in text for marker in PEER_SILENT_MARKERS)
    if not ({"DistNetworkError", "DistBackendError"} & kinds or silent or
            (isinstance(err, RuntimeError) and any(marker in text for marker in PEER_LOST_MARKERS))):
        return None
    first_line = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    launch = f"{os.environ['WORLD_SIZE']}-process launch"
    # torchrun sets LOCAL_WORLD_SIZE, the processes of this machine: fewer than WORLD_SIZE = several machines
    several_machines = os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]) != os.environ["WORLD_SIZE"]
    report = "The launch on that process's machine" if several_machines else "The launcher's report below"
    resume = "A training run keeps its last saved state: continue it with --resume RUN_DIR."
    if silent:
        return PeerLostError(
            f"another process of this {launch} did not answer within train.dist_timeout_s, so this one cannot go on "
            f"({first_line[:200]}): it hangs or was stopped, or its machine lost power or its network. {resume} If "
            "one process rightly works alone for longer (the main process building a data cache), raise "
            "train.dist_timeout_s."
        )
    return PeerLostError(
        f"another process of this {launch} stopped, so this one cannot go on ({first_line[:200]}). {report} names "
        f"the process that failed first and why (its own error line, or a signal such as SIGKILL). {resume}"
    )


def _print_error(message: str) -> None:
    """Print ``error: message`` once per launch, however many processes hit the same error.

    Under a multi-process launch every process usually hits the same user error. Before the
    processes have connected (argument and config errors) they all read the same files, so only
    the first process of each machine (LOCAL_RANK 0) prints it. Later, a process other than the
    main one waits a moment first: the launcher stops every process as soon as one fails, so if the
    main process reports the same error this one is stopped before it prints, while an error only
    this process hit is still printed.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and os.environ.get("RANK", "0") != "0":
        distributed = sys.modules.get("torch.distributed")
        connected = distributed is not None and distributed.is_available() and distributed.is_initialized()
        if not connected and os.environ.get("LOCAL_RANK", "0") != "0":
            return
        time.sleep(NON_MAIN_GRACE_S)
    print(f"error: {message}", file=sys.stderr, flush=True)


def run_cli(main: Callable[[], object]) -> None:
    """Run ``main``; a ``UserError`` becomes ``error: <message>`` on stderr and exit code 2.

    So does a multi-process run that lost one of its processes (``peer_lost``): the message says
    which launch stopped and how to continue, instead of the surviving process's traceback.
    Under ``accelerate launch`` the launcher's own exit code is 1 for any failure of its child (it
    does not pass 2 on); ``--quiet`` and ``configs/accelerate/*.yaml`` keep its output to that line.
    """
    try:
        main()
    except UserError as err:
        _print_error(str(err))
        sys.exit(2)
    except KeyboardInterrupt:  # Ctrl-C is a choice, not a crash: no traceback
        print("interrupted (a training run continues from its last saved state with --resume RUN_DIR)",
              file=sys.stderr)
        sys.exit(130)
    except Exception as err:
        lost = peer_lost(err)
        if lost is None:
            raise
        print(f"error: {lost}", file=sys.stderr, flush=True)
        sys.exit(2)
