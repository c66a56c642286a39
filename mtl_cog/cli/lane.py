"""lane: run one campaign command from a frozen copy of the code and commit its results bundle as runs finish.

    python scripts/lane.py --name fashion_mnist_full -- \\
        scripts/reproduce.py --protocol fair --scale full --data fashion_mnist --method baseline cog_fc \\
        --budget 6 --draws 2 --seeds 0 1 2 --prune --jobs 1 --tune-workers 1 --threads 1

A campaign longer than a working session (or than the life of a rented machine) must resume from
what is committed. A lane makes that automatic:

- the command runs from ``WORK/NAME/code``, a ``git archive`` of ``HEAD`` taken when the lane starts
  (``PYTHONPATH`` points there, so editing the checkout does not change code under a running
  campaign; uncommitted changes are not in it, and the lane says so);
- its output folder is ``WORK/NAME/out`` (the lane appends ``--out``); on a fresh machine the lane
  first copies the committed bundle ``results/NAME/bundle`` there, so the campaign trains only what
  the bundle lacks (``docs/explanation/campaigns.md``);
- every ``--every`` seconds, and when the command ends or is interrupted (SIGINT or SIGTERM to the lane: SIGINT
  to the campaign, its clean stop; a second signal: SIGTERM), ``out/bundle`` is copied
  (under the campaign's own bundle lock, so never half-written) to ``results/NAME/bundle`` and
  committed alone (``git commit -- results/NAME/bundle``: nothing else staged is swept in). A lost
  machine loses only the runs in flight.

Leader-rate curves read the protocol's committed bundle: give ``--protocol-dir`` as an absolute path
into the checkout's ``results/`` (the frozen copy's ``results/`` is as old as the lane).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from filelock import FileLock

from mtl_cog.cli.paths import CONFIGS
from mtl_cog.config.arguments import Parser
from mtl_cog.errors import UserError, run_cli

COMMIT_TRIES = 5  # git may be busy (another commit holds index.lock): a few tries, seconds apart


def git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=check)


def freeze_code(repo: Path, into: Path) -> str:
    """``git archive HEAD`` of ``repo`` unpacked into ``into`` (replaced) -> the commit it holds."""
    commit = git(repo, "rev-parse", "HEAD").stdout.strip()
    if into.exists():
        shutil.rmtree(into)
    into.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(repo), "archive", "--format=tar", "HEAD"], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(into)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise UserError(f"lane: git archive HEAD failed in {repo}.")
    return commit


def sync_bundle(out: Path, published: Path) -> bool:
    """Copy ``out/bundle`` to ``published`` under the campaign's bundle lock -> whether there was one."""
    source = out / "bundle"
    if not source.is_dir():
        return False
    staging = published.with_name(published.name + ".syncing")
    if staging.exists():
        shutil.rmtree(staging)
    with FileLock(str(out / "bundle.lock")):  # the Collector writes the bundle under this lock
        shutil.copytree(source, staging)
    if published.exists():
        shutil.rmtree(published)
    staging.rename(published)
    return True


def commit_bundle(repo: Path, published: Path, name: str) -> bool:
    """Commit ``published`` alone when it changed -> whether a commit was made."""
    path = str(published.relative_to(repo))
    if not git(repo, "status", "--porcelain", "--", path).stdout.strip():
        return False
    for attempt in range(COMMIT_TRIES):
        added = git(repo, "add", "-A", "--", path, check=False)
        done = added.returncode == 0 and git(
            repo, "commit", "-q", "-m", f"results: {name} bundle as runs finish (lane)", "--", path,
            check=False).returncode == 0
        if done:
            return True
        time.sleep(2 + 3 * attempt)
    print(f"lane {name}: could not commit {path} (git busy?); the next sync tries again", file=sys.stderr)
    return False


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", required=True,
                        help="the campaign's name: results/NAME/bundle is what the lane commits")
    parser.add_argument("--work", default=None, help="where the frozen code and the output live "
                        "(default: $MTL_COG_LANES or ~/.cache/mtl_cog/lanes)")
    parser.add_argument("--every", type=float, default=300.0, help="seconds between syncs (default 300)")
    parser.add_argument("--repo", default=str(CONFIGS.parent), help=argparse.SUPPRESS)  # tests: another checkout
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="-- then the campaign's script and its arguments (without --out)")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or not command[0].endswith(".py"):
        raise UserError("lane: give the campaign command after --, starting with its script "
                        "(e.g. -- scripts/reproduce.py --protocol fair ...).")
    if "--out" in command:
        raise UserError("lane: leave --out out of the command; the lane runs it with --out WORK/NAME/out.")
    if args.every <= 0:
        raise UserError(f"lane: --every {args.every:g}: give a positive number of seconds.")
    if "/" in args.name or args.name.startswith("."):
        raise UserError(f"lane: --name {args.name!r}: one folder name under results/ (no '/').")
    args.command = command
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    repo = Path(args.repo).resolve()
    if not (repo / ".git").exists():
        raise UserError(f"lane: {repo} is not a git checkout; a lane commits its bundle there.")
    work = Path(args.work or os.environ.get("MTL_COG_LANES") or Path.home() / ".cache" / "mtl_cog" / "lanes")
    lane = (work / args.name).resolve()
    code, out = lane / "code", lane / "out"
    published = repo / "results" / args.name / "bundle"
    commit = freeze_code(repo, code)
    if git(repo, "status", "--porcelain", "--untracked-files=no", "--", "mtl_cog", "configs", "scripts").stdout:
        print(f"lane {args.name}: uncommitted changes in mtl_cog/, configs/ or scripts/ are not in the frozen "
              f"code ({commit[:10]}); commit them first if the campaign needs them", file=sys.stderr)
    if not (out / "bundle").is_dir() and published.is_dir():
        out.mkdir(parents=True, exist_ok=True)
        shutil.copytree(published, out / "bundle")
        print(f"lane {args.name}: resuming from the committed bundle {published.relative_to(repo)}")
    script = code / args.command[0]
    if not script.is_file():
        raise UserError(f"lane: {args.command[0]} is not a script of the checkout (looked in {code}).")
    env = {**os.environ, "PYTHONPATH": str(code) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    # SIGINT is the campaign's clean stop (runs save their state, trials in flight are asked again later); a
    # shell starts background jobs with SIGINT ignored, and the child would inherit that: restore the default.
    child = subprocess.Popen([sys.executable, str(script), *args.command[1:], "--out", str(out)], cwd=code, env=env,
                             start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    print(f"lane {args.name}: running {' '.join(args.command)} from {commit[:10]} (pid {child.pid}); "
          f"bundle committed to {published.relative_to(repo)} every {args.every:g} s")

    stops = []

    def stop(signum: int, _frame: object) -> None:
        # first SIGINT or SIGTERM: SIGINT to the campaign, whose interrupt handling records what finished;
        # a second one: SIGTERM, for a campaign that does not stop
        stops.append(signum)
        try:
            os.killpg(child.pid, signal.SIGINT if len(stops) == 1 else signal.SIGTERM)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, stop)
    while True:
        try:
            code_now = child.wait(timeout=args.every)
        except subprocess.TimeoutExpired:
            code_now = None
        if sync_bundle(out, published):
            commit_bundle(repo, published, args.name)
        if code_now is not None:
            print(f"lane {args.name}: the command ended with exit code {code_now}; bundle synced")
            if code_now:  # the campaign's exit code is the lane's (killed by signal N: 128 + N, as a shell says)
                raise SystemExit(code_now if code_now > 0 else 128 - code_now)
            return 0


def cli() -> None:
    run_cli(main)


if __name__ == "__main__":
    cli()
