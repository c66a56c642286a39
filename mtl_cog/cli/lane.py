"""lane: run one campaign command from a frozen copy of the code and commit its results bundle as runs finish.

    python scripts/lane.py --name fashion_mnist_full -- \\
        scripts/reproduce.py --protocol fair --scale full --data fashion_mnist --method baseline cog_fc \\
        --budget 6 --draws 2 --seeds 0 1 2 --prune --jobs 1 --tune-workers 1 --threads 1

A campaign longer than a working session (or than the life of a rented machine) must resume from
what is committed. A lane makes that automatic:

- the command runs from ``WORK/NAME/code``, a ``git archive`` of ``HEAD`` taken when the lane starts
  (``PYTHONPATH`` points there, so editing the checkout does not change code under a running
  campaign; uncommitted changes are not in it, and the lane says so); the runs record that commit
  (``MTL_COG_CODE_COMMIT``: the copy has no ``.git``);
- its output folder is ``WORK/NAME/out`` (the lane appends ``--out``); on a fresh machine the lane
  first copies the committed bundle ``results/NAME/bundle`` there, so the campaign trains only what
  the bundle lacks (``docs/explanation/campaigns.md``); an ``out/bundle`` that lacks runs the
  committed one has (older than what another machine committed) is refused, at the start and before
  every sync, instead of overwriting the newer bundle; one lane per name and work folder
  (``WORK/NAME/lane.lock``);
- every ``--every`` seconds (default an hour: one commit an hour, its message saying what finished, e.g.
  "results: NAME 23/50 finals, 80/80 trials (lane)", keeps the history readable; a lost machine loses at most
  that much), and when the command ends or is interrupted (SIGINT, SIGTERM or SIGHUP to the
  lane: SIGINT to the campaign, its clean stop; a second signal: SIGTERM; a lane killed outright: the
  campaign gets SIGINT from the kernel), ``out/bundle`` is copied
  (under the campaign's own bundle lock, so never half-written) to ``results/NAME/bundle`` and
  committed alone (``git commit -- results/NAME/bundle``: nothing else staged is swept in), together with
  the docs tables made from it (every block of the pages naming it, regenerated in the same commit, so
  no commit holds docs that disagree with their bundle; a page with uncommitted edits is left out, with a
  warning). A lost machine loses only the runs in flight.

The frozen copy runs only what was committed: a committed link that leads out of it (a script under ``scripts/`` ->
a file elsewhere) would run the live file, so the lane refuses it, naming the link.

Leader-rate curves read the protocol's committed bundle: give ``--protocol-dir`` as an absolute path
into the checkout's ``results/`` (the frozen copy's ``results/`` is as old as the lane).
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import fcntl
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from filelock import FileLock

from mtl_cog.analysis.bundle_progress import progress
from mtl_cog.bundles.bundle import read_bundle
from mtl_cog.cli.paths import CONFIGS
from mtl_cog.config.arguments import Parser
from mtl_cog.errors import UserError, run_cli
from mtl_cog.reporting.docs_tables import bundles_on, figures_on, pages_naming

COMMIT_TRIES = 5  # git may be busy (another commit holds index.lock): a few tries, seconds apart
DEFAULT_EVERY_SECONDS = 3600.0  # commit the bundle at most once an hour, and when the command ends
STOP_GRACE_SECONDS = 120  # after SIGINT, how long a campaign may take to record what finished before SIGTERM
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # one folder under results/, no git pathspec magic
COMMITTED, UNCHANGED, FAILED = "committed", "unchanged", "failed"


def git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=check)


def freeze_code(repo: Path, commit: str, into: Path) -> None:
    """``git archive`` of ``commit`` unpacked into ``into`` (replaced)."""
    if into.exists():
        shutil.rmtree(into)
    into.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(repo), "archive", "--format=tar", commit], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(into)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise UserError(f"lane: git archive {commit[:10]} failed in {repo}.")
    check_no_link_leaves(into)


def check_no_link_leaves(code: Path) -> None:
    """Refuse a frozen copy holding a symbolic link whose target lies outside it (named): the campaign would run
    or read the live file, not the committed one."""
    root = code.resolve()
    for folder, dirs, files in os.walk(code):
        for name in [*dirs, *files]:
            path = Path(folder) / name
            if path.is_symlink() and not path.resolve().is_relative_to(root):
                raise UserError(f"lane: {path.relative_to(code)} in commit is a link to {os.readlink(path)}, outside "
                                "the frozen copy: the lane would run the live file, not the committed one. Commit the "
                                "file itself instead of a link.")


def run_states(bundle: Path) -> dict[str, str]:
    """{run: status} of a bundle's ``runs.csv`` (empty when there is no such file)."""
    try:
        with (bundle / "runs.csv").open(newline="") as handle:
            return {row["run"]: row.get("status", "") for row in csv.DictReader(handle) if row.get("run")}
    except FileNotFoundError:
        return {}


def check_not_older(out: Path, published: Path, repo: Path) -> None:
    """Refuse to let ``out/bundle`` replace a published bundle that records runs it lacks, or a run finished
    (``done``) that it has in another state (failed or pruned here, finished on another machine)."""
    with FileLock(str(out / "bundle.lock")):  # the Collector writes the bundle under this lock
        mine = run_states(out / "bundle")
    lacking = {run for run, status in run_states(published).items()
               if run not in mine or (status == "done" and mine[run] != "done")}
    if lacking:
        raise UserError(f"lane: {out / 'bundle'} lacks {len(lacking)} run(s) (or their finished state) that "
                        f"{published.relative_to(repo)} records (e.g. {sorted(lacking)[0]}): it is older than the "
                        f"committed bundle, and syncing it would drop them. Move {out / 'bundle'} away; the lane "
                        "then resumes from the committed one.")


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


def publish(repo: Path, out: Path, published: Path, name: str, last: str) -> str:
    """Sync ``out/bundle`` to ``published`` and commit it with its pages -> the commit's outcome (``last`` when
    there was nothing to sync).

    Under one lock for every lane of the checkout (in its git folder): a lane regenerating a page reads the other
    bundles that page shows, and another lane's sync deletes and renames its bundle's folder; one at a time, every
    bundle a lane reads is whole and, unless its own lane's commit failed, committed."""
    common = Path(git(repo, "rev-parse", "--git-common-dir").stdout.strip())
    with FileLock(str((common if common.is_absolute() else repo / common) / "mtl_cog-lanes.lock")):
        check_not_older(out, published, repo)  # another machine may have committed a newer bundle since
        if not sync_bundle(out, published):
            return last
        return commit_bundle(repo, published, name)  # UNCHANGED: nothing left uncommitted


def regenerate_pages(repo: Path, bundle: str, name: str) -> list[str]:
    """Rewrite the docs tables of ``bundle`` from it -> the pages to commit with it.

    A commit that changes a bundle without the docs tables made from it would leave a checkout whose docs
    disagree with its results (``tests/test_results_docs.py`` fails on it): a session that ends between a lane's
    commit and the next regeneration would publish that. The tables are made by the checkout's *committed* code,
    in a fresh process (``scripts/regenerate_docs_tables.py --pages-of``), not by the code this lane imported when it
    started: a report change committed while the lane runs then reaches the tables the lane commits. A page with
    uncommitted edits is left alone (committing it would sweep those edits in), and so is every page while the
    package has uncommitted changes (they would make tables no commit's code makes); the lane says so, and the
    tables wait for ``scripts/regenerate_docs_tables.py`` and a commit. Every block of those pages is made
    (``--pages-of``), not only the bundle's: a block another lane's commit had to leave alone (this bundle was
    uncommitted then) is made right here, once every bundle the pages show is committed.
    """
    try:
        pages = [str(p.relative_to(repo)) for p in pages_naming(repo, bundle)]
    except UserError as err:  # a page's marker is malformed: the bundle goes alone, the campaign runs on
        print(f"lane {name}: docs tables not regenerated: {err}", file=sys.stderr)
        return []
    if not pages:
        return []
    dirty = git(repo, "status", "--porcelain", "--", *pages).stdout.strip()
    if dirty:
        print(f"lane {name}: {', '.join(pages)} has uncommitted edits; its tables of {bundle} are not regenerated "
              "(run python scripts/regenerate_docs_tables.py and commit)", file=sys.stderr)
        return []
    # a block made of several bundles (the protocols' claims) reads the others from the working tree: one that
    # another lane has synced but not committed yet would put numbers no commit's bundles make into this commit
    others = sorted(bundles_on([repo / p for p in pages]) - {bundle})
    if others and git(repo, "status", "--porcelain", "--", *others).stdout.strip():
        print(f"lane {name}: {', '.join(pages)} also show(s) bundles with uncommitted changes; the tables of {bundle} "
              "are not regenerated now (that bundle's next commit does it)", file=sys.stderr)
        return []
    if git(repo, "status", "--porcelain", "--untracked-files=no", "--", "mtl_cog").stdout.strip():
        print(f"lane {name}: mtl_cog/ has uncommitted changes; the tables of {bundle} are not regenerated "
              "(commit them, or run python scripts/regenerate_docs_tables.py and commit)", file=sys.stderr)
        return []
    # the whole pages, else (a block of another campaign that cannot be made: e.g. its filter names a column its
    # bundle lacks) this bundle's blocks alone: one broken block elsewhere does not keep this bundle's docs out
    for scope in ("--pages-of", "--only"):
        made = subprocess.run([sys.executable, "-m", "mtl_cog.cli.regenerate_docs_tables", "--root", str(repo),
                               scope, bundle], cwd=repo, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(repo)})
        if made.returncode == 0:
            break
        said = (made.stderr.strip().splitlines() or ["no message"])[-1]
        print(f"lane {name}: docs tables not regenerated ({scope}): {said}", file=sys.stderr)
        git(repo, "checkout", "--", *pages, check=False)  # a half-written page must not be committed
    else:  # e.g. a page names a table no bundle has (a typo): the bundle goes alone
        return []
    # the pages' figures' SVG files go with them: those drawn now, and a tracked one the regeneration removed
    try:
        figures = [str(f.relative_to(repo.resolve())) for f in figures_on(repo, [repo / p for p in pages])]
    except UserError as err:  # a page edited since it was regenerated (this lane reads it with older code)
        print(f"lane {name}: docs tables not committed: {err}", file=sys.stderr)
        git(repo, "checkout", "--", *pages, check=False)
        return []
    tracked = set(git(repo, "ls-files", "--", *figures).stdout.split()) if figures else set()
    return pages + [f for f in figures if (repo / f).is_file() or f in tracked]


def commit_bundle(repo: Path, published: Path, name: str) -> str:
    """Commit ``published`` (with the docs tables made from it) when it changed -> COMMITTED, UNCHANGED or FAILED
    (git stayed busy). Nothing else, staged or not, is swept in."""
    path = str(published.relative_to(repo))
    if not git(repo, "status", "--porcelain", "--", path).stdout.strip():
        return UNCHANGED
    paths = [path, *regenerate_pages(repo, path, name)]
    for attempt in range(COMMIT_TRIES):
        added = git(repo, "add", "-A", "--", *paths, check=False)
        done = added.returncode == 0 and git(
            repo, "commit", "-q", "-m", commit_message(published, name), "--", *paths,
            check=False).returncode == 0
        if done:
            return COMMITTED
        time.sleep(2 + 3 * attempt)
    print(f"lane {name}: could not commit {path} (git busy?); the next sync tries again", file=sys.stderr)
    return FAILED


def commit_message(published: Path, name: str) -> str:
    """What finished, from the bundle: "results: NAME 23/50 finals, 80/80 trials (lane)" (a bundle that cannot
    be read, or has no planned parts yet: "results: NAME bundle as runs finish (lane)")."""
    try:
        rows = progress(read_bundle(published))
    except Exception:  # noqa: BLE001  (the message only: the bundle's own checks run where it is read)
        rows = None
    if rows is None or rows.empty:
        return f"results: {name} bundle as runs finish (lane)"
    rows = rows.assign(unit=[("trials" if str(part).startswith("tuning") else f"{part}s") for part in rows["part"]])
    told = [f"{int(g['done'].sum())}/{int(g['planned'].sum())} {unit}" for unit, g in rows.groupby("unit", sort=False)]
    return f"results: {name} {', '.join(told)} (lane)"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", required=True,
                        help="the campaign's name: results/NAME/bundle is what the lane commits")
    parser.add_argument("--work", default=None, help="where the frozen code and the output live "
                        "(default: $MTL_COG_LANES or ~/.cache/mtl_cog/lanes)")
    parser.add_argument("--every", type=float, default=DEFAULT_EVERY_SECONDS,
                        help="seconds between syncs (default 3600: at most one commit an hour, and one at exit)")
    parser.add_argument("--repo", default=str(CONFIGS.parent), help=argparse.SUPPRESS)  # tests: another checkout
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="-- then the campaign's script and its arguments (without --out)")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or not command[0].endswith(".py"):
        raise UserError("lane: give the campaign command after --, starting with its script "
                        "(e.g. -- scripts/reproduce.py --protocol fair ...).")
    script = Path(command[0])
    if script.is_absolute() or ".." in script.parts:
        raise UserError(f"lane: {command[0]}: name the script by its path inside the checkout (scripts/...), so "
                        "that the frozen copy runs, not the live file.")
    if any(arg == "--out" or arg.startswith("--out=") for arg in command):
        raise UserError("lane: leave --out out of the command; the lane runs it with --out WORK/NAME/out.")
    if not math.isfinite(args.every) or args.every <= 0:  # nan compared false with 0: it turned the syncs off
        raise UserError(f"lane: --every {args.every:g}: give a finite, positive number of seconds.")
    if not NAME.fullmatch(args.name):
        raise UserError(f"lane: --name {args.name[:40]!r}: one folder name under results/ (letters, digits, _ . -).")
    longest = _name_max(Path(args.repo))
    if len(args.name.encode()) > longest:
        raise UserError(f"lane: --name is {len(args.name.encode())} bytes long; the file system takes at most "
                        f"{longest} for a folder name under results/. Give a shorter name.")
    args.command = command
    return args


def _name_max(where: Path) -> int:
    """The longest file name the file system of ``where`` takes (255 on most); a lane's name is a folder name."""
    try:
        return os.pathconf(where if where.is_dir() else Path.cwd(), "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def _child_setup() -> None:
    """In the campaign's process before it starts: SIGINT back to its default (a shell starts background jobs
    with it ignored, and SIGINT is the campaign's clean stop), and SIGINT when the lane dies (Linux)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        parent = os.getppid()
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGINT)
        if os.getppid() != parent:  # the lane died before prctl took effect
            os.kill(os.getpid(), signal.SIGINT)


def stop_campaign(child: subprocess.Popen) -> None:
    """SIGINT to the campaign's process group, SIGTERM if it is still there after ``STOP_GRACE_SECONDS``."""
    for signum, grace in ((signal.SIGINT, STOP_GRACE_SECONDS), (signal.SIGTERM, 30)):
        if child.poll() is not None:
            return
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:
            return
        try:
            child.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    repo = Path(args.repo).resolve()
    if not (repo / ".git").exists():
        raise UserError(f"lane: {repo} is not a git checkout; a lane commits its bundle there.")
    published = repo / "results" / args.name / "bundle"
    for path in (published.parent, published):
        if path.exists() and not path.is_dir():
            raise UserError(f"lane: {path} is a file; the lane publishes a bundle folder there. Move it away.")
    work = Path(args.work or os.environ.get("MTL_COG_LANES") or Path.home() / ".cache" / "mtl_cog" / "lanes")
    lane = (work / args.name).resolve()
    lane.mkdir(parents=True, exist_ok=True)
    # The lock is an flock on a descriptor the campaign inherits (pass_fds): it is held until the lane *and* its
    # campaign are gone, so a lane restarted while a killed lane's campaign still stops cleanly is refused.
    lock = os.open(lane / "lane.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock)
        raise UserError(f"lane: another lane named {args.name}, or the campaign of one, is running on {lane} "
                        f"({lane / 'lane.lock'}).") from None
    try:
        return run_lane(args, repo, lane, published, lock)
    finally:
        os.close(lock)


def run_lane(args: argparse.Namespace, repo: Path, lane: Path, published: Path, lock: int) -> int:
    code, out = lane / "code", lane / "out"
    commit = git(repo, "rev-parse", "HEAD").stdout.strip()
    freeze_code(repo, commit, code)
    if git(repo, "status", "--porcelain", "--", "mtl_cog", "configs", "scripts").stdout.strip():
        print(f"lane {args.name}: uncommitted changes in mtl_cog/, configs/ or scripts/ are not in the frozen "
              f"code ({commit[:10]}); commit them first if the campaign needs them", file=sys.stderr)
    if (out / "bundle").is_dir():
        check_not_older(out, published, repo)
    elif published.is_dir():
        out.mkdir(parents=True, exist_ok=True)
        shutil.copytree(published, out / "bundle")
        print(f"lane {args.name}: resuming from the committed bundle {published.relative_to(repo)}")
    script = code / args.command[0]
    if not script.is_file():
        raise UserError(f"lane: {args.command[0]} is not a script of the checkout (looked in {code}).")
    env = {**os.environ, "PYTHONPATH": str(code) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "MTL_COG_CODE_COMMIT": commit[:12], "MTL_COG_REPO": str(repo)}  # paths recorded relative to it
    # --out right after the script: after a "--" in the command it would be read as an override
    child = subprocess.Popen([sys.executable, str(script), "--out", str(out), *args.command[1:]], cwd=code, env=env,
                             start_new_session=True, preexec_fn=_child_setup, pass_fds=(lock,))
    print(f"lane {args.name}: running {' '.join(args.command)} from {commit[:10]} (pid {child.pid}); "
          f"bundle committed to {published.relative_to(repo)} every {args.every:g} s", flush=True)
    stops = []

    def stop(signum: int, _frame: object) -> None:
        # first signal: SIGINT to the campaign, whose interrupt handling records what finished; a second: SIGTERM
        stops.append(signum)
        try:
            os.killpg(child.pid, signal.SIGINT if len(stops) == 1 else signal.SIGTERM)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, stop)
    last = UNCHANGED
    try:
        while True:
            try:
                code_now = child.wait(timeout=args.every)
            except subprocess.TimeoutExpired:
                code_now = None
            last = publish(repo, out, published, args.name, last)
            if code_now is not None:
                break
    except BaseException:
        stop_campaign(child)  # never leave a campaign running without its lane
        raise
    if last == FAILED:
        raise UserError(f"lane {args.name}: the command ended (exit code {code_now}) but {published.relative_to(repo)} "
                        f"is NOT committed (git stayed busy); commit it by hand: git add -A {published.parent} && "
                        f"git commit -- {published.parent}")
    print(f"lane {args.name}: the command ended with exit code {code_now}; bundle committed", flush=True)
    if code_now:  # the campaign's exit code is the lane's (killed by signal N: 128 + N, as a shell says)
        raise SystemExit(code_now if code_now > 0 else 128 - code_now)
    return 0


def cli() -> None:
    run_cli(main)


if __name__ == "__main__":
    cli()
