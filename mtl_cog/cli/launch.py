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

The launch's own values (from the command line and ``--config_file``, merged as Accelerate merges
them) are checked before anything starts (``check_launch_values``): a process or machine count
below 1, a ``--machine_rank`` outside 0..N-1, a port outside 0..65535, an address that is no IP
address or host name each end in one ``error:`` line instead of a traceback from deep inside
torchrun, a silent one-machine run, or a wait for the rendezvous timeout.
"""

from __future__ import annotations

import copy
import ipaddress
import logging
import re
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


# A host name (RFC 1123): dot-separated labels of letters, digits and inner hyphens.
HOST_NAME = re.compile(r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}"
                       r"[A-Za-z0-9])?)*\.?$")
MAX_PORT = 65535


def is_address(text: str) -> bool:
    """Whether ``text`` is an IPv4/IPv6 address or a syntactically valid host name (it is not looked up)."""
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return bool(HOST_NAME.match(text))


def check_launch_values(args) -> None:
    """Refuse launch values torchrun would fail on with a traceback, take silently, or wait on until its timeout.

    ``args``: Accelerate's launch arguments after its own merge with the config file.
    """
    def whole(name: str) -> int | None:
        value = getattr(args, name, None)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            try:  # a config file may hold "2"
                return int(str(value))
            except ValueError:
                raise UserError(f"--{name} must be a whole number, got {value!r}.") from None
        return value

    processes, machines, rank, port = (whole(n) for n in ("num_processes", "num_machines", "machine_rank",
                                                          "main_process_port"))
    if processes is not None and processes < 1:
        raise UserError(f"--num_processes must be at least 1 (the processes of the whole launch), got {processes}.")
    machines = 1 if machines is None else machines
    if machines < 1:
        raise UserError(f"--num_machines must be at least 1, got {machines}.")
    if rank is not None and not 0 <= rank < machines:
        raise UserError(f"--machine_rank must be 0 to {machines - 1} (this machine's number among --num_machines "
                        f"{machines}), got {rank}.")
    low = 1 if machines > 1 else 0  # 0 = any free port: only one machine can pick it alone
    if port is not None and not low <= port <= MAX_PORT:
        raise UserError(f"--main_process_port must be a port number {low} to {MAX_PORT}"
                        + (" (every machine must know it: 0, any free port, only works on one machine)"
                           if machines > 1 and port == 0 else "") + f", got {port}.")
    address = getattr(args, "main_process_ip", None)
    if address is not None and not is_address(str(address)):
        raise UserError(f"--main_process_ip must be machine 0's IP address or host name, got {address!r}.")
    if machines > 1:
        if address is None or port is None:
            raise UserError(f"a launch on {machines} machines needs --main_process_ip and --main_process_port: where "
                            "the machines meet (machine 0's address and a free port on it).")
        if processes is not None and processes % machines:
            raise UserError(f"--num_processes is the processes of the whole launch: {processes} cannot be split "
                            f"evenly over {machines} machines. Give a multiple of --num_machines.")


def merged_arguments(args):
    """The launch values Accelerate will use (command line over ``--config_file``), or one error line.

    Accelerate merges them in a private function (``_validate_launch_command``), on a copy here so
    that the launch itself merges the original once more; its own refusals (two launch modes, a
    missing config file) become one line too. Where a future Accelerate lacks the function, the
    command-line values are checked as given.
    """
    from accelerate.commands import launch

    validate = getattr(launch, "_validate_launch_command", None)
    if validate is None:
        return args
    logger = logging.getLogger(launch.__name__)
    level = logger.level
    logger.setLevel(logging.ERROR)  # its "values were not passed" warning is printed by the launch itself
    try:
        return validate(copy.deepcopy(args))[0]
    except (ValueError, FileNotFoundError) as err:
        raise UserError(f"accelerate launch: {str(err).strip().splitlines()[0]}") from None
    finally:
        logger.setLevel(level)


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
    check_launch_values(args)  # the command line's values first, so the message names the option given
    check_launch_values(merged_arguments(args))  # then with the config file's
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
