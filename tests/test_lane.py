"""scripts/lane.py: a campaign command from frozen code, its bundle committed as runs finish, resumed on a fresh
machine from what was committed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mtl_cog.cli import lane
from mtl_cog.errors import UserError
from mtl_cog.reporting import docs_tables

# A stand-in campaign: resumes from OUT/bundle/runs.csv when it exists, appends one run per "finish", and checks
# that it runs from the frozen copy (its own folder is the lane's code/, not the checkout).
FAKE = '''
import sys, time, pathlib
args = sys.argv[1:]
at = args.index("--out")
out = pathlib.Path(args[at + 1])
del args[at:at + 2]
runs = out / "bundle" / "runs.csv"
runs.parent.mkdir(parents=True, exist_ok=True)
before = runs.read_text() if runs.exists() else "run\\n"
assert pathlib.Path(__file__).resolve().parent.parent.name == "code", __file__
import os
(out / "commit.txt").write_text(os.environ.get("MTL_COG_CODE_COMMIT", ""))
for i in range(int(args[0])):
    before += f"{args[1]}-{i}\\n"
    (runs.parent / "runs.tmp").write_text(before)
    os.replace(runs.parent / "runs.tmp", runs)  # atomic, as write_bundle's files: a lane never reads half of it
    time.sleep(0.3)
sys.exit(int(args[2]))
'''


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    (root / "scripts" / "fake_campaign.py").write_text(FAKE)
    git(root.parent, "init", "-q", str(root))
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "empty")
    git(root, "add", "scripts")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "fake campaign")
    git(root, "config", "user.name", "t")
    git(root, "config", "user.email", "t@t")
    return root


def run_lane(repo: Path, work: Path, *command: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mtl_cog.cli.lane", "--name", "camp", "--work", str(work),
                           "--every", "0.2", "--repo", str(repo), "--", "scripts/fake_campaign.py", *command],
                          capture_output=True, text=True, timeout=120)


def test_a_lane_commits_its_bundle_alone_and_a_fresh_machine_resumes_from_it(repo, tmp_path):
    (repo / "unrelated.txt").write_text("staged, not the lane's")
    git(repo, "add", "unrelated.txt")
    head = git(repo, "rev-parse", "HEAD").strip()
    first = run_lane(repo, tmp_path / "machine1", "3", "a", "0")
    assert first.returncode == 0, first.stderr
    assert (tmp_path / "machine1" / "camp" / "out" / "commit.txt").read_text() == head[:12]  # the runs' provenance
    committed = git(repo, "show", "HEAD:results/camp/bundle/runs.csv")
    assert committed == "run\na-0\na-1\na-2\n"
    assert "unrelated.txt" not in git(repo, "log", "--name-only", "--format=", "-n", "20")
    assert "unrelated.txt" in git(repo, "diff", "--cached", "--name-only")  # still staged, untouched
    # a fresh machine: no work folder; the lane starts from the committed bundle
    second = run_lane(repo, tmp_path / "machine2", "1", "b", "0")
    assert second.returncode == 0, second.stderr
    assert "resuming from the committed bundle" in second.stdout
    assert git(repo, "show", "HEAD:results/camp/bundle/runs.csv") == "run\na-0\na-1\na-2\nb-0\n"


def test_a_failed_campaign_is_the_lanes_exit_code_and_what_finished_is_still_committed(repo, tmp_path):
    result = run_lane(repo, tmp_path / "w", "2", "c", "3")
    assert result.returncode == 3
    assert git(repo, "show", "HEAD:results/camp/bundle/runs.csv") == "run\nc-0\nc-1\n"


@pytest.mark.parametrize("argv, message", [
    (["--name", "x"], "after --"),
    (["--name", "", "--", "scripts/reproduce.py"], "an empty value"),
    (["--name", "x", "--", "/abs/scripts/reproduce.py"], "inside the checkout"),
    (["--name", "x", "--", "scripts/../../x.py"], "inside the checkout"),
    (["--name", "x", "--", "scripts/reproduce.py", "--out", "o"], "leave --out out"),
    (["--name", "x", "--", "scripts/reproduce.py", "--out=o"], "leave --out out"),
    (["--name", "a/b", "--", "scripts/reproduce.py"], "one folder name"),
    (["--name", "x", "--every", "0", "--", "scripts/reproduce.py"], "positive"),
])
def test_bad_lane_arguments_are_one_error(argv, message):
    with pytest.raises(UserError, match=message):
        lane.main(argv)


def test_a_script_the_checkout_lacks_is_refused(repo, tmp_path):
    result = run_lane(repo, tmp_path / "w", "1", "d", "0")
    assert result.returncode == 0
    missing = subprocess.run([sys.executable, "-m", "mtl_cog.cli.lane", "--name", "camp", "--work", str(tmp_path / "w"),
                              "--repo", str(repo), "--", "scripts/nope.py"], capture_output=True, text=True)
    assert missing.returncode == 2 and missing.stderr.startswith("error: lane: scripts/nope.py is not a script")


def test_stopping_a_lane_stops_its_campaign_cleanly_and_commits_what_finished(repo, tmp_path):
    """SIGTERM to a lane started in the background (SIGINT ignored): the campaign still gets SIGINT, its clean
    stop, and the bundle holds what finished."""
    import signal
    import time

    process = subprocess.Popen([sys.executable, "-m", "mtl_cog.cli.lane", "--name", "camp", "--work",
                                str(tmp_path / "w"), "--every", "0.2", "--repo", str(repo), "--",
                                "scripts/fake_campaign.py", "1000", "e", "0"], stdout=subprocess.PIPE, text=True,
                               # as `lane ... &` from a script: SIGINT ignored, which the campaign must not inherit
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    published = repo / "results" / "camp" / "bundle" / "runs.csv"
    deadline = time.monotonic() + 60
    while not published.is_file() and time.monotonic() < deadline:
        time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 128 + signal.SIGINT  # the campaign got SIGINT, its clean stop
    rows = git(repo, "show", "HEAD:results/camp/bundle/runs.csv").splitlines()
    assert rows[0] == "run" and 1 <= len(rows) - 1 < 1000


def test_an_out_bundle_older_than_the_committed_one_is_refused_not_synced_over_it(repo, tmp_path):
    """Machine 1 ran, machine 2 resumed from its commit and added a run; machine 1's stale out/ must not drop it."""
    assert run_lane(repo, tmp_path / "machine1", "3", "a", "0").returncode == 0
    assert run_lane(repo, tmp_path / "machine2", "1", "b", "0").returncode == 0
    again = run_lane(repo, tmp_path / "machine1", "1", "c", "0")
    assert again.returncode == 2 and "older than the committed bundle" in again.stderr
    assert again.stderr.count("\n") == 1 and again.stderr.startswith("error: ")
    assert git(repo, "show", "HEAD:results/camp/bundle/runs.csv") == "run\na-0\na-1\na-2\nb-0\n"


def test_a_results_path_that_is_a_file_is_one_error_and_nothing_runs(repo, tmp_path):
    (repo / "results").mkdir()
    (repo / "results" / "camp").write_text("not a folder")
    result = run_lane(repo, tmp_path / "w", "1", "a", "0")
    assert result.returncode == 2 and result.stderr.startswith("error: lane: ") and "is a file" in result.stderr
    assert not (tmp_path / "w" / "camp" / "out").exists()


def test_a_busy_git_is_reported_as_not_committed(repo, tmp_path, monkeypatch):
    published = repo / "results" / "camp" / "bundle"
    published.mkdir(parents=True)
    (published / "runs.csv").write_text("run\na\n")
    (repo / ".git" / "index.lock").write_text("")  # another git command holds the index
    monkeypatch.setattr(lane, "COMMIT_TRIES", 2)
    monkeypatch.setattr(lane.time, "sleep", lambda seconds: None)
    assert lane.commit_bundle(repo, published, "camp") == lane.FAILED
    (repo / ".git" / "index.lock").unlink()
    assert lane.commit_bundle(repo, published, "camp") == lane.COMMITTED
    assert lane.commit_bundle(repo, published, "camp") == lane.UNCHANGED


def _started(process) -> int:
    """The campaign's pid, from the lane's first line."""
    line = process.stdout.readline()
    return int(line.split("(pid ")[1].split(")")[0])


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as handle:
            return "zombie" not in handle.read()
    except FileNotFoundError:
        return False


def test_one_lane_per_name_and_a_killed_lane_takes_its_campaign_down(repo, tmp_path):
    import os
    import signal
    import time

    process = subprocess.Popen([sys.executable, "-m", "mtl_cog.cli.lane", "--name", "camp", "--work",
                                str(tmp_path / "w"), "--every", "0.2", "--repo", str(repo), "--",
                                "scripts/fake_campaign.py", "1000", "k", "0"], stdout=subprocess.PIPE, text=True)
    campaign = _started(process)
    second = run_lane(repo, tmp_path / "w", "1", "x", "0")
    assert second.returncode == 2 and "another lane named camp, or the campaign of one, is running" in second.stderr
    assert _alive(campaign)
    os.kill(process.pid, signal.SIGKILL)  # no handler runs: the kernel tells the campaign (SIGINT)
    process.wait(timeout=30)
    deadline = time.monotonic() + 30
    while _alive(campaign) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(campaign)
    # the lock went with the campaign (it held the lane's descriptor): a new lane of that name runs
    assert run_lane(repo, tmp_path / "w", "1", "z", "0").returncode == 0


def test_a_campaign_run_from_a_lane_records_the_lanes_commit(monkeypatch):
    from mtl_cog.experiments import campaign

    monkeypatch.setenv("MTL_COG_CODE_COMMIT", "0123456789ab")
    assert campaign.code_commit() == "0123456789ab"


def change(bundle: Path) -> None:
    """A new version of the bundle (a later sync, written and sealed as a campaign writes it): its command grows by
    one word."""
    from mtl_cog.bundles import bundle as bundles

    record = bundles.read_bundle(bundle)
    record.campaign["command"] = [*record.campaign.get("command", []), "x"]
    bundles.write_bundle(bundle, record)


def test_a_lane_commit_carries_the_docs_tables_of_its_bundle_and_nothing_else(repo, tmp_path, capsys):
    """Every commit of a bundle also holds its docs tables regenerated (a checkout never has docs that disagree
    with its results); a page with uncommitted edits, or one naming a table no bundle has, is left out; a table
    whose runs have not finished reads PENDING."""
    from test_campaign import write_tiny_bundle

    published = repo / "results" / "camp" / "bundle"
    (repo / "docs").mkdir()
    page, other = repo / "docs" / "r.md", repo / "docs" / "o.md"
    page.write_text("prose\n<!-- bundle-table: results/camp/bundle summary -->\nold\n<!-- /bundle-table -->\n")
    other.write_text("<!-- bundle-table: results/elsewhere/bundle summary -->\nkept\n<!-- /bundle-table -->\n")
    git(repo, "add", "docs")
    git(repo, "commit", "-q", "-m", "docs")
    write_tiny_bundle(published)
    assert lane.commit_bundle(repo, published, "camp") == lane.COMMITTED
    committed = git(repo, "show", "HEAD:docs/r.md")
    assert "| cog_ts |" in committed and "old" not in committed and committed.startswith("prose\n")
    assert git(repo, "show", "HEAD:docs/o.md") == other.read_text()  # another bundle's block untouched
    assert git(repo, "status", "--porcelain") == ""
    # a page with edits of its own: the bundle is committed, the page (and its edits) stay out
    page.write_text(page.read_text() + "an edit in progress\n")
    change(published)
    assert lane.commit_bundle(repo, published, "camp") == lane.COMMITTED
    assert "uncommitted edits" in capsys.readouterr().err
    assert "an edit in progress" not in git(repo, "show", "HEAD:docs/r.md")
    assert git(repo, "status", "--porcelain") == " M docs/r.md\n"
    # a page naming a table the bundle does not have yet (no curve runs): committed with it, the block pending
    git(repo, "checkout", "--", "docs/r.md")
    page.write_text(page.read_text().replace("camp/bundle summary", "camp/bundle curve"))
    git(repo, "commit", "-q", "-am", "a table the bundle lacks")
    change(published)
    assert lane.commit_bundle(repo, published, "camp") == lane.COMMITTED
    assert docs_tables.PENDING in git(repo, "show", "HEAD:docs/r.md")
    assert git(repo, "status", "--porcelain") == ""
    # a page naming a table no bundle has: the bundle goes alone, the page is as committed
    page.write_text(page.read_text().replace("camp/bundle curve", "camp/bundle nope"))
    git(repo, "commit", "-q", "-am", "a table no bundle has")
    change(published)
    assert lane.commit_bundle(repo, published, "camp") == lane.COMMITTED
    assert "no table 'nope'" in capsys.readouterr().err
    assert git(repo, "show", "HEAD:docs/r.md") == page.read_text()  # as its own commit left it
    assert git(repo, "status", "--porcelain") == ""
    # while the package has uncommitted changes, no table is regenerated: no commit's code would make them
    page.write_text(page.read_text().replace("camp/bundle nope", "camp/bundle summary"))
    (repo / "mtl_cog").mkdir()
    (repo / "mtl_cog" / "x.py").write_text("A = 1\n")
    git(repo, "add", "docs", "mtl_cog")
    git(repo, "commit", "-q", "-m", "code")
    (repo / "mtl_cog" / "x.py").write_text("A = 2\n")
    change(published)
    assert lane.commit_bundle(repo, published, "camp") == lane.COMMITTED
    assert "mtl_cog/ has uncommitted changes" in capsys.readouterr().err
    assert "| cog_ts |" not in git(repo, "show", "HEAD:docs/r.md")
    assert git(repo, "status", "--porcelain") == " M mtl_cog/x.py\n"


def test_a_lane_commit_carries_the_figures_of_its_bundle(repo, tmp_path):
    """A bundle-figure's SVG is committed with the page that links it: a checkout never has a page whose figure
    file is missing or drawn from other runs."""
    from test_results_docs import FIGURE_BLOCK, write_curve_bundle

    published = repo / "results" / "k" / "bundle"
    (repo / "docs").mkdir()
    page = repo / "docs" / "r.md"
    page.write_text(FIGURE_BLOCK.format(body="old\n"))
    git(repo, "add", "docs")
    git(repo, "commit", "-q", "-m", "docs")
    write_curve_bundle(published, ratios=(1.0,))
    assert lane.commit_bundle(repo, published, "k") == lane.COMMITTED
    assert git(repo, "status", "--porcelain") == ""
    first = git(repo, "show", "HEAD:docs/figures/k_nll.svg")
    assert "cog_fc: 0.304 at 1" in first
    write_curve_bundle(published, ratios=(0.01, 1.0))  # more runs: the figure is drawn again, in the same commit
    assert lane.commit_bundle(repo, published, "k") == lane.COMMITTED
    assert git(repo, "status", "--porcelain") == ""
    assert "cog_fc: 0.2842 at 0.01" in git(repo, "show", "HEAD:docs/figures/k_nll.svg")
    names = set(git(repo, "show", "--name-only", "--format=", "HEAD").split())
    assert "docs/figures/k_nll.svg" in names and all(n.startswith(("results/k/bundle/", "docs/")) for n in names)


def test_a_figure_list_the_lane_cannot_read_leaves_the_docs_out_and_commits_the_bundle(repo, monkeypatch, capsys):
    """The lane lists a bundle's figure files with the code it started with; a page changed since (a rule that
    code does not know) must not stop the campaign: the bundle is committed alone, the pages as they were."""
    from test_results_docs import FIGURE_BLOCK, write_curve_bundle

    published = repo / "results" / "k" / "bundle"
    (repo / "docs").mkdir()
    (repo / "docs" / "r.md").write_text(FIGURE_BLOCK.format(body="old\n"))
    git(repo, "add", "docs")
    git(repo, "commit", "-q", "-m", "docs")
    write_curve_bundle(published, ratios=(1.0,))

    def unreadable(*_):
        raise UserError("docs/r.md: bundle-figure file 'x' must be an .svg under docs/, relative to the page.")

    monkeypatch.setattr(lane, "figures_on", unreadable)
    assert lane.commit_bundle(repo, published, "k") == lane.COMMITTED
    assert "docs tables not committed" in capsys.readouterr().err
    assert set(git(repo, "show", "--name-only", "--format=", "HEAD").split()) <= {
        f"results/k/bundle/{f}" for f in ("runs.csv", "results.csv.gz", "curves.csv.gz", "trials.csv", "campaign.json",
                                          "manifest.json")}
    assert git(repo, "show", "HEAD:docs/r.md") == FIGURE_BLOCK.format(body="old\n")
    assert "docs/r.md" not in git(repo, "status", "--porcelain")  # restored


def _two_bundles_on_a_page(repo: Path, text: str) -> tuple[Path, Path, Path]:
    """(this lane's bundle, written, not committed; another lane's bundle, committed; the page ``text``, committed)."""
    from test_campaign import write_tiny_bundle

    published, other = repo / "results" / "camp" / "bundle", repo / "results" / "other" / "bundle"
    write_tiny_bundle(other)
    (repo / "docs").mkdir()
    page = repo / "docs" / "r.md"
    page.write_text(text)
    git(repo, "add", "docs", "results")
    git(repo, "commit", "-q", "-m", "docs and the other lane's bundle")
    write_tiny_bundle(published)
    return published, other, page


def test_a_block_of_several_bundles_waits_while_another_of_them_is_uncommitted(repo, capsys):
    """The protocols' claims read every bundle they name from the working tree: while another lane's bundle is
    synced but not committed, this lane commits its bundle alone (no commit may hold numbers of uncommitted data)."""
    published, other, page = _two_bundles_on_a_page(
        repo, "<!-- bundle-protocols: claims paper=results/camp/bundle fair=results/other/bundle -->\nold\n"
              "<!-- /bundle-protocols -->\n")
    change(other)  # the other lane has synced, not committed
    assert lane.commit_bundle(repo, published, "camp") == lane.COMMITTED
    assert "bundles with uncommitted changes" in capsys.readouterr().err
    assert git(repo, "show", "HEAD:docs/r.md") == page.read_text()  # left as committed
    git(repo, "commit", "-q", "-am", "the other lane commits")
    change(published)
    assert lane.commit_bundle(repo, published, "camp") == lane.COMMITTED
    assert "old" not in git(repo, "show", "HEAD:docs/r.md")  # now regenerated with the bundle


def test_a_block_another_lane_had_to_leave_stale_is_made_right_by_the_next_commit_on_its_page(repo):
    """Two lanes stop at once: the first commits while the second's bundle is synced but not committed, so it
    leaves the page alone; the second regenerates every block of the page, the first lane's block too.
    No commit after both is left with a block that disagrees with its committed bundle."""
    published, _, _ = _two_bundles_on_a_page(
        repo, "<!-- bundle-table: results/other/bundle summary -->\nstale\n<!-- /bundle-table -->\n"
              "<!-- bundle-table: results/camp/bundle summary -->\nold\n<!-- /bundle-table -->\n")
    assert lane.commit_bundle(repo, published, "camp") == lane.COMMITTED
    committed = git(repo, "show", "HEAD:docs/r.md")
    assert "stale" not in committed and "old" not in committed and committed.count("| cog_ts |") == 2
    assert git(repo, "status", "--porcelain") == ""
    assert docs_tables.regenerate_docs(repo, check=True) == []


def test_a_figure_of_another_bundle_on_the_lanes_page_is_committed_with_the_page(repo):
    """The page is regenerated whole, so a figure block of another (committed) bundle on it is drawn too: its SVG
    goes into the same commit, never a page linking a file the commit lacks."""
    from test_campaign import write_tiny_bundle
    from test_results_docs import FIGURE_BLOCK, write_curve_bundle

    published = repo / "results" / "camp" / "bundle"
    write_curve_bundle(repo / "results" / "k" / "bundle", ratios=(1.0,))
    (repo / "docs").mkdir()
    table = "<!-- bundle-table: results/camp/bundle summary -->\nold\n<!-- /bundle-table -->\n"
    (repo / "docs" / "r.md").write_text(FIGURE_BLOCK.format(body="old\n") + table)
    git(repo, "add", "docs", "results")
    git(repo, "commit", "-q", "-m", "a curve bundle whose figure was never drawn")
    write_tiny_bundle(published)
    assert lane.commit_bundle(repo, published, "camp") == lane.COMMITTED
    assert git(repo, "status", "--porcelain") == ""
    assert "cog_fc: 0.304 at 1" in git(repo, "show", "HEAD:docs/figures/k_nll.svg")


def test_a_broken_block_of_another_bundle_leaves_this_bundles_blocks_regenerated(repo, capsys):
    """A block elsewhere on the page that cannot be made (its campaign folder holds no bundle): the whole page
    cannot be regenerated, so the lane falls back to its own blocks, and they are committed right."""
    from test_campaign import write_tiny_bundle

    published = repo / "results" / "camp" / "bundle"
    (repo / "results" / "c").mkdir(parents=True)
    (repo / "results" / "c" / "README.md").write_text("a campaign folder without its bundle\n")
    (repo / "docs").mkdir()
    (repo / "docs" / "r.md").write_text(
        "<!-- bundle-table: results/c/bundle summary -->\nkept\n<!-- /bundle-table -->\n"
        "<!-- bundle-table: results/camp/bundle summary -->\nold\n<!-- /bundle-table -->\n")
    git(repo, "add", "docs", "results")
    git(repo, "commit", "-q", "-m", "a broken block")
    write_tiny_bundle(published)
    assert lane.commit_bundle(repo, published, "camp") == lane.COMMITTED
    assert "(--pages-of)" in capsys.readouterr().err
    committed = git(repo, "show", "HEAD:docs/r.md")
    assert "| cog_ts |" in committed and "kept" in committed and "old" not in committed
    assert git(repo, "status", "--porcelain") == ""


def test_lanes_of_one_checkout_publish_one_at_a_time(repo, tmp_path):
    """Syncing and committing hold one lock per checkout: while another lane holds it, a lane waits (it would
    otherwise read a bundle the other is half-way through replacing)."""
    import threading

    from filelock import FileLock

    out = tmp_path / "out"
    (out / "bundle").mkdir(parents=True)
    (out / "bundle" / "runs.csv").write_text("run\nr-0\n")
    published = repo / "results" / "camp" / "bundle"
    outcome = []
    with FileLock(str(repo / ".git" / "mtl_cog-lanes.lock")):
        worker = threading.Thread(target=lambda: outcome.append(lane.publish(repo, out, published, "camp",
                                                                             lane.UNCHANGED)))
        worker.start()
        worker.join(1.5)
        assert worker.is_alive() and not published.exists()  # waiting: nothing synced yet
    worker.join(60)
    assert outcome == [lane.COMMITTED] and (published / "runs.csv").is_file()
    assert git(repo, "status", "--porcelain") == ""
