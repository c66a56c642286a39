"""A campaign's pre-registered plan, recorded in its results bundle: the plan every run of it was made under.

A campaign that answers a question starts from a committed plan (hypotheses, metrics, seeds, decision rule,
budget: ``docs/results/<campaign>-plan.md``). ``--plan FILE`` (``reproduce``) records in ``campaign.json``:

- ``path``: the plan, relative to the working directory (the repository root, where campaigns run);
- ``sha256``: its content as the campaign read it;
- ``code_commit``: the commit of the code that ran (``campaign.code_commit``: a lane's frozen copy is a ``git
  archive`` of it), which holds the plan in that form, so git shows the plan before every run recorded under it.

A plan is not edited after its campaign starts: a deviation is listed on the results page. So a campaign whose
bundle recorded a plan is refused when the file now differs (or is gone), naming both digests, and a bundle that
recorded one plan is refused with another. That binds every later command of the campaign, ``--plan`` given or not
(``campaign_plan``; the engine checks it again before any run, ``reuse.with_threads``).

A plan is evidence only if git holds it, so before anything is read from it the path must be relative, lead through
no link at any level, name a regular file (not a FIFO, which would block the read, nor a device), and be tracked by
git in the checkout that runs the campaign, unchanged and not ignored; outside a git checkout it is refused (git's
"not a repository" is no "nothing uncommitted"). A lane runs a frozen ``git archive`` copy without ``.git``: there the
plan must be byte for byte the one of the commit the lane copied (``MTL_COG_CODE_COMMIT`` in ``MTL_COG_REPO``).
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from pathlib import Path

from mtl_cog.bundles.bundle import Bundle
from mtl_cog.errors import UserError

PLAN_KEY = "plan"
LANE_COMMIT, LANE_REPO = "MTL_COG_CODE_COMMIT", "MTL_COG_REPO"  # set by mtl-cog lane for its frozen copy


def plan_record(path: Path, code_commit: str) -> dict:
    """The record of the plan in ``path``: a non-empty regular file inside the working directory, tracked by git and
    committed as it is (see the module docstring)."""
    content = committed_bytes(path, f"--plan {path}")
    if not content.strip():
        raise UserError(f"--plan {path} is empty: a plan states hypotheses, metrics, seeds, a decision rule and a "
                        "budget before the runs.")
    return {"path": path.as_posix(), "sha256": hashlib.sha256(content).hexdigest(), "code_commit": code_commit}


def campaign_plan(path: Path | None, recorded: Bundle | None, code_commit: str) -> dict | None:
    """The plan this command runs under: ``--plan``'s record, checked against the bundle's; without ``--plan``, the
    one the bundle recorded is checked against its file (None: this command records nothing new)."""
    if path is None:
        check_recorded_plan(recorded)
        return None
    record = plan_record(path, code_commit)
    check_plan(recorded, record)
    return record


def check_recorded_plan(recorded: Bundle | None) -> None:
    """Refuse to go on with a campaign whose bundle recorded a plan that is now changed, gone or no longer committed."""
    old = recorded.campaign.get(PLAN_KEY) if recorded is not None else None
    if not old:
        return
    if not isinstance(old, dict) or not isinstance(old.get("path"), str) or not isinstance(old.get("sha256"), str):
        raise UserError(f"campaign.json's {PLAN_KEY!r} is not a plan record (path, sha256). Restore the bundle from "
                        "git.")
    where = (f"this campaign's bundle recorded the plan {old['path']} (sha256 {old['sha256']}), and it is no "
             "longer the committed file it was")
    content = committed_bytes(Path(old["path"]), where)
    if hashlib.sha256(content).hexdigest() != old["sha256"]:
        raise UserError(f"{where}: it has changed since the campaign started (sha256 "
                        f"{hashlib.sha256(content).hexdigest()} now): a plan is not edited once its runs began. "
                        f"Restore it (git show {old.get('code_commit') or '<commit>'}:{old['path']}) and list the "
                        "deviation on the results page.")


def committed_bytes(path: Path, what: str) -> bytes:
    """``path``'s bytes, once every check of the module docstring passed (``what`` opens each refusal)."""
    if not path.parts or path.is_absolute() or ".." in path.parts:
        raise UserError(f"{what}: give the plan's path relative to the repository root (where campaigns run), not a "
                        "link, e.g. docs/results/<campaign>-plan.md.")
    for depth in range(1, len(path.parts) + 1):  # a linked folder anywhere on the way leads out of the checkout
        step = Path(*path.parts[:depth])
        try:
            mode = os.lstat(step).st_mode
        except OSError as err:
            raise UserError(f"{what}: {step} cannot be read ({err.strerror or err}). Commit the plan first; the "
                            "campaign records which one it ran under.") from None
        if stat.S_ISLNK(mode):
            raise UserError(f"{what}: {step} is a link; give the plan itself, not a link, relative to the repository "
                            "root (where campaigns run).")
    if not stat.S_ISREG(mode):
        raise UserError(f"{what}: not a regular file ({_kind(mode)}); a plan is a committed text file.")
    # a lane's frozen copy (no .git) holds what its commit holds: the plan is compared with that commit's blob
    frozen = bool(os.environ.get(LANE_COMMIT) and os.environ.get(LANE_REPO)) and \
        _git(Path.cwd(), "rev-parse", "--is-inside-work-tree")[0] != 0
    if not frozen:
        _check_tracked(path, what)
    content = _read_regular(path, what)
    if frozen:
        blob = f"{os.environ[LANE_COMMIT]}:{path.as_posix()}"
        code, committed = _git_bytes(Path(os.environ[LANE_REPO]), "show", blob)
        if code != 0 or committed != content:
            raise UserError(f"{what}: not the file of the commit this lane runs ({os.environ[LANE_COMMIT]}"
                            f"{'' if code == 0 else ', which does not hold it'}). Commit the plan before the lane "
                            "starts.")
    return content


def _kind(mode: int) -> str:
    return ("a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else
            "a folder" if stat.S_ISDIR(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a file")


def _read_regular(path: Path, what: str) -> bytes:
    """Read without following a link and without blocking (a file swapped for a FIFO after the check)."""
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:
        raise UserError(f"{what}: cannot be read ({err.strerror or err}).") from None
    try:
        if not stat.S_ISREG(os.fstat(handle).st_mode):
            raise UserError(f"{what}: not a regular file; a plan is a committed text file.")
        with os.fdopen(handle, "rb", closefd=False) as stream:
            return stream.read()
    finally:
        os.close(handle)


def _git(where: Path, *args: str) -> tuple[int, str]:
    code, out = _git_bytes(where, *args)
    return code, out.decode(errors="replace")


def _git_bytes(where: Path, *args: str) -> tuple[int, bytes]:
    """(exit code, output) of git in ``where``; no git at all: code -1."""
    try:
        done = subprocess.run(["git", "-C", str(where), *args], capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return -1, b""
    return done.returncode, done.stdout


def _check_tracked(path: Path, what: str) -> None:
    """Refuse a plan git does not hold as it is in the checkout of the working directory."""
    here = Path.cwd()
    code, _ = _git(here, "rev-parse", "--is-inside-work-tree")
    if code != 0:
        why = "git is not installed" if code == -1 else "git: not a repository"
        raise UserError(f"{what}: not in a git checkout ({why}), so nothing shows the plan committed. Run the "
                        "campaign from the repository's checkout, with the plan committed.")
    if _git(here, "check-ignore", "-q", "--no-index", "--", str(path))[0] == 0:
        raise UserError(f"{what} is not committed: git ignores that path (.gitignore), so no commit holds it. Keep "
                        "the plan under docs/results/ and commit it.")
    if _git(here, "ls-files", "--error-unmatch", "--", str(path))[0] != 0:
        raise UserError(f"{what} is not committed: git does not track it. Commit it first, so that the commit the "
                        "runs record holds it.")
    code, changes = _git(here, "status", "--porcelain", "--", str(path))
    if code != 0 or changes.strip():
        raise UserError(f"{what} is not committed as it is: commit it first, so that the commit the runs record "
                        "holds it.")


def check_plan(recorded: Bundle | None, record: dict) -> None:
    """Refuse a plan other than the one the bundle recorded (see the module docstring)."""
    old = (recorded.campaign.get(PLAN_KEY) if recorded is not None else None) or None
    if old is None:
        return
    if old.get("path") != record["path"]:
        raise UserError(f"--plan {record['path']}: this campaign's bundle was made under the plan {old.get('path')}; "
                        "one campaign has one plan. Give that one, or use a new --out.")
    if old.get("sha256") != record["sha256"]:
        raise UserError(f"--plan {record['path']} has changed since the campaign started (sha256 {old.get('sha256')}"
                        f" then, {record['sha256']} now): a plan is not edited once its runs began. Restore it "
                        f"(git show {old.get('code_commit') or '<commit>'}:{record['path']}) and list the deviation "
                        "on the results page.")


def keep_first(bundle: Bundle, record: dict) -> None:
    """Record the plan in ``bundle`` unless it holds one already (then ``check_plan`` has found it the same); a plan
    given to a campaign whose bundle already holds runs says how many (``runs_before``): it came after them."""
    if PLAN_KEY not in bundle.campaign:
        bundle.campaign[PLAN_KEY] = {**record, "runs_before": int(len(bundle.runs))}
