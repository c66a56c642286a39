"""Launch several processes (``accelerate launch``) and report a failure as one ``error:`` line per process.

    python -m mtl_cog.cli.launch --config_file configs/accelerate/multi_process.yaml --quiet scripts/train_mtl.py ...
    mtl-cog launch --config_file configs/accelerate/multi_process.yaml --quiet scripts/train_mtl.py ...

Takes exactly ``accelerate launch``'s options (it runs Accelerate's own launcher). What differs is
the end of a failed launch: torchrun, which Accelerate uses for several processes, reports a
failed process with a ``ChildFailedError`` traceback and a table, and when the main process is
the one that died (killed, out of memory) nothing else says so, since it could not print its own
line. Here each failed process gets one line instead: a process that printed its own ``error:``
line (exit code 2) is not repeated; one that was killed is named with its signal, and the line
says how to continue (a training run keeps its last saved state). Exit code 2 like every other
command (``accelerate launch`` exits with 1 for any failure).

Several machines (``--num_machines N --machine_rank R --main_process_ip IP --main_process_port P``):
machines that do not meet within the rendezvous timeout (one was not started, or cannot reach
machine 0) and a port already in use on machine 0 end in one line each too, instead of the
store's traceback.
"""

from __future__ import annotations

import logging
import subprocess
import sys

from mtl_cog.errors import UserError, run_cli

USER_ERROR_EXIT = 2  # run_cli's exit code: that process already printed its error line


def describe_failure(rank: int, failure, processes: int) -> str | None:
    """One line for a failed process of torchrun's ``ChildFailedError.failures``; None if it printed its own."""
    if failure.exitcode == USER_ERROR_EXIT:
        return None
    how = (f"was stopped by signal {failure.signal_name()}" if failure.exitcode < 0
           else f"ended with exit code {failure.exitcode} (its output above says why)")
    hint = " (killed by hand, or by the system when out of memory?)" if failure.signal_name() == "SIGKILL" else ""
    return (f"process {rank} (pid {failure.pid}) of this {processes}-process launch {how}{hint}. A training run "
            "keeps its last saved state: continue it with --resume RUN_DIR.")


def rendezvous_failure(args, err: Exception) -> str:
    """The line for machines that did not meet: what the launch waited for and what to check."""
    cause = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return (f"the {args.num_machines} machines of this launch did not meet at {args.main_process_ip}:"
            f"{args.main_process_port} ({cause[:200]}). Start every machine with the same --num_machines, "
            "--num_processes, --main_process_ip and --main_process_port and its own --machine_rank (0 to "
            f"{args.num_machines - 1}); machine 0 must be reachable from the others on that port. Each waits "
            "--rdzv_conf timeout=SECONDS for the others (600 by default).")


def main(argv: list[str] | None = None) -> None:
    from accelerate.commands.launch import launch_command, launch_command_parser
    from torch.distributed import DistError
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        launch_command_parser().print_help()
        return
    # torchrun logs each failure and the processes it stops at ERROR level; the lines below replace them
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    args = launch_command_parser().parse_args(argv)
    # --quiet makes Accelerate's one-process launcher exit 1 on any failure, hiding the script's exit code;
    # without it the launcher raises CalledProcessError with that code, which ends below in exit code 2
    args.quiet = False
    try:
        launch_command(args)
    except ChildFailedError as err:
        failures = sorted(err.failures.items())
        # once one process has failed, torchrun stops the others with SIGTERM: those are no cause of their own
        # (a survivor may be stopped after it printed its own line, which must not be followed by a second)
        causes = [(rank, failure) for rank, failure in failures if failure.signal_name() != "SIGTERM"] or failures
        lines = [describe_failure(rank, failure, args.num_processes or len(err.failures)) for rank, failure in causes]
        for line in filter(None, lines):
            print(f"error: {line}", file=sys.stderr, flush=True)
        sys.exit(USER_ERROR_EXIT)
    except DistError as err:  # raised here, by the launcher's rendezvous, before any process of ours started
        if (args.num_machines or 1) <= 1:  # one machine meets itself: anything else is a bug, traceback kept
            raise
        raise UserError(rendezvous_failure(args, err)) from None
    except ConnectionError as err:  # Accelerate's check that machine 0's port is free; its message says what to do
        raise UserError(str(err)) from None
    except subprocess.CalledProcessError as err:  # one process: it printed its own error line (--quiet)
        if err.returncode == USER_ERROR_EXIT:
            sys.exit(USER_ERROR_EXIT)
        raise UserError(f"the launched process ended with exit code {err.returncode} (its output above says "
                        "why).") from None


def cli() -> None:
    run_cli(main)


if __name__ == "__main__":
    cli()
