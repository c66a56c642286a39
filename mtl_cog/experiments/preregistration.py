"""A campaign's pre-registered plan, recorded in its results bundle: the plan every run of it was made under.

A campaign that answers a question starts from a committed plan (hypotheses, metrics, seeds, decision rule,
budget: ``docs/results/<campaign>-plan.md``). ``--plan FILE`` (``reproduce``) records in ``campaign.json``:

- ``path``: the plan, relative to the working directory (the repository root, where campaigns run);
- ``sha256``: its content as the campaign read it;
- ``code_commit``: the commit of the code that ran (``campaign.code_commit``: a lane's frozen copy is a ``git
  archive`` of it), which holds the plan in that form, so git shows the plan before every run recorded under it.

A plan is not edited after its campaign starts: a deviation is listed on the results page. So a campaign whose
bundle recorded a plan is refused when the file now differs (or is gone), naming both digests, and a bundle that
recorded one plan is refused with another. A campaign run without ``--plan`` keeps what its bundle recorded.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from mtl_cog.errors import UserError
from mtl_cog.reporting.bundle import Bundle

PLAN_KEY = "plan"


def plan_record(path: Path, code_commit: str) -> dict:
    """The record of the plan in ``path``: a non-empty regular file inside the working directory, committed as it is
    (in a git checkout; a lane's frozen copy is a ``git archive``, so what it holds is committed)."""
    if path.is_absolute() or ".." in path.parts or path.is_symlink():
        raise UserError(f"--plan {path}: give the plan's path relative to the repository root (where campaigns run), "
                        "not a link, e.g. docs/results/<campaign>-plan.md.")
    try:
        content = path.read_bytes()
    except OSError as err:
        raise UserError(f"--plan {path}: cannot be read ({err.strerror or err}). Commit the plan first; the "
                        "campaign records which one it ran under.") from None
    if not content.strip():
        raise UserError(f"--plan {path} is empty: a plan states hypotheses, metrics, seeds, a decision rule and a "
                        "budget before the runs.")
    if uncommitted(path):
        raise UserError(f"--plan {path} is not committed as it is: commit it first, so that the commit the runs "
                        "record holds it.")
    return {"path": path.as_posix(), "sha256": hashlib.sha256(content).hexdigest(), "code_commit": code_commit}


def uncommitted(path: Path) -> bool:
    """Whether git (where this is a checkout) shows ``path`` untracked or changed against HEAD."""
    try:
        result = subprocess.run(["git", "status", "--porcelain", "--", str(path)], capture_output=True, text=True,
                                timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False  # no git: a lane's frozen copy (committed by construction) or an installed package
    return result.returncode == 0 and bool(result.stdout.strip())


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
