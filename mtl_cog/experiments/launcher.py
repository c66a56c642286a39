"""Where the runs of a sweep or a reproduction execute: local subprocesses, or a cluster through submitit.

Both launchers take the same list of ``RunJob`` (a command, its log file, the working directory)
and return the exit codes in order, printing one line per start and per end (readable in logs):

- ``LocalLauncher(parallel, gpus_per_run)``: at most ``parallel`` subprocesses at a time on this
  machine. On a machine with GPUs each running slot owns its own ``gpus_per_run`` GPUs
  (``CUDA_VISIBLE_DEVICES``), so two runs never share a GPU whatever order they finish in.
- ``SubmititLauncher(executor)``: one job per run through submitit (https://github.com/facebookincubator/submitit),
  an existing engine for Slurm (``submitit.AutoExecutor(cluster="slurm")``) that also has a local
  executor (used by the tests). Each job runs the same command (``shell_command``) in the user's
  working directory; with ``--gpus-per-run N > 1`` that command is an ``accelerate launch`` with N
  processes of its own. We write no scheduler: submitit submits, polls and cancels.

Ctrl-C stops (local) or cancels (submitit) every unfinished run and raises ``KeyboardInterrupt``;
the run folders keep their last saved state, so the next invocation resumes them.

A run's command runs with the *caller's* working directory (``cwd``), so relative paths
(``output_dir=runs``, ``data.root=data``, the default cache) resolve where the user is, not in the
clone; ``PYTHONPATH`` gets the folder holding ``mtl_cog`` so a clone that is not installed works too.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from mtl_cog.config.arguments import whole_number
from mtl_cog.errors import UserError
from mtl_cog.io import output_folder

# The folder holding the mtl_cog package (the clone, or site-packages): on every run's PYTHONPATH.
PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])
LAUNCHERS = ("local", "slurm")


@dataclass(frozen=True)
class RunJob:
    name: str  # shown in progress lines, e.g. "run_03" or "digits/cog_ts/seed1"
    command: tuple[str, ...]
    log: Path  # stdout and stderr of the run (appended: a resumed run keeps its first attempt's log)
    cwd: Path = field(default_factory=Path.cwd)  # the user's working directory
    env: tuple[tuple[str, str], ...] = ()  # extra environment variables, e.g. OMP_NUM_THREADS


def python_module_command(module: str, args: list[str], processes: int = 1, port_seed: str = "") -> list[str]:
    """``python -m module args``; with ``processes > 1`` the same under ``accelerate launch`` (one process per GPU).

    A one-process run is exactly the process ``accelerate launch`` would start. Runs that share a
    node need distinct rendezvous ports: the port is derived from ``port_seed`` (the run folder).
    """
    if processes <= 1:
        return [sys.executable, "-m", module, *args]
    port = 20000 + int(hashlib.sha1(port_seed.encode()).hexdigest(), 16) % 10000
    return [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(processes), "--multi_gpu",
            "--main_process_port", str(port), "-m", module, *args]


def train_command(run_dir: Path, configs: list[Path], overrides: list[str], resume: bool,
                  processes: int = 1) -> list[str]:
    """The command that trains one run of a campaign: a new run from ``configs`` (merged in order) and
    ``overrides``, or ``--resume`` of the unfinished run in ``run_dir`` (which keeps its own settings)."""
    files = [arg for config in configs for arg in ("--config", str(config))]
    train_args = ["--resume", str(run_dir)] if resume else [*files, *overrides]
    return python_module_command("mtl_cog.cli.train", train_args, processes, str(run_dir.resolve()))


def shell_command(job: RunJob) -> list[str]:
    """``job`` as one ``sh -c`` line: cd to the user's folder, set the variables, append all output to the log.

    What a submitit job executes (``subprocess.call`` on it, which returns the exit code): only
    the standard library is unpickled on the node, so a job starts without importing mtl_cog or
    torch twice, and it keeps the node's own environment (Slurm's GPU and task variables) and
    adds only ours.
    """
    exports = "".join(f"export {key}={shlex.quote(value)}; " for key, value in job.env)
    script = (f'export PYTHONPATH="$0${{PYTHONPATH:+:$PYTHONPATH}}"; {exports}'
              f'cd {shlex.quote(str(job.cwd))} && exec "$@" >> {shlex.quote(str(job.log))} 2>&1')
    return ["/bin/sh", "-c", script, PACKAGE_PARENT, *job.command]


OnDone = Callable[[int, int], None]  # (job index, exit code), called as each job ends (the campaign collects it)


class Launcher(Protocol):
    def run(self, jobs: list[RunJob], on_done: OnDone | None = None) -> list[int]: ...


def _report(index: int, total: int, job: RunJob, code: int, seconds: float, on_done: OnDone | None) -> None:
    status = "done" if code == 0 else f"FAILED (exit {code}, see {job.log})"
    print(f"[{index + 1}/{total}] {job.name}: {status} after {seconds:.0f} s", flush=True)
    if on_done is not None:
        on_done(index, code)


class LocalLauncher:
    """Subprocesses on this machine, ``parallel`` at a time; one slot = its own GPUs when there are GPUs."""

    def __init__(self, parallel: int = 1, gpus_per_run: int = 1, visible_gpus: int | None = None) -> None:
        if parallel < 1:
            raise UserError(f"--parallel must be >= 1. Got {parallel}.")
        if gpus_per_run < 0:
            raise UserError(f"--gpus-per-run must be >= 0. Got {gpus_per_run}.")
        if visible_gpus is None:
            import torch  # only to count GPUs; the launcher itself never touches a tensor

            visible_gpus = torch.cuda.device_count()
        self.gpus_per_run = gpus_per_run
        self.gpu_slots = visible_gpus // gpus_per_run if visible_gpus and gpus_per_run else 0
        if gpus_per_run > 1 and self.gpu_slots == 0:
            raise UserError(f"--gpus-per-run {gpus_per_run}: this machine has {visible_gpus} GPU(s).")
        self.parallel = min(parallel, self.gpu_slots) if self.gpu_slots else parallel

    def _slot_env(self, slot: int) -> dict[str, str]:
        if not self.gpu_slots:
            return {}
        first = slot * self.gpus_per_run
        return {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in range(first, first + self.gpus_per_run))}

    def run(self, jobs: list[RunJob], on_done: OnDone | None = None) -> list[int]:
        codes: list[int | None] = [None] * len(jobs)
        running: dict[int, tuple[subprocess.Popen, int, float, object]] = {}  # job -> (process, slot, start, log)
        pending = list(range(len(jobs)))
        try:
            while pending or running:
                while pending and len(running) < self.parallel:
                    i = pending.pop(0)
                    slot = min(set(range(self.parallel)) - {s for _, s, _, _ in running.values()})
                    job = jobs[i]
                    env = {**os.environ, **dict(job.env), **self._slot_env(slot)}
                    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_PARENT, env.get("PYTHONPATH", "")) if p)
                    output_folder(job.log.parent, "the log folder")
                    log = open(job.log, "a")  # noqa: SIM115  (closed when the process is collected)
                    print(f"[{i + 1}/{len(jobs)}] {job.name}: started", flush=True)
                    process = subprocess.Popen(list(job.command), cwd=job.cwd, env=env, stdout=log,
                                               stderr=subprocess.STDOUT)
                    running[i] = (process, slot, time.monotonic(), log)
                for i, (process, _, start, log) in list(running.items()):
                    if process.poll() is not None:
                        log.close()
                        codes[i] = process.returncode
                        _report(i, len(jobs), jobs[i], process.returncode, time.monotonic() - start, on_done)
                        del running[i]
                time.sleep(0.2)
        except KeyboardInterrupt:
            stop_processes([p for p, _, _, _ in running.values()])
            raise
        return [int(c) for c in codes]


def stop_processes(processes: list[subprocess.Popen], grace: float = 30.0) -> None:
    """SIGINT (a training run exits cleanly, its saved state intact), then kill what is still alive."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
    deadline = time.monotonic() + grace
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class SubmititLauncher:
    """One submitit job per run (Slurm, or submitit's local executor); the driver waits for all of them."""

    def __init__(self, executor, poll_seconds: float = 5.0) -> None:
        self.executor = executor
        self.poll_seconds = poll_seconds

    def run(self, jobs: list[RunJob], on_done: OnDone | None = None) -> list[int]:
        import submitit  # only where a cluster launcher is asked for

        if not jobs:
            return []
        for job in jobs:
            output_folder(job.log.parent, "the log folder")
        try:
            with self.executor.batch():  # one Slurm job array
                handles = [self.executor.submit(subprocess.call, shell_command(job)) for job in jobs]
        except (submitit.core.utils.FailedJobError, submitit.core.utils.FailedSubmissionError,
                subprocess.CalledProcessError, OSError) as err:  # sbatch refused the array (partition, account...)
            said = [line for line in str(err).strip().splitlines() if line.strip()]
            raise UserError(f"Slurm refused the {len(jobs)} job(s): {said[-1] if said else type(err).__name__}. "
                            "Check --partition, --time-limit, --gpus-per-run, --mem-per-run and --slurm-args "
                            "against the cluster's limits; nothing was submitted.") from None
        index = {id(h): i for i, h in enumerate(handles)}
        start = time.monotonic()
        for i, (job, handle) in enumerate(zip(jobs, handles)):
            print(f"[{i + 1}/{len(jobs)}] {job.name}: submitted as job {handle.job_id}", flush=True)
        codes: list[int] = [1] * len(jobs)
        try:
            for handle in submitit.helpers.as_completed(handles, poll_frequency=self.poll_seconds):
                i = index[id(handle)]
                try:
                    codes[i] = int(handle.result())
                except Exception as err:  # noqa: BLE001  (the job itself died: node failure, time limit, OOM kill)
                    codes[i] = 1
                    print(f"[{i + 1}/{len(jobs)}] {jobs[i].name}: job {handle.job_id} failed: "
                          f"{str(err).strip().splitlines()[-1] if str(err).strip() else err!r}", flush=True)
                _report(i, len(jobs), jobs[i], codes[i], time.monotonic() - start, on_done)
        except KeyboardInterrupt:
            for handle in handles:
                if not handle.done():
                    handle.cancel(check=False)
            print(f"cancelled the unfinished jobs ({', '.join(h.job_id for h in handles if not h.done())})",
                  flush=True)
            raise
        return codes


# ---------------------------------------------------------------------------------------------
# Command-line options shared by sweep.py and reproduce.py


def slurm_memory(text: str) -> str:
    """sbatch's --mem: a positive whole number with an optional unit K, M, G or T (and B), e.g. 16GB, 4000M."""
    match = re.fullmatch(r"([0-9]+)([KMGT]B?)?", text.strip(), flags=re.IGNORECASE)
    if match is None or int(match.group(1)) < 1:
        raise argparse.ArgumentTypeError(f"expected a memory size such as 16GB or 4000M, got {text!r}")
    return text.strip()


def add_launcher_arguments(parser: argparse.ArgumentParser, parallel_flag: str = "--parallel") -> None:
    group = parser.add_argument_group("where the runs execute")
    group.add_argument("--launcher", choices=LAUNCHERS, default="local",
                       help="local: subprocesses here (default); slurm: one Slurm job per run through submitit")
    group.add_argument(parallel_flag, dest="parallel", type=whole_number(1, 4096, "runs at a time >= 1"),
                       default=None, help="local: runs at a time (default 1 for sweeps, 2 for reproduce)")
    group.add_argument("--gpus-per-run", type=whole_number(1, 1024, "a GPU count >= 1"), default=None,
                       help="GPUs (= accelerate processes) per run; default 1 on slurm, and locally 1 when "
                            "there are GPUs")
    group.add_argument("--partition", default=None, help="slurm: the partition")
    group.add_argument("--time-limit", type=whole_number(1, 366 * 24 * 60, "minutes >= 1"), default=24 * 60,
                       metavar="MINUTES", help="slurm: time limit of each run's job (default 1440)")
    group.add_argument("--cpus-per-run", type=whole_number(1, 4096, "a CPU count >= 1"), default=6,
                       help="slurm: CPU cores per run (default 6, as the paper)")
    group.add_argument("--mem-per-run", type=slurm_memory, default="16GB",
                       help="slurm: memory per run (default 16GB, as the paper)")
    group.add_argument("--slurm-setup", nargs="*", default=[], metavar="LINE",
                       help="slurm: shell lines run before each job, e.g. 'module load cuda'")
    group.add_argument("--slurm-args", nargs="*", default=[], metavar="KEY=VALUE",
                       help="slurm: more sbatch options, e.g. account=myproj qos=high")


def processes_per_run(args: argparse.Namespace) -> int:
    """How many processes one run's command starts (accelerate launch when > 1)."""
    return max(1, args.gpus_per_run or 1)


def make_launcher(args: argparse.Namespace, log_folder: Path, default_parallel: int = 1,
                  executor=None) -> Launcher:
    """The launcher the options ask for; ``executor`` replaces the Slurm one (tests pass submitit's local one)."""
    if args.launcher == "local" and executor is None:
        gpus = 1 if args.gpus_per_run is None else args.gpus_per_run
        return LocalLauncher(args.parallel or default_parallel, gpus)
    if executor is None:
        executor = slurm_executor(args, log_folder)
    return SubmititLauncher(executor)


def check_launcher(args: argparse.Namespace, executor=None) -> None:
    """What ``make_launcher`` would refuse, without starting anything (dry runs call it too)."""
    if args.launcher == "slurm" and executor is None and shutil.which("sbatch") is None:
        raise UserError("--launcher slurm needs Slurm's sbatch on PATH (run this on the cluster's login node).")


def slurm_executor(args: argparse.Namespace, log_folder: Path):
    import submitit

    check_launcher(args)
    extra = {}
    for item in args.slurm_args:
        if "=" not in item:
            raise UserError(f"--slurm-args item {item!r} must look like key=value (e.g. account=myproj).")
        key, value = item.split("=", 1)
        extra[key.replace("-", "_")] = value
    executor = submitit.AutoExecutor(folder=log_folder / "%j", cluster="slurm")
    executor.update_parameters(
        name="mtl_cog", timeout_min=args.time_limit, nodes=1, tasks_per_node=1, gpus_per_node=processes_per_run(args),
        cpus_per_task=args.cpus_per_run, slurm_mem=args.mem_per_run, slurm_setup=list(args.slurm_setup),
        **({"slurm_partition": args.partition} if args.partition else {}),
        **({"slurm_additional_parameters": extra} if extra else {}),
    )
    return executor


def thread_env(parallel: int, threads: int | None = None, gpus: bool = False) -> tuple[tuple[str, str], ...]:
    """The one thread policy of every campaign: a CPU run gets ``threads`` torch threads (default: this
    machine's cores shared by the runs at a time, at least 1), so parallel runs do not oversubscribe the
    cores; GPU runs keep torch's default. The count each run used is recorded (``timing.jsonl``)."""
    if gpus and threads is None:
        return ()
    count = threads or max(1, (os.cpu_count() or 1) // max(1, parallel))
    return (("OMP_NUM_THREADS", str(count)), ("MKL_NUM_THREADS", str(count)))


def threads_of(env: tuple[tuple[str, str], ...]) -> int:
    return int(dict(env).get("OMP_NUM_THREADS", os.cpu_count() or 1))
