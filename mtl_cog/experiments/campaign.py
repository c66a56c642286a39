"""One campaign engine: many runs planned, estimated, launched, resumed and collected into a results bundle.

Every command that trains more than one run is a *spec generator* on top of this module: ``sweep``
(a grid), ``leader-curve`` (ratios x seeds + reference arms), ``reproduce`` (method configs x seeds,
after the fair protocol's tuning) and the tuning workers (one spec per trial). A ``RunSpec`` is one
run: its config sources and overrides, its folder, and its labels (data, method, role, tuning draw,
trial, leader/follower ratio, seed). The engine then does, once for all of them (the split of
Hydra's sweeper, which makes the specs, and launcher, which runs them):

1. **resolve** every spec's config up front: a bad spec refuses the whole campaign with one
   ``error:`` line naming it, before any run starts (``resolve``);
2. **plan** each run's state: recorded in the campaign's results bundle (``bundled``: nothing to
   train, also on a fresh clone where the run folders are gone), finished in its folder (``done``:
   collected, not retrained), interrupted (``unfinished``: resumed from its saved state) or ``new``.
   A bundle recording the same run under another config digest is refused, naming the run and both
   digests, and a bundle of another campaign is refused whole: two campaigns never mix (``plan``);
3. **estimate** what is still to run, in device-hours and, on CPUs, core-hours (``estimates``);
4. **launch** what is left through the local or submitit launcher with one thread policy
   (``launcher.thread_env``) and one interrupt message, **collecting** each run into the bundle as it
   finishes (``collect``), so that a lost machine loses only the runs in flight.

The bundle (``mtl_cog.bundles.bundle``) lives in ``<out>/bundle`` and is what a user commits;
``mtl-cog report --bundle`` regenerates every table from it alone.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from filelock import FileLock

from mtl_cog.bundles import bundle as bundles
from mtl_cog.bundles.bundle_rows import environment, failed_row, run_facts, run_rows, versions_text
from mtl_cog.config import Config, load_config
from mtl_cog.errors import ConfigError, RunFolderError, UserError
from mtl_cog.experiments import reuse
from mtl_cog.experiments.launcher import PACKAGE_PARENT, RunJob, train_command
from mtl_cog.experiments.portable import portable_command
from mtl_cog.experiments.sweep import DONE, LOCATION_KEYS, NEW, TRACKING_KEYS, UNFINISHED, run_state
from mtl_cog.io import output_folder
from mtl_cog.runs import rundir
from mtl_cog.training.resume_settings import flatten_settings

BUNDLED = "bundled"  # recorded as done in the campaign's bundle: never trained again
# Where a run's files and data lie is no setting of it: a bundle re-planned on another machine
# (another data.root, cache or output folder) holds the same runs.
DIGEST_IGNORED = (*TRACKING_KEYS, *LOCATION_KEYS, "data.root", "data.cache_dir", "data.download", "data.use_cache")


@dataclass(frozen=True)
class Labels:
    """What a run is, in the words of runs.csv."""

    data: str
    method: str
    role: str  # trial / final / curve / sweep
    seed: int
    draw: str = ""  # the tuning draw (its tuning seeds), "" when none
    trial: str = ""
    ratio: float | None = None  # leader / follower learning rate, None when not on a leader grid

    def row(self) -> dict:
        return {"data": self.data, "method": self.method, "role": self.role, "seed": self.seed, "draw": self.draw,
                "trial": self.trial, "ratio": "" if self.ratio is None else self.ratio}


@dataclass(frozen=True)
class RunSpec:
    run: str  # the run's name: unique in the campaign, the name of its folder
    configs: tuple[Path, ...]  # merged in order
    overrides: tuple[str, ...]  # then these; ``output_dir``/``run_name`` are added from ``run_dir``
    run_dir: Path
    labels: Labels
    posthoc: tuple[str, ...] = ()  # post-hoc calibrators fitted on its validation predictions when collected

    def all_overrides(self) -> list[str]:
        return [*self.overrides, f"output_dir={self.run_dir.parent}", f"run_name={self.run_dir.name}"]


@dataclass
class Campaign:
    name: str  # e.g. "reproduce-fair", "leader-curve-fashion_mnist-cog_fc", "sweep-cog_ts"
    out: Path  # <out>/bundle is its results bundle
    specs: list[RunSpec]
    command: list[str] = field(default_factory=lambda: list(sys.argv))
    counterparts: dict[str, str] = field(default_factory=dict)  # {method: counterpart} for paired verdicts
    budget: int | None = None  # the tuning budget per study (fair protocol), recorded for the reports
    threads: int | None = None  # torch threads per CPU run, recorded: a resume trains on them (reuse.with_threads)


@dataclass
class Planned:
    spec: RunSpec
    config: Config
    digest: str
    state: str  # bundled / done / unfinished / new


def run_name(*, data: str = "", method: str = "", draw: int = 1, ratio: float | None = None, trial: int | None = None,
             index: int | None = None, seed: int | None = None) -> str:
    """The one rule for a run folder's name, leaving out what a campaign does not vary:
    ``<data>-<method>[-d<draw>]-r<ratio>-trial_<NN>-run_<NN>-seed<S>`` (a reproduction's
    ``digits-cog_fc-seed0``, a curve's ``cog_fc-r0.1-seed0``, a tuning trial's ``trial_03`` or
    ``trial_03-seed1000``, a sweep's ``run_07``). The first tuning draw has no ``-d``, so one-draw
    campaigns keep their names; ``r<ratio>`` prints 6 significant digits and reads back as the same
    number (``leader_curve.check_ratios`` refuses two ratios with one name).
    """
    parts = [data, method, "" if draw == 1 else f"d{draw}", "" if ratio is None else f"r{ratio:.6g}",
             "" if trial is None else f"trial_{trial:02d}", "" if index is None else f"run_{index:02d}",
             "" if seed is None else f"seed{seed}"]
    return "-".join(p for p in parts if p)


DIGEST_VERSION = 2  # 2: the settings that differ from the schema's defaults (1: every setting)


@functools.cache
def _default_settings() -> dict:
    return flatten_settings(Config().to_dict())


def _digest_settings(cfg: Config, ignored: tuple[str, ...]) -> dict:
    """Every setting that differs from the schema's default, minus ``ignored``: a key added to the schema later
    (with a default that keeps old behaviour) leaves the digests of existing runs as they were."""
    defaults = _default_settings()
    return {k: v for k, v in flatten_settings(cfg.to_dict()).items()
            if not any(k == i or k.startswith(f"{i}.") for i in ignored) and (k not in defaults or defaults[k] != v)}


def _short_hash(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def config_digest(cfg: Config) -> str:
    """A short hash of every setting that makes the run what it is (not where it lies or reports)."""
    return _short_hash(_digest_settings(cfg, DIGEST_IGNORED))


def setting_digest(cfg: Config) -> str:
    """The config digest without the seed and the run's name: runs of one setting share it."""
    return _short_hash(_digest_settings(cfg, (*DIGEST_IGNORED, "seed", "run_name")))


def _arm(labels: dict) -> tuple:
    """What the runs of one setting share in a campaign (data, method, role, draw, trial or grid point, ratio): a
    table pools their seeds."""
    ratio = labels.get("ratio")
    ratio = "" if ratio in ("", None) or (isinstance(ratio, float) and ratio != ratio) else f"{float(ratio):.6g}"
    role = str(labels.get("role", ""))
    draw = "" if role == "curve" else str(labels.get("draw", ""))  # a curve's draw names its source, not an arm
    return (str(labels.get("data", "")), str(labels.get("method", "")), role, draw, str(labels.get("trial", "")),
            ratio)


def check_same_settings(bundle: bundles.Bundle | None, planned: list[Planned], where: Path) -> None:
    """Refuse a campaign that would pool another setting into an arm the bundle already holds (a rerun of the
    same --out with other epochs, rates or tuned settings, under other seeds): reports average an arm's runs."""
    if bundle is None:
        return
    specs = bundle.campaign.get("specs", {})
    held = {}
    for row in bundle.runs.to_dict("records"):
        record = specs.get(row["run"])
        if isinstance(record, dict) and record.get("setting"):
            held.setdefault(_arm(row), (row["run"], record["setting"]))
    for p in planned:
        arm = _arm(p.spec.labels.row())
        if arm in held and held[arm][1] != setting_digest(p.config):
            raise UserError(f"{where}: run {held[arm][0]} of {'/'.join(a for a in arm[:2])} was recorded with "
                            f"another setting (digest {held[arm][1]}) than this campaign's {p.spec.run} "
                            f"({setting_digest(p.config)}); its reports would average the two. Use another --out, "
                            "or the settings the bundle was made with.")


def resolve(specs: list[RunSpec]) -> list[Config]:
    """Every spec's config, all before anything runs: one bad spec refuses the campaign, naming it."""
    names = [s.run for s in specs]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise UserError(f"the campaign plans two runs named {', '.join(repeated[:3])}: they would share a folder. "
                        "Give distinct seeds, ratios or grid values.")
    configs = []
    for spec in specs:
        try:
            configs.append(load_config(list(spec.configs), spec.all_overrides()))
        except ConfigError as err:
            raise ConfigError(f"campaign run {spec.run}: {err}") from None
    return configs


def same_composition(bundle: bundles.Bundle, spec: RunSpec) -> bool:
    """Whether a run recorded under an older digest version was composed exactly as ``spec`` is (the same config
    files and overrides): then only the digest's definition changed, not the run."""
    record = bundle.campaign.get("specs", {}).get(spec.run)
    if not isinstance(record, dict) or record.get("digest_version") == DIGEST_VERSION or "configs" not in record:
        return False
    mine = spec_record(Planned(spec, Config(), "", NEW))
    return record["configs"] == mine["configs"] and list(record.get("overrides", [])) == mine["overrides"]


def plan(campaign: Campaign, settings_chosen_later: bool = False) -> list[Planned]:
    """Each spec's resolved config, digest and state (module docstring, step 2). ``settings_chosen_later``: a fair
    dry run's finals lack the tuned settings (choosing writes), so a recorded run is taken as recorded, uncompared."""
    configs = resolve(campaign.specs)
    bundle = bundles.read_bundle(bundles.bundle_dir(campaign.out))
    if bundle is not None and bundle.name != campaign.name:
        raise UserError(f"{bundles.bundle_dir(campaign.out)} holds the results of campaign {bundle.name!r}, not of "
                        f"{campaign.name!r}: two campaigns never share a bundle. Use another --out.")
    recorded = {} if bundle is None else dict(zip(bundle.runs["run"], zip(bundle.runs["config_digest"],
                                                                          bundle.runs["status"])))
    planned = []
    for spec, cfg in zip(campaign.specs, configs):
        digest = config_digest(cfg)
        if (spec.run in recorded and recorded[spec.run][0] != digest and not settings_chosen_later
                and not same_composition(bundle, spec)):
            raise UserError(f"{bundles.bundle_dir(campaign.out) / bundles.RUNS}: run {spec.run} was recorded with "
                            f"config digest {recorded[spec.run][0]}, and this campaign plans it as {digest} (another "
                            "setting). Use another --out, or the settings the bundle was made with.")
        if spec.run in recorded and recorded[spec.run][1] == "done":
            state = reuse.check_run_folder(bundle, spec.run, spec.run_dir) or BUNDLED
        elif settings_chosen_later:  # a folder's settings cannot be compared yet: counted by what it holds
            state = folder_state(spec.run_dir)
        else:
            state = run_state(spec.run_dir, cfg)  # a folder still there must agree
        planned.append(Planned(spec, cfg, digest, state))
    if not settings_chosen_later:
        check_same_settings(bundle, planned, bundles.bundle_dir(campaign.out))
    return planned


def folder_state(run_dir: Path) -> str:
    """A run folder's state without comparing its settings (the real command compares them once they are chosen)."""
    if not (run_dir / rundir.CONFIG).is_file():
        return NEW
    return DONE if (run_dir / rundir.DONE).exists() else UNFINISHED


def print_counts(planned: list[Planned], what: str) -> None:
    counts = {s: sum(p.state == s for p in planned) for s in (BUNDLED, DONE, UNFINISHED, NEW)}
    print(f"{what}: {len(planned)} planned ({counts[BUNDLED]} in the bundle, {counts[DONE]} finished outside it, "
          f"{counts[UNFINISHED]} to resume, {counts[NEW]} to train)", flush=True)


def interrupted(resume: str) -> SystemExit:
    """The one interrupt message: what to type to continue."""
    print(f"interrupted: finished runs are kept (and recorded in the bundle); {resume} continues where it stopped.",
          file=sys.stderr)
    return SystemExit(130)


def code_commit() -> str:
    """The commit of the code that ran (``+dirty`` with uncommitted changes), "" outside a git clone.

    A lane (``mtl-cog lane``) runs a ``git archive`` copy, which has no ``.git``: it names the commit it
    copied in ``MTL_COG_CODE_COMMIT``.
    """
    if os.environ.get("MTL_COG_CODE_COMMIT"):
        return os.environ["MTL_COG_CODE_COMMIT"]
    try:
        head = subprocess.run(["git", "-C", PACKAGE_PARENT, "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        dirty = subprocess.run(["git", "-C", PACKAGE_PARENT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    if head.returncode != 0:
        return ""
    return head.stdout.strip()[:12] + ("+dirty" if dirty.stdout.strip() else "")


def spec_record(p: Planned) -> dict:
    """What ``campaign.json`` keeps of a run: its digest, how to compose its config again on a fresh clone (config
    files relative to it, overrides), and its labels (reports know every planned run: "incomplete" until done)."""
    def portable(path: Path) -> str:
        try:
            return str(Path(path).resolve().relative_to(Path(PACKAGE_PARENT)))
        except ValueError:
            return str(path)
    return {"digest": p.digest, "digest_version": DIGEST_VERSION, "setting": setting_digest(p.config),
            "configs": [portable(c) for c in p.spec.configs], "overrides": list(p.spec.overrides),
            "labels": p.spec.labels.row()}


def recorded_spec(bundle: bundles.Bundle, run: str) -> tuple[tuple[Path, ...], tuple[str, ...]] | None:
    """(config files, overrides) of ``run`` as ``campaign.json`` records it; None when it records no more than a
    digest. Relative config paths are read from this clone."""
    record = bundle.campaign.get("specs", {}).get(run)
    if not isinstance(record, dict) or "configs" not in record:
        return None
    configs = tuple(Path(c) if Path(c).is_absolute() else Path(PACKAGE_PARENT) / c for c in record["configs"])
    return configs, tuple(record.get("overrides", ()))


class Collector:
    """Records finished runs into the campaign's bundle, one at a time under a file lock (several processes,
    e.g. tuning workers, may collect into one bundle)."""

    def __init__(self, campaign: Campaign, planned: list[Planned]) -> None:
        self.campaign = campaign
        self.folder = bundles.bundle_dir(campaign.out)
        self.lock = FileLock(str(Path(campaign.out) / "bundle.lock"))
        self.env = environment()
        self.commit = code_commit()
        self.planned = {p.spec.run: p for p in planned}

    def _campaign_record(self, old: dict | None) -> dict:
        specs = dict((old or {}).get("specs", {}))
        specs.update({name: spec_record(p) for name, p in self.planned.items()})
        command = portable_command(self.campaign.command, self.campaign.out) or (old or {}).get("command", [])
        budget = self.campaign.budget or (old or {}).get("budget")
        record = {"format": bundles.FORMAT, "campaign": self.campaign.name, "command": command,
                  **({"budget": budget} if budget else {}), **reuse.threads_record(self.campaign.threads, old),
                  "counterparts": {**(old or {}).get("counterparts", {}), **self.campaign.counterparts},
                  "environment": {**self.env, "commit": self.commit}, "specs": specs}
        return {**(old or {}), **record}  # keys others keep there (a curve's ``reused``) stay

    def labels_of(self, p: Planned) -> dict:
        return {"run": p.spec.run, "campaign": self.campaign.name, "config_digest": p.digest, **p.spec.labels.row()}

    def unfinished_row(self, p: Planned, status: str, reason: str) -> dict:
        """The runs.csv row of a run that failed or was pruned, with the versions and commit that ran it and what
        it trained before it stopped (epochs, threads, epoch seconds: a pruned trial's cost is counted too)."""
        facts = run_facts(p.spec.run_dir) if p.spec.run_dir.is_dir() else {}
        return {**failed_row(self.labels_of(p), status, reason), "versions": versions_text(self.env),
                "commit": self.commit, **{k: facts[k] for k in ("epochs_run", "threads", "wall_s") if k in facts}}

    def update(self, change) -> None:
        """Apply ``change(bundle)`` to the bundle on disk and write it back (under the lock)."""
        output_folder(self.campaign.out, "--out")
        with self.lock:
            bundle = bundles.read_bundle(self.folder)
            if bundle is None:
                bundle = bundles.Bundle(self._campaign_record(None))
            elif bundle.name != self.campaign.name:
                raise UserError(f"{self.folder} holds campaign {bundle.name!r}, not {self.campaign.name!r}.")
            bundle.campaign = self._campaign_record(bundle.campaign)
            for name, p in self.planned.items():  # a run plan() matched by composition gets today's digest
                bundle.runs.loc[bundle.runs["run"] == name, "config_digest"] = p.digest
            change(bundle)
            bundles.write_bundle(self.folder, bundle)

    def collect(self, names: list[str], failed: dict[str, str] | None = None) -> list[str]:
        """Record the finished runs among ``names`` (and ``failed``: {run: reason}); -> runs that could not be read."""
        rows, refused = [], []
        for name in names:
            p = self.planned[name]
            if p.state == BUNDLED or not (p.spec.run_dir / rundir.DONE).is_file():
                continue
            try:
                row, results, curves, reliability = run_rows(p.spec.run_dir, self.labels_of(p), p.spec.posthoc)
            except (RunFolderError, UserError) as err:
                print(f"{name}: not recorded in the bundle: {err}", file=sys.stderr)
                refused.append(name)
                continue
            row.update(versions=versions_text(self.env), commit=self.commit)
            rows.append((row, results, curves, reliability))
        failures = [self.unfinished_row(self.planned[n], "failed", reason)
                    for n, reason in (failed or {}).items()]
        if rows or failures:
            def change(bundle: bundles.Bundle) -> None:
                for row in failures:
                    if not (bundle.runs["run"] == row["run"]).any() or \
                            (bundle.runs.loc[bundle.runs["run"] == row["run"], "status"] != "done").all():
                        bundle.add_run(row, pd.DataFrame(columns=bundles.RESULT_COLUMNS),
                                       pd.DataFrame(columns=bundles.CURVE_COLUMNS))
                for row, results, curves, reliability in rows:
                    bundle.add_run(row, results, curves, reliability)
                    bundle.campaign.get("reused", {}).pop(row["run"], None)  # trained here after all
            self.update(change)
            for row, *_ in rows:
                self.planned[row["run"]].state = BUNDLED
        return refused


def jobs(planned: list[Planned], env: tuple[tuple[str, str], ...], processes: int = 1) -> list[tuple[Planned, RunJob]]:
    """The launcher's jobs for the runs still to train (unfinished ones resume with ``train --resume``)."""
    out = []
    for p in planned:
        if p.state not in (NEW, UNFINISHED):
            continue
        command = train_command(p.spec.run_dir, list(p.spec.configs), p.spec.all_overrides(), p.state == UNFINISHED,
                                processes)
        name = f"{p.spec.labels.data}/{p.spec.run}" if p.spec.labels.data else p.spec.run
        out.append((p, RunJob(name, tuple(command), p.spec.run_dir.parent / f"{p.spec.run_dir.name}.log", env=env)))
    return out


def run(campaign: Campaign, planned: list[Planned], runner, env: tuple[tuple[str, str], ...], resume: str,
        processes: int = 1, what: str = "runs") -> list[Planned]:
    """Collect what already finished, train the rest (each run collected as it ends); -> the failed runs."""
    print_counts(planned, what)
    collector = Collector(reuse.with_threads(campaign, env), planned)
    # finished before, not yet in the bundle; one the bundle refuses (damaged, swapped files) counts as failed
    refused = set(collector.collect([p.spec.run for p in planned if p.state == DONE]))
    todo = jobs(planned, env, processes)
    if not todo:
        return [p for p in planned if p.spec.run in refused]

    def finished(index: int, code: int) -> None:
        p, job = todo[index]
        if code == 0:
            if collector.collect([p.spec.run]):
                failed_names.add(p.spec.run)
        else:
            failed_names.add(p.spec.run)
            collector.collect([], {p.spec.run: f"exit {code}; see {job.log}"})

    failed_names: set[str] = set(refused)
    try:
        runner.run([job for _, job in todo], on_done=finished)
    except KeyboardInterrupt:
        # a run that ended as the stop came had its recording (post-hoc fits included) cut short: record it now,
        # in the lane's grace, so a fresh machine does not train it again (a second Ctrl-C: the next start does)
        with contextlib.suppress(KeyboardInterrupt):
            collector.collect([p.spec.run for p, _ in todo if (p.spec.run_dir / rundir.DONE).is_file()])
        raise interrupted(resume) from None
    return [p for p in planned if p.spec.run in failed_names]


def add_campaign_arguments(parser: argparse.ArgumentParser) -> None:
    """``--threads``: the one thread option of every campaign command."""
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="CPU runs: torch threads per run (default: the cores shared by the runs at a time)")
