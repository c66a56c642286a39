"""Where the runs of a sweep or a reproduction execute: local subprocesses, or a cluster through submitit.

Both launchers take the same list of ``RunJob`` (a command, its log file, the working directory)
and return the exit codes in order, printing one line per start and per end (readable in logs):

- ``LocalLauncher(parallel, gpus_per_run)``: at most ``parallel`` subprocesses at a time on this
  machine. On a machine with GPUs each running slot owns its own ``gpus_per_run`` GPUs
  (``CUDA_VISIBLE_DEVICES``), so two runs never share a GPU whatever order they finish in; with
  ``--runs-per-device K`` up to K runs share each GPU, each its own process, a run starting only where
  a memory check says it fits (``device_slots``: it waits otherwise; nothing is stopped for space).
- ``SubmititLauncher(executor)``: one job per run through submitit (https://github.com/facebookincubator/submitit),
  an existing engine for Slurm (``submitit.AutoExecutor(cluster="slurm")``) that also has a local
  executor (used by the tests). Each job runs the same command (``shell_command``) in the user's
  working directory; with ``--gpus-per-run N > 1`` that command is an ``accelerate launch`` with N
  processes of its own. We write no scheduler: submitit submits, polls and cancels. With
  ``--runs-per-device K`` one job runs K runs side by side on its GPU (``group_command``).

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
from mtl_cog.experiments.device_slots import DevicePlacer, MemoryProbe, nvidia_smi_probe
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
    """Subprocesses on this machine, ``parallel`` at a time; on GPUs each run gets its own devices, or with
    ``runs_per_device`` K > 1 a share of one: up to K runs per device, each placed after a memory check
    (``mtl_cog.experiments.device_slots``: a run that does not fit waits, nothing is stopped for space)."""

    def __init__(self, parallel: int | None = 1, gpus_per_run: int = 1, visible_gpus: int | None = None,
                 runs_per_device: int = 1, device_memory: int | None = None, probe: MemoryProbe | None = None) -> None:
        if parallel is not None and parallel < 1:
            raise UserError(f"--parallel must be >= 1. Got {parallel}.")
        if gpus_per_run < 0:
            raise UserError(f"--gpus-per-run must be >= 0. Got {gpus_per_run}.")
        if runs_per_device < 1:
            raise UserError(f"--runs-per-device must be >= 1. Got {runs_per_device}.")
        if visible_gpus is None:
            import torch  # only to count GPUs; the launcher itself never touches a tensor

            visible_gpus = torch.cuda.device_count()
        self.gpus_per_run = gpus_per_run
        groups = visible_gpus // gpus_per_run if visible_gpus and gpus_per_run else 0
        if gpus_per_run > 1 and groups == 0:
            raise UserError(f"--gpus-per-run {gpus_per_run}: this machine has {visible_gpus} GPU(s).")
        if runs_per_device > 1 and groups == 0:
            raise UserError(f"--runs-per-device {runs_per_device} shares accelerators, and this machine has none; "
                            "on CPUs --parallel sets the runs at a time.")
        self.gpu_slots = groups * runs_per_device
        # no --parallel with K runs per device: every slot (K x the devices); a CPU machine: 1 at a time
        self.parallel = min(parallel or self.gpu_slots, self.gpu_slots) if self.gpu_slots else (parallel or 1)
        ids = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
        ids = ids if len(ids) >= visible_gpus else [str(g) for g in range(visible_gpus)]
        self.placer = DevicePlacer([",".join(ids[d * gpus_per_run:(d + 1) * gpus_per_run]) for d in range(groups)],
                                   runs_per_device, probe or nvidia_smi_probe, device_memory) if groups else None

    def _slot_env(self, device: int) -> dict[str, str]:
        """The environment of a run placed on device (group) ``device``: it sees those GPUs alone."""
        return {"CUDA_VISIBLE_DEVICES": self.placer.devices[device]} if self.placer else {}

    def run(self, jobs: list[RunJob], on_done: OnDone | None = None) -> list[int]:
        codes: list[int | None] = [None] * len(jobs)
        running: dict[int, tuple[subprocess.Popen, int, float, object]] = {}  # job -> (process, device, start, log)
        pending = list(range(len(jobs)))
        said: set[str] = set()  # wait lines already printed (one per job and reason)
        if self.placer:
            self.placer.check_possible()
        try:
            while pending or running:
                while pending and len(running) < self.parallel:
                    i = pending[0]
                    job = jobs[i]
                    device = self.placer.place() if self.placer else -1
                    if device is None:  # it waits for a run to end or memory to free; nothing is stopped
                        if f"{i}:{self.placer.waiting}" not in said and running:
                            print(f"[{i + 1}/{len(jobs)}] {job.name}: waiting ({self.placer.waiting})", flush=True)
                            said.add(f"{i}:{self.placer.waiting}")
                        elif not running and f"{i}:alone" not in said:
                            print(f"[{i + 1}/{len(jobs)}] {job.name}: waiting for device memory held by other "
                                  f"processes ({self.placer.waiting})", flush=True)
                            said.add(f"{i}:alone")
                        break
                    if self.placer and self.placer.blind and "blind" not in said:
                        print("no device memory reading (nvidia-smi): only --runs-per-device limits the runs per "
                              "device", flush=True)
                        said.add("blind")
                    pending.pop(0)
                    env = {**os.environ, **dict(job.env), **(self._slot_env(device) if self.placer else {})}
                    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_PARENT, env.get("PYTHONPATH", "")) if p)
                    output_folder(job.log.parent, "the log folder")
                    log = open(job.log, "a")  # noqa: SIM115  (closed when the process is collected)
                    where = f" on GPU {self.placer.devices[device]}" if self.placer and self.gpu_slots > 1 else ""
                    print(f"[{i + 1}/{len(jobs)}] {job.name}: started{where}", flush=True)
                    start = self.placer.start(device) if self.placer else time.monotonic()
                    process = subprocess.Popen(list(job.command), cwd=job.cwd, env=env, stdout=log,
                                               stderr=subprocess.STDOUT)
                    running[i] = (process, device, start, log)
                for i, (process, device, start, log) in list(running.items()):
                    if process.poll() is not None:
                        log.close()
                        codes[i] = process.returncode
                        if self.placer:
                            self.placer.finish(device, start)
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


def group_command(jobs: list[RunJob]) -> list[str]:
    """One shell line that runs ``jobs`` side by side (each its own process, on the job's one GPU) and prints their
    exit codes, space-separated, once all have ended: what a Slurm job of ``--runs-per-device K`` executes
    (``subprocess.check_output``: only the standard library is unpickled on the node, as for one run)."""
    starts = "".join(f"{shlex.join(shell_command(job))} & p{i}=$!; " for i, job in enumerate(jobs))
    waits = "".join(f"wait $p{i}; c{i}=$?; " for i in range(len(jobs)))
    return ["/bin/sh", "-c", starts + waits + "echo " + " ".join(f"$c{i}" for i in range(len(jobs)))]


def group_codes(output: str, size: int) -> list[int]:
    """The exit codes ``group_command`` printed (its last line); 1 for each when it printed no such line."""
    lines = output.strip().splitlines()
    words = lines[-1].split() if lines else []
    return [int(w) for w in words] if len(words) == size and all(w.isdigit() for w in words) else [1] * size


class SubmititLauncher:
    """One submitit job per run (Slurm, or submitit's local executor); the driver waits for all of them.

    With ``runs_per_device`` K > 1 one job runs K runs side by side on its GPU (``group_command``): the
    jobs' runs in order, K at a time; each run is still reported and collected on its own when its job ends.
    The K runs start together, with no memory check of their own: K comes from the device check's
    measurement of K runs side by side (docs/guides/cluster.md)."""

    def __init__(self, executor, poll_seconds: float = 5.0, runs_per_device: int = 1) -> None:
        self.executor = executor
        self.poll_seconds = poll_seconds
        self.runs_per_device = runs_per_device

    def run(self, jobs: list[RunJob], on_done: OnDone | None = None) -> list[int]:
        import submitit  # only where a cluster launcher is asked for

        if not jobs:
            return []
        for job in jobs:
            output_folder(job.log.parent, "the log folder")
        k = self.runs_per_device
        groups = [list(range(start, min(start + k, len(jobs)))) for start in range(0, len(jobs), k)]
        try:
            with self.executor.batch():  # one Slurm job array
                if k == 1:
                    handles = [self.executor.submit(subprocess.call, shell_command(job)) for job in jobs]
                else:
                    handles = [self.executor.submit(subprocess.check_output, group_command([jobs[i] for i in group]),
                                                    text=True) for group in groups]
        except (submitit.core.utils.FailedJobError, submitit.core.utils.FailedSubmissionError,
                subprocess.CalledProcessError, OSError) as err:  # sbatch refused the array (partition, account...)
            said = [line for line in str(err).strip().splitlines() if line.strip()]
            raise UserError(f"Slurm refused the {len(jobs) if k == 1 else len(groups)} job(s): "
                            f"{said[-1] if said else type(err).__name__}. "
                            "Check --partition, --time-limit, --gpus-per-run, --mem-per-run and --slurm-args "
                            "against the cluster's limits; nothing was submitted.") from None
        index = {id(h): g for g, h in enumerate(handles)}
        members = [[i] for i in range(len(jobs))] if k == 1 else groups
        start = time.monotonic()
        for g, handle in enumerate(handles):
            for i in members[g]:
                print(f"[{i + 1}/{len(jobs)}] {jobs[i].name}: submitted as job {handle.job_id}", flush=True)
        codes: list[int] = [1] * len(jobs)
        try:
            for handle in submitit.helpers.as_completed(handles, poll_frequency=self.poll_seconds):
                g = index[id(handle)]
                try:
                    result = handle.result()
                    ended = [int(result)] if k == 1 else group_codes(result, len(members[g]))
                except Exception as err:  # noqa: BLE001  (the job itself died: node failure, time limit, OOM kill)
                    ended = [1] * len(members[g])
                    for i in members[g]:
                        print(f"[{i + 1}/{len(jobs)}] {jobs[i].name}: job {handle.job_id} failed: "
                              f"{str(err).strip().splitlines()[-1] if str(err).strip() else err!r}", flush=True)
                for i, code in zip(members[g], ended):
                    codes[i] = code
                    _report(i, len(jobs), jobs[i], code, time.monotonic() - start, on_done)
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


UNIT_BYTES = {"": 2**20, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}  # sbatch's --mem reads a bare number as MB


def memory_bytes(text: str) -> int:
    """A size ``slurm_memory`` accepted (16GB, 4000M, 12G), in bytes."""
    match = re.fullmatch(r"([0-9]+)([KMGT]?)B?", text.strip(), flags=re.IGNORECASE)
    return int(match.group(1)) * UNIT_BYTES[match.group(2).upper()]


def times_memory(text: str, factor: int) -> str:
    """``factor`` x a size ``slurm_memory`` accepted, in its own unit (16GB x 4 = 64GB)."""
    match = re.fullmatch(r"([0-9]+)(.*)", text.strip())
    return f"{int(match.group(1)) * factor}{match.group(2)}"


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
    group.add_argument("--runs-per-device", type=whole_number(1, 64, "runs per device >= 1"), default=1, metavar="K",
                       help="K runs side by side on each GPU, each its own process (default 1). Locally a run starts "
                            "only where it fits (K and a memory check; it waits otherwise); on slurm one job runs K "
                            "runs on its GPU, with K x --cpus-per-run and K x --mem-per-run")
    group.add_argument("--device-memory-per-run", type=slurm_memory, default=None, metavar="SIZE",
                       help="local: GPU memory a run needs before it starts (e.g. 12GB); default with K > 1 an "
                            "equal share of the device less 10%%, with K = 1 no check")


def processes_per_run(args: argparse.Namespace) -> int:
    """How many processes one run's command starts (accelerate launch when > 1)."""
    return max(1, args.gpus_per_run or 1)


def make_launcher(args: argparse.Namespace, log_folder: Path, default_parallel: int = 1,
                  executor=None) -> Launcher:
    """The launcher the options ask for; ``executor`` replaces the Slurm one (tests pass submitit's local one)."""
    k = getattr(args, "runs_per_device", 1)
    if args.launcher == "local" and executor is None:
        gpus = 1 if args.gpus_per_run is None else args.gpus_per_run
        need = getattr(args, "device_memory_per_run", None)
        # with K runs per device and no --parallel: every slot of every device
        return LocalLauncher(args.parallel or (None if k > 1 else default_parallel), gpus, runs_per_device=k,
                             device_memory=None if need is None else memory_bytes(need))
    if executor is None:
        executor = slurm_executor(args, log_folder)
    return SubmititLauncher(executor, runs_per_device=k)


def check_launcher(args: argparse.Namespace, executor=None) -> None:
    """What ``make_launcher`` would refuse, without starting anything (dry runs call it too)."""
    if args.launcher == "slurm" and executor is None and shutil.which("sbatch") is None:
        raise UserError("--launcher slurm needs Slurm's sbatch on PATH (run this on the cluster's login node).")


def slurm_executor(args: argparse.Namespace, log_folder: Path):
    import submitit

    check_launcher(args)
    k = getattr(args, "runs_per_device", 1)  # one job holds K runs: K times a run's cores and memory
    extra = {}
    for item in args.slurm_args:
        if "=" not in item:
            raise UserError(f"--slurm-args item {item!r} must look like key=value (e.g. account=myproj).")
        key, value = item.split("=", 1)
        extra[key.replace("-", "_")] = value
    executor = submitit.AutoExecutor(folder=log_folder / "%j", cluster="slurm")
    executor.update_parameters(
        name="mtl_cog", timeout_min=args.time_limit, nodes=1, tasks_per_node=1, gpus_per_node=processes_per_run(args),
        cpus_per_task=args.cpus_per_run * k, slurm_mem=times_memory(args.mem_per_run, k),
        slurm_setup=list(args.slurm_setup),
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
