"""The paper's comparison in one command: every method config × seeds, then the report.

    python scripts/reproduce.py --protocol fair [--budget 4] [--seeds 0 1 2 3 4] --dry-run   # the plan and its time
    python scripts/reproduce.py --protocol fair                  # CPU scale: digits + synthetic, ~1-2 h on 2 cores
    python scripts/reproduce.py                                  # --protocol configs: the shipped settings as they are
    python scripts/reproduce.py --scale paper --protocol fair --launcher slurm --partition gpu --gpus-per-run 1
    python scripts/reproduce.py --protocol paper --scale overconfident --data fashion_mnist --draws 2 --dry-run

Every ``configs/<dataset>/*.yaml`` is a method (new method configs are picked up without changing
this script). Three protocols: ``paper`` (the COG paper's: ``mtl_cog/experiments/protocol.py``) and

- ``fair`` (docs/explanation/protocol.md): per data set and method, an Optuna study of ``--budget`` trials on
  validation NLL over the same knobs for everyone (the follower learning rate for every method,
  baseline included; the leader/follower ratio for COG variants; label smoothing epsilon, focal
  gamma, ...; ``--prune``: successive halving, the same for all), then ``--seeds`` runs of the
  chosen setting. The studies live in OUT/tuning/optuna.db (``optuna-dashboard
  sqlite:///OUT/tuning/optuna.db``); the chosen settings are written to
  OUT/report/chosen_settings.{csv,md}, every trial to OUT/tuning/<dataset>-<method>/trials.csv.
- ``configs``: each config as shipped, not an equal-budget comparison (the report says so).

A scale is a folder of config files, ``configs/scales/<NAME>/<data set>.yaml`` (and ``methods/<method>.yaml`` where a
method needs its own), merged on top of each run's config: ``cpu`` (default; ``digits`` and ``synthetic`` with a tiny
CNN at 16 px, ``--jobs`` runs at once), ``full`` (real images at full size on CPUs) and ``paper`` (the configs' own
backbone, image size and epochs: CelebA, SVHN, CIFAR-10/100 from ``data.root``; meant for ``--launcher slurm``). A
user adds a scale by adding files; ``--data`` defaults to the data sets the scale has files for (``cpu``: digits and
synthetic).

The reproduction is a campaign (``mtl_cog/experiments/campaign.py``): every tuning trial and final run is recorded in
``OUT/bundle/`` as it finishes (commit that folder: ``mtl-cog report --bundle OUT/bundle`` regenerates the report from
it alone), and the same command on a fresh clone that has only the bundle trains nothing that the bundle records.

Runs start in your working directory (relative paths resolve there). A re-run of the same command reuses finished runs
and continues unfinished ones from their last saved state; if any run fails, the report is still written from the
others, the failures are listed and the exit code is 2. Post-hoc calibrators are fitted on the baseline runs
(``--posthoc-on``) and appear as ``baseline+<calibrator>``. The report is ``scripts/compare.py OUT/runs --out
OUT/report``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import torch

from mtl_cog.analysis.paired import counterpart_pairs
from mtl_cog.bundles.bundle import bundle_dir, read_bundle
from mtl_cog.cli.paths import CONFIGS
from mtl_cog.cli.protocol_note import HEAD_LEADER_LRS, write_protocol_note
from mtl_cog.config import load_config
from mtl_cog.config.arguments import Parser, add_deprecated_alias, distinct, whole_number
from mtl_cog.config.compose import scale_datasets, scale_files, scale_names
from mtl_cog.config.schema import MAX_SEED
from mtl_cog.constants import DEFAULT_BINS, SUMMARY_BINS
from mtl_cog.data.task_api import TASKS
from mtl_cog.errors import ConfigError, UserError, run_cli
from mtl_cog.experiments import (
    campaign,
    estimates,
    fair_tuning,
    gpu_time,
    pinning,
    preregistration,
    protocol,
    study_rules,
    tuning,
)
from mtl_cog.experiments.launcher import (
    add_launcher_arguments,
    check_launcher,
    make_launcher,
    processes_per_run,
    thread_env,
)
from mtl_cog.experiments.tuning_rule import TuningRule
from mtl_cog.io import check_writable
from mtl_cog.reporting.bundle_report import write_bundle_report
from mtl_cog.reporting.comparison import write_comparison
from mtl_cog.reporting.posthoc_run import posthoc_method_names
from mtl_cog.runs import rundir

PROTOCOLS = ("configs", "fair", "paper")
TUNED = ("fair", "paper")  # the protocols with tuning studies (and so with draws)
DEFAULT_DATA = {"cpu": ("digits", "synthetic"), "paper": ("celeba", "svhn", "cifar10", "cifar100")}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/reproduce"),
                        help="OUT/runs, OUT/tuning, OUT/report, OUT/bundle")
    parser.add_argument("--protocol", choices=PROTOCOLS, default="configs",
                        help="fair: equal tuning budget; paper: the COG paper's procedure (COG variants tuned, the "
                             "baseline at Adam 1e-4 and LS at 0.1 untuned; mtl_cog/experiments/protocol.py)")
    parser.add_argument("--scale", default="cpu", metavar="NAME",
                        help=f"a folder of configs/scales ({', '.join(scale_names(CONFIGS))}; default cpu)")
    parser.add_argument("--data", nargs="+", default=None, metavar="NAME",
                        help="data sets (default: cpu: digits synthetic; paper: celeba svhn cifar10 cifar100; "
                             "another scale: every data set it has a file for)")
    parser.add_argument("--method", nargs="+", default=None, metavar="NAME",
                        help="only these configs (default: all in configs/<data>/)")
    add_deprecated_alias(parser, "--datasets", "--data", nargs="+")
    add_deprecated_alias(parser, "--methods", "--method", nargs="+")
    # 5 seeds, the paper's count: the paired t interval (analysis/paired.py) of 3 seeds has t = 4.30
    parser.add_argument("--seeds", type=whole_number(0, MAX_SEED, "a seed"), nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--epochs", type=whole_number(1, None, "an epoch count"), default=None,
                        help="override every run's train.epochs")
    parser.add_argument("--budget", type=whole_number(1, protocol.MAX_BUDGET, "a number of tuning trials"), default=3,
                        help="fair: tuning trials per method and data set (default 3)")
    parser.add_argument("--tuning-seeds", type=whole_number(0, MAX_SEED, "a seed"), nargs="+",
                        default=[protocol.TUNE_SEED], metavar="SEED",
                        help=f"fair: every tuning trial trains once per seed and is valued by the mean (default "
                             f"{protocol.TUNE_SEED}; never one of --seeds). Several seeds damp the tuning's own "
                             "noise")
    parser.add_argument("--draws", type=whole_number(1, 10, "a number of tuning draws"), default=1,
                        help="fair/paper: tune every method this many times independently (other tuning seeds, another "
                             "sampler seed); the report sets the draws' verdicts side by side (default 1)")
    parser.add_argument("--legacy-tuning", action="store_true",
                        help="fair: the tuning rules of campaigns tuned before 2026-12-04 (results/fashion_*_full): "
                             "unshifted Halton start points in every draw, the same --seeds in every draw, a choice at "
                             "a range edge re-tuned wider for that method alone; only to resume those campaigns")
    parser.add_argument("--widen", action="store_true",
                        help="fair/paper: when a choice sits at a range edge, re-tune every method of that data set "
                             "and draw (the edge knobs widened) with the same budget; off by default")
    parser.add_argument("--prune", action="store_true",
                        help="fair: successive halving of the tuning trials (the same rungs for every method)")
    parser.add_argument("--epoch-budget", type=whole_number(1, None, "an epoch count"), default=None, metavar="N",
                        help="fair/paper: epochs a study's trials may train together (every study the same; default: "
                             "the trial count alone); at least the start points' epochs (mtl_cog/experiments/"
                             "tuning_rule.py)")
    parser.add_argument("--pin-to", type=Path, default=None, metavar="DIR",
                        help="fair: pin each COG variant's shared knobs to its counterpart's choice in the same draw "
                             "of the fair campaign in DIR, tune its leader alone (mtl_cog/experiments/pinning.py)")
    parser.add_argument("--only-draw", type=whole_number(1, 10, "a tuning draw"), default=None, metavar="K",
                        help="fair/paper: run tuning draw K of --draws alone (its seeds, studies and finals)")
    parser.add_argument("--paper-schedule", choices=protocol.PAPER_SCHEDULES, default="scaled_period",
                        help="paper: the COG variants' rate schedule (default scaled_period, the paper's period "
                             "scaled by its epoch share; constant and late_steps keep its long live phase: "
                             "protocol.py)")
    parser.add_argument("--tune-workers", type=whole_number(1, 4096, "workers >= 1"), default=None, metavar="N",
                        help="fair: Optuna workers per study (default: --jobs locally, 4 on slurm); they share it")
    parser.add_argument("--study-storage", default=None, metavar="URL",
                        help="fair: Optuna storage URL (default sqlite:///OUT/tuning/optuna.db)")
    parser.add_argument("--plan", type=Path, default=None, metavar="FILE",
                        help="the campaign's committed, pre-registered plan (docs/results/<campaign>-plan.md): "
                             "campaign.json records its path, SHA-256 and the code commit; a changed plan is refused")
    parser.add_argument("--posthoc-on", nargs="+", default=["baseline"], metavar="METHOD",
                        help="methods whose runs get the post-hoc calibrators (default: baseline, as the paper)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the estimated time, run nothing")
    parser.add_argument("--tracking", choices=["none", "wandb"], default="none",
                        help="W&B for every run (one group per reproduction, job types tuning/reproduce); default none")
    parser.add_argument("--gpu-check", type=Path, default=None, metavar="JSON",
                        help="throughput measured by scripts/gpu_check.sh (default ./gpu_check.json if present)")
    add_launcher_arguments(parser, parallel_flag="--jobs")
    campaign.add_campaign_arguments(parser)
    args = parser.parse_args(argv)
    if args.paper_schedule != "scaled_period" and args.protocol != "paper":
        raise UserError(f"--paper-schedule {args.paper_schedule} sets the paper protocol's COG schedule; use it with "
                        "--protocol paper, or leave it out.")
    if args.pin_to is not None and args.protocol != "fair" or args.only_draw and args.only_draw > args.draws:
        raise UserError("--pin-to pins to a fair campaign's choices: use it with --protocol fair" if args.pin_to else
                        f"--only-draw {args.only_draw} is not one of --draws {args.draws}'s draws 1-{args.draws}.")
    if args.epoch_budget is not None and args.protocol not in TUNED:
        raise UserError(f"--epoch-budget caps tuning studies, which --protocol {args.protocol} has none of; leave it "
                        "out.")
    if args.legacy_tuning and args.protocol != "fair" or args.widen and args.protocol not in TUNED:
        raise UserError(f"--protocol {args.protocol}: " + ("--legacy-tuning only resumes fair-protocol campaigns tuned "
                        "before 2026-12-04" if args.legacy_tuning else "--widen re-tunes studies, which only the fair "
                        "and paper protocols have") + "; leave it out.")
    for flag, values in (("--seeds", args.seeds), ("--tuning-seeds", args.tuning_seeds), ("--data", args.data),
                         ("--method", args.method)):
        distinct(values, flag)  # one folder per (dataset, method, seed): a repeat would race two jobs on it
    try:
        args.data = args.data or list(DEFAULT_DATA.get(args.scale) or scale_datasets(CONFIGS, args.scale))
        for dataset in args.data:  # every data set has the scale's file
            scale_files(CONFIGS, args.scale, dataset, "")
    except ConfigError as err:
        raise UserError(str(err)) from None
    return args


def method_configs(dataset: str, methods: list[str] | None) -> list[Path]:
    folder = CONFIGS / dataset
    configs = sorted(folder.glob("*.yaml"))
    if not configs:
        raise UserError(f"no method configs in {folder}.")
    if methods is not None:
        missing = sorted(set(methods) - {c.stem for c in configs})
        if missing:
            raise UserError(f"no config configs/{dataset}/<method>.yaml for --method {', '.join(missing)}; "
                            f"available: {', '.join(c.stem for c in configs)}.")
        configs = [c for c in configs if c.stem in methods]
    return configs


def run_files(dataset: str, config: Path, args: argparse.Namespace) -> tuple[Path, ...]:
    """The config files of a run of ``config`` (configs/<dataset>/<method>.yaml) at ``--scale``, in merge order."""
    return (config, *scale_files(CONFIGS, args.scale, dataset, config.stem))


def common_overrides(dataset: str, config: Path, args: argparse.Namespace, role: str) -> list[str]:
    """The protocol's overrides of every run: tracking, the configs protocol's head-leader rates, --epochs."""
    # one W&B group per reproduction (tracking=wandb): its runs sit together, tuning and final runs apart
    overrides = [f"tracking={args.tracking}", f"wandb_group=reproduce-{args.out.resolve().name}",
                 f"wandb_job_type={'tuning' if role == 'trial' else 'reproduce'}"]
    if args.protocol == "configs" and args.scale == "cpu" and "heads" in load_config(config).method.leader:
        overrides += HEAD_LEADER_LRS.get(dataset, [])
    return overrides + ([f"train.epochs={args.epochs}"] if args.epochs else [])


def draw_label(draw: int, args: argparse.Namespace) -> str:
    return str(draw) if args.protocol in TUNED else ""


def final_seeds(args: argparse.Namespace, draw: int) -> list[int]:
    """The evaluation seeds of tuning draw ``draw``: ``--seeds`` shifted past the previous draw's (0-4, then 5-9),
    so that no two draws' verdicts rest on the same seeds; the same ``--seeds`` in every draw with
    ``--legacy-tuning``."""
    if args.legacy_tuning:
        return list(args.seeds)
    span = max(args.seeds) - min(args.seeds) + 1
    return [seed + span * (draw - 1) for seed in args.seeds]


def protocol_overrides(dataset: str, config: Path, args: argparse.Namespace) -> list[str]:
    """The paper protocol's fixed settings of a method (``protocol.paper_overrides``); none for the others."""
    if args.protocol != "paper":
        return []
    cfg = load_config(list(run_files(dataset, config, args)), [f"train.epochs={args.epochs}"] if args.epochs else [])
    return protocol.paper_overrides(cfg, multitask=TASKS.get(cfg.data.task).num_tasks(cfg.data) > 1,
                                    schedule=args.paper_schedule)


def is_tuned(dataset: str, config: Path, args: argparse.Namespace) -> bool:
    return args.protocol in TUNED and protocol.is_tuned(load_config(config), args.protocol)


def final_specs(args: argparse.Namespace, chosen: pd.DataFrame | None) -> list[campaign.RunSpec]:
    """Every method config of every data set × draw × seed, with the draw's chosen settings (fair protocol)."""
    settings = {} if chosen is None else {(r.dataset, r.method, str(r.draw)): tuple(r.settings.split())
                                          for r in chosen.itertuples()}
    posthoc = tuple(n for n in posthoc_method_names() if n != "stability")  # stability needs the network's images
    specs = []
    for draw in draws(args):
        for dataset in args.data:
            for config in method_configs(dataset, args.method):
                method = config.stem
                for seed in final_seeds(args, draw):
                    name = campaign.run_name(data=dataset, method=method, draw=draw, seed=seed)
                    overrides = (*common_overrides(dataset, config, args, "final"),
                                 *protocol_overrides(dataset, config, args), f"seed={seed}",
                                 *settings.get((dataset, method, str(draw)), ()))
                    labels = campaign.Labels(dataset, method, "final", seed, draw_label(draw, args))
                    specs.append(campaign.RunSpec(name, run_files(dataset, config, args), overrides,
                                                  args.out / "runs" / name, labels,
                                                  posthoc if method in args.posthoc_on else ()))
    return specs


def study_specs(args: argparse.Namespace) -> fair_tuning.Studies:
    """(dataset, method, draw) -> its Optuna study of ``--budget`` trials, under this command's tuning rule (the
    bundle's recorded rule replaces it for a study the bundle records: ``study_rules.recorded_rules``)."""
    rule = command_rule(args)
    studies = {}
    for draw in draws(args):
        seeds = fair_tuning.draw_seeds(args.tuning_seeds, draw)
        for dataset in args.data:
            base_rate = dataset_follower_lr(dataset, args)
            for config in method_configs(dataset, args.method):
                if not is_tuned(dataset, config, args):  # the paper's baseline and LS: not tuned
                    continue
                files = run_files(dataset, config, args)
                study = config.stem if draw == 1 else f"{config.stem}-d{draw}"
                folder = args.out / "tuning" / f"{dataset}-{study}"
                overrides = (*common_overrides(dataset, config, args, "trial"),
                             *protocol_overrides(dataset, config, args), f"seed={seeds[0]}", f"output_dir={folder}")
                cfg = load_config(list(files), list(overrides))
                knobs = protocol.search_space(cfg, base_rate, own_knobs=args.protocol == "fair")
                studies[(dataset, config.stem, str(draw))] = tuning.StudySpec(
                    dataset, config.stem, files, overrides, base_rate, tuple(knobs), cfg.train.epochs, folder, seeds,
                    str(draw), protocol.sampler_seed(draw), rotate=not args.legacy_tuning, rule=rule)
                study_rules.check_epoch_budget(rule, args.budget, cfg.train.epochs)
    return studies


def command_rule(args: argparse.Namespace) -> TuningRule:
    """This command's tuning rule for new studies: halving judges a trial against every start point."""
    return TuningRule(tuning.start_count(args.budget), args.epoch_budget)


def draws(args: argparse.Namespace) -> list[int]:
    """The tuning draws this command runs: 1..--draws, or --only-draw's alone (none but 1 without tuning)."""
    if args.protocol not in TUNED:
        return [1]
    return [args.only_draw] if args.only_draw else list(range(1, args.draws + 1))


def draws_text(args: argparse.Namespace) -> str:
    if args.only_draw:
        return f" in draw {args.only_draw} of {args.draws} alone"
    return f" in each of {args.draws} draws" if args.draws > 1 else ""


def dataset_follower_lr(dataset: str, args: argparse.Namespace) -> float:
    """The data set's follower rate at this scale (its configs/datasets file, then the scale's): the ranges' centre."""
    path = CONFIGS / "datasets" / f"{dataset}.yaml"
    if not path.is_file():
        raise UserError(f"{path} is missing: the fair protocol centres the learning-rate range on its follower_lr.")
    return load_config([path, scale_files(CONFIGS, args.scale, dataset, "")[0]]).optim.follower_lr


def counterparts(args: argparse.Namespace) -> dict[str, str]:
    configs = {config.stem: load_config(config).to_dict() for dataset in args.data
               for config in method_configs(dataset, args.method)}
    return counterpart_pairs(configs)


def main(argv: list[str] | None = None, executor=None) -> Path:
    """``executor``: a submitit executor to use instead of Slurm's (the tests pass the local one)."""
    args = parse_args(argv)
    study_rules.check_seeds(args, final_seeds, TUNED)
    check_writable(args.out, "--out", folder=True)
    if args.protocol in TUNED:  # a bad storage URL is refused before anything is written
        tuning.check_storage(fair_tuning.study_url(args))
    report_dir = args.out / "report"
    name = f"reproduce-{args.protocol}-{args.scale}"
    measured = gpu_time.find_gpu_check(args.gpu_check, CONFIGS.parent, args.runs_per_device)
    studies = study_specs(args) if args.protocol in TUNED else {}
    recorded = read_bundle(bundle_dir(args.out))
    if args.legacy_tuning and (recorded is None or recorded.trials.empty):
        raise UserError(f"--legacy-tuning only resumes a campaign tuned under the retired rules, whose bundle is in "
                        f"--out; {bundle_dir(args.out)} records no tuning. Leave --legacy-tuning out for a new one.")
    if args.pin_to is not None:  # before the start-point check: a pinned study starts from its leader's points
        studies = pinning.pinned_studies(studies, args.pin_to, counterparts(args), args.scale)
    study_rules.check_start_rule(studies, recorded, args.budget)  # dry runs too
    studies = study_rules.recorded_rules(studies, recorded, command_rule(args), args.epoch_budget is not None)
    plan = preregistration.campaign_plan(args.plan, recorded, campaign.code_commit())  # checked against the bundle's
    if studies:
        tuning.check_processes(processes_per_run(args))
    parallel = args.parallel or 2 if args.launcher == "local" else 1
    env = thread_env(parallel, args.threads, gpus=torch.cuda.is_available())
    draft = campaign.Campaign(name, args.out, final_specs(args, None), counterparts=counterparts(args),
                              budget=args.budget if args.protocol in TUNED else None)
    print(f"protocol {args.protocol}, scale {args.scale}: {', '.join(args.data)} × "
          f"{len({s.labels.method for s in draft.specs})} methods × {len(args.seeds)} seeds"
          + (f", after {args.budget} tuning trials per method" + draws_text(args) if studies else "")
          + f"; post-hoc calibrators on {', '.join(args.posthoc_on)}")
    if args.dry_run:
        check_launcher(args, executor)  # what the real command would refuse, a dry run refuses too
        print_plan(args, studies, draft, measured, parallel)
        return report_dir
    # a launcher that refuses (no sbatch, a bad --slurm-args item) does so before any run or log is written
    runner = make_launcher(args, args.out / "slurm_logs", default_parallel=2, executor=executor)
    chosen = None
    if studies or plan is not None:  # the bundle records the command (the budget, the plan) before any run
        campaign.Collector(draft, []).update(lambda bundle: plan and preregistration.keep_first(bundle, plan))
    if studies:
        fair_tuning.run_workers(studies, args, runner, env, name)
        chosen = fair_tuning.choose_settings(studies, args)
        widenings = study_rules.MAX_WIDENINGS if args.legacy_tuning or args.widen else 0
        for widening in range(1, widenings + 1):  # a choice at a range edge: re-tune wider
            wider = study_rules.widen(studies, chosen, widening, alike=not args.legacy_tuning)
            if not wider:
                break
            print(f"re-tuning over widened ranges ({widening} of at most {study_rules.MAX_WIDENINGS}): "
                  + ", ".join(f"{s.dataset}/{s.method}" + ("" if s.draw == "1" else f" (draw {s.draw})")
                              for s in wider.values()), flush=True)
            studies.update(wider)
            fair_tuning.run_workers(wider, args, runner, env, name)
            chosen = fair_tuning.choose_settings(studies, args)
    final = campaign.Campaign(name, args.out, final_specs(args, chosen), counterparts=draft.counterparts,
                              budget=draft.budget)
    planned = campaign.plan(final)
    failed = campaign.run(final, planned, runner, env, f"the same command (--out {args.out})",
                          processes_per_run(args), "final runs")
    bundle = read_bundle(bundle_dir(args.out))
    if bundle is None or bundle.done().empty:
        raise UserError("every run failed; see the .log files next to the run folders.")
    write_bundle_report(bundle, report_dir)
    # the figures and reliability diagrams of the run folders: one draw (no two settings of one method mixed), and
    # only when every final run's folder is here (a fresh clone has the bundle alone: its tables are complete)
    if len(draws(args)) == 1 and all((p.spec.run_dir / rundir.DONE).is_file() for p in planned):
        write_comparison([args.out / "runs"], report_dir / "figures", list(DEFAULT_BINS), SUMMARY_BINS)
    write_protocol_note(report_dir, args, chosen, [final_seeds(args, d) for d in draws(args)])
    if failed:
        raise UserError(f"{len(failed)} run(s) failed, so the report lacks them: "
                        + ", ".join(str(p.spec.run_dir) for p in failed) + ". Run the same command again to continue "
                        "them.")
    return report_dir


def print_plan(args: argparse.Namespace, studies: fair_tuning.Studies, final: campaign.Campaign, measured,
               parallel: int) -> None:
    """The runs (grouped), the knobs tuned, and one estimate of what is still to run (tuning: with and
    without successive halving)."""
    full = used = (0.0, 0.0)
    if studies:
        full, used = fair_tuning.print_plan(studies, args, measured)
    planned = campaign.plan(final, settings_chosen_later=bool(studies))
    for dataset in args.data:
        mine = [p for p in planned if p.spec.labels.data == dataset]
        cfg = mine[0].config
        estimate = gpu_time.estimate_run(cfg, measured)
        sizes = "" if estimate.sizes is None else \
            " train/val/test " + "/".join(f"{n:,}" for n in estimate.sizes.values())
        print(f"  {dataset}: {len({p.spec.labels.method for p in mine})} methods × {len(args.seeds)} seeds"
              + (f" × {len(draws(args))} draws" if len(draws(args)) > 1 else "")
              + f", {cfg.model.backbone} @ {cfg.data.image_size} px, {cfg.train.epochs} epochs,{sizes}; "
              f"~{gpu_time.format_duration(estimate.seconds)} per run")
        cog = next((p.config for p in mine if p.config.method.leader), None)
        if args.protocol == "paper" and cog is not None and estimate.sizes is not None:
            print(f"    COG variants, --paper-schedule {args.paper_schedule}: "
                  + protocol.live_steps_text(cog, estimate.sizes["train"]))
    note = "" if not studies else (" (tuning included, with --prune)" if used != full else " (tuning included)")
    estimates.print_estimate(planned, measured, parallel, "final runs", used, note, out=final.out)
    if studies:
        who = "that method" if args.legacy_tuning else "every method of its data set and draw"
        widening = "" if not (args.legacy_tuning or args.widen) else (
            f"; a choice at a range edge re-tunes {who} over a wider range, up to {study_rules.MAX_WIDENINGS} times, "
            "at the same budget each")
        print("(the final runs' learning rates and knobs are chosen after tuning; times do not depend on them"
              f"{widening})")


def cli() -> None:
    run_cli(main)


if __name__ == "__main__":
    cli()
